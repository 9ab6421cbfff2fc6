"""The SLURM launcher: one multi-node GPU batch job per run, from `templates/slurm_gpu.sbatch`."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from launch.launchers import LaunchReport, start_launch
from launch.status import Progress
from launch.sweep import Run

TEMPLATES_DIR = Path(__file__).parent / "templates"
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


def render_template(text: str, values: dict[str, str]) -> str:
    """Fills `{{NAME}}` placeholders; a placeholder without a value, or a value without a
    placeholder, is an error (so template and launcher cannot drift apart silently)."""
    names = set(_PLACEHOLDER.findall(text))
    missing, unused = sorted(names - set(values)), sorted(set(values) - names)
    if missing or unused:
        raise ValueError(f"template placeholders missing values {missing}, unused values {unused}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


class SlurmLauncher:
    """Submits one multi-node GPU batch job per run (`templates/slurm_gpu.sbatch`), chained with
    `--dependency=afterok:<parent job>`; each node runs one JAX process, which finds its peers
    through the `jax.distributed` environment the script exports."""

    name = "slurm"

    def __init__(
        self,
        *,
        nodes: int = 1,
        gpus_per_node: int = 8,
        cpus_per_task: int = 32,
        time_limit: str = "48:00:00",
        partition: str | None = None,
        account: str | None = None,
        script_dir: str = "slurm",
        workdir: str | None = None,
        python: str = "python",
        port: int = 12345,
        template: Path = TEMPLATES_DIR / "slurm_gpu.sbatch",
        submit: Callable[[list[str]], str] | None = None,
        queued: Callable[[], dict[str, str]] | None = None,
    ):
        self.nodes, self.gpus_per_node, self.cpus_per_task = nodes, gpus_per_node, cpus_per_task
        self.time_limit, self.partition, self.account = time_limit, partition, account
        self.script_dir, self.workdir = script_dir, workdir or os.getcwd()
        self.python, self.port, self.template = python, port, Path(template)
        self.submit = submit or _sbatch
        self.queued = queued or _squeue

    @classmethod
    def add_arguments(cls, group) -> None:
        """Command-line options of this launcher."""
        group.add_argument("--nodes", type=int, default=1, help="nodes per run (SLURM)")
        group.add_argument("--gpus-per-node", type=int, default=8)
        group.add_argument("--partition")
        group.add_argument("--account")
        group.add_argument("--time-limit", default="48:00:00")
        group.add_argument("--script-dir", default="slurm", help="where sbatch scripts are written")
        group.add_argument("--slurm-python", default="python", help="python on the nodes")

    @classmethod
    def from_args(cls, args) -> SlurmLauncher:
        """Builds the launcher from parsed command-line options."""
        return cls(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            partition=args.partition,
            account=args.account,
            time_limit=args.time_limit,
            script_dir=args.script_dir,
            python=args.slurm_python,
        )

    def render(self, run: Run, *, allow_missing: bool = False) -> str:
        """The batch script of one run."""
        sbatch = [f"#SBATCH --partition={self.partition}"] if self.partition else []
        sbatch += [f"#SBATCH --account={self.account}"] if self.account else []
        env = {"PYTHONUNBUFFERED": "1", **run.environment()}
        values = {
            "JOB_NAME": run.run_id,
            "NODES": str(self.nodes),
            "GPUS_PER_NODE": str(self.gpus_per_node),
            "CPUS_PER_TASK": str(self.cpus_per_task),
            "TIME_LIMIT": self.time_limit,
            "LOG_DIR": str(Path(self.script_dir) / "logs"),
            "EXTRA_SBATCH": "\n".join(sbatch),
            "WORKDIR": shlex.quote(self.workdir),
            "EXPORTS": "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
            "COORDINATOR_PORT": str(self.port),
            "COMMAND": shlex.join(run.argv(self.python, allow_missing=allow_missing)),
        }
        return render_template(self.template.read_text(), values)

    def launch(
        self, runs: Sequence[Run], *, dry_run: bool = False, progress: Progress | None = None
    ) -> LaunchReport:
        """Writes a script per pending run and submits them with dependencies (prints the sbatch
        commands instead when `dry_run`; the scripts are written either way, for inspection)."""
        pending, progress, report = start_launch(runs, progress)
        (Path(self.script_dir) / "logs").mkdir(parents=True, exist_ok=True)
        # Runs already queued or running (job name = run id) are not submitted twice; their job
        # ids still chain the runs that depend on them.
        in_queue = {} if dry_run else self.queued()
        job_ids: dict[str, str] = {}
        for run in pending:
            if run.run_id in in_queue:
                job_ids[run.run_id] = in_queue[run.run_id]
                progress.skip(run, f"already in the queue as job {in_queue[run.run_id]}")
                continue
            script = Path(self.script_dir) / f"{run.run_id}.sbatch"
            script.write_text(self.render(run, allow_missing=dry_run))
            deps = [job_ids[d] for d in run.depends_on if d in job_ids]
            argv = ["sbatch", "--parsable"]
            argv += [f"--dependency=afterok:{':'.join(deps)}"] if deps else []
            argv.append(str(script))
            if dry_run:
                job_ids[run.run_id] = f"<job:{run.run_id}>"
                report.commands.append(shlex.join(argv))
                print(shlex.join(argv), file=progress.stream, flush=True)
                continue
            job_ids[run.run_id] = self.submit(argv)
            report.submitted.append(run.run_id)
            progress.note(f"submitted {run.run_id} as job {job_ids[run.run_id]}")
        return report


def _squeue() -> dict[str, str]:
    """Job name -> id of this user's queued and running jobs ({} where squeue is unavailable)."""
    try:
        out = subprocess.run(
            ["squeue", "--me", "--noheader", "--format=%j %i"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def _sbatch(argv: list[str]) -> str:
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return out.strip().split(";")[0]
