"""What the training loop does when an update is not finite (`loop.LoopConfig.on_nonfinite`).

The train step never applies a non-finite update (`trainer.steps`), so the state in memory and
every checkpoint stay finite. This module turns the step's finiteness flags into decisions and
messages:

- "stop": the run stops at the first non-finite step with `NonFiniteError`, naming the step,
  what was not finite and the checkpoint it rolls back to (a restart resumes from there);
- "skip": such updates are dropped and counted, and the run fails once more than
  `max_skipped_fraction` of its steps were skipped (beyond `MIN_SKIPS_TOLERATED`), or at the end
  when it applied no update at all, so a diverged run never looks complete.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

# Step metric -> what it checks, in the order a message lists them.
FINITE_PARTS: dict[str, str] = {
    "finite_loss": "loss",
    "finite_grads": "gradients",
    "finite_update": "update",
}
# A run may skip this many updates whatever its length (one early skip in a short run is fine).
MIN_SKIPS_TOLERATED = 1
ADVICE = (
    "lower the learning rate (PEAK_LR, schedules.ScheduleConfig.peak) or lengthen its warm-up, "
    "add a z-loss (Z_LOSS, steps.StepConfig.z_loss), or check the data; resuming with a changed setting needs "
    "--gin.RESUME_POLICY naming it (e.g. 'schedule')"
)


class NonFiniteError(RuntimeError):
    """Training diverged: a non-finite loss, gradient or update stopped the run ("stop" mode), or
    too many updates were skipped ("skip" mode). No non-finite state was checkpointed."""


def nonfinite_parts(metrics: Mapping[str, Any]) -> list[str]:
    """What was not finite in one step's metrics (e.g. `['update']`)."""
    parts = [
        what for key, what in FINITE_PARTS.items() if key in metrics and not bool(metrics[key])
    ]
    return parts or ["loss or gradients"]


def stop_message(
    *, step: int, metrics: Mapping[str, Any], rollback_step: int | None, model_dir: Any
) -> str:
    """The "stop" mode error: which step, what was not finite, where a restart resumes from, and
    what to change."""
    rollback = (
        f"step {rollback_step}, the last checkpoint (all finite)"
        if rollback_step is not None
        else "step 0 (no checkpoint was written yet: a restart starts afresh)"
    )
    lr = float(metrics.get("learning_rate", math.nan))
    return (
        f"non-finite {', '.join(nonfinite_parts(metrics))} at step {step} (learning rate {lr:.3g}); "
        f"the run stopped without saving and rolls back to {rollback}: rerunning with "
        f"MODEL_DIR {model_dir} resumes from there (metrics.jsonl was truncated to that step). "
        f"To go on, {ADVICE}; or set ON_NONFINITE='skip' (loop.LoopConfig.on_nonfinite) to drop such updates "
        f"(the run then fails past MAX_SKIPPED_FRACTION of skipped steps)."
    )


def too_many_skipped(*, step: int, skipped: int, max_fraction: float) -> bool:
    """Whether `skipped` of the first `step` updates exceed `max_fraction` of them (beyond
    `MIN_SKIPS_TOLERATED`, so one early skip in a short run is fine)."""
    return skipped > max(MIN_SKIPS_TOLERATED, max_fraction * step)


def check_skipped(
    *, step: int, skipped: int, max_fraction: float, rollback_step: int | None = None
) -> None:
    """In "skip" mode, fails once `too_many_skipped`.

    Raises:
      NonFiniteError: naming the counts, the step a rerun resumes from and what to change.
    """
    if too_many_skipped(step=step, skipped=skipped, max_fraction=max_fraction):
        resume = (
            f"step {rollback_step}, its last checkpoint (metrics.jsonl was truncated to it)"
            if rollback_step is not None
            else "step 0 (no checkpoint was written yet)"
        )
        raise NonFiniteError(
            f"{skipped} of {step} updates were skipped as non-finite, more than "
            f"MAX_SKIPPED_FRACTION = {max_fraction} (loop.LoopConfig.max_skipped_fraction) allows: the run "
            f"is diverging. It stopped without saving; a rerun resumes from {resume}. "
            f"To go on, {ADVICE}."
        )


def check_applied(*, step: int, skipped: int) -> None:
    """A run must have applied at least one update to count as completed.

    Raises:
      NonFiniteError: when all `step` updates were skipped.
    """
    if step > 0 and skipped >= step:
        raise NonFiniteError(
            f"all {step} updates were skipped as non-finite: the run did not train and is not "
            f"marked COMPLETED; {ADVICE}."
        )


def on_nonfinite(
    counters: Any,
    *,
    step: int,
    mode: str,
    max_skipped_fraction: float,
    model_dir: Any,
    store: Any,
    writer: Any,
) -> None:
    """Deals with the skipped steps in `counters.nonfinite` (a `metrics.Counters` absorbed up to
    `step`): "stop" raises at the first one, "skip" logs them and raises past
    `max_skipped_fraction`. Before raising, the run rolls back to its last checkpoint (`store`, a
    `checkpoints.CheckpointStore`): `metrics.jsonl` (`writer`) keeps no record after it, as a
    resume from it would.

    Raises:
      NonFiniteError: as above.
    """

    def rollback() -> int | None:
        store.wait()
        latest = store.latest_step()
        writer.truncate_after(latest or 0)
        return latest

    if mode == "stop":
        first_step, first = counters.nonfinite[0]
        rollback_step = rollback()
        raise NonFiniteError(
            stop_message(
                step=first_step, metrics=first, rollback_step=rollback_step, model_dir=model_dir
            )
        )
    log.warning(
        "skipped non-finite updates at steps %s (%d of %d so far)",
        [s for s, _ in counters.nonfinite],
        counters.skipped,
        step,
    )
    counters.nonfinite = []
    counts = dict(step=step, skipped=counters.skipped, max_fraction=max_skipped_fraction)
    if too_many_skipped(**counts):
        check_skipped(**counts, rollback_step=rollback())
