"""Every restore is verified: a checkpoint is complete only with its integrity
record, written inside orbax's commit, and a step without one is never restored blind.

- A process killed (SIGKILL, a real one) right after writing a step's record but before orbax's
  rename never committed that step; one killed right after the rename left it with its record.
- A step committed without its record (older code hashed after the commit; the record deleted
  here stands for a kill in between) is set aside as `unverified`: the resume falls back to the
  newest recorded step, or starts fresh, and ends bitwise equal to an uninterrupted run.
- A record that cannot be written fails the save: the step never commits.
- A foreign `INIT_CHECKPOINT` without a record is refused in two lines naming the step and the
  command that records it (`xlscale convert record`), and accepted once recorded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from resume_runs import STEPS, base_kwargs
from tiny_runs import REPO

from convert import init_checkpoints
from rundir import checksums, exits, names, storage
from rundir import records as rundir_records
from trainer import checkpoints
from trainer import restore as restore_lib
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig, CheckpointStore
from xlscale_cli import main as cli_main

pytestmark = pytest.mark.usefixtures("compilation_cache")

UNVERIFIED = "no checksums"  # what an unverified restore used to log; never again


def _ckpt(model_dir: Path) -> Path:
    """The run's checkpoints directory as a local path (rglob works on it)."""
    return Path(os.fspath(checkpoints.checkpoints_dir(model_dir)))


def _params_hash(model_dir: Path, step: int) -> str:
    directory = checkpoints.checkpoints_dir(model_dir)
    return init_checkpoints.params_hash(init_checkpoints.read_params(directory, step))


def _top_files(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.iterdir() if p.name != names.LEASE_FILE)


def _equals_reference(model_dir: Path, reference: Path) -> None:
    """Same metrics (line for line), COMPLETED, run record and final parameters, bit for bit."""
    got, want = rundir_records.read_metrics(model_dir), rundir_records.read_metrics(reference)
    assert len(got) == len(want) == STEPS // 2
    assert [rundir_records.without_timing(r) for r in got] == [
        rundir_records.without_timing(r) for r in want
    ]
    assert rundir_records.read_completed(model_dir) == rundir_records.read_completed(reference)
    assert rundir_records.read_run_json(model_dir) == rundir_records.read_run_json(reference)
    assert _params_hash(model_dir, STEPS) == _params_hash(reference, STEPS)
    store = CheckpointStore(_ckpt(model_dir), CheckpointConfig(), read_only=True)
    try:
        assert store.all_steps() == [2, STEPS]
        assert all(store.verify(step) > 0 for step in store.all_steps())
    finally:
        store.close()


def _drop_records(model_dir: Path, steps) -> None:
    for step in steps:
        (_ckpt(model_dir) / str(step) / checksums.MANIFEST_FILE).unlink()


@pytest.mark.slow
def test_every_step_of_a_run_is_committed_with_its_record(finished):  # noqa: F811
    for step in (2, STEPS):
        step_dir = _ckpt(finished) / str(step)
        record = json.loads((step_dir / checksums.MANIFEST_FILE).read_text())["files"]
        # Every data file is listed; only orbax's commit marker and timestamp are not.
        on_disk = {
            p.relative_to(step_dir).as_posix()
            for p in step_dir.rglob("*")
            if p.is_file() and p.name != checksums.MANIFEST_FILE
        }
        assert set(record) == on_disk - set(init_checkpoints.COMMIT_FILES)
        assert any(name.startswith("params/") for name in record)
        assert any(name.startswith("opt_state/") for name in record)
    assert checkpoints.committed_step(finished) == STEPS


@pytest.mark.slow
@pytest.mark.parametrize(
    "dropped, resumed",
    [
        ([STEPS], 2),  # the newest step: the resume falls back to the one before
        ([2, STEPS], None),  # every step: a fresh start, as if killed before the first one
    ],
)
def test_steps_without_their_record_are_set_aside_and_the_run_equals_an_uninterrupted_one(
    finished,  # noqa: F811
    tiny_data,
    seqio_registry,
    tmp_path,
    caplog,
    dropped,
    resumed,
):
    model_dir = tmp_path / "run"
    shutil.copytree(finished, model_dir)
    _drop_records(model_dir, dropped)  # killed between the commit and the record (older code)
    assert checkpoints.committed_step(model_dir) == resumed  # the one resume rule agrees
    with caplog.at_level(logging.INFO):
        result = train_lib.train(model_dir=model_dir, **base_kwargs(tiny_data))
    assert result.completed and result.step == STEPS
    restored = [line for line in caplog.messages if line.startswith("restored checkpoint")]
    assert restored == ([f"restored checkpoint step {resumed} (verified)"] if resumed else [])
    assert UNVERIFIED not in caplog.text
    for step in dropped:
        assert f"checkpoint step {step} set aside (unverified)" in caplog.text
    assert sorted(p.name for p in (model_dir / checkpoints.SET_ASIDE_SUBDIR).iterdir()) == [
        f"{step}.unverified" for step in dropped
    ]
    # Nothing else was written or recorded: the same files as the uninterrupted run, no amendment.
    assert _top_files(model_dir) == sorted([*_top_files(finished), checkpoints.SET_ASIDE_SUBDIR])
    _equals_reference(model_dir, finished)


# A child that saves steps 1, 2, 3 and kills itself (SIGKILL) during step 2's commit: right after
# its record is written into the temporary directory ("record"), or right after orbax's rename
# ("rename").
KILLED_SAVER = """
import asyncio, os, signal, sys
import jax.numpy as jnp
import orbax.checkpoint as ocp
from convert import init_checkpoints
from trainer.checkpoints import CheckpointConfig, CheckpointStore

directory, where = sys.argv[1], sys.argv[2]
kill = lambda: os.kill(os.getpid(), signal.SIGKILL)
if where == "record":
    record = init_checkpoints.RecordOnCommit.__call__
    def hooked(self):
        step = self._step
        record(self)
        if step == 2:
            kill()
    init_checkpoints.RecordOnCommit.__call__ = hooked
else:
    rename = ocp.path.atomicity.AtomicRenameTemporaryPath.finalize
    async def hooked(self):
        await rename(self)
        if self.get_final().name == "2":
            kill()
    ocp.path.atomicity.AtomicRenameTemporaryPath.finalize = hooked
store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
for step in (1, 2, 3):
    store.save(step, params={"w": jnp.full(4, float(step))}, opt_state={"m": jnp.zeros(2)},
               train_state={"step": step})
store.close()
print("not killed")
"""


def _abstract():
    return (
        {"w": jax.ShapeDtypeStruct((4,), jnp.float32)},
        {"m": jax.ShapeDtypeStruct((2,), jnp.float32)},
    )


@pytest.mark.slow
@pytest.mark.parametrize("where, resumed", [("record", 1), ("rename", 2)])
def test_a_kill_during_the_commit_leaves_only_recorded_steps(tmp_path, caplog, where, resumed):
    model_dir = tmp_path / "run"
    directory = _ckpt(model_dir)
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(REPO), env.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, "-c", KILLED_SAVER, os.fspath(directory), where],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert child.stdout == "" and "Traceback" not in child.stderr
    committed = sorted(p.name for p in directory.iterdir() if p.name.isdigit())
    assert committed == [str(s) for s in range(1, resumed + 1)]
    if where == "record":  # the record was in the step's files before the commit
        assert (
            directory / f"2{ocp.path.atomicity_types.TMP_DIR_SUFFIX}" / "xlscale_checksums.json"
        ).is_file()
    assert checkpoints.committed_step(model_dir) == resumed
    with caplog.at_level(logging.INFO, logger="trainer.checkpoints"):
        store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
        try:
            step, params, _, train_state = store.restore_latest_intact(
                abstract_params=_abstract()[0], abstract_opt_state=_abstract()[1]
            )
        finally:
            store.close()
    assert step == resumed and train_state == {"step": resumed}
    np.testing.assert_array_equal(np.asarray(params["w"]), np.full(4, float(resumed)))
    assert f"restored checkpoint step {resumed} (verified)" in caplog.text
    assert "set aside" not in caplog.text and UNVERIFIED not in caplog.text
    assert not (model_dir / checkpoints.SET_ASIDE_SUBDIR).exists()


def test_a_record_that_cannot_be_written_fails_the_save_and_the_step_never_commits(
    tmp_path, monkeypatch, caplog
):
    # A real failed write of step 2's record: its path is taken by a directory just before it is
    # written (a full disk is tests/test_storage_failures.py's; any failure acts the same).
    directory = tmp_path / "run" / checkpoints.CHECKPOINTS_SUBDIR
    write = checksums.write_manifest

    def taken_at_step_2(step_dir, **kwargs):
        if storage.as_path(step_dir).name.startswith("2"):
            (Path(os.fspath(step_dir)) / checksums.MANIFEST_FILE).mkdir()
        return write(step_dir, **kwargs)

    monkeypatch.setattr(checksums, "write_manifest", taken_at_step_2)
    params = {"w": jnp.full(4, 1.0)}
    store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
    try:
        store.save(1, params=params, opt_state={"m": jnp.zeros(2)}, train_state={"step": 1})
        store.save(2, params=params, opt_state={"m": jnp.zeros(2)}, train_state={"step": 2})
        with pytest.raises(OSError, match=checksums.MANIFEST_FILE):
            store.wait()
    finally:
        store.close()
    assert sorted(p.name for p in directory.iterdir()) == [
        "1",
        f"2{ocp.path.atomicity_types.TMP_DIR_SUFFIX}",  # never committed
    ]
    assert checkpoints.committed_step(tmp_path / "run") == 1
    with caplog.at_level(logging.INFO, logger="trainer.checkpoints"):
        store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
        try:
            assert store.all_steps() == [1]
            step, *_ = store.restore_latest_intact(
                abstract_params=_abstract()[0], abstract_opt_state=_abstract()[1]
            )
        finally:
            store.close()
    assert step == 1 and "restored checkpoint step 1 (verified)" in caplog.text
    assert "set aside" not in caplog.text


def _foreign_checkpoint(directory: Path) -> dict:
    """A params-only step written by plain orbax, as another tool would (no record)."""
    params = {"b": jnp.arange(3.0), "w": jnp.ones((2, 3))}
    manager = ocp.CheckpointManager(
        directory,
        item_handlers={
            "params": ocp.StandardCheckpointHandler(),
            "train_state": ocp.JsonCheckpointHandler(),
        },
    )
    manager.save(
        7,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), train_state=ocp.args.JsonSave({"step": 7})
        ),
    )
    manager.wait_until_finished()
    manager.close()
    return params


def test_a_foreign_init_checkpoint_without_a_record_is_refused_until_recorded(
    tmp_path, capsys, caplog, monkeypatch
):
    directory = tmp_path / "foreign"
    params = _foreign_checkpoint(directory)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    for refuse in (
        lambda: checkpoints.check_init_checkpoint(os.fspath(directory), abstract_params=abstract),
        lambda: restore_lib.restore_params(f"{directory}@7", abstract_params=abstract),
    ):
        with pytest.raises(checksums.CheckpointUnrecordedError) as e:
            refuse()
        lines = exits.brief(exits.message(e.value)).splitlines()
        assert len(lines) == 2 and exits.classify(e.value).name == "contract"
        assert f"step 7 ({directory / '7'}) has no integrity record" in lines[0]
        assert lines[1].endswith(f"xlscale convert record '{directory}@7'")
    assert restore_lib.kept_steps(directory) == []  # not complete: not a kept step
    assert not checksums.has_manifest(directory / "7")  # nothing was written

    assert cli_main.main(["convert", "record", f"{directory}@7"]) == 0
    assert capsys.readouterr().out.startswith(f"recorded {directory}/7;")
    record = (directory / "7" / checksums.MANIFEST_FILE).read_bytes()
    assert cli_main.main(["convert", "record", os.fspath(directory)]) == 0  # kept as it was
    assert (directory / "7" / checksums.MANIFEST_FILE).read_bytes() == record
    with caplog.at_level(logging.INFO, logger="trainer.checkpoints"):
        restored, _, step = checkpoints.restore_init_params(
            os.fspath(directory), abstract_params=abstract
        )
    assert step == 7 and f"restored the parameters of {directory} step 7 (verified)" in caplog.text
    assert init_checkpoints.params_hash(restored) == init_checkpoints.params_hash(params)

    # A step the run's plan already checked is restored without reading the shapes again, and
    # still verified against its record.
    def no_metadata(*args, **kwargs):
        raise AssertionError("the parameters' metadata read again")

    monkeypatch.setattr(CheckpointStore, "params_metadata", no_metadata)
    again, _, _ = checkpoints.restore_init_params(
        f"{directory}@7", abstract_params=abstract, checked=True
    )
    assert init_checkpoints.params_hash(again) == init_checkpoints.params_hash(params)
    with pytest.raises(AssertionError, match="metadata read again"):
        checkpoints.restore_init_params(f"{directory}@7", abstract_params=abstract)
    # A recorded step whose file changed afterwards is refused as corrupt.
    files = [p for p in (directory / "7" / "params").rglob("*") if p.is_file()]
    victim = max(files, key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[:-1])
    with pytest.raises(checksums.CheckpointCorruptError, match=f"file {victim} has"):
        checkpoints.restore_init_params(f"{directory}@7", abstract_params=abstract, checked=True)
    with pytest.raises(checksums.CheckpointCorruptError, match=f"file {victim} has"):
        checkpoints.check_init_checkpoint(os.fspath(directory), abstract_params=abstract)


def test_an_empty_record_verifies_nothing_and_is_refused(tmp_path):
    step_dir = tmp_path / "3"
    step_dir.mkdir()
    with pytest.raises(checksums.CheckpointCorruptError, match="no checkpoint files"):
        checksums.write_manifest(step_dir)
    (step_dir / checksums.MANIFEST_FILE).write_text('{"files": {}}')
    with pytest.raises(checksums.CheckpointCorruptError, match="lists no file"):
        checksums.verify_manifest(step_dir, step=3, source="test")


@pytest.mark.slow
def test_on_gcs_each_step_commits_with_its_record_and_one_without_is_set_aside(gcs_bucket, caplog):
    # On gs:// orbax commits by a marker file, not a rename: the record is written before it.
    model_dir = f"{gcs_bucket}/run"
    directory = checkpoints.checkpoints_dir(model_dir)
    store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
    try:
        for step in (1, 2):
            params = {"w": jnp.full(4, float(step))}
            store.save(step, params=params, opt_state={"m": jnp.zeros(2)}, train_state={})
        store.wait()
        assert store.all_steps() == [1, 2] and all(store.verify(s) > 0 for s in (1, 2))
    finally:
        store.close()
    assert checkpoints.committed_step(model_dir) == 2
    (directory / "2" / checksums.MANIFEST_FILE).unlink()  # as older code killed before hashing
    assert checkpoints.committed_step(model_dir) == 1
    with caplog.at_level(logging.INFO, logger="trainer.checkpoints"):
        store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
        try:
            step, params, *_ = store.restore_latest_intact(
                abstract_params=_abstract()[0], abstract_opt_state=_abstract()[1]
            )
            assert store.all_steps() == [1]
        finally:
            store.close()
    assert step == 1 and np.asarray(params["w"]).tolist() == [1.0] * 4
    assert "restored checkpoint step 1 (verified)" in caplog.text and UNVERIFIED not in caplog.text
    set_aside = storage.as_path(model_dir) / checkpoints.SET_ASIDE_SUBDIR / "2.unverified"
    assert set_aside.is_dir() and not (set_aside / checksums.MANIFEST_FILE).exists()
