"""A run directory on object storage, end to end, against a real GCS API server (fake-gcs-server
on 127.0.0.1, `tests/gcs_server.py`): a tiny source run and a CPT run from it write their whole
run directories to the bucket and nothing locally; the CPT run is killed with SIGKILL and resumes
from the bucket to the same records and parameters as an uninterrupted run; the runs are fitted,
status'd and scored zero-shot from the bucket; a second writer is refused by name; an adaptive
sweep steers TPU VM jobs whose run directories are in the bucket.

The trainer runs as `python -m trainer.train` subprocesses (the real command line) with the
server's environment; the no-egress guard of the fixture covers them too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bucket_runs import (
    REPO,
    STEPS,
    run_argv,
    subprocess_env,
    wait_or_dump_stacks,
)

from rundir import names, records, storage

INJECT = Path(__file__).resolve().parent / "inject_faults.py"


def _train(argv, cwd: Path, log: Path, *, wait: bool = True, fault: str | None = None):
    # -X faulthandler: a process that overstays its wait dumps every thread's stack (`wait_or_dump_stacks`).
    entry = ["-m", "trainer.train"] if fault is None else [str(INJECT), fault, "trainer.train"]
    command = [sys.executable, "-X", "faulthandler", *entry, *argv]
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT
        )
    if not wait:
        return process
    code = wait_or_dump_stacks(process, log, timeout=300)
    assert code == 0, log.read_text()[-3000:]
    return process


def _checkpoint_hash(model_dir: str) -> str:
    """params_hash of a run's last kept step (restored without a model: shapes from metadata)."""
    from convert import init_checkpoints

    return init_checkpoints.params_hash(init_checkpoints.read_params(*_last(model_dir)))


def _last(model_dir: str):
    from convert import init_checkpoints

    return init_checkpoints.resolve_step(model_dir)


@pytest.mark.slow
def test_a_cpt_run_lives_in_the_bucket(gcs_bucket, tiny_data, tiny_prepared, tmp_path):
    runs = f"{gcs_bucket}/runs"
    source, cpt, reference = f"{runs}/source_en", f"{runs}/cpt_fr", f"{gcs_bucket}/ref/cpt_fr"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    # The vocabulary lives in the bucket too (VOCAB_PATH=gs://...). The runs read prepared data
    # (local, `tiny_prepared`): the subject is the run directory, not seqio.
    vocab = f"{gcs_bucket}/vocab/tiny.model"
    storage.write_bytes(vocab, Path(tiny_data["vocab"]).read_bytes())
    prepared = tiny_prepared
    _train(
        run_argv(source, tiny_data, experiment="cpt_source_en", vocab=vocab, prepared=prepared),
        cwd,
        tmp_path / "source.log",
    )
    cpt_macros = {"INIT_CHECKPOINT": f"'{source}'", "TARGET_LANG": "'fr'", "vocab": vocab}
    cpt_macros["prepared"] = prepared
    # The uninterrupted CPT run trains beside the killed one and its resumption (it only has to
    # be done before the comparison).
    ref_log = tmp_path / "ref.log"
    uninterrupted = _train(
        run_argv(reference, tiny_data, experiment="cpt", **cpt_macros), cwd, ref_log, wait=False
    )

    # The CPT run kills itself with SIGKILL at step 5, once a checkpoint past step 2 is in the
    # bucket (`tests/inject_faults.py`: at a chosen point, not raced against the trainer).
    killed_log = tmp_path / "killed.log"
    process = _train(
        run_argv(cpt, tiny_data, experiment="cpt", **cpt_macros),
        cwd,
        killed_log,
        wait=False,
        fault="kill_after_commit@5",
    )
    assert wait_or_dump_stacks(process, killed_log, timeout=300) == -signal.SIGKILL, (
        killed_log.read_text()[-3000:]
    )
    assert not records.read_completed(cpt)
    resumed = _train(
        run_argv(cpt, tiny_data, experiment="cpt", **cpt_macros), cwd, tmp_path / "resumed.log"
    )
    assert resumed.returncode == 0
    log = (tmp_path / "resumed.log").read_text()
    assert "resuming from step" in log and "taking over the stale lease" in log
    assert wait_or_dump_stacks(uninterrupted, ref_log, timeout=300) == 0, ref_log.read_text()[
        -3000:
    ]

    # Nothing local: no `gs:` folder, nothing at all in the working directory.
    assert list(cwd.iterdir()) == []
    # The resumed run equals the uninterrupted one: records (less wall-clock fields), COMPLETED
    # and the final parameters.
    got, want = records.read_metrics(cpt), records.read_metrics(reference)
    assert [records.without_timing(r) for r in got] == [records.without_timing(r) for r in want]
    assert records.read_completed(cpt) == records.read_completed(reference)
    assert _checkpoint_hash(cpt) == _checkpoint_hash(reference)
    # Every file of the run directory is in the bucket, TensorBoard events included.
    entries = {p.name for p in storage.as_path(cpt).iterdir()}
    assert {names.RUN_FILE, names.METRICS_FILE, names.COMPLETED_FILE, names.CONFIG_FILE} <= entries
    assert {names.TB_SUBDIR, names.CHECKPOINTS_SUBDIR} <= entries
    assert names.LEASE_FILE not in entries  # released at the end
    assert any((storage.as_path(cpt) / names.TB_SUBDIR).iterdir())

    # Status, fits and zero-shot scores read (and write) the bucket.
    from evals import local_tasks
    from xlscale_cli import main as cli

    assert cli.main(["fit", "--runs", runs, "--out", f"{gcs_bucket}/fits", "--bootstrap", "0"]) in (
        0,
        3,
    )
    fits = json.loads((storage.as_path(gcs_bucket) / "fits" / "fits.json").read_text())
    assert fits["n_runs"] == 2 and fits["runs_dir"] == runs
    from launch import status

    state = status.run_status(
        type("R", (), {"run_id": "cpt_fr", "model_dir": cpt, "done_marker": names.COMPLETED_FILE})
    )
    assert (state.state, state.step) == ("done", STEPS)
    tasks = local_tasks.write_local_tasks(
        Path(tiny_data["corpora"]), tmp_path / "tasks", langs=["en", "fr"], items=4
    )
    assert cli.main(["zeroshot", "--model-dir", cpt, "--local", str(tasks.dir)]) == 0
    from rundir import zeroshot

    scores = zeroshot.read_zeroshot(cpt)
    assert {s.task for s in scores} >= {"xl_cont_fr"} and all(s.step == STEPS for s in scores)
    assert list(cwd.iterdir()) == []


def test_a_second_writer_of_a_bucket_run_is_refused_by_name(gcs_bucket):
    from rundir import lease

    model_dir = f"{gcs_bucket}/runs/busy"
    held = lease.acquire(model_dir)
    try:
        with pytest.raises(lease.LeaseHeldError, match=f"pid {os.getpid()}"):
            lease._take(storage.as_path(model_dir), lease.LeaseConfig())
        holder, stale = lease.holder_state(model_dir)
        assert holder["pid"] == os.getpid() and stale is None
    finally:
        held.release()
    assert lease.holder_state(model_dir) == (None, None)
    assert not (storage.as_path(model_dir) / names.LEASE_FILE).exists()


@pytest.mark.slow
def test_an_unsupported_scheme_is_refused_before_anything_is_written(tmp_path, tiny_data):
    from trainer import validation  # noqa: F401 - the trainer's import, as a user would have it

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.train",
            *run_argv("s3://bucket/run", tiny_data, experiment="cpt_source_en"),
        ],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "MODEL_DIR" in result.stderr and "s3://bucket/run" in result.stderr
    assert "gs://" in result.stderr
    assert list(tmp_path.iterdir()) == []


# The store going away mid-save, at start, and a full disk: tests/test_storage_failures.py.


def test_a_sweep_launched_locally_keeps_its_runs_in_the_bucket(gcs_bucket, tmp_path, monkeypatch):
    # The local launcher on gs:// MODEL_DIRs: launch.json and the runs' records in the bucket,
    # the process logs in ./xlscale_logs, status from the bucket.
    import io

    from launch_fakes import MANIFEST

    from launch import launchers, status, sweep

    monkeypatch.chdir(tmp_path)
    manifest = tmp_path / "unit.toml"
    manifest.write_text(MANIFEST)
    runs = sweep.expand(sweep.load_manifest(manifest, runs_dir=f"{gcs_bucket}/runs"))

    def runner(run, log_path):
        for step in range(1, run.steps + 1):
            records.append_metrics(run.model_dir, {"step": step, "train/loss": 1.0 / step})
        records.write_completed(run.model_dir, step=run.steps, tokens=run.tokens)
        with open(log_path, "a") as log:
            log.write(f"trained {run.run_id}\n")

    launcher = launchers.LocalLauncher(runner=runner)
    report = launcher.launch(runs, progress=status.Progress(runs, stream=io.StringIO()))
    assert report.ok and report.completed == [r.run_id for r in runs]
    for run in runs:
        assert run.model_dir.startswith("gs://")
        state = status.run_status(run)
        assert (state.state, state.step) == ("done", run.steps)
        record = json.loads((storage.as_path(run.model_dir) / names.LAUNCH_FILE).read_text())
        assert record["state"] == "completed"
        log = tmp_path / "xlscale_logs" / run.run_id / "train.log"
        assert record["log"] == str(log) and f"trained {run.run_id}" in log.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit.toml", "xlscale_logs"]


@pytest.mark.slow
def test_an_adaptive_sweep_steers_tpu_vm_jobs_whose_runs_live_in_the_bucket(
    gcs_bucket, tiny_data, tiny_prepared, tmp_path, monkeypatch
):
    # `sweep run --adaptive --launcher tpu_vm` as on a pod: the run directories in the bucket,
    # the adaptive sweep on the launching machine reading them and writing its log and stop
    # requests there. Each job's `gcloud ... ssh --command` runs its worker command here, in a
    # shell (cd to the checkout, the exports, `python -m trainer.train`), as the one worker.
    from adaptive_study import caught_up, manifest_text
    from launch_fakes import with_prepared_data

    from launch import adaptive, adaptive_loop, status, sweep, tpu_vm
    from rundir import stop_request

    monkeypatch.chdir(tmp_path)
    manifest = tmp_path / "adaptive_tiny.toml"
    # The runs read prepared data (local, `tiny_prepared`): the subject is not seqio.
    manifest.write_text(with_prepared_data(manifest_text(f"{gcs_bucket}/runs")))
    variables = {
        "DATA_DIR": tiny_data["corpora"],
        "VOCAB_PATH": tiny_data["vocab"],
        "PREPARED_DATA": tiny_prepared,
    }
    loaded = sweep.load_manifest(manifest, variables=variables)
    runs = sweep.expand(loaded)
    ids = [r.run_id for r in runs]

    def worker(argv, stdout, stderr):
        assert argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"] and "--worker=all" in argv
        # The job expects a TPU (exit 69 without one); this worker is a CPU.
        remote = argv[-1].replace("XLSCALE_EXPECT_PLATFORM=tpu", "XLSCALE_EXPECT_PLATFORM=any")
        assert remote != argv[-1]
        return subprocess.call(
            ["bash", "-c", remote], stdout=stdout, stderr=stderr, env=subprocess_env()
        )

    launcher = tpu_vm.TpuVmLauncher(
        tpu="pod", zone="z", remote_dir=str(REPO), python=sys.executable, call=worker,
        log_dir=str(tmp_path / "logs"),
    )  # fmt: skip
    policy = adaptive.Policy(min_gain=1e12, tolerance=0.02)
    steering = adaptive_loop.AdaptiveSweep.for_runs(runs, loaded.runs_dir, policy, bootstrap=10)
    # Each job starts once the sweep has seen the ones before it: the law's decisions, not the
    # trainer's speed, say which runs are dropped.
    caught_up(steering, launcher, monkeypatch)
    (report,) = adaptive_loop.run(steering, lambda: [launcher.launch(runs)], poll_s=0.5)

    assert report.completed[:2] == ids[:2] and not report.failed, report
    dropped = set(report.stopped)
    assert dropped and dropped <= set(ids[2:]) and set(report.completed) | dropped == set(ids)
    for run in runs:
        assert run.model_dir.startswith(f"{gcs_bucket}/runs/")
        state = status.run_status(run).state
        assert state == ("stopped" if run.run_id in dropped else "done"), run.run_id
        if run.run_id in dropped:
            assert "adaptive" in stop_request.read(run.model_dir)["by"]
    decisions = adaptive.read_lines(loaded.runs_dir, names.ADAPTIVE_DECISIONS_FILE)
    assert {d["run_id"] for d in decisions if d["decision"] != adaptive.RUN} >= dropped
    assert adaptive.replay(loaded.runs_dir).ok
    assert storage.as_path(loaded.runs_dir, name="runs_dir").joinpath("adaptive").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adaptive_tiny.toml", "logs"]
