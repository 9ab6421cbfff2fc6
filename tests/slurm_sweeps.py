"""Sweeps on the test SLURM cluster (`slurm_cluster.py`): the tiny sweep manifests, `sweep run`
with the SLURM launcher (`sweep_run`), its jobs and logs, and `run_beside_one_process`, a run of
two JAX processes checked against the same run as one process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fast_compile_flags
from launch_fakes import size_section, tiny_sweep
from slurm_cluster import SlurmCluster

from launch import status, sweep
from launch.runs import Run
from rundir import records

REPO = Path(sweep.__file__).resolve().parent.parent

# One tiny shape; a source run (en) and CPT runs (fr, without and with 10% English replay),
# reading prepared data (`PREPARED_DATA`, given by `--var` as `sweep_data` says): the subject is
# the launcher, not seqio, so its trainers build no seqio task or tf.data pipeline. Each
# job has one CPU device ([env]): 8 simulated ones (this session's XLA_FLAGS, which sbatch passes
# on) all-reduce through a rendezvous that times out when two jobs share two CPUs.
MANIFEST = f"""{tiny_sweep("slurm_cluster", prepared=True)}EVAL_PERIOD = 4
EVAL_MAX_TOKENS = 512
LOG_EVERY = 2
CHECKPOINT_PERIOD = 4

[env]
XLA_FLAGS = "--xla_force_host_platform_device_count=1 FAST_COMPILE"

{size_section("t16", d_model=16, d_ff=32, num_layers=1)}
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
# Two copies of one training, told apart only by when they save (which changes no number), at a
# real job's pace (MIN_STEP_SECONDS: every step takes at least 0.2 s, the trainer sleeping the
# rest) so that the test can stop each in the middle, its first checkpoint at step 100, however
# fast the machine trains, and without spending the CPU of thousands of steps.
LONG_STEPS = 300
LONG_PERIODS = (100, 101)
LONG_STEP_S = 0.2
# The time-limited copy's limit (minutes) until the test brings it near, and its SIGTERM's lead.
LONG_LIMIT_MIN = 30
SIGNAL_BEFORE_S = 120
LONG_MANIFEST = f"""{tiny_sweep("slurm_cluster_long", prepared=True)}EVAL_PERIOD = {LONG_STEPS // 2}
EVAL_MAX_TOKENS = 512
LOG_EVERY = 50
MIN_STEP_SECONDS = {LONG_STEP_S}

[env]
XLA_FLAGS = "--xla_force_host_platform_device_count=1 {fast_compile_flags()}"

{size_section("t32", d_model=32, d_ff=64, num_layers=2)}
[axes]
sizes = ["t32"]
target_langs = ["fr"]
seeds = [0]

[[grid]]
strategies = ["source", "cpt"]
gin_axes = {{ CHECKPOINT_PERIOD = [{LONG_PERIODS[0]}, {LONG_PERIODS[1]}] }}

[budget]
steps = {LONG_STEPS}
batch_size = 32

[strategies.cpt]
budget = {{ steps = 6 }}
"""
# The jobs compile as the suite's processes do (FAST_COMPILE_FLAGS in tests/conftest.py).
MANIFEST = MANIFEST.replace("FAST_COMPILE", fast_compile_flags())
WAIT_S = 900  # the whole sweep, queue to COMPLETED, on two shared CPUs (a bound: slow machines)
# The tiny source run alone (seed 1: its own job name); each process has one CPU device.
TWO_TASKS_MANIFEST = (
    MANIFEST.split("[[grid]]")[0].replace("seeds = [0]", "seeds = [1]")
    + '[[grid]]\nstrategies = ["source"]\n\n[budget]\nsteps = 6\nbatch_size = 8\n'
)


def sweep_data(tiny_data, tiny_prepared) -> dict[str, str]:
    """The data of this module's manifests (all of them read prepared data): `tiny_data`'s
    corpora and vocabulary, and `tiny_prepared` (the `PREPARED_DATA` variable)."""
    return {**tiny_data, "prepared": tiny_prepared}


def variables(data) -> dict[str, str]:
    """The manifest variables of `data` (`sweep_data`)."""
    return {
        "DATA_DIR": data["corpora"],
        "VOCAB_PATH": data["vocab"],
        "PREPARED_DATA": data["prepared"],
    }


def sweep_run(manifest: Path, runs_dir: Path, script_dir: Path, data, *extra: str) -> int:
    """`xlscale sweep run MANIFEST --launcher slurm` with `data`'s variables (`sweep_data`)."""
    from xlscale_cli import main as cli

    return cli.main(
        [
            "sweep",
            "run",
            str(manifest),
            *(f"--var={key}={value}" for key, value in variables(data).items()),
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


def sweep_runs(manifest: Path, runs_dir: Path, data) -> list[Run]:
    loaded = sweep.load_manifest(manifest, variables=variables(data), runs_dir=str(runs_dir))
    return sweep.expand(loaded)


def job_ids(script_dir: Path) -> dict[str, str]:
    """Run id -> job id, from the job logs `<run id>-<job id>.out`."""
    return {
        path.stem.rsplit("-", 1)[0]: path.stem.rsplit("-", 1)[1]
        for path in (script_dir / "logs").glob("*.out")
    }


def wait_for_empty_queue(cluster: SlurmCluster, script_dir: Path, timeout: float) -> None:
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


def job_log(script_dir: Path, run_id: str) -> str:
    return "".join(p.read_text() for p in (script_dir / "logs").glob(f"{run_id}-*.out"))


def loss_rows(run: Run) -> list[dict]:
    keys = ("step", "tokens", "tokens_by_task", "train/loss", "learning_rate", "eval/lm_en/loss")
    return [{k: r[k] for k in keys if k in r} for r in records.read_metrics(run.model_dir)]


def run_beside_one_process(cluster: SlurmCluster, data, tmp_path: Path, *flags: str):
    """Runs `TWO_TASKS_MANIFEST`'s run as a SLURM job of two JAX processes (`flags` say how they
    are placed) and, beside it, as one process with two devices; checks that both complete, that
    the job's log names both processes and that the two log the same losses. Returns the run,
    the job (`scontrol show job`) and its log. `data`: `sweep_data`."""
    manifest = tmp_path / "two_processes.toml"
    manifest.write_text(TWO_TASKS_MANIFEST)
    runs_dir, script_dir = tmp_path / "runs", tmp_path / "slurm"
    (run,) = sweep_runs(manifest, runs_dir, data)
    (reference,) = sweep_runs(manifest, tmp_path / "one", data)
    env = {**os.environ, **reference.environment()}
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=2 {fast_compile_flags()}"
    with open(tmp_path / "one.log", "w") as out:
        one = subprocess.Popen(
            reference.argv(sys.executable), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            assert sweep_run(manifest, runs_dir, script_dir, data, *flags) == 0
            wait_for_empty_queue(cluster, script_dir, WAIT_S)
            assert one.wait(timeout=WAIT_S) == 0, (tmp_path / "one.log").read_text()[-3000:]
        finally:
            if one.poll() is None:
                one.kill()
    job_id = job_ids(script_dir)[run.run_id]
    job, log = cluster.job(job_id), job_log(script_dir, run.run_id)
    assert "process 0 of 2" in log and "process 1 of 2" in log, log[-3000:]
    assert status.is_completed(run) and status.is_completed(reference)
    assert len(loss_rows(run)) == run.steps // 2
    assert loss_rows(run) == loss_rows(reference)
    return run, job, log
