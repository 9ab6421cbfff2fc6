"""Stopping a job cleanly when told to: a SIGTERM (preemptible TPUs, schedulers, a job script's
time limit) or a stop request, noticed once per step so that the loop saves a checkpoint and the
job exits as a preemption."""

from __future__ import annotations

import logging
import signal
import threading
from typing import TYPE_CHECKING

import jax

from trainer import stop_requests

if TYPE_CHECKING:
    from trainer.checkpoints import CheckpointStore

log = logging.getLogger(__name__)


class SigtermFlag:
    """Turns SIGTERM into a flag from construction until `close()`: `trainer.train` installs it
    before taking the lease, so a SIGTERM during start-up (loading, compiling) ends the job as a
    preemption (lease released, exit 75) rather than killing it with the lease left behind.

    Only single-process jobs in the main thread install a handler (it only sets the flag: saving
    inside a signal handler is unsafe); multi-host jobs rely on JAX's preemption service.
    """

    def __init__(self):
        self.event = threading.Event()
        self._previous = None
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        del frame
        log.warning("received signal %d: stopping (saving a checkpoint if training)", signum)
        self.event.set()

    def close(self) -> None:
        """Restores the previous SIGTERM handler."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


class PreemptionWatcher:
    """Notices a SIGTERM (preemptible TPUs, schedulers) or, given `model_dir`, a stop request
    (`trainer.stop_requests`) so the loop can save and exit cleanly.

    Single-process jobs watch a `SigtermFlag` (their own, or the caller's installed earlier);
    multi-host jobs rely on JAX's preemption service, which all hosts agree on through
    `CheckpointStore.reached_preemption`.
    """

    def __init__(self, store: CheckpointStore, *, flag: SigtermFlag | None = None, model_dir=None):
        self._store = store
        self._own = flag is None
        self._flag = SigtermFlag() if flag is None else flag
        self._requests = None if model_dir is None else stop_requests.Poller(model_dir)

    def signalled(self) -> bool:
        """Whether this process received SIGTERM, or (single process) a stop is requested."""
        return self._flag.event.is_set() or bool(self._requests and self._requests.requested_now())

    def should_stop(self, step: int) -> bool:
        """Whether a preemption was signalled or a stop requested (checked once per step)."""
        requested = self._requests is not None and self._requests.poll()
        return requested or self._flag.event.is_set() or self._store.reached_preemption(step)

    def close(self) -> None:
        """Restores the previous SIGTERM handler (if this watcher installed it)."""
        if self._own:
            self._flag.close()
