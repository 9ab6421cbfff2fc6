"""The trainer's side of a stop request (`rundir.stop_request`: `MODEL_DIR/STOP_REQUESTED`).

`Poller.poll()` is asked once per step by the preemption watcher
(`trainer.checkpoints.PreemptionWatcher`) and looks at the file at most every `POLL_S` seconds
(on object storage each look is a request; the store failing there ends the run as any storage
failure does, rather than reading as "no request" and waiting on the store again at the next
look). A single-process job stops at the step it sees the request, as after a SIGTERM: the
checkpoint hook saves that step, no COMPLETED is written, and the job exits
`rundir.exits.STOPPED`. In a multi-host job only process 0 looks, and on seeing the request it
sends itself SIGTERM: JAX's preemption service then has every host agree on one step to stop at
(`CheckpointStore.reached_preemption`), the very path a preemption takes.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

import jax

from rundir import stop_request

log = logging.getLogger(__name__)

POLL_S = 2.0  # seconds between looks at the request file


class StopRequested(Exception):
    """A single-process job started while its run holds a stop request: it ends before it
    builds, compiles or writes anything (`trainer.gin_entry.run` turns it into
    `rundir.exits.STOPPED`)."""


def refuse_if_requested(model_dir) -> None:
    """Raises `StopRequested` when the run in `model_dir` holds a stop request and this job is a
    single process (the hosts of a multi-host job could see a new request at different moments,
    so they stop together in the loop instead)."""
    if jax.process_count() == 1 and stop_request.requested(model_dir, storage_failures=True):
        why = (stop_request.read(model_dir) or {}).get("reason", "")
        raise StopRequested(
            f"{stop_request.path(model_dir)}: stop requested ({why}); not started. "
            "Remove the file to start or resume the run"
        )


class Poller:
    """Looks for the stop request of the run in `model_dir` (see the module docstring), every
    `every_s` seconds (default `POLL_S`)."""

    def __init__(
        self,
        model_dir,
        *,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._model_dir = model_dir
        self._every_s = POLL_S if every_s is None else every_s
        self._clock = clock
        self._next = -float("inf")  # the first step looks at once
        self._multihost = jax.process_count() > 1
        self._looks = not self._multihost or jax.process_index() == 0
        self._seen = False

    def requested_now(self) -> bool:
        """Whether a request exists now (a single-process job's start-up check: it then trains
        nothing); always False in a multi-host job, whose hosts must decide together."""
        return not self._multihost and stop_request.requested(
            self._model_dir, storage_failures=True
        )

    def poll(self) -> bool:
        """Whether this step is the one to stop at (single process), after looking at the file
        if `POLL_S` passed; a multi-host job's process 0 raises the preemption notice instead
        and the hosts stop where the preemption service says."""
        if self._seen:
            return not self._multihost
        now = self._clock()
        if not self._looks or now < self._next:
            return False
        self._next = now + self._every_s
        if not stop_request.requested(self._model_dir, storage_failures=True):
            return False
        self._seen = True
        log.warning(
            "stop requested (%s): saving a checkpoint and stopping",
            stop_request.path(self._model_dir),
        )
        if self._multihost:
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption notifier tells every host
            return False
        return True
