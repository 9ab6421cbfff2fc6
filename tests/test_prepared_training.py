"""The trainer on prepared data (`PREPARED_DATA`): a replay mixture prepared once by
`xlscale data prepare` and read by index trains, stops and resumes to the records of the
uninterrupted run; the run's fingerprint records which prepared data it read, and a resume on
other prepared data, or prepared data from another vocabulary, is refused before training."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
from prepared_runs import prepare_train_splits, prepared_kwargs
from tiny_runs import t5_pretrain_data

from pipelines.prepared import prepare as prepare_lib
from rundir import records as rundir_records
from trainer import model_spec, validation
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import DataConfig, EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

STEPS = 8
MIXTURE = "cpt_fr_replay_en_20"  # 80% French, 20% English replay (token fractions)


@pytest.fixture(scope="module")
def prepared(tiny_data, seqio_state, tmp_path_factory):
    """`lm_fr` and `lm_en` prepared from the tiny corpora (2 shards each)."""
    saved = seqio_state.snapshot()
    out = tmp_path_factory.mktemp("prepared")
    registration = prepare_lib.Registration(
        vocab_path=tiny_data["vocab"], corpora_dir=tiny_data["corpora"]
    )
    registration.register()
    try:
        return prepare_train_splits(out, ("lm_fr", "lm_en"))
    finally:
        seqio_state.restore(saved)


def STOP_AT(step):  # noqa: N802 -- reads as a constant at the call
    """Logging every step, stopping (with a checkpoint) after `step`."""
    return LoopConfig(log_every=1, stop_after=step)


def _kwargs(tiny_data, prepared_dir, **overrides):
    replay = train_lib.RunInfo(
        strategy="cpt_replay", source_lang="en", target_lang="fr", replay_ratio=0.2
    )
    return prepared_kwargs(
        tiny_data,
        prepared_dir,
        mixture_or_task=MIXTURE,
        langs=("en", "fr"),
        **{"train_steps": STEPS, "run": replay, **overrides},
    )


@pytest.mark.slow
def test_a_run_on_prepared_data_resumes_to_the_uninterrupted_records(
    tiny_data, prepared, tmp_path, seqio_state
):
    saved = seqio_state.snapshot()
    try:
        full = train_lib.train(model_dir=tmp_path / "full", **_kwargs(tiny_data, prepared))
        train_lib.train(
            model_dir=tmp_path / "resumed", **_kwargs(tiny_data, prepared, loop=STOP_AT(4))
        )
        resumed = train_lib.train(model_dir=tmp_path / "resumed", **_kwargs(tiny_data, prepared))
    finally:
        seqio_state.restore(saved)
    assert full.completed and resumed.completed
    records = rundir_records.read_metrics(tmp_path / "full")
    again = rundir_records.read_metrics(tmp_path / "resumed")
    assert [rundir_records.without_timing(r) for r in again] == [
        rundir_records.without_timing(r) for r in records
    ]
    losses = [r["train/loss"] for r in records]
    assert losses[-1] < losses[0], losses
    # The replay share, counted by the trainer from the batches' task ids: 20% of tokens.
    by_task = records[-1]["tokens_by_task"]
    assert by_task["lm_en"] / sum(by_task.values()) == pytest.approx(0.2, abs=0.03), by_task
    fingerprint = json.loads((tmp_path / "full" / "run.json").read_text())["fingerprint"]
    assert fingerprint["data"]["prepared_dir"] == os.fspath(prepared)
    assert set(fingerprint["data"]["prepared_manifests"]) == {"lm_fr", "lm_en"}


@pytest.mark.slow
def test_a_resume_on_other_prepared_data_is_refused(tiny_data, prepared, tmp_path, seqio_state):
    other = tmp_path / "other"
    shutil.copytree(prepared, other)
    manifest = other / "lm_en" / "manifest.json"
    content = json.loads(manifest.read_text())
    # Other content (the recorded preprocessing differs); the time alone would not count.
    content["preprocessors"]["precache"] = [*content["preprocessors"]["precache"], "another"]
    manifest.write_text(json.dumps(content))
    saved = seqio_state.snapshot()
    try:
        train_lib.train(
            model_dir=tmp_path / "run",
            **_kwargs(tiny_data, prepared, train_steps=4, loop=STOP_AT(2)),
        )
        with pytest.raises(validation.ConfigError) as refused:
            train_lib.train(
                model_dir=tmp_path / "run",
                **_kwargs(
                    tiny_data,
                    prepared,
                    train_steps=4,
                    data=dataclasses.replace(
                        _kwargs(tiny_data, prepared)["data"], prepared_dir=os.fspath(other)
                    ),
                ),
            )
    finally:
        seqio_state.restore(saved)
    assert "data.prepared_manifests" in str(refused.value), refused.value
    assert "data.prepared_dir" in str(refused.value)


def test_prepared_data_of_another_vocabulary_is_refused_before_training(
    tiny_data, prepared, tmp_path, seqio_state
):
    from sentencepiece import sentencepiece_model_pb2

    # The same pieces with another training setting: a model file of another digest.
    proto = sentencepiece_model_pb2.ModelProto()
    with open(tiny_data["vocab"], "rb") as f:
        proto.ParseFromString(f.read())
    proto.trainer_spec.seed_sentencepiece_size += 1
    foreign = tmp_path / "foreign.model"
    foreign.write_bytes(proto.SerializeToString())
    saved = seqio_state.snapshot()
    try:
        kwargs = _kwargs(tiny_data, prepared)
        kwargs["data"] = dataclasses.replace(kwargs["data"], vocab_path=os.fspath(foreign))
        with pytest.raises(validation.ConfigError) as refused:
            train_lib.train(model_dir=tmp_path / "run", **kwargs)
    finally:
        seqio_state.restore(saved)
    message = str(refused.value)
    assert "PREPARED_DATA" in message and "vocabulary" in message, message
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_t5_pretrains_on_prepared_span_corruption_and_finetunes_on_prepared_pairs(
    tiny_data, tmp_path, seqio_state
):
    # The encoder-decoder kinds: span corruption (en 50 / fr 50 at token ratios) and a finetuning
    # set of exactly 12 translation pairs (the MT paper's Df / 512 pairs), both read by index.
    from trainer.optimizers import adafactor_defaults

    saved = seqio_state.snapshot()
    out = tmp_path / "prepared"
    registration = prepare_lib.Registration(
        vocab_path=tiny_data["vocab"], corpora_dir=tiny_data["corpora"], extra_ids=100
    )
    lengths = {"inputs": 64, "targets": 32}
    t5 = model_spec.ModelSpec(family="t5", size="t5_tiny", overrides={"vocab_size": 512})
    common = dict(
        model=t5,
        optimizer=adafactor_defaults(),
        schedule=ScheduleConfig(name="constant", peak=1e-3),
        checkpoint=CheckpointConfig(period=4, keep_last=1),
        mesh=MeshConfig(num_devices=1),
        evaluation=EvalConfig(tasks=(), period=0),
        loop=LoopConfig(log_every=1),
        seed=0,
    )
    try:
        registration.register()
        prepare_train_splits(out, ("span_en", "span_fr", "mt_en_fr"))
        data = t5_pretrain_data(tiny_data, lengths, prepared_dir=os.fspath(out))
        pretrained = train_lib.train(
            model_dir=tmp_path / "pretrain",
            data=data,
            train_steps=4,
            run=train_lib.RunInfo(strategy="pretrain"),
            **common,
        )
        finetuned = train_lib.train(
            model_dir=tmp_path / "finetune",
            data=dataclasses.replace(
                data, mixture_or_task="mt_en_fr", subset_examples=12, pairs=None
            ),
            train_steps=3,
            run=train_lib.RunInfo(strategy="finetune"),
            init_checkpoint=os.fspath(tmp_path / "pretrain"),
            **common,
        )
    finally:
        seqio_state.restore(saved)
    assert pretrained.completed and finetuned.completed
    records = rundir_records.read_metrics(tmp_path / "pretrain")
    by_task = records[-1]["tokens_by_task"]
    assert set(by_task) == {"span_en", "span_fr"}
    assert by_task["span_en"] / sum(by_task.values()) == pytest.approx(0.5, abs=0.1), by_task
    tuned = rundir_records.read_metrics(tmp_path / "finetune")
    assert all(np.isfinite(r["train/loss"]) for r in tuned), tuned


# One host's reading (`_read_as_host`) in a process of its own.
_HOST_SCRIPT = (
    "import json, sys; sys.path.insert(0, sys.argv[2]); "
    "from test_prepared_training import _read_as_host; "
    "print(json.dumps(_read_as_host(json.loads(sys.argv[1]))))"
)


@pytest.mark.slow
def test_two_processes_read_the_one_process_batches_each_only_its_rows(
    tiny_data, prepared, seqio_state
):
    # Two real processes (hosts 0 and 1 of 2, started side by side) read a replay mixture by
    # index from step 1,000: their rows together are the batches one process reads, and each
    # reads fewer documents than the one process.
    import subprocess
    import sys

    def args(index: int, hosts: int) -> dict:
        return dict(
            vocab=tiny_data["vocab"],
            corpora=tiny_data["corpora"],
            prepared=os.fspath(prepared),
            mixture=MIXTURE,
            start=1000,
            steps=4,
            host=index,
            hosts=hosts,
        )

    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _HOST_SCRIPT, json.dumps(args(i, 2)), os.path.dirname(__file__)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    saved = seqio_state.snapshot()
    try:  # the one-process reading, here meanwhile
        one = _read_as_host(args(0, 1))
    finally:
        seqio_state.restore(saved)
    hosts = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        hosts.append(json.loads(out.strip().splitlines()[-1]))
    first, second = hosts
    # Per step, host 0 holds rows 0-3 and host 1 rows 4-7 of the global batch.
    merged = []
    for step in range(4):
        merged += first["rows"][4 * step : 4 * step + 4] + second["rows"][4 * step : 4 * step + 4]
    assert merged == one["rows"]
    assert first["reads"] < one["reads"] and second["reads"] < one["reads"], (first, second, one)


def _read_as_host(args: dict) -> dict:
    """What `_HOST_SCRIPT` prints, computed in this process."""
    from pipelines import mixtures
    from trainer import data as data_lib

    prepare_lib.Registration(vocab_path=args["vocab"], corpora_dir=args["corpora"]).register()
    mixtures.register_mixtures()
    config = DataConfig(
        mixture_or_task=args["mixture"],
        task_feature_lengths={"targets": 64},
        batch_size=8,
        vocab_path=args["vocab"],
        corpora_dir=args["corpora"],
        prepared_dir=args["prepared"],
    )
    datasets = data_lib.prepared_datasets(config, vocab_hash=None)
    stream = data_lib.train_batches(
        config,
        seed=0,
        start_step=args["start"],
        shard_index=args["host"],
        num_shards=args["hosts"],
        prepared=datasets,
    )
    rows = []
    for _ in range(args["steps"]):
        batch = next(stream)
        rows += [
            b"".join(batch[k][r].tobytes() for k in sorted(batch)).hex()
            for r in range(len(batch["decoder_target_tokens"]))
        ]
    return {"rows": rows, "reads": sum(ds.reads for ds in datasets.values())}


def test_another_host_count_resumes_implicitly_on_prepared_data(tmp_path):
    from trainer import fingerprint

    stored = {"data": {"prepared_dir": "/p", "host_sharding": "per_host"}, "process_count": 1}
    moved = {**stored, "process_count": 2}
    amendment = fingerprint.check_resume(stored=stored, new=moved, policy=None, model_dir=tmp_path)
    assert amendment is not None  # recorded, not refused
    seqio_path = {"data": {"prepared_dir": None, "host_sharding": "per_host"}, "process_count": 1}
    with pytest.raises(validation.ConfigError, match="process_count"):
        fingerprint.check_resume(
            stored=seqio_path,
            new={**seqio_path, "process_count": 2},
            policy=None,
            model_dir=tmp_path,
        )


def test_the_digest_is_of_the_content_not_of_when_or_where_it_was_made(prepared, tmp_path):
    """Re-preparing the same data, or mounting it elsewhere, keeps the resume identity; a sample
    (max_documents) or another shard does not."""
    from pipelines.prepared.manifest import Manifest

    made = Manifest.from_json((prepared / "lm_en" / "manifest.json").read_text())
    same = dataclasses.replace(
        made,
        created="2030-01-01T00:00:00Z",
        source={"repr": "elsewhere", "files": []},
        vocab_path="/mnt/other/spm.model",
    )
    assert same.content_digest() == made.content_digest()
    assert dataclasses.replace(made, max_documents=3).content_digest() != made.content_digest()
    shard = dataclasses.replace(made.shards[0], sha256="0" * 64)
    other = dataclasses.replace(made, shards=(shard, *made.shards[1:]))
    assert other.content_digest() != made.content_digest()


def test_a_prepared_validation_split_is_not_training_data(
    tiny_data, prepared, tmp_path, seqio_state
):
    """A directory holding another split (or task) than training reads is refused before
    training, naming PREPARED_DATA, what it holds and the prepare command."""
    other = tmp_path / "prepared"
    shutil.copytree(prepared, other)
    manifest = other / "lm_en" / "manifest.json"
    content = json.loads(manifest.read_text())
    content["split"] = "validation"
    manifest.write_text(json.dumps(content))
    saved = seqio_state.snapshot()
    try:
        with pytest.raises(validation.ConfigError) as refused:
            train_lib.train(model_dir=tmp_path / "run", **_kwargs(tiny_data, other))
    finally:
        seqio_state.restore(saved)
    text = str(refused.value)
    assert "PREPARED_DATA" in text and "split 'validation'" in text and "split 'train'" in text
    assert "xlscale data prepare --task lm_en --vocab " in text
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_settings_prepared_input_cannot_follow_are_refused():
    """pack=False or shuffle=False would be recorded but not followed by the prepared reader."""
    with pytest.raises(validation.ConfigError, match=r"pack=False with PREPARED_DATA.*allowed"):
        DataConfig(mixture_or_task="lm_en", prepared_dir="/data/prepared", pack=False)
    with pytest.raises(validation.ConfigError, match=r"shuffle=False with PREPARED_DATA"):
        DataConfig(mixture_or_task="lm_en", prepared_dir="/data/prepared", shuffle=False)
    assert not DataConfig(mixture_or_task="lm_en", pack=False).pack  # the seqio path: allowed
