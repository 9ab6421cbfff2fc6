"""How every `xlscale` command and `python -m trainer.*` entry point ends: one exit code per kind
of refusal, and one presentation of it.

A known refusal (a configuration that cannot run, a run directory whose contract forbids the
job, a divergence, the storage service failing) is printed as its message on stderr, prefixed by
the command, with no traceback: the message already names the cause and the fix. Anything else is
a bug and keeps its traceback (exit 1). `--verbose` or `XLSCALE_DEBUG=1` prints the traceback of
a refusal too. Launchers and `launch.status` read the codes (docs/interfaces.md, "Exit codes").

Exceptions are matched by class name along their MRO (`module.QualName`), so this module imports
none of the layers that define them and stays at the bottom.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence

DEBUG_ENV = "XLSCALE_DEBUG"
# The platform a job expects ('gpu', 'tpu', 'cpu'; 'any' for none), exported by the SLURM GPU and
# TPU VM launchers: a trainer whose JAX runs elsewhere refuses to start with the `platform` code
# (`trainer.platform`). Here, at the bottom, so launchers name it without importing JAX.
EXPECT_PLATFORM_ENV = "XLSCALE_EXPECT_PLATFORM"
VERBOSE_FLAG = "--verbose"
BUG = 1  # an unexpected exception (its traceback is printed)


@dataclasses.dataclass(frozen=True)
class ExitClass:
    """One kind of ending: its exit code and what the user does about it."""

    name: str
    code: int
    meaning: str


# Kind -> exit class. The codes follow sysexits.h where one fits.
CLASSES: dict[str, ExitClass] = {
    c.name: c
    for c in (
        ExitClass("configuration", 2, "the command as given cannot run: change the flag named"),
        ExitClass("contract", 73, "the run directory refuses this job (lease, permissions, files)"),
        ExitClass("storage", 74, "the storage service failed: retry, or check the URL named"),
        ExitClass("divergence", 65, "training diverged; the last checkpoint is finite"),
        ExitClass("preemption", 75, "stopped early with a checkpoint saved: start it again"),
        ExitClass("platform", 69, "the job asked for an accelerator JAX cannot see"),
        # No sysexits.h code fits; launchers do not restart it (`rundir.stop_request`).
        ExitClass(
            "stopped",
            79,
            "stopped on request (MODEL_DIR/STOP_REQUESTED), checkpoint saved: "
            "remove the request and start it again to resume",
        ),
    )
}
PREEMPTED = CLASSES["preemption"].code
STOPPED = CLASSES["stopped"].code

# Exception class (`module.QualName`, subclasses included) -> kind in `CLASSES`.
REFUSALS: dict[str, str] = {
    "trainer.validation.ConfigError": "configuration",
    # `INIT_CHECKPOINT`/`CHECKPOINT` naming no such run or step, or parameters that do not fit
    # (`trainer.restore.CheckpointNotFoundError` is a subclass of the first).
    "convert.init_checkpoints.CheckpointNotFoundError": "configuration",
    "convert.init_checkpoints.CheckpointSpecError": "configuration",
    "convert.init_checkpoints.CheckpointMismatchError": "configuration",
    "rundir.storage.UnsupportedPathError": "configuration",
    "pipelines.vocab.VocabularyFileError": "configuration",
    "rundir.lease.LeaseHeldError": "contract",
    "rundir.lease.ModelDirNotWritableError": "contract",
    "rundir.records.MetricsFileError": "contract",
    "rundir.checksums.CheckpointCorruptError": "contract",
    "rundir.storage.StorageError": "storage",
    "trainer.divergence.NonFiniteError": "divergence",
    "trainer.platform.PlatformError": "platform",
}
# Lines gin appends to an exception raised inside a configurable (not the user's concern).
_GIN_CONTEXT = ("  In call to configurable", "  In file ")
# A refusal is at most this many lines on stderr; a longer message keeps its first lines and
# says how many more `--verbose` prints (its traceback holds the whole message).
MAX_LINES = 3


def classify(error: BaseException) -> ExitClass | None:
    """The exit class of a known refusal, or None (a bug: keep the traceback)."""
    for cls in type(error).__mro__:
        kind = REFUSALS.get(f"{cls.__module__}.{cls.__qualname__}")
        if kind is not None:
            return CLASSES[kind]
    return None


def message(error: BaseException) -> str:
    """The refusal's own message, without the context lines gin appends."""
    lines = str(error).splitlines() or [type(error).__name__]
    return "\n".join(line for line in lines if not line.startswith(_GIN_CONTEXT)).rstrip()


def brief(text: str, *, max_lines: int = MAX_LINES) -> str:
    """`text` in at most `max_lines` lines: a longer one keeps its first `max_lines - 1` lines and
    ends with a line saying how many were left out and that `--verbose` prints them."""
    lines = text.splitlines() or [""]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    left = len(lines) - (max_lines - 1)
    return "\n".join(
        [*lines[: max_lines - 1], f"  ... and {left} more lines ({VERBOSE_FLAG} prints them all)"]
    )


def debug_enabled() -> bool:
    """Whether tracebacks were asked for (`XLSCALE_DEBUG` set to anything but '', '0')."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def pop_verbose(argv: Sequence[str]) -> tuple[list[str], bool]:
    """`argv` without `--verbose`, and whether it was there (or `XLSCALE_DEBUG` is set)."""
    rest = [a for a in argv if a != VERBOSE_FLAG]
    return rest, len(rest) != len(argv) or debug_enabled()


# Classes whose job can simply be started again once the cause is gone: their refusal ends with
# the command that does it (the run resumes from its last complete checkpoint).
RESUMABLE = ("storage",)


def present(
    error: BaseException, *, prog: str, verbose: bool = False, argv: Sequence[str] | None = None
) -> int | None:
    """Prints a known refusal on stderr (`prog: message`, at most `MAX_LINES` lines; the
    traceback first when `verbose`) and returns its exit code; None for anything else (the
    caller re-raises it). A `RESUMABLE` class with the command's `argv` known adds one line: the
    command that resumes the job."""
    kind = classify(error)
    if kind is None:
        return None
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    print(brief(f"{prog}: {message(error)}"), file=sys.stderr)
    if kind.name in RESUMABLE and argv is not None:
        print(
            f"  to resume once it is fixed: {shlex.join([*prog.split(), *argv])}", file=sys.stderr
        )
    return kind.code


def run_main(main: Callable[[list[str]], int | None], *, prog: str, argv=None) -> int:
    """Runs an entry point's `main(argv)` with this presentation (`python -m trainer.train`)."""
    args, verbose = pop_verbose(sys.argv[1:] if argv is None else argv)
    try:
        return int(main(args) or 0)
    except Exception as e:
        code = present(e, prog=prog, verbose=verbose, argv=args)
        if code is None:
            raise
        return code


# After a failure, threads that are still alive (an orbax save waiting on a store that went
# away, its signalling threads) get this long to end before the process ends without them.
JOIN_DEADLINE_S = 5.0


def _drop_background_output() -> None:
    """After the failure has been reported, what threads still print (their tracebacks, the
    retries they log, native libraries' lines) is dropped: the report stays the last lines on
    stderr. (`--verbose` or `XLSCALE_DEBUG=1` keeps them.)"""
    threading.excepthook = lambda args: None
    logging.disable(logging.CRITICAL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        stderr = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a file (a test's capture): nothing native writes to it
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stderr)
    os.close(devnull)


def leave(code: int) -> int:
    """Ends a command's process with `code` (its top-level `main`, not a library call).

    A failed job may leave non-daemon threads behind that Python's exit would wait for: an orbax
    save blocked on storage that went away waits for minutes, its signalling threads forever.
    After a failure, what threads still print is dropped (the report stays the last lines on
    stderr), and they get `JOIN_DEADLINE_S` in all; if one is still alive then, the standard
    streams are flushed and the process ends at once (`os._exit`) rather than by the
    interpreter's exit, which would wait for it. Nothing it could still write matters: the error
    has been reported, and a resume does not see an uncommitted step. Otherwise, and for success
    and preemption, `code` is returned for a normal exit.
    """
    if code in (0, PREEMPTED):
        return code
    if VERBOSE_FLAG not in sys.argv and not debug_enabled():
        _drop_background_output()
    deadline = time.monotonic() + JOIN_DEADLINE_S
    stuck = False
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon:
            continue
        try:  # the base class's join: a library's override may wait on its own terms (orbax's)
            threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - e.g. a thread Python did not start cannot be joined
            pass
        stuck = stuck or thread.is_alive()
    if stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
