"""Vocabulary identity across runs: `run.json` records the vocabulary's hash, and an
`INIT_CHECKPOINT` whose run recorded another vocabulary is refused before anything is compiled or
written (`trainer.plan`); sources that say nothing (older runs, bare checkpoint directories) are
accepted as before.

One module-scoped 2-step source run with the fixture vocabulary; a second, real SentencePiece
vocabulary of the same corpora (other pieces, so other ids) plays the wrong one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pytest
from tiny_runs import tiny_kwargs

from convert import grown_init
from rundir import records
from trainer import plan as plan_lib
from trainer import train as train_lib
from trainer import validation
from trainer.checkpoints import CheckpointConfig
from trainer.data import EvalConfig
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig
from trainer.run_request import RunRequest
from trainer.schedules import ScheduleConfig
from trainer.steps import StepConfig

pytestmark = pytest.mark.usefixtures("compilation_cache")


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def kwargs_of(tiny_data, **overrides):
    """A 2-step single-device constant-LR run, no evaluation."""
    kwargs = tiny_kwargs(
        tiny_data,
        train_steps=2,
        schedule=ScheduleConfig(name="constant", peak=3e-3),
        checkpoint=CheckpointConfig(period=2, keep_last=2),
        mesh=MeshConfig(num_devices=1),
        evaluation=EvalConfig(),
    )
    kwargs.update(overrides)
    return kwargs


def cpt_kwargs(tiny_data, vocab_path):
    """CPT into French from the source run, reading text with `vocab_path`."""
    kwargs = kwargs_of(tiny_data, run=train_lib.RunInfo(strategy="cpt", target_lang="fr"))
    kwargs["data"] = dataclasses.replace(
        kwargs["data"], mixture_or_task="lm_fr", vocab_path=str(vocab_path)
    )
    return kwargs


@pytest.fixture(scope="module")
def source(tiny_data, tmp_path_factory, seqio_state):
    """The finished `kwargs_of` source run (English), once for the module."""
    model_dir = tmp_path_factory.mktemp("init_vocab") / "source"
    with seqio_state.kept():
        result = train_lib.train(model_dir=model_dir, **kwargs_of(tiny_data))
    assert result.completed
    return model_dir


@pytest.mark.slow
def test_run_json_records_the_vocabulary_and_the_param_basis(source, tiny_data):
    info = records.read_run_json(source)
    assert info["vocab_sha256"] == _sha(tiny_data["vocab"]) == info["fingerprint"]["vocab_sha256"]
    assert info["param_basis"] == "non_embedding" == info["fingerprint"]["param_basis"]
    assert records.read_run_record(source).vocab_sha256 == _sha(tiny_data["vocab"])


@pytest.mark.slow
def test_an_init_checkpoint_of_another_vocabulary_is_refused(
    source, tiny_data, other_vocab, seqio_registry, tmp_path
):
    assert _sha(other_vocab) != _sha(tiny_data["vocab"])
    model_dir = tmp_path / "cpt"
    with pytest.raises(validation.ConfigError) as e:
        train_lib.train(
            model_dir=model_dir,
            init_checkpoint=f"{source}@2",
            **cpt_kwargs(tiny_data, other_vocab),
        )
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("INIT_CHECKPOINT (train.init_checkpoint) = '…/init_vocab")
    assert _sha(tiny_data["vocab"])[:12] in message and _sha(other_vocab)[:12] in message
    assert "VOCAB_PATH (data.DataConfig.vocab_path) = '…/other_vocab" in message
    assert "xlscale tokenizer extend" in message and "grow-checkpoint" in message
    assert not model_dir.exists()  # refused before anything was written


def _plan(tiny_data, *, init_checkpoint, vocab_path, model_dir):
    """The plan `train` would build (nothing compiled or written)."""
    return plan_lib.build_run_plan(
        request=RunRequest(
            **{
                "optimizer": OptimizerConfig(),
                "step": StepConfig(),
                **cpt_kwargs(tiny_data, vocab_path),
                "model_dir": model_dir,
                "init_checkpoint": init_checkpoint,
                "gin_config": "",
                "resume_policy": None,
                "param_basis": "non_embedding",
                "tokens_per_param": None,
            }
        )
    )


def test_the_same_contents_at_another_path_are_accepted(
    source, tiny_data, seqio_registry, tmp_path
):
    moved = tmp_path / "moved.model"
    shutil.copyfile(tiny_data["vocab"], moved)
    plan = _plan(
        tiny_data, init_checkpoint=f"{source}/checkpoints@2", vocab_path=moved, model_dir=tmp_path
    )
    assert plan.vocab_hash == _sha(tiny_data["vocab"]) and plan.init_checkpoint.endswith("@2")


def test_a_source_that_records_no_vocabulary_is_accepted(
    source, tiny_data, other_vocab, seqio_registry, tmp_path
):
    older = tmp_path / "older"
    shutil.copytree(source, older)
    info = records.read_run_json(older)
    del info["vocab_sha256"], info["fingerprint"]["vocab_sha256"]
    records.write_run_json(older, info)
    assert plan_lib.init_vocab_sha256(str(older)) is None
    _plan(tiny_data, init_checkpoint=str(older), vocab_path=other_vocab, model_dir=tmp_path / "r")
    (older / "run.json").unlink()  # a bare checkpoint directory: nothing to compare with
    _plan(tiny_data, init_checkpoint=str(older), vocab_path=other_vocab, model_dir=tmp_path / "s")


def test_where_the_source_vocabulary_is_read_from(tmp_path):
    fp_only = tmp_path / "fp_only"
    records.write_run_json(fp_only, {"model": "m", "fingerprint": {"vocab_sha256": "a" * 64}})
    assert plan_lib.init_vocab_sha256(f"{fp_only}@3") == "a" * 64
    assert plan_lib.init_vocab_sha256(f"{fp_only}/checkpoints") == "a" * 64
    grown = tmp_path / "grown"
    record = {"vocab_sha256": "b" * 64, "old_vocab_sha256": "c" * 64}
    records.write_run_json(
        grown, {"kind": grown_init.GROWN_KIND, "model": "m", grown_init.RUN_FIELD: record}
    )
    assert plan_lib.init_vocab_sha256(str(grown)) == "b" * 64  # the vocabulary it was grown to
    assert plan_lib.init_vocab_sha256("hf:/models/llama") is None
    assert plan_lib.init_vocab_sha256(str(tmp_path / "nothing")) is None


def test_the_check_names_both_vocabularies_in_one_line():
    with pytest.raises(validation.ConfigError) as e:
        validation.check_init_vocab(
            init_checkpoint="gs://b/runs/cpt/source-1b@100",
            source_hash="1" * 64,
            vocab_path="/data/vocab/en_zh_fr_ru.model",
            vocab_hash="2" * 64,
        )
    assert str(e.value).startswith(
        "INIT_CHECKPOINT (train.init_checkpoint) = '…/cpt/source-1b@100' was trained on "
        "vocabulary sha256 111111111111, but VOCAB_PATH (data.DataConfig.vocab_path) = "
        "'…/vocab/en_zh_fr_ru.model' is sha256 222222222222"
    )
    validation.check_init_vocab(
        init_checkpoint="x", source_hash="1" * 64, vocab_path="v", vocab_hash="1" * 64
    )
