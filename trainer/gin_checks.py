"""Every gin macro and binding of a configuration must mean something.

gin itself rejects a binding to a configurable or parameter that does not exist, but says
neither which flag set it nor what was meant, and it accepts any macro: `--gin.TRAIN_STEP=3` (a
typo of `TRAIN_STEPS`) used to run the default number of steps and exit 0. This module reads the
gin texts the entry points parse (with gin's own parser, `gin.config_parser`) and

- `check_macros`: a macro that is set but that no gin file reads (no `%NAME` in the parsed files,
  the bindings or the shipped `t5x_configs/`) is a `ConfigError` naming the macro, where it was
  set and the nearest macros the configuration reads. A macro that only another job reads (an
  eval-only default in a train job) is logged, not refused: run files document defaults that a
  given job may not use, and a sweep's `[gin]` table serves every strategy of the sweep
  (`check_macro_table` checks such a table).
- `explain_gin_error`, `explain_unbound_macro`: turn gin's errors for an unknown configurable or
  parameter, and for a macro read but set nowhere, into a `ConfigError` naming the flag or file
  line and the nearest valid names.
- `explain_syntax_error`, `refused`: turn gin's parse errors (a flag or file line gin cannot
  parse, anything else gin refuses) into a one-line `ConfigError` naming the flag or file line.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import io
import logging
import re
import sys
import tokenize
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import gin
from gin import config_parser

from trainer import validation

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "t5x_configs"
_LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TextScan:
    """What one parsed gin text sets and reads.

    Attributes:
      defined: `(macro, place)` for each macro the text sets, in order; `place` is
        `by <flag>` for a command-line binding, `in <file>:<line>` otherwise.
      reads: `(macro, place)` for each macro the text reads (`%NAME`, scoped names included).
      selectors: configurables the text binds parameters of (e.g. `partitioning.MeshConfig`).
      includes: the files the text includes, as written.
      modules: `(name, module)` for each Python module the text imports (`from trainer import
        data` binds `data` to `trainer.data`).
      bound: `(binding, place)` for each parameter the text binds, as written
        (`[scope/]configurable.param`).
    """

    defined: tuple[tuple[str, str], ...] = ()
    reads: tuple[tuple[str, str], ...] = ()
    selectors: frozenset[str] = frozenset()
    includes: tuple[str, ...] = ()
    modules: tuple[tuple[str, str], ...] = ()
    bound: tuple[tuple[str, str], ...] = ()

    @property
    def referenced(self) -> frozenset[str]:
        """The macros the text reads."""
        return frozenset(macro for macro, _ in self.reads)


class _Recorder(config_parser.ParserDelegate):
    """A parser delegate that records the macros a text reads instead of resolving them."""

    def __init__(self) -> None:
        self.macros: list[str] = []

    def configurable_reference(self, scoped_configurable_name, evaluate):  # noqa: D102
        return scoped_configurable_name

    def macro(self, macro_name):  # noqa: D102
        self.macros.append(macro_name)
        return macro_name


def place(*, name: str, line: int, labels: Sequence[str] | None = None) -> str:
    """Where line `line` of text `name` comes from: `by <flag>` when `labels` names the
    command-line flag of each line, else `in <name>:<line>`."""
    if labels is not None and 0 < line <= len(labels):
        return f"by {labels[line - 1]}"
    return f"in {name}:{line}" if line else f"in {name}"


def scan_text(text: str, *, name: str, labels: Sequence[str] | None = None) -> TextScan:
    """The macros `text` sets and reads, and the files it includes, by gin's own parser.

    Args:
      text: gin statements.
      name: the file the text comes from (places are `in <name>:<line>`).
      labels: the command-line flag of each line, for the bindings text (places `by <flag>`).
    """
    recorder = _Recorder()
    defined, reads, selectors, includes, modules, bound = [], [], set(), [], [], []
    source = io.StringIO(text)
    source.name = name  # syntax errors name the file, as gin's own do
    for statement in config_parser.ConfigParser(source, recorder):
        where = place(name=name, line=statement.location.line_num, labels=labels)
        reads += [(macro, where) for macro in recorder.macros]
        recorder.macros.clear()
        if isinstance(statement, config_parser.IncludeStatement):
            includes.append(statement.filename)
        if isinstance(statement, config_parser.ImportStatement):
            modules.append((statement.bound_name(), statement.module))
        if not isinstance(statement, config_parser.BindingStatement):
            continue
        name = f"{statement.scope}/{statement.selector}" if statement.scope else statement.selector
        if statement.arg_name:
            selectors.add(statement.selector)
            bound.append((f"{name}.{statement.arg_name}", where))
            continue
        defined.append((name, where))
    return TextScan(
        defined=tuple(defined),
        reads=tuple(reads),
        selectors=frozenset(selectors),
        includes=tuple(includes),
        modules=tuple(modules),
        bound=tuple(bound),
    )


@functools.lru_cache(maxsize=256)
def _file_scan(path: Path, mtime_ns: int) -> tuple[frozenset[str], tuple[str, ...]]:
    """The macros a gin file reads and the files it includes (nothing when it does not parse:
    gin reports that itself when a job parses it)."""
    del mtime_ns  # part of the cache key only
    try:
        scan = scan_text(path.read_text(), name=str(path))
    except (OSError, SyntaxError, ValueError, tokenize.TokenError):
        return frozenset(), ()
    return scan.referenced, scan.includes


def _find(name: str | Path, search_paths: Sequence[str | Path]) -> Path | None:
    """`name` as given or under the first search path that has it (as `gin_entry` looks)."""
    for directory in ("", *search_paths):
        candidate = Path(directory) / name
        if candidate.is_file():
            return candidate.resolve()
    return None


def known_macros(*, files: Iterable[str | Path] = (), search_paths: Sequence[str] = ()) -> set[str]:
    """Macros that some gin file reads: the shipped `t5x_configs/` (the documented library of
    macros), and `files` (found under `search_paths` as the trainer looks) with their includes.
    """
    paths = sorted(CONFIGS_DIR.rglob("*.gin"))
    lookup = (*search_paths, CONFIGS_DIR)
    pending = [found for name in files if (found := _find(name, lookup)) is not None]
    known: set[str] = set()
    seen: set[Path] = set()
    for path in paths:
        known |= _file_scan(path, path.stat().st_mtime_ns)[0]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        referenced, includes = _file_scan(path, path.stat().st_mtime_ns)
        known |= referenced
        pending += [found for name in includes if (found := _find(name, lookup)) is not None]
    return known


def nearest(name: str, candidates: Collection[str]) -> list[str]:
    """Up to three of `candidates` closest to `name` (difflib's ratio, case-insensitive)."""
    folded = {c.upper(): c for c in sorted(candidates)}
    matches = difflib.get_close_matches(name.upper(), list(folded), n=3, cutoff=0.6)
    return [folded[m] for m in matches]


def _did_you_mean(name: str, candidates: Collection[str], what: str) -> str:
    close = nearest(name, candidates)
    if close:
        return "did you mean " + " or ".join(close) + "?"
    return f"no {what} has a similar name"


def unknown_macro_message(*, macro: str, where: Sequence[str], candidates: Collection[str]) -> str:
    """The message for a macro nothing reads: the macro, where it was set, the nearest names."""
    hint = _did_you_mean(macro, set(candidates) - {macro}, "macro the configuration reads")
    places = "; ".join(f"set {p}" for p in where)
    return f"gin macro {macro} ({places}) is used by nothing in the configuration; {hint}"


def check_defined(
    defined: Iterable[tuple[str, str]], *, known: Collection[str], used: Collection[str] = ()
) -> None:
    """Every macro in `defined` must be in `known` (read by some gin file).

    Args:
      defined: `(macro, place)` pairs (`TextScan.defined`).
      known: macros some gin file reads.
      used: macros this job reads (the nearest names come from these, else from `known`).

    Raises:
      trainer.validation.ConfigError: naming each unknown macro, where it was set and the
        nearest macros the configuration reads.
    """
    where: dict[str, list[str]] = {}
    for macro, place in defined:
        where.setdefault(macro, []).append(place)
    unknown = [macro for macro in where if macro not in known and not macro.startswith("gin.")]
    if unknown:
        raise validation.ConfigError(
            "\n".join(
                unknown_macro_message(
                    macro=m, where=where[m], candidates=used if nearest(m, used) else known
                )
                for m in unknown
            )
        )


def check_macros(scans: Sequence[TextScan]) -> None:
    """Refuses macros no gin file reads; logs command-line macros only other jobs read.

    Args:
      scans: every text the job parsed (its files, their includes, the bindings).

    Raises:
      trainer.validation.ConfigError: a macro is set but nothing reads it (see `check_defined`).
    """
    used = set().union(*(scan.referenced for scan in scans))
    defined = [pair for scan in scans for pair in scan.defined]
    check_defined(defined, known=used | known_macros(), used=used)
    for macro, where in defined:
        if macro not in used and where.startswith("by "):
            _LOG.warning(
                "gin macro %s (set %s) is not read by this job's configuration", macro, where
            )


_UNKNOWN_PARAMETER = re.compile(
    r"Configurable '(?P<selector>[^']+)' doesn't have a parameter named '(?P<param>[^']+)'"
)
_UNKNOWN_CONFIGURABLE = re.compile(
    r"No configurable matching (?:reference )?'@?(?P<selector>[^'(]+)"
)
_LINE = re.compile(r"line (?P<line>\d+)")


def _parameters(selector: str) -> list[str]:
    """The parameter names of configurable `selector` (a dataclass's fields), or [] if unknown."""
    try:
        fn = gin.get_configurable(selector)
    except (ValueError, KeyError):
        return []
    if dataclasses.is_dataclass(fn):
        return [field.name for field in dataclasses.fields(fn)]
    try:
        return list(inspect.signature(inspect.unwrap(fn)).parameters)
    except (TypeError, ValueError):
        return []


def _configurables(scans: Sequence[TextScan]) -> set[str]:
    """Configurable names a misspelt one may have meant: those the texts bind, and the public
    callables of the modules they import (`from trainer import data` -> `data.lm_task`, ...)."""
    names = set().union(*(scan.selectors for scan in scans))
    for scan in scans:
        for alias, module_name in scan.modules:
            module = sys.modules.get(module_name)
            if module is not None:
                names |= {
                    f"{alias}.{attr}"
                    for attr, value in vars(module).items()
                    if not attr.startswith("_")
                    and callable(value)
                    and getattr(value, "__module__", None) == module_name
                }
    return names


def explain_gin_error(
    error: ValueError, *, name: str, labels: Sequence[str] | None, scans: Sequence[TextScan]
) -> validation.ConfigError | None:
    """gin's error for an unknown configurable or parameter, as a `ConfigError` naming the flag
    (or file line) and the nearest valid names; None for any other error.

    Args:
      error: what `gin.parse_config` raised.
      name: the text's file name (as given to gin).
      labels: the command-line flag of each line, for the bindings text.
      scans: the texts parsed so far (their configurables and modules are the candidates for a
        misspelt configurable).
    """
    message = str(error)
    line = _LINE.search(message)
    where = "set " + place(name=name, line=int(line["line"]) if line else 0, labels=labels)
    if match := _UNKNOWN_PARAMETER.search(message):
        selector, param = match["selector"], match["param"]
        params = _parameters(selector)
        hint = _did_you_mean(param, params, "parameter")
        allowed = f" (allowed: {', '.join(params)})" if params else ""
        return validation.ConfigError(
            f"gin binding {selector}.{param} ({where}): {selector} has no parameter {param!r}; "
            f"{hint}{allowed}"
        )
    if match := _UNKNOWN_CONFIGURABLE.search(message):
        selector = match["selector"]
        candidates = _configurables(scans) - {selector}
        hint = _did_you_mean(selector, candidates, "configurable of the imported modules")
        return validation.ConfigError(
            f"gin configurable {selector} ({where}): no configurable {selector!r}; {hint}"
        )
    return None


def check_macro_table(
    settings: Mapping[str, object],
    *,
    where: str,
    files: Iterable[str | Path] = (),
    search_paths: Sequence[str] = (),
) -> None:
    """The macros of a `{KEY: value}` table (a sweep manifest's `[gin]`) must be read by some gin
    file; keys with a dot bind configurables and are checked by gin when the job parses them.

    Raises:
      trainer.validation.ConfigError: naming each unknown key, `where` and the nearest macros.
    """
    defined = [(key, f"in {where}") for key in settings if "." not in key]
    known = known_macros(files=files, search_paths=search_paths)
    known |= {v[1:] for v in settings.values() if isinstance(v, str) and v.startswith("%")}
    check_defined(defined, known=known)


_UNBOUND_MACRO = re.compile(r"No bindings specified for '(?P<macro>[^']+)/gin\.macro'")


def explain_unbound_macro(
    error: ValueError, *, scans: Sequence[TextScan]
) -> validation.ConfigError | None:
    """gin's error for a macro that is read (`%NAME`) but set nowhere (raised by
    `gin.finalize` together with the whole config), as a `ConfigError` naming the macro, where it
    is read and the nearest macros that are set; None for any other error."""
    match = _UNBOUND_MACRO.search(str(error))
    if match is None:
        return None
    macro = match["macro"]
    places = [where for scan in scans for name, where in scan.reads if name == macro]
    read = "; ".join(f"read {where}" for where in places) or "read by the configuration"
    defined = {name for scan in scans for name, _ in scan.defined}
    hint = _did_you_mean(macro, defined, "macro of the configuration")
    return validation.ConfigError(f"gin macro {macro} ({read}) is set nowhere; {hint}")


# How a flag is written, for the refusal of one gin cannot parse.
FLAG_SYNTAX = (
    "--gin.NAME=VALUE with VALUE a Python literal (strings quoted: --gin.NAME=\"'text'\"), "
    "a %MACRO or an @configurable()"
)
# What gin's parser says when a text ends inside brackets or a string (tokenize's words).
_UNCLOSED = "a bracket or a string is not closed"


def _parse_failure(error: Exception) -> tuple[str, int]:
    """gin's reason for a text it cannot parse, in a few words, and the line (0: unknown)."""
    if isinstance(error, tokenize.TokenError):
        return _UNCLOSED, 0
    reason = (str(getattr(error, "msg", "")).strip().splitlines() or ["unparsable"])[-1]
    return reason.strip().rstrip("."), int(getattr(error, "lineno", 0) or 0)


PARSE_ERRORS = (SyntaxError, tokenize.TokenError)  # what gin's parser raises on bad text


def explain_syntax_error(
    error: Exception, *, name: str, text: str, labels: Sequence[str] | None
) -> validation.ConfigError:
    """gin's parser error for `text` (a `PARSE_ERRORS`) as a one-line `ConfigError`: for the
    command-line bindings, the flag gin cannot parse (each line is parsed alone to find it: an
    unclosed bracket would otherwise swallow the flags after it) and how a flag is written; for a
    gin file, the file, its line and gin's reason.

    Args:
      error: what gin's parser raised.
      name: the text's file name (as given to gin).
      text: the text parsed.
      labels: the command-line flag of each line, for the bindings text.
    """
    lines = text.splitlines()
    if labels is not None and len(labels) == len(lines):
        for line, label in zip(lines, labels, strict=True):
            try:
                scan_text(line, name=name)
            except PARSE_ERRORS as e:
                reason, _ = _parse_failure(e)
                return validation.ConfigError(
                    f"{label}: gin cannot parse it ({reason}); allowed: {FLAG_SYNTAX}"
                )
    reason, line = _parse_failure(error)
    shown = f" {lines[line - 1].strip()!r}" if 0 < line <= len(lines) else ""
    return validation.ConfigError(
        f"gin cannot parse the statement {place(name=name, line=line, labels=labels)}{shown}: "
        f"{reason}; allowed: gin statements (NAME = VALUE, configurable.param = VALUE, include, "
        "import)"
    )


def refused(error: Exception, *, name: str, labels: Sequence[str] | None) -> validation.ConfigError:
    """Any other error gin raised while parsing a text (not one `explain_gin_error` knows), as a
    one-line `ConfigError` naming the flag or file line and gin's own first line."""
    message = (str(error).strip().splitlines() or [type(error).__name__])[0]
    line = _LINE.search(str(error))
    where = place(name=name, line=int(line["line"]) if line else 0, labels=labels)
    return validation.ConfigError(f"gin refused the configuration set {where}: {message}")
