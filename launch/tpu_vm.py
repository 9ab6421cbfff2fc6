"""The TPU-VM launcher: one `gcloud compute tpus tpu-vm ssh NAME --worker=all` per run, or on
several slices joined by the data-center network (`--num-slices N`), one per slice at once.

Install the code on the workers first with `launch/tpu_vm_setup.sh NAME ZONE [PROJECT]` (on
several slices, once per slice).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from concurrent import futures
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


# The trainer's binding that makes its mesh data-parallel across slices (`MeshConfig.num_slices`).
NUM_SLICES_BINDING = "partitioning.MeshConfig.num_slices"


def slice_names(tpu: str, num_slices: int) -> list[str]:
    """The TPU VMs of a job: `tpu` itself, or on several slices the nodes of a multislice queued
    resource (`gcloud compute tpus queued-resources create ... --node-count N --node-prefix
    TPU`), which Cloud TPU names TPU-0 ... TPU-(N-1)."""
    return [tpu] if num_slices == 1 else [f"{tpu}-{i}" for i in range(num_slices)]


class TpuVmLauncher(SequentialLauncher):
    """Runs each job on every worker of a TPU VM through
    `gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all --command '...'`: change to the
    checkout made by `launch/tpu_vm_setup.sh`, export the environment, run `trainer.train` (or
    `t5x.train` for the t5x runner).
    MODEL_DIR should be on shared storage (gs://...) that all workers and this machine see.

    With `num_slices` > 1 the job runs on the N slices of a multislice queued resource at once
    (`slice_names`), one ssh per slice, and the trainer builds a mesh that is data-parallel
    across them (`--gin.partitioning.MeshConfig.num_slices=N`). Cloud TPU gives the slices'
    workers the `MEGASCALE_*` settings from which JAX finds every process of the job."""

    name = "tpu_vm"

    def __init__(
        self,
        *,
        tpu: str,
        zone: str,
        project: str | None = None,
        remote_dir: str = "~/xlscale",
        num_slices: int = 1,
        python: str = ".venv/bin/python",
        log_dir: str = "logs/tpu_vm",
        retries: int = 0,
        call: Callable[..., int] = subprocess.call,
    ):
        super().__init__(retries=retries)
        if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
            raise ValueError(
                f"--num-slices {num_slices!r}: allowed an integer >= 1 (the TPU slices a job "
                "runs on, data parallel across them; 1 = the single TPU VM --tpu)"
            )
        self.tpu, self.zone, self.project = tpu, zone, project
        self.remote_dir, self.num_slices = remote_dir, num_slices
        self.python, self.log_dir = python, log_dir
        self.call = call

    @classmethod
    def add_arguments(cls, group) -> None:
        """Command-line options of this launcher."""
        group.add_argument("--tpu", help="TPU VM name")
        group.add_argument("--zone", help="TPU VM zone, e.g. us-central2-b")
        group.add_argument("--project", help="GCP project (default: gcloud's)")
        group.add_argument("--remote-dir", default="~/xlscale", help="checkout on the workers")
        group.add_argument(
            "--num-slices",
            type=int,
            default=1,
            help="TPU slices per job, data parallel across the data-center network: the nodes "
            "TPU-0 ... TPU-(N-1) of a multislice queued resource whose --node-prefix is --tpu",
        )

    @classmethod
    def from_args(cls, args) -> TpuVmLauncher:
        """Builds the launcher from parsed command-line options."""
        if not args.tpu or not args.zone:
            raise ValueError("--launcher tpu_vm needs --tpu NAME and --zone ZONE")
        names = ("tpu", "zone", "project", "remote_dir", "num_slices", "retries")
        return cls(**options_from_args(args, names))

    @property
    def slices(self) -> list[str]:
        """The TPU VMs every job runs on (`slice_names`)."""
        return slice_names(self.tpu, self.num_slices)

    def job_argv(self, run: Run, *, allow_missing: bool = False) -> list[str]:
        """The training command line; on several slices with the trainer's binding that makes
        its mesh span them.

        Raises:
          ValueError: several slices for a run that T5X trains (its partitioner builds its own
            mesh), or see `Run.argv`.
        """
        if self.num_slices == 1:
            return run.argv(self.python, allow_missing=allow_missing)
        if run.runner != "xlscale":
            raise ValueError(
                f"--num-slices {self.num_slices}: run {run.run_id} is trained by the "
                f"{run.runner!r} runner, whose partitioner builds its own mesh; allowed: "
                "--num-slices 1, or runs of xlscale's trainer"
            )
        argv = run.argv(self.python, allow_missing=allow_missing)
        return [*argv, f"--gin.{NUM_SLICES_BINDING}={self.num_slices}"]

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
        # The zero-shot stage runs on every slice too: each worker's JAX waits for all the
        # job's processes, and the scorer's mesh over all devices works across slices.
        job = (
            zeroshot_stage.run_argv(run, self.python, allow_missing=allow_missing)
            if score
            else self.job_argv(run, allow_missing=allow_missing)
        )
        return f"{_remote_cd(self.remote_dir)} && {exports} && {shlex.join(job)}"

    def commands(
        self, run: Run, *, allow_missing: bool = False, score: bool = False
    ) -> list[list[str]]:
        """The local gcloud argvs for one run, one per slice (with `score`, for its zero-shot
        stage); they run at once."""
        remote = self.remote_command(run, allow_missing=allow_missing, score=score)
        where = ["--zone", self.zone, *(["--project", self.project] if self.project else [])]
        return [
            ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name, *where, "--worker=all"]
            + ["--command", remote]
            for name in self.slices
        ]

    def command(self, run: Run, *, allow_missing: bool = False, score: bool = False) -> list[str]:
        """The local gcloud argv for one run on the first (or only) slice."""
        return self.commands(run, allow_missing=allow_missing, score=score)[0]

    @staticmethod
    def _shell(argvs: list[list[str]]) -> str:
        """Shell text that runs `argvs` as the launcher does: one command, or one line a slice
        in the background and a `wait` (the slices must run at once)."""
        if len(argvs) == 1:
            return shlex.join(argvs[0])
        return "".join(f"{shlex.join(argv)} &\n" for argv in argvs) + "wait"

    def describe_score(self, run: Run) -> str:
        """The gcloud commands of the run's zero-shot stage, shell-quoted (`_shell`)."""
        return self._shell(self.commands(run, allow_missing=True, score=True))

    def execute_score(self, run: Run, progress: Progress) -> int:
        """Runs the zero-shot stage on the workers, logging beside the training's logs."""
        return self._run_on_slices(run, self.commands(run, score=True))

    def describe(self, run: Run) -> str:
        """The gcloud commands, shell-quoted (`_shell`)."""
        return self._shell(self.commands(run, allow_missing=True))

    def execute(self, run: Run, progress: Progress) -> int:
        """Runs the gcloud commands, logging the workers' output under `log_dir`."""
        return self._run_on_slices(run, self.commands(run))

    def log_paths(self, run: Run) -> list[Path]:
        """Where each slice's workers' output goes: `RUN_ID.log`, or on several slices
        `RUN_ID.slice-I.log`."""
        if self.num_slices == 1:
            return [Path(self.log_dir) / f"{run.run_id}.log"]
        return [Path(self.log_dir) / f"{run.run_id}.slice-{i}.log" for i in range(self.num_slices)]

    def _run_on_slices(self, run: Run, argvs: list[list[str]]) -> int:
        """Runs one command per slice at once (a multislice job starts only when every slice's
        processes have joined) and returns the first non-zero exit status, or 0."""
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)

        def one(argv: list[str], path: Path) -> int:
            with open(path, "a") as log:
                return self.call(argv, stdout=log, stderr=subprocess.STDOUT)

        paths = self.log_paths(run)
        if len(argvs) == 1:
            return one(argvs[0], paths[0])
        with futures.ThreadPoolExecutor(max_workers=len(argvs)) as pool:
            codes = list(pool.map(one, argvs, paths))
        return next((code for code in codes if code), 0)
