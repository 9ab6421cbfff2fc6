"""The trainer's own train step, compiled for a benchmark: one call of `trainer.jobs.compile_job`
with what every benchmark fixes (no data, a single component, the step settings of a plain run).

The benchmark scripts (`accelerator_rows.py`, `aot_tpu.py`, `memory_model.py`, `t5_train.py`,
`train_step.py`) each build a partitioned model (`trainer.jobs.build_partitioned_model`) and ask
this module for its step, so what they time, compile or measure is the step a training run
compiles. Imports no TensorFlow, seqio or gin (the accelerator benchmark runs without them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainer import jobs, steps
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import Partitioner
from trainer.schedules import ScheduleConfig


def compile_train_step(
    built: tuple[Any, Partitioner, Any],
    *,
    batch_size: int,
    seq_len: int,
    optimizer: OptimizerConfig,
    schedule: ScheduleConfig,
    step_config: steps.StepConfig | None = None,
    feature_lengths: Mapping[str, int] | None = None,
    eval_batch_size: int | None = None,
    components: Sequence[str] = ("synthetic",),
    total_steps: int = 10_000,
) -> jobs.Job:
    """The compiled job of a benchmark's step.

    Args:
      built: `(wrapper, partitioner, abstract_params)`, as `jobs.build_partitioned_model` returns.
      batch_size, seq_len, feature_lengths: the global batch and its lengths (`feature_lengths`
        None: decoder-only `{"targets": seq_len}`).
      optimizer, schedule: as a run's gin binds them.
      step_config: None: `StepConfig(num_components=1)`.
      eval_batch_size: also compile the eval step for this batch (None: no eval step).
      components: the names the step's per-component counters carry.
      total_steps: the schedule's length (matters only to length-dependent schedules).
    """
    wrapper, partitioner, abstract = built
    return jobs.compile_job(
        model=wrapper,
        partitioner=partitioner,
        abstract_params=abstract,
        components=list(components),
        total_steps=total_steps,
        batch_size=batch_size,
        seq_len=seq_len,
        feature_lengths=feature_lengths,
        eval_batch_size=eval_batch_size,
        optimizer=optimizer,
        schedule=schedule,
        step_config=step_config or steps.StepConfig(num_components=1),
    )
