"""`xlscale sweep run --launcher slurm` against a real single-node SLURM cluster on 127.0.0.1
(`tests/slurm_cluster.py`: munged, slurmctld and slurmd from Debian's packages, 2 CPUs, no GPU):
a source run and two CPT runs chained by `afterok`; runs stopped by their time limit or by a
preemption notice that requeue themselves, resume bitwise and complete before their dependents
start; a failing run whose dependents are cancelled; jobs that can never start, named by
`sweep status`; a run of two JAX processes (two SLURM tasks) equal to one process; and an
adaptive sweep (`--adaptive`) steering the jobs it submitted.

The tests of this module share one cluster (module scope). Under pytest-xdist the tests may land
on both workers; `SlurmCluster.start` then makes the second worker's cluster wait for the first
to stop (a machine-wide lock), so two clusters never share the CPUs or race for ports. Skipped,
saying why, only where the daemons cannot start.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import ClusterUnavailable, SlurmCluster, ensure_installed
from slurm_sweeps import (
    LONG_LIMIT_MIN,
    LONG_MANIFEST,
    LONG_PERIODS,
    LONG_STEPS,
    MANIFEST,
    SIGNAL_BEFORE_S,
    WAIT_S,
    job_ids,
    job_log,
    loss_rows,
    run_beside_one_process,
    sweep_data,
    sweep_run,
    sweep_runs,
    variables,
    wait_for_empty_queue,
)

from launch import status
from launch.runs import Run
from rundir import records
from trainer import checkpoints


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


# The time-limit test's long copies train LONG_STEPS unless XLSCALE_TEST_SLURM_STEPS says
# otherwise: the test's moments are its own (a logged step, a committed checkpoint, the trainer
# held until the script's SIGTERM), so fewer steps (200: the first checkpoint, step 100, half-way
# instead of a third of the way) stand for a faster trainer, more (600: twice the wall-clock time)
# for a slower one, and it passes with either (docs/testing.md). A count must be a multiple of 100:
# the copies log every 50 steps and evaluate half-way.
TIME_LIMIT_STEPS = int(os.environ.get("XLSCALE_TEST_SLURM_STEPS", LONG_STEPS))


def _long_manifest(steps: int) -> str:
    """LONG_MANIFEST with the long copies' steps (evaluated half-way and at the end)."""
    text = LONG_MANIFEST.replace(f"\nsteps = {LONG_STEPS}\n", f"\nsteps = {steps}\n")
    text = text.replace(f"EVAL_PERIOD = {LONG_STEPS // 2}\n", f"EVAL_PERIOD = {steps // 2}\n")
    assert steps == LONG_STEPS or text != LONG_MANIFEST, "LONG_MANIFEST changed its form"
    return text


def _story(how: str, log: str, most: int = 150) -> str:
    """A failure message: the job log with each run of per-step progress lines cut to its last
    line (what happened at every start, stop and requeue, with where training was), in full
    (a string: pytest truncates a tuple's repr mid-log)."""
    lines = log.splitlines()
    kept = [
        line
        for k, line in enumerate(lines)
        if not re.search(r" INFO step \d+/", line)
        or k + 1 == len(lines)
        or not re.search(r" INFO step \d+/", lines[k + 1])
    ]
    return "\n".join([f"{how}: the job log, steps elided", *kept[-most:]])


@pytest.mark.slow
def test_a_cpt_sweep_runs_to_completion_under_slurm(
    slurm_env, tiny_data, tiny_prepared, tmp_path, capsys
):
    data = sweep_data(tiny_data, tiny_prepared)
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster.toml"
    manifest.write_text(MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    runs = sweep_runs(manifest, runs_dir, data)
    assert sorted(r.strategy for r in runs) == ["cpt", "cpt_replay", "source"]

    assert sweep_run(manifest, runs_dir, script_dir, data) == 0
    queued = {job["name"]: job for job in cluster.jobs()}
    assert set(queued) <= {r.run_id for r in runs}
    wait_for_empty_queue(cluster, script_dir, WAIT_S)

    jobs = job_ids(script_dir)
    assert set(jobs) == {r.run_id for r in runs}
    source = next(r for r in runs if r.strategy == "source")
    for run in runs:
        job = cluster.job(jobs[run.run_id])
        log = job_log(script_dir, run.run_id)
        assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
        assert job["Restarts"] == "0" and "requeue 0 of at most 3" in log
        assert status.is_completed(run), log[-3000:]
        assert records.read_completed(run.model_dir)["step"] == run.steps
        if run.depends_on:
            assert run.depends_on == (source.run_id,)
            # Started only after the source job had completed (afterok).
            assert job["StartTime"] >= cluster.job(jobs[source.run_id])["EndTime"]
    # A second `sweep run` finds every run done and submits nothing.
    assert sweep_run(manifest, runs_dir, script_dir, data) == 0
    assert cluster.jobs() == [] and len(job_ids(script_dir)) == len(runs)
    # `sweep status` joins the finished jobs (slurmctld keeps them for MinJobAge).
    text = _sweep_status(manifest, runs_dir, capsys, data=data)
    for run in runs:
        row = next(line for line in text.splitlines() if line.startswith(run.run_id))
        assert row.split()[1] == "done" and f"{jobs[run.run_id]} COMPLETED" in row, text
    assert "# slurm: COMPLETED 3" in text


@pytest.mark.slow
def test_runs_stopped_by_a_time_limit_or_a_preemption_requeue_themselves_and_complete(
    slurm_env, tiny_data, tiny_prepared, tmp_path, capsys
):
    # Two copies of one training side by side (a CPU each), told apart only by their checkpoint
    # period: one gets a preemption notice once it trains, one has its time limit brought near
    # once it has committed a checkpoint (its script then sends SIGTERM SIGNAL_BEFORE s before the
    # new limit). Each saves a checkpoint, exits 75, requeues itself, resumes and completes, and
    # only then does its afterok dependent start; the two log the same losses, step for step.
    # Nothing here depends on how fast the machine trains: the moments are the test's own, and
    # the time-limited trainer is held (SIGSTOP) from the moment its limit moves until the
    # script's SIGTERM has been sent, so it cannot finish first however fast it is.
    data = sweep_data(tiny_data, tiny_prepared)
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster_long.toml"
    steps = TIME_LIMIT_STEPS
    assert steps > max(LONG_PERIODS), f"the first checkpoints are at steps {LONG_PERIODS}"
    manifest.write_text(_long_manifest(steps))
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    runs = sweep_runs(manifest, runs_dir, data)
    source = {r.coord("CHECKPOINT_PERIOD"): r for r in runs if r.strategy == "source"}
    cpt = {r.coord("CHECKPOINT_PERIOD"): r for r in runs if r.strategy == "cpt"}
    (limited, preempted) = sorted(source)
    assert source[limited].steps == steps and cpt[limited].steps == 6
    assert cpt[limited].depends_on == (source[limited].run_id,)

    only = {p: ["--only", cpt[p].run_id] for p in source}
    assert sweep_run(manifest, runs_dir, script_dir, data, *only[preempted]) == 0
    time_limit = ["--time-limit", str(LONG_LIMIT_MIN), "--signal-before", str(SIGNAL_BEFORE_S)]
    assert sweep_run(manifest, runs_dir, script_dir, data, *only[limited], *time_limit) == 0
    jobs = {p: _job_ids_when_started(script_dir, source[p].run_id) for p in source}
    # Once training has logged a step, a preemption notice (SIGTERM to the job's steps, not its
    # batch shell) makes the trainer save a checkpoint, exit 75, and the job requeue itself.
    _wait_until(lambda: status.last_step(source[preempted]) > 0, "a logged step", 300, script_dir)
    cluster.run(["scancel", "--signal=TERM", jobs[preempted]])
    _wait_until(
        lambda: "(checkpoint saved); requeue 1" in job_log(script_dir, source[preempted].run_id),
        "requeue",
        300,
        script_dir,
    )
    # While it waits to start again (or has started again), `sweep run` submits nothing new and
    # `sweep status` shows the requeue.
    capsys.readouterr()
    assert sweep_run(manifest, runs_dir, script_dir, data, *only[preempted]) == 0
    out = capsys.readouterr().out
    assert "submitted 0," in out and f"already in the queue as job {jobs[preempted]}" in out
    text = _sweep_status(manifest, runs_dir, capsys, data=data)
    row = next(line for line in text.splitlines() if line.startswith(source[preempted].run_id))
    assert f"{jobs[preempted]} " in row and row.endswith("requeued 1"), text

    # The time-limited copy: once it has committed its first checkpoint, its trainer is held and
    # its time limit brought to the first whole minute (SLURM's unit) that puts the SIGTERM at
    # most a minute away; released once the script has sent it, the trainer saves and exits 75.
    limited_run = source[limited]
    _wait_until(
        lambda: checkpoints.committed_step(limited_run.model_dir) is not None,
        "committed checkpoint",
        WAIT_S,
        script_dir,
    )
    trainer = _trainer_pid(limited_run)
    os.kill(trainer, signal.SIGSTOP)
    try:
        ran = _seconds(cluster.job(jobs[limited])["RunTime"])
        minutes = math.ceil((ran + SIGNAL_BEFORE_S + 5) / 60)
        cluster.run(["scontrol", "update", f"JobId={jobs[limited]}", f"TimeLimit={minutes}"])
        _wait_until(
            lambda: "SIGTERM to the trainer" in job_log(script_dir, limited_run.run_id),
            "SIGTERM from the job script",
            60 * minutes,
            script_dir,
        )
    finally:
        os.kill(trainer, signal.SIGCONT)
    _wait_until(
        lambda: "(checkpoint saved); requeue 1" in job_log(script_dir, limited_run.run_id),
        "requeue after the time limit's SIGTERM",
        300,
        script_dir,
    )
    # Its next start has the far limit back, and completes.
    cluster.run(["scontrol", "update", f"JobId={jobs[limited]}", f"TimeLimit={LONG_LIMIT_MIN}"])
    wait_for_empty_queue(cluster, script_dir, WAIT_S)

    stopped_at = {}
    for period, how in ((limited, "time limit"), (preempted, "preemption")):
        run, job_id = source[period], jobs[period]
        job = cluster.job(job_id)
        log = job_log(script_dir, run.run_id)
        # One stop, one requeue, one completing start.
        assert (job["JobState"], job["Restarts"]) == ("COMPLETED", "1"), _story(how, log)
        # The job's one log (appended across starts) records each start, stop and requeue.
        marks = [
            re.sub(r"( on \S+)? at \d{4}-\d\d-\d\dT\S+Z", "", line)
            for line in log.splitlines()
            if line.startswith("xlscale: ")
        ]
        starts = [f"xlscale: job {job_id} start, requeue {k} of at most 3" for k in range(2)]
        assert [m for m in marks if " start, " in m] == starts, _story(how, log)
        assert marks[-1] == "xlscale: trainer exited 0", _story(how, log)
        exits = [m for m in marks if "trainer exited" in m][:-1]
        assert exits == ["xlscale: trainer exited 75 (checkpoint saved); requeue 1 of at most 3"]
        sigterm = f"xlscale: SIGTERM to the trainer, {SIGNAL_BEFORE_S} s before the time limit"
        assert marks.count(sigterm) == (1 if period == limited else 0), _story(how, log)
        # Stopped in the middle of training with a checkpoint; the next start resumed there.
        stopped = [int(s) for s in re.findall(r"stopping at step (\d+) \(checkpoint saved\)", log)]
        resumed = [int(s) for s in re.findall(r"resuming from step (\d+)", log)]
        assert len(stopped) == 1 and 0 < stopped[0] < steps, _story(how, log)
        assert sorted(set(resumed)) == stopped, _story(how, log)  # the header and the loop
        stopped_at[how] = stopped
        assert records.read_completed(run.model_dir)["step"] == steps
        dependent = cluster.job(job_ids(script_dir)[cpt[period].run_id])
        assert dependent["JobState"] == "COMPLETED" and status.is_completed(cpt[period])
        assert dependent["StartTime"] >= job["EndTime"], how
    # Held from its first checkpoint until the SIGTERM: it stopped after it, not at its end.
    assert stopped_at["time limit"][0] >= limited
    # Resumed bitwise: both copies, stopped at different steps, log the same losses.
    rows = {p: loss_rows(source[p]) for p in source}
    assert [r["step"] for r in rows[limited]] == list(range(50, steps + 1, 50))
    assert rows[limited] == rows[preempted], stopped_at
    print(f"stopped at steps {stopped_at} of {steps}")


def _seconds(run_time: str) -> int:
    """`scontrol`'s RunTime (`[D-]HH:MM:SS`) in seconds."""
    days, _, clock = run_time.rpartition("-")
    h, m, sec = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def _trainer_pid(run: Run) -> int:
    """The pid of `run`'s trainer process on this (single-node) cluster: the Python process whose
    command line is the run's (`python -m trainer.train ... MODEL_DIR ...`); holding it holds the
    training, whatever srun does."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        # The interpreter itself (`--slurm-python`), not srun or the shell that exec'd it.
        if argv[:3] == [sys.executable, "-m", run.module] and any(
            str(run.model_dir) in a for a in argv
        ):
            return int(proc.name)
    raise AssertionError(f"no trainer process of {run.run_id}")


def _job_ids_when_started(script_dir: Path, run_id: str) -> str:
    _wait_until(lambda: run_id in job_ids(script_dir), f"job log of {run_id}", 120, script_dir)
    return job_ids(script_dir)[run_id]


def _wait_until(ready, what: str, timeout: float, script_dir: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            logs = "\n".join(p.read_text()[-2000:] for p in (script_dir / "logs").glob("*"))
            pytest.fail(f"no {what} after {timeout} s\n{logs}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_run_that_fails_is_not_requeued_and_its_dependents_are_cancelled(
    slurm_env, tiny_data, tiny_prepared, tmp_path, capsys
):
    data = sweep_data(tiny_data, tiny_prepared)
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster.toml"
    manifest.write_text(MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    broken = {**data, "vocab": str(tmp_path / "missing.model")}  # a configuration error
    runs = sweep_runs(manifest, runs_dir, broken)

    assert sweep_run(manifest, runs_dir, script_dir, broken) == 0
    submitted = dict(re.findall(r"submitted (\S+) as job (\d+)", capsys.readouterr().out))
    assert set(submitted) == {r.run_id for r in runs}
    wait_for_empty_queue(cluster, script_dir, WAIT_S)

    for run in runs:
        job = cluster.job(submitted[run.run_id])
        if run.depends_on:
            assert (job["JobState"], job["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied")
            # Never started: no start time (None, or Unknown once the scheduler had looked).
            assert job["StartTime"] in ("None", "Unknown") or job["RunTime"] == "00:00:00", job
            continue
        log = job_log(script_dir, run.run_id)
        assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("FAILED", "2:0", "0"), log
        assert "xlscale: trainer exited 2" in log and "requeue 1" not in log
        assert "missing.model" in log
    assert not any(status.is_completed(r) for r in runs)


def _sweep_status(manifest: Path, runs_dir: Path, capsys, *extra: str, data=None) -> str:
    from xlscale_cli import main as cli

    data = data or {"corpora": "/d", "vocab": "/v", "prepared": "/p"}
    capsys.readouterr()
    argv = ["sweep", "status", str(manifest), "--runs-dir", str(runs_dir), *extra]
    argv += [f"--var={key}={value}" for key, value in variables(data).items()]
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def test_status_names_jobs_that_can_never_start(slurm_env, tmp_path, capsys):
    # The first encounter: every job asks more CPUs than the node has, and pends forever
    # (PartitionConfig); `sweep status` says so, and what to do, instead of "pending".
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster.toml"
    manifest.write_text(MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    data = {"corpora": "/d", "vocab": "/v", "prepared": "/p"}
    runs = sweep_runs(manifest, runs_dir, data)
    too_many = str(cluster.cpus * 16)
    assert sweep_run(manifest, runs_dir, script_dir, data, "--cpus-per-task", too_many) == 0
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
        # The dependents wait on the partition's limits too, or (as SLURM's scheduler cycles
        # re-evaluate them, on a loaded machine) on their dependency: either way never starting.
        summary = next(line for line in text.splitlines() if line.startswith("# slurm: "))
        assert summary.startswith("# slurm: PENDING 3 (") and "PartitionConfig" in summary, text
        never = next(line for line in text.splitlines() if "will never start" in line)
        assert "(PartitionConfig: " in never and submitted[source.run_id] in never, text
        assert "--cpus-per-task" in never
        rows = json.loads(_sweep_status(manifest, runs_dir, capsys, "--json"))
        by_id = {row["run_id"]: row for row in rows}
        assert by_id[source.run_id]["state"] == "pending"
        assert by_id[source.run_id]["slurm"]["reason"] == "PartitionConfig"
        assert by_id[source.run_id]["slurm"]["stuck"].startswith("the partition cannot give")
        assert {row["slurm"]["reason"] for row in rows} <= {"PartitionConfig", "Dependency"}
        # A second `sweep run` finds the runs in the queue and submits none of them again.
        assert sweep_run(manifest, runs_dir, script_dir, data, "--cpus-per-task", "1") == 0
        assert "submitted 0" in capsys.readouterr().out
    finally:
        cluster.run(["scancel", "--user=root"], check=False)
    assert "no job of these runs" not in _sweep_status(manifest, runs_dir, capsys)
    assert "slurm job" not in _sweep_status(manifest, runs_dir, capsys, "--scheduler", "none")


@pytest.mark.slow
def test_a_run_of_two_tasks_has_the_losses_of_one_process(
    slurm_env, tiny_data, tiny_prepared, tmp_path
):
    # `--tasks-per-node 2`: one job, two JAX processes (one CPU device each) that find each
    # other through jax.distributed from SLURM's variables and split the global batch of 8; the
    # same run as one process with two devices, beside the job, logs the same losses.
    data = sweep_data(tiny_data, tiny_prepared)
    two_tasks = ["--tasks-per-node", "2", "--cpus-per-task", "1"]
    run, job, log = run_beside_one_process(slurm_env, data, tmp_path, *two_tasks)
    assert (job["JobState"], job["NumTasks"], job["ExitCode"]) == ("COMPLETED", "2", "0:0"), log


@pytest.mark.slow
def test_a_run_stopped_on_request_is_not_requeued(
    slurm_env, tiny_data, tiny_prepared, tmp_path, capsys
):
    # `sweep run --adaptive`'s STOP (`rundir.stop_request`): the trainer saves a checkpoint and
    # exits 79, which the job script does not requeue (75 and 143 it does); the run reads as
    # stopped, resumable once the request is withdrawn.
    from rundir import exits, names, stop_request

    data = sweep_data(tiny_data, tiny_prepared)
    cluster = slurm_env
    manifest = tmp_path / "slurm_cluster_long.toml"
    manifest.write_text(LONG_MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    runs = sweep_runs(manifest, runs_dir, data)
    period = LONG_PERIODS[0]
    (source,) = [
        r for r in runs if r.strategy == "source" and r.coord("CHECKPOINT_PERIOD") == period
    ]
    assert sweep_run(manifest, runs_dir, script_dir, data, "--only", source.run_id) == 0
    job = _job_ids_when_started(script_dir, source.run_id)
    _wait_until(lambda: status.last_step(source) > 0, "a logged step", 180, script_dir)
    stop_request.request(source.model_dir, reason="STOP: test")
    wait_for_empty_queue(cluster, script_dir, WAIT_S)
    log = job_log(script_dir, source.run_id)
    state = cluster.job(job)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == (
        "FAILED",
        f"{exits.STOPPED}:0",
        "0",
    ), log
    assert f"xlscale: trainer exited {exits.STOPPED}" in log and "requeue 1" not in log
    saved = [int(p.name) for p in (runs_dir / source.run_id / "checkpoints").iterdir()]
    # The checkpoint of the step it stopped at (after the last logged one; no periodic save yet).
    assert saved and status.last_step(source) <= max(saved) < period, saved
    assert not (runs_dir / source.run_id / names.COMPLETED_FILE).exists()
    assert status.run_status(source).state == "stopped"


@pytest.mark.slow
def test_an_adaptive_sweep_steers_the_slurm_jobs_it_submitted(
    slurm_env, tiny_data, tiny_prepared, tmp_path, capsys
):
    # `sweep run --adaptive --launcher slurm` (beside every launcher): the five tiny
    # scratch runs of `test_adaptive_sweep`, submitted at once and run one at a time (each job
    # asks every CPU of the node, so the last two wait in the queue however slow the refit). The sweep
    # polls their run directories beside the queue and refits on every evaluation; once three
    # sizes identify the law it drops the rest: a skipped run's queued job is cancelled (it
    # never takes an allocation; one that started meanwhile finds its stop request and ends
    # before compiling), a running one saves a checkpoint and exits 79; none is requeued.
    from adaptive_study import manifest_text
    from launch_fakes import with_prepared_data

    from launch import adaptive, slurm
    from rundir import exits, names, stop_request

    data = sweep_data(tiny_data, tiny_prepared)
    cluster = slurm_env
    manifest = tmp_path / "adaptive_tiny.toml"
    # 48 steps, so a run is still training when the third size's first evaluations identify the
    # law; refits without a bootstrap (the information decides here).
    text = manifest_text(tmp_path / "runs").replace("steps = 24", "steps = 48")
    manifest.write_text(with_prepared_data(text))
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    runs = sweep_runs(manifest, runs_dir, data)
    ids = [r.run_id for r in runs]
    steer = ["--adaptive", "--min-gain=1e12", "--tolerance=0.02", "--adaptive-poll=1"]
    steer += ["--adaptive-bootstrap=0", "--cpus-per-task", str(cluster.cpus)]
    # Returns once every job has ended: the sweep polls on after the launcher submitted them.
    capsys.readouterr()
    assert sweep_run(manifest, runs_dir, script_dir, data, *steer) == 0
    out = capsys.readouterr().out
    wait_for_empty_queue(cluster, script_dir, 60)

    states = {r.run_id: status.run_status(r).state for r in runs}
    assert set(states.values()) <= {"done", "stopped"}, states
    dropped = {k for k, state in states.items() if state == "stopped"}
    assert dropped and dropped <= set(ids[2:]) and states[ids[0]] == states[ids[1]] == "done"
    jobs = slurm.scheduler_jobs(ids)
    cancelled = set()
    for run in runs:
        job = cluster.job(jobs[run.run_id].job_id)
        log = job_log(script_dir, run.run_id)
        if run.run_id in dropped and job["JobState"] == "CANCELLED":  # skipped while queued
            assert not log and f"cancelled queued job {job['JobId']} of {run.run_id}" in out, out
            cancelled.add(run.run_id)
        elif run.run_id in dropped:  # started before its SKIP, or stopped (79, not requeued)
            assert (job["JobState"], job["ExitCode"], job["Restarts"]) == (
                "FAILED",
                f"{exits.STOPPED}:0",
                "0",
            ), log[-3000:]
        else:
            assert job["JobState"] == "COMPLETED" and status.is_completed(run), log[-3000:]
        if run.run_id in dropped:
            assert "adaptive" in stop_request.read(run.model_dir)["by"]
    # The last size waits in the queue behind the third and fourth when the third size's first
    # evaluations identify the law: skipped there, its job never starts.
    assert ids[-1] in cancelled, (states, out)
    decisions = adaptive.read_lines(str(runs_dir), names.ADAPTIVE_DECISIONS_FILE)
    drops = [d for d in decisions if d["decision"] != adaptive.RUN]
    assert {d["run_id"] for d in drops} >= dropped
    assert all(d["identifiable"] and d["fit"]["n_points"] > 0 for d in drops)
    assert adaptive.replay(str(runs_dir)).ok
    text = _sweep_status(manifest, runs_dir, capsys, data=data)
    assert "# adaptive (--min-gain 1e+12, --tolerance 0.02): spent" in text
    assert "scratch.alpha = " in text, text
