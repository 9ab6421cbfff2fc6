"""The run the resume tests resume: a finished 4-step single-device constant-LR run
(`base_kwargs`), which the `finished` fixture (conftest.py) trains once per module."""

from __future__ import annotations

from tiny_runs import tiny_kwargs

from trainer.checkpoints import CheckpointConfig
from trainer.data import EvalConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

STEPS = 4
CONSTANT = ScheduleConfig(name="constant", peak=3e-3)


def base_kwargs(tiny_data, **overrides):
    """A 4-step single-device constant-LR run checkpointed every 2 steps, no evaluation."""
    kwargs = tiny_kwargs(
        tiny_data,
        train_steps=STEPS,
        schedule=CONSTANT,
        checkpoint=CheckpointConfig(period=2, keep_last=10),
        mesh=MeshConfig(num_devices=1),
        evaluation=EvalConfig(),
    )
    kwargs.update(overrides)
    return kwargs
