"""A stop request (`MODEL_DIR/STOP_REQUESTED`, `rundir.stop_request`) on a tiny real run: the
trainer notices it mid-run, saves a checkpoint at that step and stops without COMPLETED; started
again while the request exists it trains nothing; with the request withdrawn it resumes and ends
bit for bit like the same run never stopped."""

from __future__ import annotations

import threading
import time

import pytest
from tiny_runs import prepared_data, tiny_kwargs

from rundir import exits, names, stop_request
from rundir import records as rundir_records
from trainer import checkpoints, stop_requests
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig

pytestmark = pytest.mark.usefixtures("compilation_cache")

STEPS = 120


def _kwargs(tiny_data, prepared):
    # Long enough that a request written at step 3 lands well before the end; one device, no
    # periodic checkpoint or evaluation: the checkpoint of the stopped run is the stop's own. On
    # prepared data: no tf.data pipeline built for each of the four runs.
    return tiny_kwargs(
        tiny_data,
        data=prepared_data(tiny_data, prepared),
        train_steps=STEPS,
        mesh=MeshConfig(num_devices=1),
        checkpoint=CheckpointConfig(period=1000, keep_last=3),
        evaluation=EvalConfig(tasks=("lm_en",), period=60, max_tokens=512),
        loop=LoopConfig(log_every=1),
    )


def _request_at(model_dir, step: int) -> threading.Thread:
    """Writes the stop request as soon as `metrics.jsonl` shows `step`, from another thread (as
    `sweep run --adaptive` does from its own process)."""

    def watch():
        deadline = time.time() + 300
        while time.time() < deadline:
            logged = rundir_records.read_metrics(model_dir) if model_dir.exists() else []
            if logged and logged[-1]["step"] >= step:
                stop_request.request(model_dir, reason="test")
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_stop_request_checkpoints_exits_and_resumes_bitwise(
    tiny_data, tiny_prepared, tmp_path, seqio_state, monkeypatch
):
    monkeypatch.setattr(stop_requests, "POLL_S", 0.0)  # look at every step: the test is short
    saved = seqio_state.snapshot()
    try:
        full = train_lib.train(model_dir=tmp_path / "full", **_kwargs(tiny_data, tiny_prepared))
        model_dir = tmp_path / "stopped"
        watcher = _request_at(model_dir, 3)
        stopped = train_lib.train(model_dir=model_dir, **_kwargs(tiny_data, tiny_prepared))
        watcher.join()
        logged = rundir_records.read_metrics(model_dir)
        store = checkpoints.CheckpointStore(
            checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
        )
        # Stopped where it noticed the request, with that step saved and no COMPLETED.
        assert not stopped.completed and 3 <= stopped.step < STEPS
        assert store.latest_step() == stopped.step == logged[-1]["step"]
        assert not (model_dir / names.COMPLETED_FILE).exists()
        # Started again while the request exists: it builds, compiles and writes nothing.
        before = sorted(p.name for p in model_dir.iterdir())
        with pytest.raises(stop_requests.StopRequested, match="STOP_REQUESTED: stop requested"):
            train_lib.train(model_dir=model_dir, **_kwargs(tiny_data, tiny_prepared))
        assert sorted(p.name for p in model_dir.iterdir()) == before
        assert store.latest_step() == stopped.step
        # The decision reversed: withdraw the request, start again, and it resumes.
        assert stop_request.withdraw(model_dir)
        resumed = train_lib.train(model_dir=model_dir, **_kwargs(tiny_data, tiny_prepared))
    finally:
        seqio_state.restore(saved)
    assert full.completed and resumed.completed and resumed.step == STEPS
    assert (model_dir / names.COMPLETED_FILE).exists()
    expected = [
        rundir_records.without_timing(r) for r in rundir_records.read_metrics(full.model_dir)
    ]
    got = [rundir_records.without_timing(r) for r in rundir_records.read_metrics(model_dir)]
    assert got == expected  # bit-exact: losses, token counts, data order, eval losses


def test_a_job_started_with_a_request_ends_at_once_with_its_exit_code(tiny_data, tmp_path, capsys):
    """What a queued SLURM or xmanager job of a skipped run does: nothing built, compiled or
    written, exit 79 (not requeued), one line saying why."""
    import gin
    from tiny_runs import tiny_train

    from xlscale_cli import main

    model_dir = tmp_path / "skipped"
    stop_request.request(model_dir, reason="SKIP: predicted within 1%")
    gin.clear_config()
    try:
        code = main.main(tiny_train(tiny_data, model_dir))
    finally:
        gin.clear_config()
    assert code == exits.STOPPED
    assert "stop requested (SKIP: predicted within 1%); not started" in capsys.readouterr().err
    assert sorted(p.name for p in model_dir.iterdir()) == [names.STOP_REQUEST_FILE]


def test_a_request_is_written_read_and_withdrawn(tmp_path):
    model_dir = tmp_path / "run"
    assert not stop_request.requested(model_dir) and stop_request.read(model_dir) is None
    stop_request.request(model_dir, reason="SKIP: predicted within 1%", by="test")
    assert stop_request.requested(model_dir)
    assert stop_request.read(model_dir)["reason"] == "SKIP: predicted within 1%"
    assert stop_request.withdraw(model_dir) and not stop_request.requested(model_dir)
    assert not stop_request.withdraw(model_dir)


def test_the_poller_looks_at_most_every_poll_s(tmp_path):
    now = [0.0]
    poller = stop_requests.Poller(tmp_path, every_s=2.0, clock=lambda: now[0])
    assert not poller.poll()  # looked at t=0: nothing
    stop_request.request(tmp_path, reason="test")
    now[0] = 1.0
    assert not poller.poll()  # not looked again before 2 s
    assert poller.requested_now()  # the start-up check looks at once
    now[0] = 2.0
    assert poller.poll() and poller.poll()  # seen: this step and after


@pytest.mark.slow
def test_a_stop_request_stops_every_host_at_one_step(tiny_data, tiny_prepared, tmp_path):
    """A 2-process job (1 CPU device each, on prepared data): process 0 sees the request and
    raises the preemption notice, and JAX's preemption service stops both hosts at the same step,
    exit 79 on each. Each step takes at least a second (`MIN_STEP_SECONDS`): the notice crosses
    to the other host while the job is still training, however fast the machine trains (at
    full speed the 6 steps can end before the hosts agree on a step, and the run completes)."""
    from two_host_runs import STEPS as HOST_STEPS
    from two_host_runs import two_hosts

    model_dir = tmp_path / "two"
    stop_request.request(model_dir, reason="test")
    codes, logs = two_hosts(
        model_dir,
        tiny_data,
        tmp_path,
        name="stop",
        cache=tmp_path / "xla",
        prepared=tiny_prepared,
        pace_s=1.0,
    )
    assert codes == [exits.STOPPED] * 2, [log[-3000:] for log in logs]
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    )
    step = store.latest_step()
    assert step is not None and 1 <= step < HOST_STEPS
    for text in logs:
        assert f"stopping at step {step} (checkpoint saved)" in text
    assert "stop requested" in logs[0]
    assert not (model_dir / names.COMPLETED_FILE).exists()
