"""The TPU-VM launcher: one `gcloud compute tpus tpu-vm ssh NAME --worker=all` per run.

Install the code on the workers first with `launch/tpu_vm_setup.sh NAME ZONE [PROJECT]`.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

from launch import zeroshot_stage
from launch.launchers import SequentialLauncher, options_from_args
from launch.runs import Run
from launch.status import Progress
from rundir import exits


def _remote_cd(directory: str) -> str:
    if directory == "~" or directory.startswith("~/"):
        return "cd ~" + (f"/{shlex.quote(directory[2:])}" if len(directory) > 2 else "")
    return f"cd {shlex.quote(directory)}"


class TpuVmLauncher(SequentialLauncher):
    """Runs each job on every worker of a TPU VM through
    `gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all --command '...'`: change to the
    checkout made by `launch/tpu_vm_setup.sh`, export the environment, run `trainer.train` (or
    `t5x.train` for the t5x runner).
    MODEL_DIR should be on shared storage (gs://...) that all workers and this machine see."""

    name = "tpu_vm"

    def __init__(
        self,
        *,
        tpu: str,
        zone: str,
        project: str | None = None,
        remote_dir: str = "~/xlscale",
        python: str = ".venv/bin/python",
        log_dir: str = "logs/tpu_vm",
        retries: int = 0,
        call: Callable[..., int] = subprocess.call,
    ):
        super().__init__(retries=retries)
        self.tpu, self.zone, self.project = tpu, zone, project
        self.remote_dir, self.python, self.log_dir = remote_dir, python, log_dir
        self.call = call

    @classmethod
    def add_arguments(cls, group) -> None:
        """Command-line options of this launcher."""
        group.add_argument("--tpu", help="TPU VM name")
        group.add_argument("--zone", help="TPU VM zone, e.g. us-central2-b")
        group.add_argument("--project", help="GCP project (default: gcloud's)")
        group.add_argument("--remote-dir", default="~/xlscale", help="checkout on the workers")

    @classmethod
    def from_args(cls, args) -> TpuVmLauncher:
        """Builds the launcher from parsed command-line options."""
        if not args.tpu or not args.zone:
            raise ValueError("--launcher tpu_vm needs --tpu NAME and --zone ZONE")
        return cls(**options_from_args(args, ("tpu", "zone", "project", "remote_dir", "retries")))

    def remote_command(self, run: Run, *, allow_missing: bool = False, score: bool = False) -> str:
        """The shell command each worker runs; it exports `XLSCALE_EXPECT_PLATFORM=tpu`, so a
        worker whose JAX finds no TPU refuses to start (exit 69) instead of training on its CPU.
        With `score`, the run's zero-shot stage instead of its training (`evals.score_run`, on
        every worker like the training; process 0 writes the results)."""
        env = {
            "PYTHONUNBUFFERED": "1",
            exits.EXPECT_PLATFORM_ENV: "tpu",
            **run.environment(allow_missing=allow_missing),
        }
        exports = "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        job = (
            zeroshot_stage.run_argv(run, self.python, allow_missing=allow_missing)
            if score
            else run.argv(self.python, allow_missing=allow_missing)
        )
        return f"{_remote_cd(self.remote_dir)} && {exports} && {shlex.join(job)}"

    def command(self, run: Run, *, allow_missing: bool = False, score: bool = False) -> list[str]:
        """The local gcloud argv for one run (with `score`, for its zero-shot stage)."""
        argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", self.tpu, "--zone", self.zone]
        argv += ["--project", self.project] if self.project else []
        remote = self.remote_command(run, allow_missing=allow_missing, score=score)
        return [*argv, "--worker=all", "--command", remote]

    def describe_score(self, run: Run) -> str:
        """The gcloud command of the run's zero-shot stage, shell-quoted."""
        return shlex.join(self.command(run, allow_missing=True, score=True))

    def execute_score(self, run: Run, progress: Progress) -> int:
        """Runs the zero-shot stage on the workers, logging beside the training's log."""
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(self.log_dir) / f"{run.run_id}.log", "a") as log:
            argv = self.command(run, score=True)
            return self.call(argv, stdout=log, stderr=subprocess.STDOUT)

    def describe(self, run: Run) -> str:
        """The gcloud command line, shell-quoted."""
        return shlex.join(self.command(run, allow_missing=True))

    def execute(self, run: Run, progress: Progress) -> int:
        """Runs the gcloud command, logging the workers' output under `log_dir`."""
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(self.log_dir) / f"{run.run_id}.log", "a") as log:
            return self.call(self.command(run), stdout=log, stderr=subprocess.STDOUT)
