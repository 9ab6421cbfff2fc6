"""The tiny trainer runs the trainer tests share: `tiny_kwargs`, the arguments of a 12-step run
of `llama2_tiny` on the UDHR fixture corpora, and `tiny_train`, the same run's command line."""

from __future__ import annotations

from pathlib import Path

from trainer import model_spec
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
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


def tiny_train(tiny_data, model_dir, *extra):
    return [
        "train",
        "--gin_file=experiments/cpt_source_en.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        *extra,
    ]
