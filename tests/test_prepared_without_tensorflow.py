"""A run on prepared data (`PREPARED_DATA`, with its eval task's validation split prepared)
trains and evaluates in a process where TensorFlow, tensorflow_text and seqio cannot be imported
(an import blocker installed before anything else, as on an accelerator image that ships JAX
alone), and its eval loss of the initial parameters equals the seqio path's. Its TensorBoard
event files are written without TensorFlow (`trainer.event_files`) and read like clu's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prepared_runs import prepare_splits, prepare_train_splits, tiny_registration

from fitting.readers import event_files
from rundir import names
from rundir import records as rundir_records
from trainer import model_spec
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import DataConfig, EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig

BLOCKED = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "seqio")
STEPS = 3
EVAL_TOKENS = 1024

# The child: refuses the blocked packages (and their submodules) before anything is imported,
# then trains the run described by the JSON file named on its command line.
CHILD = textwrap.dedent(
    """
    import importlib.abc, json, sys

    BLOCKED = {blocked!r}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked: a run on prepared data imports no TF")
            return None

    sys.meta_path.insert(0, Blocker())

    from trainer import model_spec
    from trainer import train as train_lib
    from trainer.checkpoints import CheckpointConfig
    from trainer.data import DataConfig, EvalConfig
    from trainer.loop import LoopConfig
    from trainer.partitioning import MeshConfig

    spec = json.load(open(sys.argv[1]))
    data = spec["data"]
    data["task_feature_lengths"] = dict(data["task_feature_lengths"])
    result = train_lib.train(
        model_dir=spec["model_dir"],
        model=model_spec.ModelSpec(**spec["model"]),
        data=DataConfig(**data),
        evaluation=EvalConfig(**spec["evaluation"]),
        train_steps=spec["train_steps"],
        checkpoint=CheckpointConfig(period=spec["train_steps"], keep_last=2),
        mesh=MeshConfig(num_devices=1),
        loop=LoopConfig(log_every=1),
        run=train_lib.RunInfo(strategy="source", source_lang="en"),
        seed=0,
    )
    assert result.completed
    loaded = sorted(m for m in BLOCKED if m in sys.modules)
    assert not loaded, loaded
    print("TRAINED WITHOUT", ",".join(BLOCKED))
    """
).format(blocked=BLOCKED)

MODEL = {"size": "llama2_tiny", "overrides": {"vocab_size": 512, "max_len": 128}}
EVALUATION = {"tasks": ["lm_en"], "period": STEPS, "max_tokens": EVAL_TOKENS, "at_start": True}


def _data(tiny_data, prepared_dir):
    return {
        "mixture_or_task": "lm_en",
        "task_feature_lengths": {"targets": 64},
        "batch_size": 8,
        "vocab_path": tiny_data["vocab"],
        "corpora_dir": tiny_data["corpora"],
        "langs": ["en", "fr"],
        "prepared_dir": prepared_dir,
    }


@pytest.fixture(scope="module")
def prepared(tiny_data, seqio_state, tmp_path_factory):
    """`lm_en` prepared from the tiny corpora: its train split (2 shards) and its validation
    split (one shard)."""
    out = tmp_path_factory.mktemp("prepared_no_tf")
    with seqio_state.kept():
        tiny_registration(tiny_data).register()
        prepare_train_splits(out, ("lm_en",))
        return prepare_splits(out, ("lm_en",), split="validation", num_shards=1)


def _eval_losses(model_dir: Path) -> dict[int, tuple[float, int]]:
    """`{step: (eval loss, eval tokens)}` of `lm_en` in the run's metrics."""
    return {
        r["step"]: (r["eval/lm_en/loss"], r["eval/lm_en/tokens"])
        for r in rundir_records.read_metrics(model_dir)
        if "eval/lm_en/loss" in r
    }


@pytest.mark.slow
def test_a_prepared_run_trains_and_evaluates_without_tensorflow_or_seqio(
    tiny_data, prepared, tmp_path, seqio_state
):
    spec = {
        "model_dir": os.fspath(tmp_path / "prepared_run"),
        "model": MODEL,
        "data": _data(tiny_data, os.fspath(prepared)),
        "evaluation": EVALUATION,
        "train_steps": STEPS,
    }
    spec_file = tmp_path / "run.json"
    spec_file.write_text(json.dumps(spec))
    child = subprocess.run(
        [sys.executable, "-c", CHILD, os.fspath(spec_file)],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert child.returncode == 0, child.stderr[-4000:]
    assert "TRAINED WITHOUT" in child.stdout
    prepared_losses = _eval_losses(tmp_path / "prepared_run")
    assert sorted(prepared_losses) == [0, STEPS]
    # Its TensorBoard events hold the same records, read as the fit's fallback reads them.
    events = event_files.read_tensorboard(tmp_path / "prepared_run" / names.TB_SUBDIR)
    assert dict(events["eval/lm_en/loss"])[0] == pytest.approx(prepared_losses[0][0], rel=1e-6)
    assert [step for step, _ in events["train/loss"]] == list(range(1, STEPS + 1))

    # The seqio path, same model and seed: the initial parameters' eval loss is the same.
    saved = seqio_state.snapshot()
    try:
        train_lib.train(
            model_dir=tmp_path / "seqio_run",
            model=model_spec.ModelSpec(**MODEL),
            data=DataConfig(**{**_data(tiny_data, None), "langs": ("en", "fr")}),
            evaluation=EvalConfig(**{**EVALUATION, "tasks": ("lm_en",), "period": 1}),
            train_steps=1,
            checkpoint=CheckpointConfig(period=1, keep_last=2),
            mesh=MeshConfig(num_devices=1),
            loop=LoopConfig(log_every=1),
            run=train_lib.RunInfo(strategy="source", source_lang="en"),
            seed=0,
        )
    finally:
        seqio_state.restore(saved)
    seqio_losses = _eval_losses(tmp_path / "seqio_run")
    (prepared_loss, prepared_tokens), (seqio_loss, seqio_tokens) = (
        prepared_losses[0],
        seqio_losses[0],
    )
    assert prepared_tokens == seqio_tokens > 0
    assert prepared_loss == pytest.approx(seqio_loss, rel=1e-6, abs=1e-6)
