"""The tiny trainer runs the trainer tests share: `tiny_kwargs`, the arguments of a 12-step run
of `llama2_tiny` on the UDHR fixture corpora, and `tiny_train`, the same run's command line;
`tiny_source_argv`, the flags of `experiments/tiny.gin`'s source run; `started_from`, a job
started from another run's checkpoint; and checkpoint stores of hand-saved tiny steps
(`save_tiny_steps`, `restore_latest_tiny`) for the checkpoint integrity tests.

A test whose subject is not seqio's data path passes `prepared=` (the `tiny_prepared` fixture's
directory) to `tiny_train` or `tiny_source_argv`, or reads `prepared_data(...)` in process: the
run then reads the same tasks as prepared data (`PREPARED_DATA`), and a trainer subprocess
imports no TensorFlow and builds no tf.data pipeline (seconds of CPU each)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from trainer import model_spec
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig, CheckpointStore
from trainer.data import DataConfig, EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

REPO = Path(__file__).resolve().parent.parent
TRAIN_STEPS = 12


def tiny_kwargs(tiny_data, **overrides):
    """Arguments of a 12-step run of `llama2_tiny` on English (overridable); model and lengths
    as in `experiments/tiny.gin`."""
    kwargs = dict(
        model=model_spec.ModelSpec(
            size="llama2_tiny", overrides={"vocab_size": 512, "max_len": 128}
        ),
        data=DataConfig(
            mixture_or_task="lm_en",
            task_feature_lengths={"targets": 64},
            batch_size=8,
            vocab_path=tiny_data["vocab"],
            corpora_dir=tiny_data["corpora"],
            langs=("en", "fr"),
        ),
        train_steps=TRAIN_STEPS,
        schedule=ScheduleConfig(peak=3e-3),
        checkpoint=CheckpointConfig(period=4, keep_last=10),
        mesh=MeshConfig(data=2, fsdp=2, model=2),
        evaluation=EvalConfig(tasks=("lm_en",), period=6, max_tokens=1024),
        run=train_lib.RunInfo(strategy="source", source_lang="en"),
        loop=LoopConfig(log_every=2),
        seed=0,
    )
    kwargs.update(overrides)
    return kwargs


def prepared_flag(prepared) -> str:
    """The flag that makes a tiny command line read `prepared` (a directory of prepared tasks,
    the `tiny_prepared` fixture's) instead of building seqio's pipelines."""
    return f"--gin.PREPARED_DATA='{os.fspath(prepared)}'"


def prepared_data(tiny_data, prepared, **overrides) -> DataConfig:
    """`tiny_kwargs`' data (with `overrides`) read from `prepared` (`DataConfig.prepared_dir`):
    the in-process form of `prepared_flag`."""
    return dataclasses.replace(
        tiny_kwargs(tiny_data)["data"], prepared_dir=os.fspath(prepared), **overrides
    )


def abstract_of(tree):
    """`tree`'s arrays as `jax.ShapeDtypeStruct`s (shape and dtype): what a checkpoint store
    restores into."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def save_tiny_steps(directory: Path, params, steps=(1, 2)) -> None:
    """Saves each of `steps` in a trainer's checkpoint store at `directory` (every step, 10 kept),
    each committed with its integrity record: `params` times the step, the optimizer state
    `{"m": 3 floats of the step}` and the train state `{"step": step}`. A store without a
    training run, for the tests that damage its files."""
    store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
    try:
        for step in steps:
            store.save(
                step,
                params=jax.tree.map(lambda x, s=step: x * s, params),
                opt_state={"m": jnp.full(3, float(step))},
                train_state={"step": step},
            )
    finally:
        store.close()


def restore_latest_tiny(store, params):
    """`store.restore_latest_intact` of a store of `save_tiny_steps` steps of `params`' shapes:
    `(step, params, opt_state, train_state)` of the latest step that loads."""
    return store.restore_latest_intact(
        abstract_params=abstract_of(params),
        abstract_opt_state={"m": jax.ShapeDtypeStruct((3,), jnp.float32)},
    )


def started_from(job, source_dir: Path, step: int, *, store_dir: Path, seed: int):
    """`(state, saved, init, reference)`: what `start_state.initial_state` gives `job` started
    (not resumed) from step `step` of the run in `source_dir`, with a new store in `store_dir`,
    and the parameters that checkpoint holds (restored in `job`'s shapes), to compare them with:
    the check of an initialisation from another run's checkpoint, in both families' tests."""
    from trainer import checkpoints, start_state

    store = checkpoints.CheckpointStore(store_dir, CheckpointConfig())
    state, saved, init = start_state.initial_state(
        job, store, resume=False, init_checkpoint=f"{source_dir}@{step}", seed=seed
    )
    store.close()
    source_store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(source_dir), CheckpointConfig(), read_only=True
    )
    reference = source_store.restore_params(
        step, abstract_params=job.abstract_state_with_shardings().params
    )
    source_store.close()
    return state, saved, init, reference


def tiny_source_argv(model_dir, tiny_data, *, prepared=None, **macros) -> list[str]:
    """The flags of the tiny source run of `experiments/tiny.gin` in `model_dir`, on the fixture
    corpora (for `xlscale train` or `python -m trainer.train`), read from `prepared` when given
    (`prepared_flag`), then `--gin.K=V` for each of `macros` in order: the command line the
    subprocess tests vary by their own settings."""
    return [
        "--gin_file=experiments/cpt_source_en.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        *([prepared_flag(prepared)] if prepared is not None else []),
        *(f"--gin.{name}={value}" for name, value in macros.items()),
    ]


def t5_pretrain_data(tiny_data, lengths, **overrides) -> DataConfig:
    """The data of a tiny T5 pretraining on the fixture corpora: span corruption of English 50 /
    French 50 (`mix_en_50_fr_50`) at `lengths`, 8 rows a batch, T5's 100 sentinel ids, and
    `overrides` (a `prepared_dir`, say), for the encoder-decoder trainer tests."""
    return DataConfig(
        mixture_or_task="mix_en_50_fr_50",
        task_feature_lengths=lengths,
        batch_size=8,
        vocab_path=tiny_data["vocab"],
        corpora_dir=tiny_data["corpora"],
        extra_ids=100,
        **overrides,
    )


def tiny_train(tiny_data, model_dir, *extra, prepared=None):
    """`xlscale train`'s arguments for the tiny source run in `model_dir`, read from `prepared`
    when given (`prepared_flag`), then `extra`."""
    return [
        "train",
        "--gin_file=experiments/cpt_source_en.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        *([prepared_flag(prepared)] if prepared is not None else []),
        *extra,
    ]
