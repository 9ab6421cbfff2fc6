"""The local launcher and run states: dependency order, skipping completed runs, resuming
interrupted ones, retries, progress, and the subprocess path with its own log."""

import io
import json
import os
import socket
import sys
import time
import types
from pathlib import Path

import pytest
from launch_fakes import MANIFEST, FakeTrainer, launch, write_metrics

from launch import launchers, status, sweep


@pytest.fixture
def runs(tmp_path):
    path = tmp_path / "unit.toml"
    path.write_text(MANIFEST)
    return sweep.expand(sweep.load_manifest(path, runs_dir=str(tmp_path / "runs")))


def test_runs_complete_in_dependency_order_then_are_skipped(runs):
    trainer = FakeTrainer()
    report, out = launch(runs, trainer)
    assert report.ok and report.completed == [r.run_id for r in runs]
    assert [c[0] for c in trainer.calls] == [r.run_id for r in runs]
    assert f"[sweep {len(runs)}/{len(runs)} done" in out
    assert "ETA" in out
    for run in runs:
        state = status.run_status(run)
        assert (state.state, state.step) == ("done", run.steps)
        record = json.loads((Path(run.model_dir) / status.LAUNCH_FILE).read_text())
        assert record["state"] == "completed" and record["returncode"] == 0
        assert "training" in (Path(run.model_dir) / status.LOG_FILE).read_text()

    again = FakeTrainer()
    report, out = launch(runs, again)
    assert again.calls == [] and report.skipped == [r.run_id for r in runs]
    assert "skip" in out and "(completed)" in out


def test_interrupted_run_fails_blocks_dependents_and_resumes_on_rerun(runs):
    source_a = next(r for r in runs if r.strategy == "source" and r.size == "a")
    dependents = [r.run_id for r in runs if r.depends_on == (source_a.run_id,)]
    assert len(dependents) == 2
    report, out = launch(runs, FakeTrainer(fail_at={source_a.run_id: 3}))
    assert report.failed == [source_a.run_id]
    assert sorted(report.blocked) == sorted(dependents)
    assert "FAILED" in out and "(preempted; checkpoint saved)" in out
    assert "blocked by a failed dependency" in out
    state = status.run_status(source_a, now=time.time() + 3600)
    assert (state.state, state.step) == ("interrupted", 3)  # exit 75: checkpoint saved
    assert state.loss == pytest.approx(10 / 3)
    assert state.evals == (("lm_zh", pytest.approx(1 + 10 / 3)),)
    done_before = {r.run_id for r in runs if status.is_completed(r)}
    assert len(done_before) == len(runs) - 3

    trainer = FakeTrainer()
    report, out = launch(runs, trainer)
    assert report.ok
    assert trainer.calls[0] == (source_a.run_id, 3)  # resumed from its checkpoint
    assert "resuming at step 3" in out
    assert {c[0] for c in trainer.calls} == {source_a.run_id, *dependents}
    assert sorted(report.skipped) == sorted(done_before)
    record = json.loads((Path(source_a.model_dir) / status.LAUNCH_FILE).read_text())
    assert record["attempt"] == 2 and record["state"] == "completed"


def test_retries_restart_a_failed_run_within_one_launch(runs):
    first = runs[0]
    trainer = FakeTrainer(fail_at={first.run_id: 2}, raise_instead=True)
    report, out = launch(runs, trainer, retries=1)
    assert report.ok and report.failed == []
    assert trainer.calls[:2] == [(first.run_id, 0), (first.run_id, 2)]
    assert "(attempt 2)" in out
    log = (Path(first.model_dir) / status.LOG_FILE).read_text()
    assert "RuntimeError: simulated crash" in log and "from step 2" in log


def test_exceptions_are_failures_with_the_traceback_in_the_log(runs):
    def broken(run, log_path):
        raise ValueError("bad config for " + run.run_id)

    report, _ = launch(runs[:1], broken)
    assert report.failed == [runs[0].run_id]
    assert status.run_status(runs[0]).state == "failed"
    log = (Path(runs[0].model_dir) / status.LOG_FILE).read_text()
    assert "ValueError: bad config for" in log


def test_ctrl_c_marks_the_run_interrupted_and_propagates(runs):
    def interrupted(run, log_path):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch(runs[:1], interrupted)
    record = json.loads((Path(runs[0].model_dir) / status.LAUNCH_FILE).read_text())
    assert record["state"] == "interrupted"


def test_dry_run_prints_commands_and_starts_nothing(runs):
    trainer = FakeTrainer()
    stream = io.StringIO()
    report = launchers.LocalLauncher(runner=trainer, python="python").launch(
        runs, dry_run=True, progress=status.Progress(runs, stream=stream)
    )
    assert trainer.calls == [] and len(report.commands) == len(runs)
    assert report.commands[0].startswith("XLSCALE_TEST_ENV=/data/x python -m trainer.train ")
    assert "--gin_file=experiments/cpt_source_en.gin" in report.commands[0]
    assert not Path(runs[0].model_dir).exists()


def test_status_states(runs, tmp_path):
    run = runs[0]
    directory = Path(run.model_dir)
    assert status.run_status(run).state == "pending"
    directory.mkdir(parents=True)
    write_metrics(directory, 2, 1.5)
    assert status.run_status(run).state == "running"  # metrics just written
    later = time.time() + 3600
    assert status.run_status(run, now=later).state == "interrupted"
    record = {"state": "running", "pid": os.getpid(), "host": socket.gethostname()}
    (directory / status.LAUNCH_FILE).write_text(json.dumps(record))
    assert status.run_status(run, now=later).state == "running"  # our live pid
    record["pid"] = 2**22 + 12345  # no such process
    (directory / status.LAUNCH_FILE).write_text(json.dumps(record))
    assert status.run_status(run, now=later).state == "interrupted"
    (directory / "COMPLETED").write_text(json.dumps({"step": 6, "tokens": 10}))
    assert status.run_status(run).state == "done"


def test_last_metrics_reads_the_tail_and_skips_a_partial_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": i, "pad": "x" * 100}) for i in range(2000)]
    path.write_text("\n".join(lines) + '\n{"step": 20')
    assert status.last_metrics(path)["step"] == 1999
    assert status.last_metrics(tmp_path / "missing.jsonl") is None


def test_progress_eta_scales_with_work():
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    clock = Clock()
    small = types.SimpleNamespace(run_id="s", cost=1.0, tokens=1, steps=10)
    big = types.SimpleNamespace(run_id="b", cost=9.0, tokens=1, steps=10)
    progress = status.Progress([small, big], stream=io.StringIO(), clock=clock)
    assert progress.eta() is None
    started = progress.start(small)
    clock.now = 10.0
    progress.finish(small, True, started)
    assert progress.eta() == pytest.approx(90.0)
    assert progress.eta(big, 5) == pytest.approx(45.0)
    progress.start(big, from_step=5)  # a resumed run has only its second half left
    assert progress.eta() == pytest.approx(45.0)
    assert progress.eta(big, 8) == pytest.approx(18.0)
    assert status.format_seconds(3725) == "1h02m" and status.format_seconds(None) == "?"


FAKE_TRAINER_SCRIPT = """\
#!{python}
# Stands in for `python -m trainer.train`: checks its flags and environment, writes outputs.
import json, os, pathlib, sys, time
assert sys.argv[1:3] == ["-m", "trainer.train"], sys.argv
flags = dict(a[len("--gin."):].split("=", 1) for a in sys.argv[3:] if a.startswith("--gin."))
model_dir = pathlib.Path(flags["MODEL_DIR"].strip("'"))
assert os.environ["XLSCALE_TEST_ENV"] == "/data/x"
steps = int(flags["TRAIN_STEPS"])
print("fake trainer", model_dir, flush=True)
for step in range(1, steps + 1):
    with open(model_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({{"step": step, "train/loss": 1.0 / step}}) + "\\n")
    time.sleep(0.05)
if os.environ.get("FAKE_FAIL"):
    sys.exit(3)
(model_dir / "COMPLETED").write_text(json.dumps({{"step": steps}}))
"""


def test_subprocess_jobs_log_to_their_own_file(runs, tmp_path, monkeypatch):
    script = tmp_path / "fake_python"
    script.write_text(FAKE_TRAINER_SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    stream = io.StringIO()
    launcher = launchers.LocalLauncher(python=str(script), poll_s=0.05)
    report = launcher.launch(runs[:2], progress=status.Progress(runs[:2], stream=stream))
    assert report.ok and report.completed == [r.run_id for r in runs[:2]]
    log = (Path(runs[0].model_dir) / status.LOG_FILE).read_text()
    assert log.startswith(f"$ {script} -m trainer.train ") and "fake trainer" in log
    assert "step " in stream.getvalue() and "loss" in stream.getvalue()

    monkeypatch.setenv("FAKE_FAIL", "1")
    report = launcher.launch(runs[2:3], progress=status.Progress(runs[2:3], stream=stream))
    assert report.failed == [runs[2].run_id]
    record = json.loads((Path(runs[2].model_dir) / status.LAUNCH_FILE).read_text())
    assert (record["state"], record["returncode"]) == ("failed", 3)


def test_launcher_registry():
    assert sorted(launchers.LAUNCHERS) == ["local", "slurm", "tpu_vm", "xmanager"]
    for name in launchers.LAUNCHERS:
        assert launchers.get_launcher(name).name == name
    with pytest.raises(ValueError, match="local"):
        launchers.get_launcher("k8s")


def test_manifest_env_reaches_the_job(runs):
    assert runs[0].environment() == {"XLSCALE_TEST_ENV": "/data/x"}


def timed_runner(run, log_path):
    """A module-level (picklable) runner for the worker pool: records when it ran, in which
    process, and that its parent had finished; fails the run whose id has FAIL_ME in its env."""
    model_dir = Path(run.model_dir)
    init = dict(run.bindings).get("INIT_CHECKPOINT")
    parent_done = init is None or (Path(init.strip("'")) / "COMPLETED").exists()
    start = time.time()
    logging_line = f"worker {os.getpid()} training {run.run_id}"
    import logging

    logging.getLogger("trainer").info(logging_line)
    time.sleep(float(os.environ.get("RUN_SECONDS", "0.6")))
    write_metrics(model_dir, run.steps, 1.0)
    (model_dir / "span.json").write_text(
        json.dumps({"start": start, "end": time.time(), "pid": os.getpid(), "parent": parent_done})
    )
    if run.run_id.startswith(os.environ.get("FAIL_PREFIX", "\0")):
        raise RuntimeError("simulated failure in a worker")
    (model_dir / "COMPLETED").write_text(json.dumps({"step": run.steps}))
    return 0


@pytest.mark.slow
def test_parallel_jobs_overlap_in_worker_processes_and_keep_dependency_order(runs):
    stream = io.StringIO()
    launcher = launchers.LocalLauncher(runner=timed_runner, jobs=2, poll_s=0.2)
    report = launcher.launch(runs, progress=status.Progress(runs, stream=stream))
    assert report.ok and sorted(report.completed) == sorted(r.run_id for r in runs)
    spans = {r.run_id: json.loads((Path(r.model_dir) / "span.json").read_text()) for r in runs}
    assert all(s["parent"] for s in spans.values())  # each CPT run started after its source
    by_id = {r.run_id: r for r in runs}
    for run_id, span in spans.items():
        for dep in by_id[run_id].depends_on:
            assert spans[dep]["end"] <= span["start"], (dep, run_id)
    ordered = sorted(spans.values(), key=lambda s: s["start"])
    overlaps = sum(a["end"] > b["start"] for a, b in zip(ordered, ordered[1:], strict=False))
    assert overlaps >= 1, "no two runs ran at the same time"
    assert os.getpid() not in {s["pid"] for s in spans.values()}
    assert len({s["pid"] for s in spans.values()}) <= 2  # the pool's two workers, reused
    # The trainer's log lines went to each run's own train.log, not the terminal.
    log = (Path(runs[0].model_dir) / status.LOG_FILE).read_text()
    assert f"training {runs[0].run_id}" in log
    assert f"[sweep {len(runs)}/{len(runs)} done" in stream.getvalue()

    again = launchers.LocalLauncher(runner=timed_runner, jobs=2).launch(
        runs, progress=status.Progress(runs, stream=io.StringIO())
    )
    assert again.skipped == [r.run_id for r in sweep.topological_order(runs)]


@pytest.mark.slow
def test_parallel_failure_blocks_only_its_dependents(runs, monkeypatch):
    source_a = next(r for r in runs if r.strategy == "source" and r.size == "a")
    monkeypatch.setenv("FAIL_PREFIX", source_a.run_id)
    launcher = launchers.LocalLauncher(runner=timed_runner, jobs=2, poll_s=0.2)
    report = launcher.launch(runs, progress=status.Progress(runs, stream=io.StringIO()))
    dependents = {r.run_id for r in runs if source_a.run_id in r.depends_on}
    assert report.failed == [source_a.run_id]
    assert set(report.blocked) == dependents and dependents
    others = {r.run_id for r in runs} - dependents - {source_a.run_id}
    assert set(report.completed) == others
    log = (Path(source_a.model_dir) / status.LOG_FILE).read_text()
    assert "simulated failure in a worker" in log
    record = json.loads((Path(source_a.model_dir) / status.LAUNCH_FILE).read_text())
    assert (record["state"], record["returncode"]) == ("failed", 1)


def test_parallel_subprocess_jobs(runs, tmp_path):
    script = tmp_path / "fake_python"
    script.write_text(FAKE_TRAINER_SCRIPT.format(python=sys.executable))
    script.chmod(0o755)
    launcher = launchers.LocalLauncher(python=str(script), poll_s=0.05, jobs=3)
    report = launcher.launch(runs, progress=status.Progress(runs, stream=io.StringIO()))
    assert report.ok and sorted(report.completed) == sorted(r.run_id for r in runs)
    with pytest.raises(ValueError, match="jobs"):
        launchers.LocalLauncher(jobs=0)


def test_default_jobs(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLSCALE_JOBS", "3")
    assert launchers.default_jobs() == 3
    monkeypatch.setenv("XLSCALE_JOBS", "two")
    with pytest.raises(ValueError, match="XLSCALE_JOBS"):
        launchers.default_jobs()
    monkeypatch.delenv("XLSCALE_JOBS")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert launchers.default_jobs() == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert launchers.default_jobs() == 2


@pytest.mark.slow
def test_parallel_failure_blocks_a_whole_chain(runs, monkeypatch):
    import dataclasses

    a, b, c = [r for r in runs if not r.depends_on][:3]
    chain = [
        a,
        dataclasses.replace(b, parent=a.run_id),
        dataclasses.replace(c, parent=b.run_id),
    ]
    monkeypatch.setenv("FAIL_PREFIX", a.run_id)
    launcher = launchers.LocalLauncher(runner=timed_runner, jobs=2, poll_s=0.2)
    report = launcher.launch(chain, progress=status.Progress(chain, stream=io.StringIO()))
    assert report.failed == [a.run_id] and report.blocked == [b.run_id, c.run_id]


@pytest.mark.slow
def test_sigterm_stops_a_parallel_launch_and_its_workers(runs, monkeypatch):
    import signal
    import threading

    monkeypatch.setenv("RUN_SECONDS", "30")
    first = [r for r in runs if not r.depends_on][:2]
    launcher = launchers.LocalLauncher(runner=timed_runner, jobs=2, poll_s=0.2)
    timer = threading.Timer(4.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    start = time.time()
    with pytest.raises(KeyboardInterrupt):
        launcher.launch(first, progress=status.Progress(first, stream=io.StringIO()))
    timer.cancel()
    assert time.time() - start < 25  # did not wait for the 30 s runs
    assert signal.getsignal(signal.SIGTERM) is not None  # the launcher restored the handler
    for run in first:
        record = json.loads((Path(run.model_dir) / status.LAUNCH_FILE).read_text())
        assert record["state"] == "interrupted", record
        assert not (Path(run.model_dir) / "COMPLETED").exists()


def test_default_jobs_is_one_on_accelerator_hosts(monkeypatch):
    monkeypatch.delenv("XLSCALE_JOBS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert launchers.default_jobs() == 1
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert launchers.default_jobs() == 2


def test_last_metrics_passes_over_zero_shot_records(tmp_path):
    # `xlscale zeroshot` appends `zeroshot/<task>/...` at a checkpoint's step; status reads the
    # last training record for the step and losses.
    path = tmp_path / "metrics.jsonl"
    records = [
        {"step": 10, "train/loss": 2.5, "tokens": 640},
        {"step": 10, "zeroshot/xl_cont_en/acc_norm": 0.3, "zeroshot/xl_cont_en/n": 100},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert status.last_metrics(path) == records[0]
