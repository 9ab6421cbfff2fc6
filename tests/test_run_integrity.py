"""A run directory has one writer and is checked on resume.

The lease on `MODEL_DIR` (`rundir.lease`), checkpoint checksums verified on restore
(`rundir.checksums`), the fallback from a corrupt latest step, and the repair of a
torn `metrics.jsonl` tail. The slow test kills the trainer's command line (forked from a
process that imported it once) with SIGKILL while async saves are in flight, ten times, and
checks that the run still completes with intact outputs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fast_compile_flags
from lease_files import lease_holder, write_lease
from tiny_runs import (
    REPO,
    abstract_of,
    prepared_data,
    restore_latest_tiny,
    save_tiny_steps,
    tiny_kwargs,
    tiny_source_argv,
)

from rundir import checksums, names
from rundir import lease as lease_lib
from rundir import records as rundir_records
from trainer import checkpoints, metrics_log
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig, CheckpointStore
from trainer.data import EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig

pytestmark = pytest.mark.usefixtures("compilation_cache")


def test_second_writer_is_refused_naming_the_holder(tiny_data, tmp_path, no_compile):
    other = subprocess.Popen(["sleep", "60"])
    try:
        model_dir = tmp_path / "run"
        path = write_lease(model_dir, lease_holder(other.pid))
        before = path.read_text()
        with pytest.raises(lease_lib.LeaseHeldError) as e:
            train_lib.train(model_dir=model_dir, **tiny_kwargs(tiny_data))
        message = str(e.value)
        assert f"host {socket.gethostname()}, pid {other.pid}, since " in message
        assert os.fspath(model_dir) in message and "Wait for that job" in message
        assert path.read_text() == before  # the holder's lease is untouched
        assert sorted(p.name for p in model_dir.iterdir()) == ["LEASE"]  # nothing else written
    finally:
        other.kill()
        other.wait()
    # Another host's lease with a fresh heartbeat is refused too; with an old one it is stale.
    remote = lease_holder(12345, host="elsewhere.example")
    write_lease(tmp_path / "remote", remote)
    with pytest.raises(lease_lib.LeaseHeldError, match="host elsewhere.example, pid 12345"):
        lease_lib.acquire(tmp_path / "remote")
    config = lease_lib.LeaseConfig(stale_after_s=60)
    write_lease(tmp_path / "remote", {**remote, "heartbeat": time.time() - 120})
    held = lease_lib.acquire(tmp_path / "remote", config=config)
    assert held.took_over["host"] == "elsewhere.example"
    held.release()


def test_stale_lease_is_taken_over_and_refreshed_and_released(tmp_path, caplog):
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = write_lease(tmp_path, lease_holder(dead.pid))
    with caplog.at_level(logging.WARNING, logger="rundir.lease"):
        held = lease_lib.acquire(tmp_path, config=lease_lib.LeaseConfig(heartbeat_s=0.05))
    try:
        assert held.took_over["pid"] == dead.pid
        assert f"pid {dead.pid}" in caplog.text and "no longer runs" in caplog.text
        first = json.loads(path.read_text())
        assert first["pid"] == os.getpid() and first["host"] == socket.gethostname()
        # This process holds it: a second take from the same process is refused.
        with pytest.raises(lease_lib.LeaseHeldError):
            lease_lib.acquire(tmp_path)
        deadline = time.time() + 10
        while json.loads(path.read_text())["heartbeat"] == first["heartbeat"]:
            assert time.time() < deadline, "the heartbeat was never refreshed"
            time.sleep(0.05)
    finally:
        held.release()
    assert not path.exists()


def test_multi_host_lease_outcome_reaches_every_host(tmp_path, monkeypatch):
    """Process 0 takes the lease and broadcasts the outcome (the broadcast is replayed here from
    what process 0 sent); the others raise the same error without touching the directory."""
    from jax.experimental import multihost_utils

    sent = []

    def broadcast(buf):
        if jax.process_index() == 0:
            sent.append(np.array(buf))
        return sent[-1]

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", broadcast)
    write_lease(tmp_path / "run", lease_holder(4242, host="elsewhere.example"))
    for index in (0, 1):
        monkeypatch.setattr(jax, "process_index", lambda index=index: index)
        with pytest.raises(lease_lib.LeaseHeldError, match="host elsewhere.example, pid 4242"):
            lease_lib.acquire(tmp_path / "run")
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    held = lease_lib.acquire(tmp_path / "free")
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    follower = lease_lib.acquire(tmp_path / "free")
    assert follower.path is None and held.path == lease_lib.lease_path(tmp_path / "free")
    follower.release()
    assert held.path.exists()
    held.release()
    assert not lease_lib.lease_path(tmp_path / "free").exists()


def test_unwritable_model_dir_fails_before_compiling(tiny_data, tmp_path, no_compile):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(lease_lib.ModelDirNotWritableError) as e:
        train_lib.train(model_dir=blocker / "run", **tiny_kwargs(tiny_data))
    assert f"MODEL_DIR {blocker / 'run'} is not writable" in str(e.value)
    assert os.fspath(blocker / "run" / "LEASE") in str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_model_dir_fails_before_compiling(tiny_data, tmp_path, no_compile):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    model_dir.chmod(0o555)
    try:
        with pytest.raises(lease_lib.ModelDirNotWritableError) as e:
            train_lib.train(model_dir=model_dir, **tiny_kwargs(tiny_data))
    finally:
        model_dir.chmod(0o755)
    assert f"MODEL_DIR {model_dir} is not writable" in str(e.value)
    assert os.fspath(model_dir / "LEASE") in str(e.value)


def _tiny_store(directory: Path, steps=(1, 2)) -> dict:
    """Saves a small params/opt_state tree at `steps` (each committed with its record)."""
    params = {"w": jnp.arange(24.0).reshape(4, 6), "b": jnp.ones(6)}
    save_tiny_steps(directory, params, steps)
    return params


def _largest_data_file(step_dir: Path, item: str = "params") -> Path:
    """The item's largest array data file (the merged OCDBT data that a restore reads)."""
    files = [p for p in (Path(os.fspath(step_dir)) / item / "d").iterdir() if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def test_bit_flipped_init_checkpoint_is_refused_naming_the_file(
    tiny_data, tmp_path, monkeypatch, seqio_registry
):
    source = tmp_path / "source"
    _tiny_store(checkpoints.checkpoints_dir(source))
    step_dir = checkpoints.checkpoints_dir(source) / "2"
    assert checksums.has_manifest(step_dir)
    checkpoints.check_init_checkpoint(
        os.fspath(source), abstract_params=abstract_of({"b": jnp.ones(6), "w": jnp.ones((4, 6))})
    )  # intact: verifies
    victim = _largest_data_file(step_dir)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x04
    victim.write_bytes(bytes(data))

    compiled = []
    monkeypatch.setattr("trainer.jobs.compile_job", lambda **kw: compiled.append(1))
    kwargs = tiny_kwargs(
        tiny_data,
        run=train_lib.RunInfo(strategy="cpt", target_lang="en", source_lang="en"),
        mesh=MeshConfig(num_devices=1),
    )
    with pytest.raises(checksums.CheckpointCorruptError) as e:
        train_lib.train(model_dir=tmp_path / "cpt", init_checkpoint=os.fspath(source), **kwargs)
    assert f"step 2: file {victim} does not match its SHA-256" in str(e.value)
    assert "INIT_CHECKPOINT" in str(e.value) and not compiled
    assert not lease_lib.lease_path(tmp_path / "cpt").exists()  # released on the exception


def test_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    # (A step without its record is never restored: tests/test_restore_verified.py.)
    directory = tmp_path / "run" / "checkpoints"
    params = _tiny_store(directory)
    victim = _largest_data_file(directory / "2")
    victim.write_bytes(victim.read_bytes()[:7])
    store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
    try:
        with caplog.at_level(logging.WARNING, logger="trainer.checkpoints"):
            step, restored, opt_state, train_state = restore_latest_tiny(store, params)
        assert step == 1 and train_state == {"step": 1}
        np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(params["w"]))
        assert "checkpoint step 2" in caplog.text and "falling back" in caplog.text
        assert os.fspath(victim) in caplog.text
        assert store.all_steps() == [1]  # set aside: re-saved later, never counted by keep_last
        assert [p.name for p in (tmp_path / "run" / checkpoints.SET_ASIDE_SUBDIR).iterdir()] == [
            "2.corrupt"
        ]
    finally:
        store.close()
    # When no step loads, the error lists each one and nothing is moved.
    victim = _largest_data_file(directory / "1")
    victim.write_bytes(victim.read_bytes()[:7])
    store = CheckpointStore(directory, CheckpointConfig(), read_only=True)
    try:
        with pytest.raises(checksums.CheckpointCorruptError, match="step 1"):
            restore_latest_tiny(store, params)
        assert store.all_steps() == [1]
    finally:
        store.close()


@pytest.mark.slow
def test_resume_skips_a_truncated_latest_step_and_a_torn_metrics_line(
    tiny_data, tiny_prepared, tmp_path, caplog
):
    """Through `train` (on prepared data): a run whose latest step (4) was truncated and whose
    metrics end in a torn line resumes from step 2, re-saves step 4 and ends with the same metrics
    as before."""
    kwargs = tiny_kwargs(
        tiny_data,
        data=prepared_data(tiny_data, tiny_prepared),
        train_steps=4,
        checkpoint=CheckpointConfig(period=2, keep_last=10),
        mesh=MeshConfig(num_devices=1),
        evaluation=EvalConfig(),
        loop=LoopConfig(log_every=1),
    )
    model_dir = tmp_path / "run"
    train_lib.train(model_dir=model_dir, **kwargs)
    before = [rundir_records.without_timing(r) for r in rundir_records.read_metrics(model_dir)]
    ckpt_dir = checkpoints.checkpoints_dir(model_dir)
    victim = _largest_data_file(ckpt_dir / "4")
    victim.write_bytes(victim.read_bytes()[:7])
    with (model_dir / names.METRICS_FILE).open("a") as f:
        f.write('{"step": 5, "tok')  # a later job killed mid-write
    with caplog.at_level(logging.WARNING):
        result = train_lib.train(model_dir=model_dir, **kwargs)
    assert result.completed and result.step == 4
    assert f"file {victim} has 7 bytes" in caplog.text and "falling back" in caplog.text
    assert "truncating a torn last line" in caplog.text
    after = [rundir_records.without_timing(r) for r in rundir_records.read_metrics(model_dir)]
    assert [r["step"] for r in after] == [1, 2, 3, 4] and after == before
    assert [p.name for p in (model_dir / checkpoints.SET_ASIDE_SUBDIR).iterdir()] == ["4.corrupt"]
    store = CheckpointStore(ckpt_dir, CheckpointConfig(), read_only=True)
    try:
        assert store.all_steps() == [2, 4] and store.verify(4)
    finally:
        store.close()
    assert not lease_lib.lease_path(model_dir).exists()


def test_torn_metrics_tail_is_truncated_with_a_warning(tmp_path, caplog):
    writer = metrics_log.MetricsWriter(tmp_path, is_chief=True, tensorboard=False)
    for step in (2, 4, 6):
        writer.write({"step": step, "train/loss": 1.0 / step})
    path = tmp_path / names.METRICS_FILE
    with path.open("a") as f:
        f.write('{"step": 8, "train/lo')  # killed mid-write
    with caplog.at_level(logging.WARNING, logger="trainer.metrics_log"):
        assert [r["step"] for r in rundir_records.read_metrics(tmp_path)] == [2, 4, 6]
        writer.truncate_after(4)
    assert f"{path}: truncating a torn last line" in caplog.text
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 4]
    # Damage anywhere else is an error naming the file and the line.
    path.write_text('{"step": 2}\nnot json\n{"step": 6}\n')
    with pytest.raises(
        rundir_records.MetricsFileError, match=f"{path}: line 2 is not a JSON record"
    ):
        writer.truncate_after(6)
    with pytest.raises(rundir_records.MetricsFileError, match="line 2"):
        rundir_records.read_metrics(tmp_path)


def _argv(model_dir, tiny_data, *, steps, prepared):
    return tiny_source_argv(
        model_dir,
        tiny_data,
        prepared=prepared,
        TRAIN_STEPS=steps,
        CHECKPOINT_PERIOD=1,
        EVAL_TASKS="[]",
        LOG_EVERY=1,
    )


# A fork server: imports the trainer, its prepared-data reader and what its TensorBoard writer
# imports once (most of a launch's CPU is imports; the runs read prepared data), then for each JSON
# line `[log path, argv]` on stdin forks a child that runs `python -m trainer.train argv` with
# stderr in the log, prints the child's pid, waits for it and prints its exit status. A child is
# the same command line as a fresh process from the first line of `trainer.train.main` on, and
# SIGKILL ends it just as abruptly.
FORK_SERVER = """
import json, os, shutil, sys, tempfile
import trainer.train
import trainer.prepared_data
from trainer import event_files
tb = tempfile.mkdtemp()
event_files.scalar_writer(tb).close()
shutil.rmtree(tb)
print("ready", flush=True)
for line in sys.stdin:
    log_path, argv = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        try:
            code = trainer.train.main(argv)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    print(pid, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def _in_flight(checkpoints_dir: Path) -> bool:
    return checkpoints_dir.is_dir() and any("tmp" in p.name for p in checkpoints_dir.iterdir())


@pytest.mark.slow
def test_kill_9_loop_during_async_saves_keeps_the_run_intact(tiny_data, tiny_prepared, tmp_path):
    model_dir = tmp_path / "killed"
    ckpt_dir = checkpoints.checkpoints_dir(model_dir)
    steps, kills, killed_pids = 60, 10, []
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=fast_compile_flags()
    )
    env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(REPO), env.get("PYTHONPATH", "")])
    server = subprocess.Popen(
        [sys.executable, "-c", FORK_SERVER],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    logs = []
    try:
        assert server.stdout.readline().strip() == "ready"
        for attempt in range(kills + 1):
            log_path = tmp_path / f"attempt_{attempt}.log"
            logs.append(log_path)
            argv = _argv(model_dir, tiny_data, steps=steps, prepared=tiny_prepared)
            server.stdin.write(json.dumps([os.fspath(log_path), argv]) + "\n")
            server.stdin.flush()
            pid = int(server.stdout.readline())
            if attempt == kills:
                assert int(server.stdout.readline()) == 0, log_path.read_text()[-3000:]
                break
            start = len(rundir_records.read_metrics(model_dir))
            deadline = time.time() + 120
            # Kill once training is under way and an async save is in flight.
            while time.time() < deadline:
                if len(rundir_records.read_metrics(model_dir)) >= start + 2 and _in_flight(
                    ckpt_dir
                ):
                    break
                time.sleep(0.002)
            assert Path(f"/proc/{pid}").exists(), log_path.read_text()[-3000:]  # still running
            os.kill(pid, signal.SIGKILL)
            code = int(server.stdout.readline())
            assert code == -signal.SIGKILL, (code, log_path.read_text()[-3000:])
            killed_pids.append(pid)
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    # Each restart took over the lease of the process killed before it; every step a kill left
    # was committed with its integrity record: none is found without one.
    for pid, log_path in zip(killed_pids, logs[1:], strict=True):
        text = log_path.read_text()
        assert "taking over the stale lease" in text and f"pid {pid}" in text, text[-2000:]
        assert "no integrity record" not in text, text[-2000:]
    assert not (model_dir / checkpoints.SET_ASIDE_SUBDIR).exists()
    assert not lease_lib.lease_path(model_dir).exists()
    assert json.loads((model_dir / "COMPLETED").read_text())["step"] == steps
    records = rundir_records.read_metrics(model_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # one row each, no repeats
    tokens = [r["tokens"] for r in records]
    assert all(b > a for a, b in zip(tokens, tokens[1:], strict=False))
    store = CheckpointStore(ckpt_dir, CheckpointConfig(), read_only=True)
    try:
        for step in store.all_steps():
            assert store.verify(step) > 0  # raises for a step without its record
    finally:
        store.close()
