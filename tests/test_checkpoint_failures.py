"""Checkpoint failures, each injected at a chosen point (never by racing the clock), end with a
true and short report, and leave nothing behind that the next start misreads.

- A failure after an asynchronous save committed names that step as the last complete one (a
  rerun resumes there), and a failed save names its own step, not the one of the save that
  noticed it.
- A disk filling during orbax's commit (ENOSPC injected into the commit; a real 1 MB tmpfs where
  the tests run as root) ends the run with the storage exit code and at most 5 lines beside
  the progress lines: no orbax ERROR record, no traceback, no TensorFlow line on the terminal.
  Orbax's records go to the third-party log.
- A kill during the keep policy's deletion of an old step leaves `<step>.deleting`, which the next
  start removes with one line, never setting it aside as a step "written by older code".
  The steps set aside so far are listed each time a writer opens the checkpoints.

The trainer runs as a subprocess with its fault installed by `tests/inject_faults.py`, on prepared
data (`tiny_prepared`: no TensorFlow imported), except one disk-filling case on the seqio path,
whose TensorFlow start-up lines must stay off the terminal too.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from conftest import fast_compile_flags
from tiny_runs import tiny_source_argv

from pipelines import native_logs
from rundir import checksums, exits, local_files, names, records, storage
from trainer import checkpoints, orbax_logs, step_deletion
from trainer.checkpoints import CheckpointConfig, CheckpointStore

REPO = Path(__file__).resolve().parent.parent
INJECT = Path(__file__).resolve().parent / "inject_faults.py"
STORAGE = exits.CLASSES["storage"].code
STEPS = 30
# A progress or start-up record of the trainer: every other terminal line counts as the failure's.
PROGRESS = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO ")
MAX_FAILURE_LINES = 5
OLDER_CODE = "older code"


def _save(store: CheckpointStore, step: int) -> None:
    store.save(
        step,
        params={"w": jnp.full(3, float(step))},
        opt_state={"m": jnp.zeros(2)},
        train_state={"step": step},
    )


def _entries(directory) -> list[str]:
    return sorted(p.name for p in storage.as_path(directory).iterdir())


# --------------------------------------------------------------------------- in-process


def test_a_failed_save_names_its_own_step_and_the_last_committed_one(tmp_path, monkeypatch):
    # The record of step 2 cannot be written inside its commit (a full disk there): the save of
    # step 3 notices it, and the error names step 2; step 1 is the last committed.
    real = local_files.staged

    def staged(target, data):
        path = Path(target)
        if path.name == checksums.MANIFEST_FILE and path.parent.name.startswith("2."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), target)
        return real(target, data)

    monkeypatch.setattr(local_files, "staged", staged)
    store = CheckpointStore(tmp_path, CheckpointConfig(period=1, keep_last=5))
    _save(store, 1)
    store.wait()
    _save(store, 2)
    with pytest.raises(storage.StorageError, match=r"disk full: .*/2\.") as failed:
        _save(store, 3)
    assert os.fspath(tmp_path / "3") not in str(failed.value)
    assert store.last_committed(wait=True) == 1
    monkeypatch.setattr(local_files, "staged", real)
    _save(store, 3)  # the store goes on: the save in flight is the new one
    assert store.last_committed(wait=True) == 3
    assert store.all_steps() == [1, 3]
    store.close()


def test_the_keep_policy_deletes_a_step_under_its_deleting_name(tmp_path, monkeypatch):
    deleted = []
    real = ocp.path.deleter.PathDeleter.delete

    def delete(self, path, **kwargs):
        deleted.append(Path(os.fspath(path)).name)
        return real(self, path, **kwargs)

    monkeypatch.setattr(ocp.path.deleter.PathDeleter, "delete", delete)
    store = CheckpointStore(tmp_path, CheckpointConfig(period=1, keep_last=1))
    for step in (1, 2, 3):
        _save(store, step)
    store.close()
    assert deleted == ["1.deleting", "2.deleting"]
    assert _entries(tmp_path) == ["3"]


def _cut_short(step_dir: Path) -> None:
    """What a kill during a deletion leaves: the record and half the other files gone."""
    (step_dir / checksums.MANIFEST_FILE).unlink()
    files = sorted(p for p in step_dir.rglob("*") if p.is_file())
    for file in files[: len(files) // 2]:
        file.unlink()


def test_a_deletion_cut_short_is_finished_by_the_next_writer(tmp_path, caplog):
    directory = tmp_path / names.CHECKPOINTS_SUBDIR
    store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=5))
    for step in (1, 2, 3):
        _save(store, step)
    store.close()
    # Local disk: step 1 was renamed, then half deleted. Object storage's form: a marker beside
    # what is left of step 2.
    os.replace(directory / "1", directory / step_deletion.deleting_name(1))
    _cut_short(directory / step_deletion.deleting_name(1))
    _cut_short(directory / "2")
    (directory / step_deletion.deleting_name(2)).write_text("")
    # A reader sees only the steps that are whole.
    reader = CheckpointStore(directory, CheckpointConfig(), read_only=True)
    assert reader.latest_step() == 3
    reader.close()
    with caplog.at_level(logging.INFO):
        store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=5))
    assert store.all_steps() == [3]
    assert store.last_committed(wait=True) == 3
    store.close()
    assert _entries(directory) == ["3"]
    assert not (tmp_path / names.SET_ASIDE_SUBDIR).exists()
    messages = [r.getMessage() for r in caplog.records]
    for step in (1, 2):
        assert any(
            m.startswith(f"checkpoint step {step}: its deletion (keep policy) was cut short")
            for m in messages
        ), messages
    assert not any(OLDER_CODE in m or "set aside" in m for m in messages), messages


def test_a_writer_lists_the_steps_set_aside(tmp_path, caplog):
    directory = tmp_path / names.CHECKPOINTS_SUBDIR
    for name in ("20.corrupt", "10.unverified"):
        (tmp_path / names.SET_ASIDE_SUBDIR / name).mkdir(parents=True)
    with caplog.at_level(logging.INFO):
        CheckpointStore(directory, CheckpointConfig()).close()
    listed = [r.getMessage() for r in caplog.records if "set aside in" in r.getMessage()]
    assert len(listed) == 1 and listed[0].endswith(": 10.unverified, 20.corrupt"), listed


def test_orbax_error_records_go_to_the_third_party_log_only(tmp_path, monkeypatch):
    third_party = tmp_path / "third_party.log"
    monkeypatch.setenv(native_logs.THIRD_PARTY_LOG_ENV, os.fspath(third_party))
    keeps = orbax_logs.OrbaxErrors()

    def record(level: int, pathname: str) -> logging.LogRecord:
        return logging.LogRecord("absl", level, pathname, 1, "save failed", None, None)

    in_orbax = os.path.join(os.path.dirname(ocp.__file__), "checkpoint_manager.py")
    assert not keeps.filter(record(logging.ERROR, in_orbax))
    assert "ERROR save failed [absl]" in third_party.read_text()
    assert keeps.filter(record(logging.WARNING, in_orbax))  # below ERROR: as before
    assert keeps.filter(record(logging.ERROR, __file__))  # not orbax's: as before


@pytest.mark.slow
def test_object_storage_deletions_are_marked_and_finished(gcs_bucket):
    directory = storage.as_path(f"{gcs_bucket}/run/{names.CHECKPOINTS_SUBDIR}")
    store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=1))
    for step in (1, 2):
        _save(store, step)
    store.close()
    assert _entries(directory) == ["2"]  # step 1 deleted, its marker too
    # A kill after the marker was written: the next writer removes the step and the marker.
    storage.write_bytes(directory / step_deletion.deleting_name(2), b"")
    assert step_deletion.finish_interrupted(directory) == [2]
    assert storage.list_files(directory) == []  # neither the step nor its marker


# --------------------------------------------------------------------------- subprocesses


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    """One compilation cache for this module's runs (the same tiny program each time)."""
    return tmp_path_factory.mktemp("xla")


def _argv(model_dir, tiny_data, prepared=None, **macros) -> list[str]:
    """A tiny source run of 30 steps, saved every 10, a record every 5, no evaluation; read from
    `prepared` when given, else through seqio."""
    settings = dict(TRAIN_STEPS=STEPS, CHECKPOINT_PERIOD=10, LOG_EVERY=5, EVAL_TASKS="[]")
    argv = tiny_source_argv(model_dir, tiny_data, prepared=prepared, **settings)
    return argv + [f"--gin.{k}={v}" for k, v in macros.items()]


def _env(cache: Path, **extra) -> dict[str, str]:
    """The environment a user's run has (TensorFlow's own log level not lowered), on the CPU."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", exits.DEBUG_ENV)
    }
    env.pop(native_logs.THIRD_PARTY_LOG_ENV, None)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=fast_compile_flags(), **extra)
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(REPO), env.get("PYTHONPATH", "")])
    env["JAX_COMPILATION_CACHE_DIR"] = os.fspath(cache)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    return env


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Runs `command`; its exit code and what it printed (stdout and stderr, as a terminal shows
    them)."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout


def _inject(fault: str, entry: str, args: list[str], cwd: Path, env) -> tuple[int, str]:
    return _run([sys.executable, os.fspath(INJECT), fault, entry, *args], cwd, env)


def _failure_lines(text: str) -> list[str]:
    """The terminal lines other than the trainer's progress and start-up records."""
    return [line for line in text.splitlines() if line.strip() and not PROGRESS.match(line)]


def _report(text: str, prog: str) -> list[str]:
    """The failure's lines, checked: the report is all of them, at most 5, nothing of orbax."""
    lines = _failure_lines(text)
    assert lines and lines[0].startswith(f"{prog}: storage disk full: "), text[-4000:]
    assert len(lines) <= MAX_FAILURE_LINES, text[-4000:]
    assert "Traceback" not in text and " ERROR " not in text and "ERROR:" not in text, text
    return lines


@pytest.mark.slow
def test_a_failure_after_a_committed_save_names_that_step(
    tiny_data, tiny_prepared, tmp_path, xla_cache
):
    # The metrics record of step 15 cannot be written, once step 10 committed.
    model_dir = tmp_path / "run"
    code, text = _inject(
        "metrics_full@15",
        "trainer.train",
        _argv(model_dir, tiny_data, tiny_prepared),
        tmp_path,
        _env(xla_cache),
    )
    assert code == STORAGE, text[-4000:]
    lines = _report(text, "python -m trainer.train")
    assert lines[2].startswith("  last complete checkpoint: step 10 ("), lines
    assert checksums.has_manifest(model_dir / names.CHECKPOINTS_SUBDIR / "10")


@pytest.mark.slow
@pytest.mark.parametrize(
    "failed, last, seqio",
    [
        # the first save: nothing complete, noticed by the save of step 20; on the seqio path,
        # whose TensorFlow start-up lines go to the third-party log, not the terminal
        (10, None, True),
        (20, 10, False),  # noticed by the save of step 30
        (30, 20, False),  # the last save: noticed when the run waits for it
    ],
)
def test_a_disk_filling_during_a_commit_ends_in_a_few_lines(
    tiny_data, tiny_prepared, tmp_path, xla_cache, failed, last, seqio
):
    model_dir = tmp_path / "run"
    third_party = tmp_path / "third_party.log"
    code, text = _inject(
        f"record_full@{failed}",
        "xlscale",
        ["train", *_argv(model_dir, tiny_data, None if seqio else tiny_prepared)],
        tmp_path,
        _env(xla_cache, **{native_logs.THIRD_PARTY_LOG_ENV: os.fspath(third_party)}),
    )
    assert code == STORAGE, text[-4000:]
    lines = _report(text, "xlscale train")
    print("\n".join(lines))
    assert f"{names.CHECKPOINTS_SUBDIR}/{failed}." in lines[0], lines  # the failed save's step
    where = "no checkpoint was complete yet" if last is None else f"checkpoint: step {last} ("
    assert where in lines[2], lines
    assert lines[-1].startswith("  to resume once it is fixed: xlscale train "), lines
    assert "Failed to run" in third_party.read_text()  # orbax's records: kept, elsewhere
    assert not records.read_completed(model_dir)


@pytest.fixture
def small_disk(tmpfs):
    """A 16 MiB tmpfs mounted for the test (it runs as root in CI), unmounted afterwards."""
    return tmpfs(16)


def _leave_free(directory: Path, free: int) -> None:
    """Takes all but `free` bytes of `directory`'s filesystem with one file."""
    stat = os.statvfs(directory)
    ballast = directory / f"ballast-{uuid.uuid4().hex[:6]}"
    with open(ballast, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, stat.f_bavail * stat.f_frsize - free)


@pytest.mark.slow
def test_a_real_disk_filling_during_a_commit_ends_in_a_few_lines(
    small_disk, tiny_data, tiny_prepared, tmp_path, xla_cache
):
    # 1 MB free at the start: step 10 (about 0.7 MB) commits, step 20 fills the disk in its
    # commit, wherever TensorStore, orbax or TensorBoard happen to be writing then.
    _leave_free(small_disk, 1 << 20)
    model_dir = small_disk / "run"
    code, text = _run(
        [
            sys.executable,
            "-m",
            "xlscale_cli.main",
            "train",
            *_argv(model_dir, tiny_data, tiny_prepared),
        ],
        tmp_path,
        _env(xla_cache),
    )
    assert code == STORAGE, text[-4000:]
    lines = _report(text, "xlscale train")
    print("\n".join(lines))
    # The step named is the one committed on the disk (what a rerun resumes from).
    assert checkpoints.committed_step(model_dir) == 10
    assert lines[2].startswith("  last complete checkpoint: step 10 ("), lines


@pytest.mark.slow
def test_a_kill_during_a_deletion_is_finished_at_the_next_start(
    tiny_data, tiny_prepared, tmp_path, xla_cache
):
    # KEEP_LAST=1: once step 20 committed, step 10 is deleted, and the kill comes half-way.
    model_dir = tmp_path / "run"
    argv = _argv(model_dir, tiny_data, tiny_prepared, KEEP_LAST=1)
    checkpoints = model_dir / names.CHECKPOINTS_SUBDIR
    code, text = _inject("kill_deleting", "trainer.train", argv, tmp_path, _env(xla_cache))
    assert code == -9, text[-4000:]
    assert _entries(checkpoints) == ["10.deleting", "20"], text[-4000:]
    code, text = _run([sys.executable, "-m", "trainer.train", *argv], tmp_path, _env(xla_cache))
    assert code == 0, text[-4000:]
    finished = [line for line in text.splitlines() if "its deletion (keep policy)" in line]
    assert len(finished) == 1 and "checkpoint step 10: " in finished[0], text
    assert OLDER_CODE not in text and "set aside" not in text, text
    assert "resuming from step 20" in text
    assert _entries(checkpoints) == [str(STEPS)]
    assert not (model_dir / names.SET_ASIDE_SUBDIR).exists()
    assert records.read_completed(model_dir)["step"] == STEPS
