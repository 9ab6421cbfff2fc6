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
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gin

from trainer import compile_cache, partitioning, validation

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


_SEARCH_PATHS: set[str] = set()


def _tolerant(existence_check: Callable[[str], bool]) -> Callable[[str], bool]:
    """Wraps a gin existence check so that an unusable candidate answers False.

    gin's package-path reader treats `runs/pretrain.gin` as file `pretrain.gin` of a Python
    package `runs`; a plain `runs/` directory on `sys.path` (e.g. a sweep's output directory in
    the working directory) is a namespace package without a file, and the check raised TypeError
    instead of moving on to the next search path.
    """

    def check(path: str) -> bool:
        try:
            return existence_check(path)
        except TypeError:
            return False

    check.tolerant = True  # type: ignore[attr-defined]
    return check


def _harden_file_readers() -> None:
    """Makes every registered gin file reader's existence check tolerant (idempotent)."""
    from gin import config as gin_config

    readers = gin_config._FILE_READERS  # gin has no public API to wrap a registered reader
    for i, (reader, check) in enumerate(readers):
        if not getattr(check, "tolerant", False):
            readers[i] = (reader, _tolerant(check))


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


def _quiet_search(record: logging.LogRecord) -> bool:
    """Drops gin's "Path not found" errors, logged for every search path it tries in vain."""
    return not str(record.msg).startswith("Path not found")


def parse(argv: Sequence[str], *, job: str, distributed: str = "auto") -> ParsedConfig:
    """Starts multi-host JAX if needed, parses gin files and bindings, checks required macros.

    Raises:
      trainer.validation.ConfigError: a required macro is unset (names it and the flag to pass).
    """
    _show_progress()
    partitioning.maybe_initialize_distributed(
        mode=os.environ.get("XLSCALE_DISTRIBUTED", distributed)
    )
    compile_cache.enable()
    files, bindings, paths = split_flags(argv)
    _harden_file_readers()
    if not files:
        raise validation.ConfigError("no --gin_file given; e.g. --gin_file=experiments/cpt.gin")
    for path in (*paths, os.getcwd(), os.fspath(CONFIGS_DIR)):
        if path not in _SEARCH_PATHS:
            _SEARCH_PATHS.add(path)
            gin.add_config_file_search_path(path)
    root = logging.getLogger()
    root.addFilter(_quiet_search)
    try:
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    finally:
        root.removeFilter(_quiet_search)
    validation.check_required({name: macro_value(name) for name in REQUIRED_MACROS[job]})
    try:
        gin.finalize()
    except ValueError as e:
        message = str(e)
        if "gin.REQUIRED" in message:
            name = message.split("/", 1)[0]
            raise validation.ConfigError(
                f"required gin macro {name} is not set; pass --gin.{name}=..."
            ) from None
        raise
    return ParsedConfig(
        job=job, files=tuple(files), bindings=tuple(bindings), config_str=gin.config_str()
    )


def call(fn: Callable, config: ParsedConfig) -> Any:
    """Calls the gin-configured `fn` (passing the resolved config as `gin_config` if it takes it)."""
    configured = gin.get_configurable(fn)
    if "gin_config" in inspect.signature(fn).parameters:
        return configured(gin_config=config.config_str)
    return configured()
