"""Orbax's error records while a run saves checkpoints: kept off the terminal.

A save that fails (a full disk, a store gone away) fails in orbax's background threads first:
each logs an ERROR record (`_SignalingThread.run() raised an exception: ...`, `Failed to run 5
Handler Commit operations ...`) while training goes on, and the main thread, when it next waits
for the save, logs the failure again with a traceback of 60-100 lines. The trainer then raises
that failure and `rundir.exits` reports it in a few lines: what failed and why, the failed
save's step, the last complete checkpoint, the command that resumes. Orbax's records tell the
user nothing more, so once a run opens its checkpoints for writing (`install`), orbax's records
at ERROR and above go to the third-party log where one is named (`$XLSCALE_THIRD_PARTY_LOG`,
`pipelines.native_logs`), and nowhere else -- whatever thread logs them, whenever the disk fills.
`--verbose` or `XLSCALE_DEBUG=1` leaves them where they were.
"""

from __future__ import annotations

import logging
import os
import sys

import orbax.checkpoint as ocp

from pipelines import native_logs
from rundir import exits

# orbax logs through absl: every record of its package reaches this logger.
_ABSL_LOGGER = "absl"
_ORBAX_DIR = os.path.dirname(os.path.abspath(ocp.__file__)) + os.sep
# The third-party log's record format (as `xlscale_cli.terminal` writes it).
_THIRD_PARTY_FORMAT = "%(asctime)s %(levelname)s %(message)s [%(name)s]"


class _QuietFileHandler(logging.FileHandler):
    """A file handler that stays silent when its own write fails (the third-party log may sit on
    the disk that just filled up): logging would print its own traceback on the terminal."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        del record


class OrbaxErrors(logging.Filter):
    """Takes orbax's records at ERROR and above off the terminal, writing them (traceback
    included) to the third-party log when one is named; every other record passes."""

    def __init__(self):
        super().__init__()
        self._handlers: dict[str, logging.Handler] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not is_orbax(record):
            return True
        path = native_logs.third_party_log()
        if path:
            if path not in self._handlers:
                handler = _QuietFileHandler(path, delay=True)
                handler.setFormatter(logging.Formatter(_THIRD_PARTY_FORMAT))
                self._handlers[path] = handler
            self._handlers[path].handle(record)
        return False


def is_orbax(record: logging.LogRecord) -> bool:
    """Whether `record` was logged by orbax's code (absl names no module of its own)."""
    return os.path.abspath(record.pathname).startswith(_ORBAX_DIR)


def install() -> None:
    """Keeps orbax's error records off the terminal from now on (see the module docstring),
    unless tracebacks were asked for; once per process."""
    if exits.VERBOSE_FLAG in sys.argv or exits.debug_enabled():
        return
    logger = logging.getLogger(_ABSL_LOGGER)
    if not any(isinstance(f, OrbaxErrors) for f in logger.filters):
        logger.addFilter(OrbaxErrors())


class _NoMetricNotice(logging.Filter):
    """Drops orbax's warning for a save without metrics while it tracks the best checkpoint: only
    checkpoints saved at an evaluation step have a value, by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Requested `tracked_metric`")


logging.getLogger("absl").addFilter(_NoMetricNotice())
