"""The step loop: run steps, and at the steps that need it, let hooks log, evaluate, save and stop.

A hook is a `(when, what)` pair, as in Levanter's trainer (`add_hook(..., every=N)`): `when`
looks at a `StepInfo` and says whether the hook acts at that step, `what` acts. A hook object
(`StepHook`: a name, `when` and `__call__`) is registered whole with `StepLoop.add`; the trainer's
metrics and checkpoint hooks are such objects (`trainer.run_hooks`). The loop keeps
one contract, which the trainer relies on and `tests/test_step_loop.py` checks:

1. After each step the loop asks every hook's `when`, and, when one says yes, brings the metrics
   of the steps since the last sync to the host (`sync`) **before** any hook acts: the trainer's
   sync is also where a non-finite update is found, so a rollback (`divergence`) always comes
   before a save, and no checkpoint holds a step that was not checked.
2. Hooks act in the order they were added (the trainer adds log, then checkpoint), so a
   checkpoint carries the metric records logged up to and including its step.
3. `StepInfo.stopping` (asked once per step: `stop_after`, or a preemption notice) ends the loop
   after the hooks of that step acted; the checkpoint hook saves at such a step.

Metrics stay on the device between syncs, so the host never waits for a step it does not look at.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from trainer import validation

NONFINITE_MODES = ("stop", "skip")


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How the loop runs around the steps (gin: `loop.LoopConfig`; none of it is in a run's
    fingerprint: it changes when things happen, not what is trained).

    Attributes:
      log_every: write a `metrics.jsonl` record every this many steps (and at eval steps, kept
        checkpoints and the end).
      on_nonfinite: what a non-finite loss, gradient or update does: "stop" raises
        `divergence.NonFiniteError` and rolls back to the last checkpoint (all checkpoints are
        finite); "skip" drops such updates (counting neither their tokens nor their loss).
      max_skipped_fraction: in "skip" mode, fail once more than this fraction of the steps so
        far were skipped (one skip is always tolerated).
      stop_after: stop (saving a checkpoint) after this step, as a preemption would.
      min_step_seconds: each step takes at least this long, the loop sleeping the rest: a tiny
        model then trains at a real job's pace, so a cluster's preemption, time limits and stop
        requests can be rehearsed at toy size (and a test can act mid-run however fast the
        machine trains) without spending the CPU of thousands of steps; 0: never sleeps.
    """

    log_every: int = 100
    on_nonfinite: str = "stop"
    max_skipped_fraction: float = 0.05
    stop_after: int | None = None
    min_step_seconds: float = 0.0

    def __post_init__(self):
        validation.check_choice(
            name="on_nonfinite", value=self.on_nonfinite, allowed=NONFINITE_MODES
        )
        validation.check_fraction(name="max_skipped_fraction", value=self.max_skipped_fraction)
        if self.log_every < 1:
            raise validation.ConfigError(
                f"LOG_EVERY (loop.LoopConfig.log_every) = {self.log_every}: must be at least 1"
            )
        if not self.min_step_seconds >= 0:
            raise validation.ConfigError(
                f"MIN_STEP_SECONDS (loop.LoopConfig.min_step_seconds) = {self.min_step_seconds}: "
                "must be 0 (no floor) or a positive number of seconds"
            )


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One finished step, as the hooks see it.

    Attributes:
      step: the step just finished (1-based: the number of updates so far).
      last: whether it is the run's last step.
      stopping: whether the run stops after it (and is not complete): `stop_after` or a
        preemption notice.
    """

    step: int
    last: bool
    stopping: bool


@dataclasses.dataclass(frozen=True)
class Hook:
    """Periodic work: `what(info)` runs at the steps where `when(info)` is true."""

    name: str
    when: Callable[[StepInfo], bool]
    what: Callable[[StepInfo], None]


def periodic(n: int | None) -> Callable[[StepInfo], bool]:
    """A `when` for every `n`-th step (0 or None: never)."""
    return lambda info: bool(n) and info.step % n == 0


class StepHook:
    """A hook as an object (as Levanter's trainer hooks are): its `name`, `when(info)` (default:
    every `every` steps) and `__call__(info)`, the work. A new kind of periodic work is a new
    subclass registered with `StepLoop.add`, not an edit of the loop's owner; state the hook
    shares with others is given to its constructor."""

    name: str = "hook"
    every: int | None = None

    def when(self, info: StepInfo) -> bool:
        """Whether the hook acts at this step (default: every `every` steps)."""
        return periodic(self.every)(info)

    def __call__(self, info: StepInfo) -> None:
        """The hook's work at a step where `when` said yes."""
        raise NotImplementedError


class StepLoop:
    """Runs steps `start+1 .. total` with hooks (see the module docstring for the contract).

    Args:
      start: the step the state is at.
      total: the run's last step.
      run_step: runs one step and returns its device-side metrics.
      sync: takes `[(step, metrics), ...]` since the last sync (fetching them from the device);
        may raise (a non-finite stop) before any hook acts.
      should_stop: asked once per step but the last; true ends the run after that step.
      on_first_step: called after the first step of this start (to leave compilation out of the
        throughput).
      min_step_seconds: the least time from one step's start to the next's (`LoopConfig`).
    """

    def __init__(
        self,
        *,
        start: int,
        total: int,
        run_step: Callable[[], Any],
        sync: Callable[[list[tuple[int, Any]]], None],
        should_stop: Callable[[int], bool],
        on_first_step: Callable[[int, Any], None] | None = None,
        min_step_seconds: float = 0.0,
    ):
        self.start = start
        self._min_step_s = min_step_seconds
        self.total = total
        self._run_step = run_step
        self._sync = sync
        self._should_stop = should_stop
        self._on_first_step = on_first_step
        self.hooks: list[Hook] = []

    def add_hook(
        self,
        name: str,
        what: Callable[[StepInfo], None],
        *,
        every: int | None = None,
        when: Callable[[StepInfo], bool] | None = None,
    ) -> None:
        """Adds a hook acting every `every` steps, or where `when` says; after earlier hooks."""
        if (every is None) == (when is None):
            raise ValueError(f"hook {name!r}: give exactly one of every= and when=")
        self.hooks.append(Hook(name, when or periodic(every), what))

    def add(self, hook: StepHook) -> None:
        """Registers a hook object (`StepHook`) under its name, after earlier hooks."""
        self.hooks.append(Hook(hook.name, hook.when, hook))

    def run(self) -> int:
        """Runs until the last step or a stop; returns the step reached."""
        step, pending = self.start, []
        while step < self.total:
            began = time.monotonic()
            metrics = self._run_step()
            step += 1
            pending.append((step, metrics))
            if step == self.start + 1 and self._on_first_step is not None:
                self._on_first_step(step, metrics)
            last = step == self.total
            info = StepInfo(step=step, last=last, stopping=not last and self._should_stop(step))
            acting = [hook for hook in self.hooks if hook.when(info)]
            if acting:
                self._sync(pending)
                pending = []
            for hook in acting:
                hook.what(info)
            if info.stopping:
                break
            if self._min_step_s and not last:  # the step runs on the device meanwhile
                time.sleep(max(0.0, self._min_step_s - (time.monotonic() - began)))
        return step
