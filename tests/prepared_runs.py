"""What the tests that train on prepared data (`PREPARED_DATA`) share: preparing the tiny
corpora's train splits, and a tiny run that reads them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from tiny_runs import tiny_kwargs

from pipelines.prepared import prepare as prepare_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig


def tiny_registration(tiny_data) -> prepare_lib.Registration:
    """The registration of the seqio tasks on the tiny corpora and vocabulary (`tiny_data`),
    for the tests that prepare them; the caller registers it (and drops it afterwards)."""
    return prepare_lib.Registration(vocab_path=tiny_data["vocab"], corpora_dir=tiny_data["corpora"])


def prepare_splits(out: Path, tasks: Sequence[str], *, split: str, num_shards: int) -> Path:
    """Prepares `split` of each of `tasks` (registered by the caller) into `out`, `num_shards`
    shards each, in this process and quietly; returns `out`."""
    for task in tasks:
        prepare_lib.prepare(
            task_name=task,
            split=split,
            out_dir=out,
            num_shards=num_shards,
            workers=1,
            log=lambda line: None,
        )
    return out


def prepare_train_splits(out: Path, tasks: Sequence[str]) -> Path:
    """Prepares the train split of each of `tasks` (registered by the caller) into `out`, two
    shards each, in this process; returns `out`."""
    return prepare_splits(out, tasks, split="train", num_shards=2)


def prepared_kwargs(
    tiny_data, prepared_dir: Path, *, mixture_or_task: str, langs: Sequence[str], **overrides
) -> dict:
    """`tiny_kwargs` reading `mixture_or_task` from `prepared_dir`, on one device, with a
    checkpoint every 2 steps (10 kept), a log line every step and no evaluation (each
    overridable)."""
    data = dataclasses.replace(
        tiny_kwargs(tiny_data)["data"],
        mixture_or_task=mixture_or_task,
        langs=tuple(langs),
        prepared_dir=os.fspath(prepared_dir),
    )
    settings = dict(
        data=data,
        checkpoint=CheckpointConfig(period=2, keep_last=10),
        mesh=MeshConfig(num_devices=1),
        evaluation=EvalConfig(tasks=(), period=0),
        loop=LoopConfig(log_every=1),
    )
    return tiny_kwargs(tiny_data, **{**settings, **overrides})
