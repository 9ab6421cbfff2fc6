"""Refusals leave nothing and record nothing.

An amended resume records its amendment (run.json's fingerprint and `amendments`,
`config.<step>.gin`) only at its first checkpoint: refused on damaged prepared data, or diverged
at once, it leaves run.json and config.gin byte-identical, and the original settings resume. A
bit-flipped prepared shard is refused while the run plans: a fresh start leaves no MODEL_DIR, a
resume leaves its run directory unchanged. `sweep status` shows a MODEL_DIR that holds only a
refused attempt as pending.

One prepared `lm_en` and one run stopped (with a checkpoint) at step 2 serve every test; each
test resumes its own copy of that run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from launch_fakes import MANIFEST
from prepared_runs import prepare_train_splits, prepared_kwargs, tiny_registration

from launch import status, sweep
from pipelines.prepared import shards
from rundir import names
from trainer import divergence, validation
from trainer import train as train_lib
from trainer.loop import LoopConfig
from trainer.schedules import ScheduleConfig

STEPS = 4
CONSTANT = ScheduleConfig(name="constant", peak=3e-3)


@pytest.fixture(scope="module")
def prepared(tiny_data, seqio_state, tmp_path_factory):
    """`lm_en` prepared from the tiny corpora (2 shards)."""
    out = tmp_path_factory.mktemp("prepared")
    with seqio_state.kept():
        tiny_registration(tiny_data).register()
        return prepare_train_splits(out, ["lm_en"])


def _kwargs(tiny_data, prepared_dir, **overrides):
    return prepared_kwargs(
        tiny_data,
        prepared_dir,
        mixture_or_task="lm_en",
        langs=("en",),
        **{"train_steps": STEPS, "schedule": CONSTANT, **overrides},
    )


@pytest.fixture(scope="module")
def stopped(tiny_data, prepared, tmp_path_factory, seqio_state):
    """A run stopped at step 2 (checkpoint 2 committed) of 4."""
    saved = seqio_state.snapshot()
    model_dir = tmp_path_factory.mktemp("stopped") / "run"
    try:
        result = train_lib.train(
            model_dir=model_dir,
            **_kwargs(tiny_data, prepared, loop=LoopConfig(log_every=1, stop_after=2)),
        )
    finally:
        seqio_state.restore(saved)
    assert result.step == 2 and not result.completed
    return model_dir


@pytest.fixture
def run_copy(stopped, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(stopped, model_dir)
    return model_dir


def tree(model_dir: Path) -> dict[str, bytes | None]:
    """Every path under `model_dir` and the bytes of its files (directories: None)."""
    return {
        os.fspath(p.relative_to(model_dir)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(model_dir.rglob("*"))
    }


def run_files(model_dir: Path) -> tuple[bytes, bytes]:
    return (model_dir / names.RUN_FILE).read_bytes(), (model_dir / names.CONFIG_FILE).read_bytes()


def _shard(prepared: Path) -> Path:
    return sorted((prepared / "lm_en").glob("*.array_record*"))[0]


@pytest.mark.slow
def test_an_amended_resume_refused_on_damaged_data_records_nothing(
    tiny_data, prepared, run_copy, seqio_state
):
    manifest = prepared / "lm_en" / "manifest.json"
    intact = manifest.read_bytes()
    content = json.loads(intact)
    # Damaged token counts: another content digest (what RESUME_POLICY would let through) and
    # a manifest the sidecars disagree with.
    tokens = content["shards"][0]["tokens"]
    tokens["targets"] += 1
    before = tree(run_copy)
    saved = seqio_state.snapshot()
    try:
        manifest.write_text(json.dumps(content))
        with pytest.raises(validation.ConfigError) as refused:
            train_lib.train(
                model_dir=run_copy,
                **_kwargs(tiny_data, prepared, resume_policy="data.prepared_manifests"),
            )
        assert "PREPARED_DATA" in str(refused.value) and "tokens" in str(refused.value)
        assert tree(run_copy) == before  # nothing written, not even TensorBoard's events
        manifest.write_bytes(intact)
        result = train_lib.train(model_dir=run_copy, **_kwargs(tiny_data, prepared))
    finally:
        manifest.write_bytes(intact)
        seqio_state.restore(saved)
    assert result.completed and result.step == STEPS
    info = json.loads((run_copy / names.RUN_FILE).read_text())
    assert "amendments" not in info


@pytest.mark.slow
def test_an_amended_resume_that_diverges_at_once_records_nothing(
    tiny_data, prepared, run_copy, seqio_state
):
    before = run_files(run_copy)
    saved = seqio_state.snapshot()
    try:
        with pytest.raises(divergence.NonFiniteError):
            train_lib.train(
                model_dir=run_copy,
                **_kwargs(
                    tiny_data,
                    prepared,
                    schedule=ScheduleConfig(name="constant", peak=3.4e38),
                    resume_policy="schedule",
                ),
            )
        assert run_files(run_copy) == before
        assert not list(run_copy.glob("config.*.gin"))
        # The original settings resume: the amendment was never recorded.
        result = train_lib.train(model_dir=run_copy, **_kwargs(tiny_data, prepared))
    finally:
        seqio_state.restore(saved)
    assert result.completed and result.step == STEPS


@pytest.mark.slow
def test_an_amendment_is_recorded_at_the_first_checkpoint(
    tiny_data, prepared, run_copy, seqio_state
):
    old_config = (run_copy / names.CONFIG_FILE).read_bytes()
    saved = seqio_state.snapshot()
    try:
        result = train_lib.train(
            model_dir=run_copy,
            **_kwargs(tiny_data, prepared, train_steps=6, resume_policy="train_steps"),
            gin_config="# amended\n",
        )
    finally:
        seqio_state.restore(saved)
    assert result.completed and result.step == 6
    info = json.loads((run_copy / names.RUN_FILE).read_text())
    assert [a["step"] for a in info["amendments"]] == [2]
    assert info["fingerprint"]["train_steps"] == 6
    assert (run_copy / names.amended_config_file(2)).read_bytes() == old_config
    assert (run_copy / names.CONFIG_FILE).read_text() == "# amended\n"


def test_a_bit_flipped_shard_is_refused_before_anything_is_written(
    tiny_data, prepared, run_copy, tmp_path, seqio_state
):
    shard = _shard(prepared)
    intact = shard.read_bytes()
    flipped = bytearray(intact)
    flipped[int(len(flipped) * 0.3)] ^= 0x01  # in a record's bytes: only the sha256 tells
    before = tree(run_copy)
    fresh = tmp_path / "fresh"
    saved = seqio_state.snapshot()
    try:
        shard.write_bytes(bytes(flipped))
        with shards.PreparedDataset.open(prepared / "lm_en"):  # sizes and counts still agree
            pass
        for model_dir in (fresh, run_copy):
            with pytest.raises(validation.ConfigError) as refused:
                train_lib.train(model_dir=model_dir, **_kwargs(tiny_data, prepared))
            assert "sha256" in str(refused.value) and shard.name in str(refused.value)
    finally:
        shard.write_bytes(intact)
        seqio_state.restore(saved)
    assert not fresh.exists()
    assert tree(run_copy) == before


@pytest.mark.slow
def test_a_fresh_start_refused_after_its_plan_leaves_no_model_dir(
    tiny_data, prepared, tmp_path, seqio_state
):
    # A feature length the prepared documents cannot be cut to is refused by the input stream,
    # after compiling: the start removes what it created.
    model_dir = tmp_path / "fresh"
    saved = seqio_state.snapshot()
    try:
        kwargs = _kwargs(tiny_data, prepared)
        kwargs["data"] = dataclasses.replace(kwargs["data"], subset_examples=10**9)
        with pytest.raises(validation.ConfigError) as refused:
            train_lib.train(model_dir=model_dir, **kwargs)
        assert "subset_examples" in str(refused.value)
    finally:
        seqio_state.restore(saved)
    assert not model_dir.exists()


def test_sweep_status_shows_a_refused_attempt_as_not_started(tmp_path):
    path = tmp_path / "unit.toml"
    path.write_text(MANIFEST)
    runs = sweep.expand(sweep.load_manifest(path, runs_dir=str(tmp_path / "runs")))
    run = runs[0]
    directory = Path(run.model_dir)
    directory.mkdir(parents=True)
    # What a refused attempt used to leave: run files, an empty checkpoints/ and tb/.
    (directory / names.RUN_FILE).write_text("{}")
    (directory / names.CONFIG_FILE).write_text("# refused\n")
    (directory / names.CHECKPOINTS_SUBDIR).mkdir()
    (directory / names.TB_SUBDIR).mkdir()
    (directory / names.TB_SUBDIR / "events.out.tfevents.1").write_bytes(b"")
    later = 10**10
    state = status.run_status(run, now=later)
    assert state.state == "pending" and state.step is None
    assert "refused attempt" in state.message and "\n" not in state.message
    assert status.count_states([state])["interrupted"] == 0
    # A committed step is progress.
    (directory / names.CHECKPOINTS_SUBDIR / "2").mkdir()
    assert status.run_status(run, now=later).state == "interrupted"
