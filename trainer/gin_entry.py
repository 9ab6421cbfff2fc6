"""Command-line flags -> gin: the shared front half of the `train`, `eval` and `infer` entry points.

Flags follow T5X: `--gin_file=F` (repeatable; later files override earlier ones),
`--gin.KEY=VALUE` (a binding or macro, e.g. `--gin.MODEL_DIR="'/runs/x'"`), and
`--gin_search_paths=A,B` (where `--gin_file` and `include` look; the `t5x_configs/` directory and
the working directory are always searched). Gin files configure the library through
`from __gin__ import dynamic_registration`, so no library function is decorated.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import io
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gin

from pipelines import native_logs
from rundir import exits, stop_request, storage
from trainer import compile_cache, gin_checks, gin_types, partitioning, stop_requests, validation

log = logging.getLogger(__name__)

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "t5x_configs"
# Macros each job needs (beyond what its gin files default).
REQUIRED_MACROS: dict[str, tuple[str, ...]] = {
    "train": (
        "MODEL_DIR",
        "MODEL_SIZE",
        "MIXTURE_OR_TASK_NAME",
        "TASK_FEATURE_LENGTHS",
        "BATCH_SIZE",
    ),
    "eval": ("MODEL_DIR", "MODEL_SIZE", "EVAL_TASKS"),
    "infer": ("MODEL_DIR", "MODEL_SIZE", "VOCAB_PATH"),
}
# Job -> (module, function): what the gin files configure (the importable module, not
# `__main__`, so that `python -m trainer.train` binds the same function the files name).
JOBS: dict[str, tuple[str, str]] = {
    "train": ("trainer.train", "train"),
    "eval": ("trainer.eval", "evaluate"),
    "infer": ("trainer.infer", "infer"),
}


@dataclasses.dataclass(frozen=True)
class ParsedConfig:
    """The resolved gin configuration of one job."""

    job: str
    files: tuple[str, ...]
    bindings: tuple[str, ...]
    config_str: str


def split_flags(argv: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """`(gin files, gin bindings, search paths)` from T5X-style flags.

    Raises:
      SystemExit: on an unknown flag (argparse's usage message).
    """
    parser = argparse.ArgumentParser(prog="trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument("--gin_search_paths", default="", help="comma-separated directories")
    parser.add_argument("--gin_bindings", action="append", default=[], help="KEY=VALUE")
    bindings, rest = [], []
    args_iter = iter(argv)
    for arg in args_iter:
        if arg.startswith("--gin."):
            binding = arg[len("--gin.") :]
            if "=" not in binding:
                binding = f"{binding}={next(args_iter, '')}"
            bindings.append(binding)
        else:
            rest.append(arg)
    args = parser.parse_args(rest)
    paths = [p for p in args.gin_search_paths.split(",") if p]
    return args.gin_file, [*args.gin_bindings, *bindings], paths


def macro_value(name: str) -> Any:
    """The value bound to gin macro `name`, or None when it is unbound or `%gin.REQUIRED`."""
    try:
        value = gin.query_parameter(f"{name}/macro.value")
    except ValueError:
        return None
    if value is gin.REQUIRED or repr(value) == "%gin.REQUIRED":
        return None
    return value


_INCLUDE = re.compile(r"""^include\s+(['"])(?P<name>[^'"]+)\1\s*(#.*)?$""")
_IMPORT = re.compile(r"^(from\s+\S+\s+)?import\s")


def find_config_file(name: str, search_paths: Sequence[str]) -> Path:
    """The gin file `name` as given (absolute, or relative to the working directory) or under
    the first of `search_paths` that has it.

    Raises:
      trainer.validation.ConfigError: no such file (names the paths searched).
    """
    candidates = (
        [name] if os.path.isabs(name) else [name, *(os.path.join(p, name) for p in search_paths)]
    )
    for candidate in candidates:
        if os.path.isfile(candidate):
            return Path(candidate).resolve()
    raise validation.ConfigError(
        f"gin file {name!r} not found; searched the working directory and {list(search_paths)} "
        "(add a directory with --gin_search_paths)"
    )


def parse_config_text(
    text: str,
    *,
    name: str,
    search_paths: Sequence[str],
    including: tuple[Path, ...] = (),
    labels: Sequence[str] | None = None,
    parsed: Sequence[gin_checks.TextScan] = (),
) -> list[gin_checks.TextScan]:
    """Parses gin `text` with gin's public `gin.parse_config`, resolving its `include`s here.

    Each `include 'F'` is looked up with `find_config_file` and parsed (recursively) before the
    text's own statements, which is what gin does when includes come before the bindings, as they
    must here. gin's own lookup is avoided: it also treats `runs/pretrain.gin` as file
    `pretrain.gin` of a Python package `runs`, and a plain `runs/` directory on `sys.path` (a
    sweep's output directory in the working directory of `python -m trainer.train`) made it fail
    with TypeError before reaching the search path.

    Args:
      text: gin statements (a file's contents, or command-line bindings one per line).
      name: where `text` comes from, for error messages.
      search_paths: directories `include`s are looked up in, after the working directory.
      including: the files whose includes led here (an include cycle is an error).
      labels: what to call each line of `text` in messages (the flag of each binding line).
      parsed: the scans of texts parsed before (their configurables are the candidates for a
        misspelt one).

    Returns:
      What each parsed text (the included files first) sets and reads, for
      `gin_checks.check_macros`.

    Raises:
      trainer.validation.ConfigError: an include after a binding, an include cycle, a missing
        file, a binding to a configurable or parameter that does not exist, or a flag or file
        line gin cannot parse (naming it), or anything else gin refuses.
    """
    body, bound, scans = [], False, []
    for lineno, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        match = _INCLUDE.match(stripped)
        if match is None:
            bound = bound or bool(stripped and stripped[0] != "#" and not _IMPORT.match(stripped))
            body.append(line)
            continue
        if bound:
            raise validation.ConfigError(f"{name}:{lineno}: put includes before the bindings")
        path = find_config_file(match["name"], search_paths)
        if path in including:
            raise validation.ConfigError(f"{name}:{lineno}: include cycle through {path}")
        scans += parse_config_text(
            path.read_text(),
            name=os.fspath(path),
            search_paths=search_paths,
            including=(*including, path),
        )
        body.append("\n")  # keeps gin's line numbers right
    try:
        scan = gin_checks.scan_text("".join(body), name=name, labels=labels)
    except gin_checks.PARSE_ERRORS as e:
        raise gin_checks.explain_syntax_error(
            e, name=name, text="".join(body), labels=labels
        ) from None
    source = io.StringIO("".join(body))
    source.name = name  # gin's parser names the file in its error messages
    try:
        gin.parse_config(source)
    except (ValueError, *gin_checks.PARSE_ERRORS) as e:
        error = gin_checks.explain_gin_error(
            e, name=name, labels=labels, scans=[*parsed, *scans, scan]
        )
        raise (error or gin_checks.refused(e, name=name, labels=labels)) from None
    return [*scans, scan]


def _show_progress() -> None:
    """Sends the trainer's own INFO logs (progress lines) to stderr, leaving other libraries'
    logging (orbax and TensorFlow are chatty at INFO) as it is."""
    logger = logging.getLogger("trainer")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


class _BackgroundTracebacks(logging.Filter):
    """Keeps a background thread's log record to its message, without the traceback: orbax's
    save threads log one per failed operation when the store goes away or the disk fills (tens
    of tracebacks); the job's main thread reports the failure itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and threading.current_thread() is not threading.main_thread():
            log.debug("traceback of %s", record.getMessage(), exc_info=record.exc_info)
            record.exc_info, record.exc_text = None, None
        return True


def _background_tracebacks_off() -> None:
    """Background threads' tracebacks go to the job's debug log, not the terminal: those of
    orbax's records (absl), and those printed for uncaught errors in threads (TensorStore's
    callbacks once orbax closed their event loop report "Event loop is closed", one each, as
    unraisable errors).
    `--verbose` or `XLSCALE_DEBUG=1` keeps them all."""
    absl = logging.getLogger("absl")
    if exits.VERBOSE_FLAG in sys.argv or exits.debug_enabled():
        return
    if any(isinstance(f, _BackgroundTracebacks) for f in absl.filters):
        return  # once per process
    absl.addFilter(_BackgroundTracebacks())
    printed = sys.excepthook

    def excepthook(kind, value, traceback):
        if threading.current_thread() is threading.main_thread():
            printed(kind, value, traceback)
        else:
            log.debug("in a background thread: %s", value, exc_info=(kind, value, traceback))

    sys.excepthook = excepthook
    unraisable = sys.unraisablehook

    def unraisablehook(args):  # TensorStore's callbacks report theirs as unraisable
        if threading.current_thread() is threading.main_thread():
            unraisable(args)
        else:
            log.debug("in a background thread: %s", args.exc_value)

    sys.unraisablehook = unraisablehook

    def thread_excepthook(args):  # a thread of ours or a library's died: one line, no traceback
        name = getattr(args.thread, "name", "?")
        log.warning("thread %s failed: %s", name, exits.message(args.exc_value))
        log.debug("thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    threading.excepthook = thread_excepthook


def parse(argv: Sequence[str], *, job: str, distributed: str = "auto") -> ParsedConfig:
    """Starts multi-host JAX if needed, parses gin files and bindings, checks that every macro
    set is read by some gin file (`gin_checks`), that the required macros are set and that every
    bound value has its parameter's type (`gin_types`).

    Raises:
      trainer.validation.ConfigError: a required macro is unset (names it and the flag to pass),
        a macro or binding that nothing uses (names it, where it was set and the nearest valid
        names), a flag or file line gin cannot parse, or a value of the wrong type (names the
        macro or binding, where it was set, the value and the types allowed).
    """
    native_logs.quiet_tensorflow_import()  # TF's C++ start-up lines stay off the terminal
    _show_progress()
    _background_tracebacks_off()
    storage.bound_orbax_retries()  # a store that goes away fails a save in seconds, not minutes
    partitioning.maybe_initialize_distributed(
        mode=os.environ.get("XLSCALE_DISTRIBUTED", distributed)
    )
    compile_cache.enable()
    files, bindings, paths = split_flags(argv)
    if not files:
        raise validation.ConfigError("no --gin_file given; e.g. --gin_file=experiments/cpt.gin")
    search_paths = (*paths, os.getcwd(), os.fspath(CONFIGS_DIR))
    scans = []
    for file in files:
        path = find_config_file(file, search_paths)
        scans += parse_config_text(
            path.read_text(), name=os.fspath(path), search_paths=search_paths, including=(path,)
        )
    scans += parse_config_text(
        "\n".join(bindings),
        name="<bindings>",
        search_paths=search_paths,
        labels=[f"--gin.{binding}" for binding in bindings],
        parsed=scans,
    )
    gin_checks.check_macros(scans)
    validation.check_required({name: macro_value(name) for name in REQUIRED_MACROS[job]})
    try:
        gin.finalize()
    except ValueError as e:
        if (error := gin_checks.explain_unbound_macro(e, scans=scans)) is not None:
            raise error from None
        message = str(e)
        if "gin.REQUIRED" in message:
            name = message.split("/", 1)[0]
            raise validation.ConfigError(
                f"required gin macro {name} is not set; pass --gin.{name}=..."
            ) from None
        raise
    gin_types.check_bound_types(scans)
    return ParsedConfig(
        job=job, files=tuple(files), bindings=tuple(bindings), config_str=gin.config_str()
    )


def call(fn: Callable, config: ParsedConfig) -> Any:
    """Calls the gin-configured `fn` (passing the resolved config as `gin_config` if it takes it)."""
    configured = gin.get_configurable(fn)
    if "gin_config" in inspect.signature(fn).parameters:
        return configured(gin_config=config.config_str)
    return configured()


# Macros whose gs:// URL TensorStore reads or writes (orbax's checkpoint arrays).
_TENSORSTORE_MACROS = ("MODEL_DIR", "INIT_CHECKPOINT")


def _quiet_tensorstore_credentials() -> None:
    """TensorStore's first GCS request, with its credentials line kept off the terminal
    (`native_logs.quiet_tensorstore_credentials`), made here in the main thread before the job
    starts, when a macro of `_TENSORSTORE_MACROS` names a gs:// URL."""
    for name in _TENSORSTORE_MACROS:
        value = macro_value(name)
        if isinstance(value, str) and value.startswith("gs://"):
            native_logs.quiet_tensorstore_credentials(value)
            return


def run(job: str, argv: Sequence[str] | None = None) -> int:
    """One job from its flags (`python -m trainer.<job>` and `xlscale <job>`): parses them
    (`parse`), calls the job's gin-configured function and returns the exit code: 0, or
    `rundir.exits.PREEMPTED` for a run that stopped early with a checkpoint (rerun it), or
    `rundir.exits.STOPPED` when it stopped on a request (`rundir.stop_request`)."""
    module, name = JOBS[job]
    fn = getattr(importlib.import_module(module), name)
    config = parse(sys.argv[1:] if argv is None else argv, job=job)
    _quiet_tensorstore_credentials()
    try:
        result = call(fn, config)
    except stop_requests.StopRequested as e:  # told to stop before it started: not a failure
        print(f"python -m {module}: {exits.message(e)}", file=sys.stderr)
        return exits.STOPPED
    if getattr(result, "completed", True):
        return 0
    return exits.STOPPED if stop_request.requested(result.model_dir) else exits.PREEMPTED


def main(job: str) -> None:
    """The `if __name__ == "__main__"` of a job module: `run` with one-line errors and their
    exit codes (`rundir.exits`). A failed job ends within `exits.JOIN_DEADLINE_S` of its error
    (`exits.leave`): it may leave background threads (an orbax save retrying against storage
    that went away) that would hold the process for many minutes."""
    code = exits.run_main(lambda argv: run(job, argv), prog=f"python -m {JOBS[job][0]}")
    sys.exit(exits.leave(code))
