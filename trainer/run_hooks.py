"""The trainer's hooks on the step loop (`trainer.loop.StepHook` objects): a metrics record (with
evaluation) and a checkpoint.

`trainer.train._run` builds them over the run's shared state (`Training`: the train state, the
counters, the store and writer, the eval schedule and the records not yet in a checkpoint) and
registers them on the loop, metrics first (a checkpoint carries the records logged up to its
step). A new kind of periodic work is a new `StepHook` here, registered there.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import numpy as np

from trainer import loop as loop_lib
from trainer import run_files


class Training(Protocol):
    """The run's shared state, as the hooks see it (`trainer.train._Training`)."""

    plan: Any  # trainer.plan.RunPlan
    job: Any  # trainer.jobs.Job
    state: Any
    counters: Any  # trainer.metrics_log.Counters
    progress: Any  # trainer.metrics_log.StepRate
    store: Any  # trainer.checkpoints.CheckpointStore
    eval_at: frozenset[int]
    best_key: str | None
    evaluated: tuple[int, float | None]
    unsaved: list[dict]

    def evaluate(self, step: int) -> dict:
        """Validation losses (and decoding scores) of the current parameters."""
        ...

    def log_record(self, record: dict) -> None:
        """Writes a `metrics.jsonl` record, kept for the next checkpoint too."""
        ...


class MetricsHook(loop_lib.StepHook):
    """The log hook: a `metrics.jsonl` record of the steps since the last one, with evaluation
    if due, and the progress line."""

    name = "log"

    def __init__(self, training: Training):
        self.training = training

    def when(self, info: loop_lib.StepInfo) -> bool:
        """A record at the end, at eval steps, at kept checkpoints (fitting dates a kept
        checkpoint by its record's `tokens`) and every `log_every` steps."""
        plan, step = self.training.plan, info.step
        checkpoint = plan.checkpoint
        kept = bool(checkpoint.keep_every) and step % checkpoint.period == 0
        kept = kept and step % checkpoint.keep_every == 0
        return info.last or step in self.training.eval_at or kept or step % plan.loop.log_every == 0

    def __call__(self, info: loop_lib.StepInfo) -> None:
        """Writes the record (evaluating first at an eval step)."""
        t, step = self.training, info.step
        timing = t.progress.timing(step)
        record = t.counters.record(step, **t.job.flops_kwargs())
        t.progress.log_line(
            step,
            loss=record.get("train/loss", float("nan")),
            learning_rate=record["learning_rate"],
            timing=timing,
        )
        if step in t.eval_at:
            record.update(t.evaluate(step))
            t.evaluated = (step, record.get(t.best_key))
            t.progress.start(step)
        t.log_record({**record, **timing})


class CheckpointHook(loop_lib.StepHook):
    """The checkpoint hook: state, counters, and the records logged since the last one.

    Args:
      training: the run's shared state.
      pending_files: a resume's run files, written by its first checkpoint (None: none wait).
    """

    name = "checkpoint"

    def __init__(self, training: Training, *, pending_files: run_files.RunFiles | None = None):
        self.training = training
        self.pending_files = pending_files

    def when(self, info: loop_lib.StepInfo) -> bool:
        """A checkpoint at the end, before a stop, every `checkpoint.period` steps and, with
        `keep_best`, at every evaluation (each a candidate for the best)."""
        t = self.training
        best = t.best_key is not None and info.step in t.eval_at
        return info.last or info.stopping or best or info.step % t.plan.checkpoint.period == 0

    def __call__(self, info: loop_lib.StepInfo) -> None:
        """Saves the checkpoint of this step.

        The first checkpoint of a resume first writes the resume's run files: the loop synced
        (and found every update since the resume finite, or skipped it) before this hook acts,
        so an amendment is recorded once the run has trained under it, and before any checkpoint
        trained under it exists (a resume with the old settings must then be refused).
        """
        t = self.training
        if self.pending_files is not None:
            self.pending_files.write(t.plan.model_dir)
            self.pending_files = None
        state = t.state
        train_state = {
            "step": info.step,
            "data_position": info.step,
            "rng": [int(x) for x in np.asarray(jax.device_get(state.rng)).ravel()],
            "skipped": int(jax.device_get(state.skipped)),
            **t.counters.to_json(),
            "records": list(t.unsaved),
        }
        best = t.evaluated[1] if t.evaluated[0] == info.step else None
        t.store.save(
            info.step,
            params=state.params,
            opt_state=state.opt_state,
            train_state=train_state,
            best=best,
        )
        t.unsaved.clear()
        t.progress.start(info.step)
