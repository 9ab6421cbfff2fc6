"""Every gin macro and binding of a configuration must mean something.

gin itself rejects a binding to a configurable or parameter that does not exist, but says
neither which flag set it nor what was meant, and it accepts any macro: `--gin.TRAIN_STEP=3` (a
typo of `TRAIN_STEPS`) used to run the default number of steps and exit 0. This module reads the
gin texts the entry points parse (with gin's own parser, `gin.config_parser`) and

- `check_macros`: a macro that is set but that no gin file reads (no `%NAME` in the parsed files,
  the bindings or the shipped `t5x_configs/`) is a `ConfigError` naming the macro, where it was
  set and the nearest macros the configuration reads. A macro that only another job reads (an eval-only default in a train job) is logged, not refused: run files
  document defaults that a given job may not use, and a sweep's `[gin]` table serves every
  strategy of the sweep.
- `explain_gin_error`: turns gin's unknown-configurable and unknown-parameter errors into a
  `ConfigError` naming the flag or file line and the nearest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import logging
import re
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
      defined: `(macro, where it is set)` for each macro binding, in order (`where` is a file line
        or the command-line flag).
      referenced: macros the text reads (`%NAME`, scoped names included).
      selectors: configurables the text binds parameters of (e.g. `partitioning.MeshConfig`).
      includes: the files the text includes, as written.
    """

    defined: tuple[tuple[str, str], ...] = ()
    referenced: frozenset[str] = frozenset()
    selectors: frozenset[str] = frozenset()
    includes: tuple[str, ...] = ()


class _Recorder(config_parser.ParserDelegate):
    """A parser delegate that records the macros a text reads instead of resolving them."""

    def __init__(self) -> None:
        self.macros: set[str] = set()

    def configurable_reference(self, scoped_configurable_name, evaluate):  # noqa: D102
        return scoped_configurable_name

    def macro(self, macro_name):  # noqa: D102
        self.macros.add(macro_name)
        return macro_name


def scan_text(text: str, *, name: str, labels: Sequence[str] | None = None) -> TextScan:
    """The macros `text` sets and reads, and the files it includes, by gin's own parser.

    Args:
      text: gin statements.
      name: the file the text comes from; a macro set on line `i` is "set in `name:i`".
      labels: what to call each line instead (the command-line flag of each binding line).
    """
    recorder = _Recorder()
    defined, selectors, includes = [], set(), []
    for statement in config_parser.ConfigParser(text, recorder):
        if isinstance(statement, config_parser.IncludeStatement):
            includes.append(statement.filename)
        if not isinstance(statement, config_parser.BindingStatement):
            continue
        line = statement.location.line_num
        if statement.arg_name:
            selectors.add(statement.selector)
            continue
        macro = f"{statement.scope}/{statement.selector}" if statement.scope else statement.selector
        if labels is not None and 0 < line <= len(labels):
            where = f"set by {labels[line - 1]}"
        else:
            where = f"set in {name}:{line}"
        defined.append((macro, where))
    return TextScan(
        defined=tuple(defined),
        referenced=frozenset(recorder.macros),
        selectors=frozenset(selectors),
        includes=tuple(includes),
    )


@functools.lru_cache(maxsize=256)
def _file_scan(path: Path, mtime_ns: int) -> tuple[frozenset[str], tuple[str, ...]]:
    """The macros a gin file reads and the files it includes (nothing when it does not parse:
    gin reports that itself when a job parses it)."""
    del mtime_ns  # part of the cache key only
    try:
        scan = scan_text(path.read_text(), name=str(path))
    except (OSError, SyntaxError, ValueError):
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
    return f"gin macro {macro} ({'; '.join(where)}) is used by nothing in the configuration; {hint}"


def check_defined(
    defined: Iterable[tuple[str, str]], *, known: Collection[str], used: Collection[str] = ()
) -> None:
    """Every macro in `defined` must be in `known` (read by some gin file).

    Args:
      defined: `(macro, where it is set)` pairs.
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
        if macro not in used and where.startswith("set by "):
            _LOG.warning("gin macro %s (%s) is not read by this job's configuration", macro, where)


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


def explain_gin_error(
    error: ValueError, *, name: str, labels: Sequence[str] | None, selectors: Collection[str]
) -> validation.ConfigError | None:
    """gin's error for an unknown configurable or parameter, as a `ConfigError` naming the flag
    (or file line) and the nearest valid names; None for any other error.

    Args:
      error: what `gin.parse_config` raised.
      name: the text's file name (as given to gin).
      labels: the command-line flag of each line, for the bindings text.
      selectors: configurables the configuration binds (candidates for a misspelt one).
    """
    message = str(error)
    line = _LINE.search(message)
    number = int(line["line"]) if line else 0
    if labels is not None and 0 < number <= len(labels):
        where = f"set by {labels[number - 1]}"
    else:
        where = f"set in {name}:{number}" if number else f"set in {name}"
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
        hint = _did_you_mean(selector, set(selectors) - {selector}, "configurable bound here")
        return validation.ConfigError(
            f"gin binding {selector} ({where}): no configurable {selector!r}; {hint}"
        )
    return None


def check_bindings_mapping(
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
    defined = [(key, f"set in {where}") for key in settings if "." not in key]
    known = known_macros(files=files, search_paths=search_paths)
    known |= {v[1:] for v in settings.values() if isinstance(v, str) and v.startswith("%")}
    check_defined(defined, known=known)
