"""`xlscale sweep run --launcher slurm` against a real single-node SLURM cluster on 127.0.0.1
(`tests/slurm_cluster.py`: munged, slurmctld and slurmd from Debian's packages, 2 CPUs, no GPU):
a source run and two CPT runs chained by `afterok`, and a run stopped early by SIGTERM that
requeues itself, resumes and completes before its dependent starts.

All cluster tests live in this module and share one cluster (module scope), so under
pytest-xdist a single worker runs them. Skipped, saying why, only where the daemons cannot start.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import ClusterUnavailable, SlurmCluster, ensure_installed

from launch import status, sweep
from rundir import records

REPO = Path(sweep.__file__).resolve().parent.parent

# One tiny shape; a source run (en) and CPT runs (fr, without and with 10% English replay).
MANIFEST = """
[sweep]
name = "slurm_cluster"
family = "llama2"
seq_len = 64
gin_files = ["experiments/tiny.gin"]

[vars]
DATA_DIR = ""
VOCAB_PATH = ""

[gin]
DATA_DIR = "${DATA_DIR}"
VOCAB_PATH = "${VOCAB_PATH}"
MODEL_OVERRIDES = { vocab_size = 512, max_len = 128 }
SEQUENCE_LENGTH = 64
EVAL_PERIOD = 4
EVAL_MAX_TOKENS = 512
LOG_EVERY = 2
CHECKPOINT_PERIOD = 4

[sizes.t16]
base = "llama2_cpu_d64"
d_model = 16
d_ff = 32
num_heads = 2
num_layers = 1

[axes]
sizes = ["t16"]
target_langs = ["fr"]
seeds = [0]

[[grid]]
strategies = ["source", "cpt"]

[[grid]]
strategies = ["cpt_replay"]
replay_ratios = [0.1]

[budget]
steps = 6
batch_size = 8
"""
LONG_STEPS = 500  # the run stopped by SIGTERM: a few seconds of steps after its first log line
WAIT_S = 300  # the whole sweep, queue to COMPLETED, on two shared CPUs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One single-node SLURM cluster for this module (daemons stopped by pid afterwards)."""
    root = tmp_path_factory.mktemp("slurm")
    try:
        ensure_installed(root / "apt-get.log")
    except ClusterUnavailable as e:
        pytest.skip(f"no SLURM cluster: {e}")
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except ClusterUnavailable as e:
        pytest.skip(f"no SLURM cluster: the daemons cannot start here ({e})")
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm_env(cluster, monkeypatch):
    """This process's SLURM clients (the launcher's sbatch and squeue) talk to `cluster`."""
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    return cluster


def _sweep_run(manifest: Path, runs_dir: Path, script_dir: Path, tiny_data, *extra: str) -> int:
    from xlscale_cli import main as cli

    return cli.main(
        [
            "sweep",
            "run",
            str(manifest),
            "--var",
            f"DATA_DIR={tiny_data['corpora']}",
            "--var",
            f"VOCAB_PATH={tiny_data['vocab']}",
            "--runs-dir",
            str(runs_dir),
            "--launcher",
            "slurm",
            "--gpus-per-node",
            "0",
            "--cpus-per-task",
            "1",
            "--time-limit",
            "15:00",
            "--script-dir",
            str(script_dir),
            "--slurm-python",
            sys.executable,
            "--slurm-workdir",
            str(REPO),
            *extra,
        ]
    )


def _runs(manifest: Path, runs_dir: Path, tiny_data) -> list[sweep.Run]:
    variables = {"DATA_DIR": tiny_data["corpora"], "VOCAB_PATH": tiny_data["vocab"]}
    loaded = sweep.load_manifest(manifest, variables=variables, runs_dir=str(runs_dir))
    return sweep.expand(loaded)


def _job_ids(script_dir: Path) -> dict[str, str]:
    """Run id -> job id, from the job logs `<run id>-<job id>.out`."""
    return {
        path.stem.rsplit("-", 1)[0]: path.stem.rsplit("-", 1)[1]
        for path in (script_dir / "logs").glob("*.out")
    }


def _wait_for_empty_queue(cluster: SlurmCluster, script_dir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while jobs := cluster.jobs():
        if time.monotonic() > deadline or any(
            "DependencyNeverSatisfied" in j["reason"] for j in jobs
        ):
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text()[-2000:]}" for p in (script_dir / "logs").glob("*")
            )
            pytest.fail(f"jobs still queued (waited at most {timeout} s): {jobs}\n{logs}")
        time.sleep(1.0)


def _log(script_dir: Path, run_id: str) -> str:
    return "".join(p.read_text() for p in (script_dir / "logs").glob(f"{run_id}-*.out"))


@pytest.mark.slow
def test_a_cpt_sweep_runs_to_completion_under_slurm(slurm_env, tiny_data, tmp_path, capsys):
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster.toml"
    manifest.write_text(MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    runs = _runs(manifest, runs_dir, tiny_data)
    assert sorted(r.strategy for r in runs) == ["cpt", "cpt_replay", "source"]

    assert _sweep_run(manifest, runs_dir, script_dir, tiny_data) == 0
    queued = {job["name"]: job for job in cluster.jobs()}
    assert set(queued) <= {r.run_id for r in runs}
    _wait_for_empty_queue(cluster, script_dir, WAIT_S)

    jobs = _job_ids(script_dir)
    assert set(jobs) == {r.run_id for r in runs}
    source = next(r for r in runs if r.strategy == "source")
    for run in runs:
        job = cluster.job(jobs[run.run_id])
        log = _log(script_dir, run.run_id)
        assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
        assert job["Restarts"] == "0" and "requeue 0 of at most 3" in log
        assert status.is_completed(run), log[-3000:]
        assert records.read_completed(run.model_dir)["step"] == run.steps
        if run.depends_on:
            assert run.depends_on == (source.run_id,)
            # Started only after the source job had completed (afterok).
            assert job["StartTime"] >= cluster.job(jobs[source.run_id])["EndTime"]
    # A second `sweep run` finds every run done and submits nothing.
    assert _sweep_run(manifest, runs_dir, script_dir, tiny_data) == 0
    assert cluster.jobs() == [] and len(_job_ids(script_dir)) == len(runs)
    # `sweep status` joins the finished jobs (slurmctld keeps them for MinJobAge).
    text = _sweep_status(manifest, runs_dir, capsys, data=tiny_data)
    for run in runs:
        row = next(line for line in text.splitlines() if line.startswith(run.run_id))
        assert row.split()[1] == "done" and f"{jobs[run.run_id]} COMPLETED" in row, text
    assert "# slurm: COMPLETED 3" in text


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_requeues_itself_and_completes(slurm_env, tiny_data, tmp_path):
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster.toml"
    # Long enough (a few seconds of steps) to be stopped in the middle of training.
    manifest.write_text(
        MANIFEST.replace("steps = 6", f"steps = {LONG_STEPS}")
        .replace("EVAL_PERIOD = 4", f"EVAL_PERIOD = {LONG_STEPS // 2}")
        .replace("CHECKPOINT_PERIOD = 4", f"CHECKPOINT_PERIOD = {LONG_STEPS}")
    )
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    runs = [r for r in _runs(manifest, runs_dir, tiny_data) if r.strategy in ("source", "cpt")]
    source, cpt = sorted(runs, key=lambda r: r.strategy != "source")
    assert source.steps == LONG_STEPS

    assert _sweep_run(manifest, runs_dir, script_dir, tiny_data, "--only", cpt.run_id) == 0
    job_id = _job_ids_when_started(script_dir, source.run_id)
    # Once training has logged a step, a preemption notice (SIGTERM to the job's steps, not its
    # batch shell) makes the trainer save a checkpoint, exit 75, and the job requeue itself.
    _wait_until(lambda: status.last_step(source) > 0, "a logged step", 180, script_dir)
    stopped_after = status.last_step(source)
    cluster.run(["scancel", "--signal=TERM", job_id])
    _wait_for_empty_queue(cluster, script_dir, WAIT_S)

    job = cluster.job(job_id)
    log = _log(script_dir, source.run_id)
    assert (job["JobState"], job["Restarts"]) == ("COMPLETED", "1"), log[-3000:]
    # The job's one log (appended across attempts) records the stop, the requeue and the rerun.
    marks = [
        re.sub(r"( on \S+)? at \d{4}-\d\d-\d\dT\S+Z", "", line)
        for line in log.splitlines()
        if line.startswith("xlscale: ")
    ]
    assert marks == [
        f"xlscale: job {job_id} start, requeue 0 of at most 3",
        "xlscale: trainer exited 75 (checkpoint saved); requeue 1 of at most 3",
        f"xlscale: job {job_id} start, requeue 1 of at most 3",
        "xlscale: trainer exited 0",
    ], log[-3000:]
    # The rerun resumed from the checkpoint saved on SIGTERM, in the middle of training.
    resumed = re.findall(r"resuming from step (\d+)", log)
    assert len(resumed) == 1 and stopped_after <= int(resumed[0]) < LONG_STEPS, log[-3000:]
    assert records.read_completed(source.model_dir)["step"] == source.steps
    steps = [r["step"] for r in records.read_metrics(source.model_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == LONG_STEPS
    cpt_job = cluster.job(_job_ids(script_dir)[cpt.run_id])
    assert cpt_job["JobState"] == "COMPLETED" and status.is_completed(cpt)
    assert cpt_job["StartTime"] >= job["EndTime"]


def _job_ids_when_started(script_dir: Path, run_id: str) -> str:
    _wait_until(lambda: run_id in _job_ids(script_dir), f"job log of {run_id}", 120, script_dir)
    return _job_ids(script_dir)[run_id]


def _wait_until(ready, what: str, timeout: float, script_dir: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-2000:] for p in (script_dir / "logs").glob("*"))
            pytest.fail(f"no {what} after {timeout} s\n{logs}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_run_that_fails_is_not_requeued_and_its_dependents_are_cancelled(
    slurm_env, tiny_data, tmp_path, capsys
):
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster.toml"
    manifest.write_text(MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    broken = {**tiny_data, "vocab": str(tmp_path / "missing.model")}  # a configuration error
    runs = _runs(manifest, runs_dir, broken)

    assert _sweep_run(manifest, runs_dir, script_dir, broken) == 0
    submitted = dict(re.findall(r"submitted (\S+) as job (\d+)", capsys.readouterr().out))
    assert set(submitted) == {r.run_id for r in runs}
    _wait_for_empty_queue(cluster, script_dir, WAIT_S)

    for run in runs:
        job = cluster.job(submitted[run.run_id])
        if run.depends_on:
            assert (job["JobState"], job["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied")
            assert job["StartTime"] == "None" or job["RunTime"] == "00:00:00"
            continue
        log = _log(script_dir, run.run_id)
        assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("FAILED", "2:0", "0"), log
        assert "xlscale: trainer exited 2" in log and "requeue 1" not in log
        assert "missing.model" in log
    assert not any(status.is_completed(r) for r in runs)


def _sweep_status(manifest: Path, runs_dir: Path, capsys, *extra: str, data=None) -> str:
    from xlscale_cli import main as cli

    data = data or {"corpora": "/d", "vocab": "/v"}
    capsys.readouterr()
    argv = ["sweep", "status", str(manifest), "--runs-dir", str(runs_dir), *extra]
    argv += ["--var", f"DATA_DIR={data['corpora']}", "--var", f"VOCAB_PATH={data['vocab']}"]
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def test_status_names_jobs_that_can_never_start(slurm_env, tmp_path, capsys):
    # The first encounter: every job asks more CPUs than the node has, and pends forever
    # (PartitionConfig); `sweep status` says so, and what to do, instead of "pending".
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster.toml"
    manifest.write_text(MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    data = {"corpora": "/d", "vocab": "/v"}
    runs = _runs(manifest, runs_dir, data)
    too_many = str(cluster.cpus * 16)
    assert _sweep_run(manifest, runs_dir, script_dir, data, "--cpus-per-task", too_many) == 0
    try:
        submitted = dict(re.findall(r"submitted (\S+) as job (\d+)", capsys.readouterr().out))
        assert len(submitted) == len(runs)
        source = next(r for r in runs if not r.depends_on)
        deadline = time.monotonic() + 30
        while cluster.job(submitted[source.run_id])["Reason"] != "PartitionConfig":
            assert time.monotonic() < deadline, cluster.job(submitted[source.run_id])
            time.sleep(0.5)

        text = _sweep_status(manifest, runs_dir, capsys)
        assert f"{submitted[source.run_id]} PENDING (PartitionConfig)" in text
        # Every job, dependents included, waits on the partition's limits first.
        assert "# slurm: PENDING 3 (PartitionConfig 3)" in text, text
        assert "# 3 job(s) will never start (PartitionConfig: " in text
        assert "--cpus-per-task" in text
        rows = json.loads(_sweep_status(manifest, runs_dir, capsys, "--json"))
        by_id = {row["run_id"]: row for row in rows}
        assert by_id[source.run_id]["state"] == "pending"
        assert by_id[source.run_id]["slurm"]["reason"] == "PartitionConfig"
        assert by_id[source.run_id]["slurm"]["stuck"].startswith("the partition cannot give")
        assert {row["slurm"]["reason"] for row in rows} == {"PartitionConfig"}
        # A second `sweep run` finds the runs in the queue and submits none of them again.
        assert _sweep_run(manifest, runs_dir, script_dir, data, "--cpus-per-task", "1") == 0
        assert "submitted 0" in capsys.readouterr().out
    finally:
        cluster.run(["scancel", "--user=root"], check=False)
    assert "no job of these runs" not in _sweep_status(manifest, runs_dir, capsys)
    assert "slurm job" not in _sweep_status(manifest, runs_dir, capsys, "--scheduler", "none")
