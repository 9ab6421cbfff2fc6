"""The SLURM launcher: one batch job per run (GPU or CPU nodes, one or several JAX processes per
node), from `templates/slurm_gpu.sbatch`; jobs stopped at their time limit or preempted requeue
themselves and resume. Also what the scheduler says about each run's job (`scheduler_jobs`:
`squeue`, and `sacct` where accounting is on)."""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from launch import cli_options, sbatch_options, zeroshot_stage
from launch.launchers import LaunchReport, options_from_args, start_launch
from launch.runs import Run
from launch.status import PREEMPTED_EXIT_CODE, Progress
from rundir import exits

TEMPLATES_DIR = Path(__file__).parent / "templates"
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
# How often a job script asks SLURM for its end time again (seconds): a time limit changed while
# the job runs moves the script's SIGTERM before it (SLURM's own limit check runs every 30 s).
LIMIT_POLL_S = 30


def sbatch_line(option: str) -> str:
    """One extra `#SBATCH` option as given on the command line (`--constraint=h100`, with or
    without the `#SBATCH` prefix), checked to be a single long option the launcher does not set
    itself (`launch.sbatch_options`), so it cannot break the script it is written into.

    Raises:
      ValueError: one line naming `--sbatch-line`, the value and what is allowed.
    """
    return sbatch_options.sbatch_option(option, where="--sbatch-line")


def render_template(text: str, values: dict[str, str]) -> str:
    """Fills `{{NAME}}` placeholders; a placeholder without a value, or a value without a
    placeholder, is an error (so template and launcher cannot drift apart silently)."""
    names = set(_PLACEHOLDER.findall(text))
    missing, unused = sorted(names - set(values)), sorted(set(values) - names)
    if missing or unused:
        raise ValueError(f"template placeholders missing values {missing}, unused values {unused}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


class SlurmLauncher:
    """Submits one batch job per run (`templates/slurm_gpu.sbatch`), chained with
    `--dependency=afterok:<parent job>`; each node runs `tasks_per_node` JAX processes (1: one
    process drives all the node's GPUs; one per GPU is common too), which find their peers
    through the `jax.distributed` environment the script exports whenever the job has several
    tasks, each process driving its share of the node's GPUs.

    The resources asked are the ones given, nothing more: `gpus_per_node=0` asks for no GPU
    (CPU partitions have no `gpu` gres, and a request for 0 of them pends forever there), and
    `partition`, `account`, `qos`, `mem` and extra `#SBATCH` lines (the manifest's `[slurm]
    sbatch_lines`, then `sbatch_lines`) appear only when set. A trainer stopped early with its
    checkpoint saved (exit 75: a SIGTERM `signal_before` seconds ahead of each start's time
    limit, sent by the script's own timer, or a preemption), or killed by a SIGTERM it could not
    catch (exit 143: while starting or exiting), makes the script requeue its own job, at most
    `max_requeues` times as counted by SLURM, so the run resumes from its last checkpoint,
    completes, and its dependents start. The script does not use sbatch's `--signal`: slurmctld sends that on its
    30-s limit check and, in SLURM 22.05, to a requeued job right as it starts again, before the
    trainer can catch it (measured on the test cluster: the restarted job then fails).
    """

    name = "slurm"

    def __init__(
        self,
        *,
        nodes: int = 1,
        tasks_per_node: int = 1,
        gpus_per_node: int = 8,
        cpus_per_task: int = 32,
        mem: str | None = None,
        time_limit: str = "48:00:00",
        partition: str | None = None,
        account: str | None = None,
        qos: str | None = None,
        sbatch_lines: Sequence[str] = (),
        max_requeues: int = 3,
        signal_before: int = 300,
        script_dir: str = "slurm",
        workdir: str | None = None,
        python: str = "python",
        port: int = 12345,
        template: Path = TEMPLATES_DIR / "slurm_gpu.sbatch",
        submit: Callable[[list[str]], str] | None = None,
        queued: Callable[[], dict[str, str]] | None = None,
    ):
        if nodes < 1 or gpus_per_node < 0 or cpus_per_task < 1 or max_requeues < 0:
            raise ValueError(
                f"slurm: nodes {nodes} (>= 1), gpus per node {gpus_per_node} (>= 0), cpus per "
                f"task {cpus_per_task} (>= 1) and max requeues {max_requeues} (>= 0) are out of range"
            )
        if tasks_per_node < 1 or (gpus_per_node and gpus_per_node % tasks_per_node):
            raise ValueError(
                f"slurm: --tasks-per-node {tasks_per_node}: give a count >= 1 that divides "
                f"--gpus-per-node {gpus_per_node} (each process drives the same number of GPUs)"
            )
        self.nodes, self.gpus_per_node, self.cpus_per_task = nodes, gpus_per_node, cpus_per_task
        self.tasks_per_node = tasks_per_node
        self.mem, self.time_limit = mem, time_limit
        self.partition, self.account, self.qos = partition, account, qos
        self.sbatch_lines = [sbatch_line(line) for line in sbatch_lines]
        self.max_requeues, self.signal_before = max_requeues, signal_before
        self.script_dir, self.workdir = script_dir, workdir or os.getcwd()
        self.python, self.port, self.template = python, port, Path(template)
        self.submit = submit or _sbatch
        self.queued = queued or _squeue

    @classmethod
    def add_arguments(cls, group) -> None:
        """Command-line options of this launcher."""
        group.add_argument("--nodes", type=int, default=1, help="nodes per run (SLURM)")
        group.add_argument(
            "--tasks-per-node",
            type=int,
            default=1,
            help="JAX processes per node (1: one drives all the node's GPUs; or one per GPU); "
            "several tasks in all start jax.distributed from SLURM's variables",
        )
        group.add_argument(
            "--gpus-per-node", type=int, default=8, help="0 asks for no GPU (CPU partitions)"
        )
        group.add_argument("--cpus-per-task", type=int, default=32, help="CPUs per task")
        group.add_argument("--mem", help="memory per node, e.g. 64G (default: the partition's)")
        group.add_argument("--partition")
        group.add_argument("--account")
        group.add_argument("--qos")
        cli_options.repeatable(
            group,
            "--sbatch-line",
            metavar="OPTION",
            help="an extra #SBATCH line, e.g. '--constraint=h100' (repeatable)",
        )
        group.add_argument("--time-limit", default="48:00:00")
        group.add_argument(
            "--max-requeues",
            type=int,
            default=3,
            help="times a job stopped at its time limit or preempted (checkpoint saved, exit 75) "
            "requeues itself; 0 never",
        )
        group.add_argument(
            "--signal-before",
            type=int,
            default=300,
            metavar="SECONDS",
            help="SIGTERM (checkpoint and stop) this long before each start's time limit",
        )
        group.add_argument("--script-dir", default="slurm", help="where sbatch scripts are written")
        group.add_argument("--slurm-python", default="python", help="python on the nodes")
        group.add_argument(
            "--slurm-workdir", help="the xlscale checkout on the nodes (default: this directory)"
        )

    @classmethod
    def from_args(cls, args) -> SlurmLauncher:
        """Builds the launcher from parsed command-line options."""
        same = "nodes tasks_per_node gpus_per_node cpus_per_task mem partition account qos"
        same += " time_limit max_requeues signal_before script_dir"
        return cls(
            **options_from_args(
                args,
                same.split(),
                sbatch_lines="sbatch_line",
                workdir="slurm_workdir",
                python="slurm_python",
            )
        )

    def sbatch_options(self, run: Run | None = None) -> list[str]:
        """The optional `#SBATCH` lines: only the resources and placement that were asked for,
        then the extra lines of `run`'s manifest (`[slurm] sbatch_lines`) and of the launcher."""
        options = [f"--gpus-per-node={self.gpus_per_node}"] if self.gpus_per_node else []
        options += [f"--mem={self.mem}"] if self.mem else []
        options += [
            f"--{name}={value}"
            for name, value in (
                ("partition", self.partition),
                ("account", self.account),
                ("qos", self.qos),
            )
            if value
        ]
        options.append("--requeue" if self.max_requeues else "--no-requeue")
        extra = sbatch_options.merge(run.sbatch_lines if run else (), self.sbatch_lines)
        return [f"#SBATCH {option}" for option in options + extra]

    def render(self, run: Run, *, allow_missing: bool = False, score: bool = False) -> str:
        """The batch script of one run. A job that asks for GPUs exports the expectation
        (`XLSCALE_EXPECT_PLATFORM=gpu`): its trainer refuses to start, exit 69, if JAX finds no GPU
        rather than train on the CPU backend (a run's own environment may say otherwise).

        With `score`, the script of the run's zero-shot stage (`evals.score_run`): one process on
        one node, named `<run id>.zeroshot`, from the same template."""
        expect = {exits.EXPECT_PLATFORM_ENV: "gpu"} if self.gpus_per_node else {}
        env = {"PYTHONUNBUFFERED": "1", **expect, **run.environment()}
        nodes, tasks = (1, 1) if score else (self.nodes, self.tasks_per_node)
        command = (
            zeroshot_stage.run_argv(run, self.python, allow_missing=allow_missing)
            if score
            else run.argv(self.python, allow_missing=allow_missing)
        )
        values = {
            "JOB_NAME": zeroshot_stage.job_name(run) if score else run.run_id,
            "NODES": str(nodes),
            "TASKS_PER_NODE": str(tasks),
            "GPUS_PER_TASK": str(self.gpus_per_node // tasks),
            "CPUS_PER_TASK": str(self.cpus_per_task),
            "TIME_LIMIT": self.time_limit,
            "SIGNAL_BEFORE": str(self.signal_before),
            "LIMIT_POLL_S": str(LIMIT_POLL_S),
            "LOG_DIR": str(Path(self.script_dir) / "logs"),
            "EXTRA_SBATCH": "\n".join(self.sbatch_options(run)),
            "WORKDIR": shlex.quote(self.workdir),
            "EXPORTS": "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
            "COORDINATOR_PORT": str(self.port),
            "MAX_REQUEUES": str(self.max_requeues),
            "PREEMPTED_EXIT_CODE": str(PREEMPTED_EXIT_CODE),
            "COMMAND": shlex.join(command),
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
            if report.block_if_dependency_failed(run, progress):
                continue
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
            try:
                job_ids[run.run_id] = self.submit(argv)
            except SubmitError as e:
                report.failed.append(run.run_id)
                progress.skip(run, str(e))
                continue
            report.submitted.append(run.run_id)
            progress.note(f"submitted {run.run_id} as job {job_ids[run.run_id]}")
        self._submit_scoring(runs, job_ids, in_queue, report, progress, dry_run=dry_run)
        return report

    def cancel_queued(self, run: Run) -> str | None:
        """Cancels the run's jobs that are still waiting in the queue (its training job and its
        zero-shot stage), for an adaptive sweep that skipped it: a skipped run then takes no
        allocation. `scancel --state=PENDING` leaves a job that started meanwhile to find its stop
        request and exit 79. Returns what was cancelled, or None."""
        user = pwd.getpwuid(os.getuid()).pw_name
        names = [run.run_id, zeroshot_stage.job_name(run)]
        argv = ["squeue", f"--user={user}", "--states=PENDING", "--noheader", "--format=%i"]
        out = _client([*argv, f"--name={','.join(names)}"])
        ids = (out or "").split()
        if not ids or _client(["scancel", "--state=PENDING", *ids]) is None:
            return None
        return f"cancelled queued job{'s' if len(ids) > 1 else ''} {', '.join(ids)} of {run.run_id}"

    def _submit_scoring(
        self,
        runs: Sequence[Run],
        job_ids: dict[str, str],
        in_queue: dict[str, str],
        report: LaunchReport,
        progress: Progress,
        *,
        dry_run: bool,
    ) -> None:
        """The zero-shot stage (`launch.zeroshot_stage`): a job `<run id>.zeroshot` per run that
        has one, after its training job (`--dependency=afterok:`), or at once for a run already
        completed but not scored; none while one is queued, or when the run is scored."""
        skipped = set(report.skipped)
        for run in runs:
            if run.zeroshot is None:
                continue
            waits_for = job_ids.get(run.run_id)
            if waits_for is None and not (
                run.run_id in skipped and zeroshot_stage.needs_scoring(run)
            ):
                continue  # not submitted (blocked, failed) or already scored
            name = zeroshot_stage.job_name(run)
            if name in in_queue:
                progress.note(
                    f"zero-shot of {run.run_id} already in the queue as job {in_queue[name]}"
                )
                continue
            script = Path(self.script_dir) / f"{name}.sbatch"
            script.write_text(self.render(run, allow_missing=dry_run, score=True))
            argv = ["sbatch", "--parsable"]
            argv += [f"--dependency=afterok:{waits_for}"] if waits_for else []
            argv.append(str(script))
            if dry_run:
                report.commands.append(shlex.join(argv))
                print(shlex.join(argv), file=progress.stream, flush=True)
                continue
            try:
                job = self.submit(argv)
            except SubmitError as e:
                report.score_failed.append(run.run_id)
                progress.note(f"zero-shot of {run.run_id}: {e}")
                continue
            report.submitted.append(name)
            progress.note(f"submitted the zero-shot stage of {run.run_id} as job {job}")


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


class SubmitError(RuntimeError):
    """sbatch refused a job (its message says why: an unknown partition, a request the cluster
    cannot satisfy); the run and its dependents are not submitted."""


def _sbatch(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
    except OSError as e:
        raise SubmitError(f"sbatch cannot start: {e}") from e
    if done.returncode != 0:
        raise SubmitError(f"sbatch refused the job: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip().split(";")[0]


# Pending reasons that do not go away by waiting: the job asks what its partition cannot give,
# or a job it depends on failed. -> what to do about it.
STUCK_REASONS = {
    "PartitionConfig": "the partition cannot give what the job asks (--cpus-per-task, "
    "--gpus-per-node, --mem, --nodes, --time-limit): scancel, and run the sweep asking less",
    "PartitionNodeLimit": "more nodes than the partition allows: cancel, submit with --nodes lower",
    "PartitionTimeLimit": "a longer --time-limit than the partition allows: cancel and resubmit",
    "DependencyNeverSatisfied": "a job it depends on failed: fix that run and run the sweep again",
    "InvalidAccount": "the --account is not valid here",
    "InvalidQOS": "the --qos is not valid here",
}
_SQUEUE_FIELDS = ("JobID", "Name", "State", "Reason", "TimeUsed", "NodeList", "RestartCnt")


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """A run's newest job as SLURM shows it (its queue, or accounting for finished jobs): id,
    state (PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...), the reason it waits or ended
    (Dependency, DependencyNeverSatisfied, PartitionConfig, NonZeroExitCode, TimeLimit, ...),
    time used, node(s), requeues so far, and the exit code (`2:0`; accounting only)."""

    job_id: str
    state: str
    reason: str
    elapsed: str
    nodes: str
    restarts: int
    exit_code: str = ""

    @property
    def stuck(self) -> str | None:
        """What to do when the job waits for something that will not come, else None."""
        return STUCK_REASONS.get(self.reason) if self.state == "PENDING" else None

    def describe(self) -> str:
        """`1234 PENDING (Dependency)`, `1235 RUNNING 0:42 on node7, requeued 1`,
        `1236 FAILED (NonZeroExitCode) exit 2:0 0:03 on node7`: one cell."""
        text = f"{self.job_id} {self.state}"
        if self.reason and self.reason != "None":
            text += f" ({self.reason})"
        if self.exit_code and self.exit_code != "0:0":
            text += f" exit {self.exit_code}"
        if self.state not in ("PENDING", "CANCELLED") and self.elapsed:
            text += f" {self.elapsed}" + (f" on {self.nodes}" if self.nodes else "")
        return text + (f", requeued {self.restarts}" if self.restarts else "")


def parse_squeue(text: str) -> dict[str, SlurmJob]:
    """Run id (job name) -> its newest job (highest id), from `squeue --Format` lines of
    `_SQUEUE_FIELDS` each ending in `|`."""
    jobs: dict[str, SlurmJob] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(_SQUEUE_FIELDS):
            continue
        job_id, name, state, reason, elapsed, nodes, restarts = fields[: len(_SQUEUE_FIELDS)]
        job = SlurmJob(
            job_id=job_id.strip(),
            state=state.strip(),
            reason=reason.strip(),
            elapsed=elapsed.strip(),
            nodes=nodes.strip(),
            restarts=int(restarts) if restarts.strip().isdigit() else 0,
        )
        name = name.strip()
        if name not in jobs or _job_number(job) > _job_number(jobs[name]):
            jobs[name] = job
    return jobs


def _job_number(job: SlurmJob) -> int:
    head = job.job_id.split("_")[0]
    return int(head) if head.isdigit() else -1


# Where SLURM's clients find their configuration when SLURM_CONF is not set.
CONFIG_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")


# `sacct` columns, in this order (`--parsable2`: `|` between fields, none at the end).
_SACCT_FIELDS = ("JobID", "JobName", "State", "Reason", "Elapsed", "NodeList", "ExitCode")


def parse_sacct(text: str) -> dict[str, SlurmJob]:
    """Run id (job name) -> its newest job, from `sacct --allocations --duplicates --parsable2
    --noheader --format=<_SACCT_FIELDS>` lines, as documented in sacct(1) of SLURM 22.05:
    `1234|<run id>|COMPLETED|None|00:12:03|node7|0:0`.

    With `--duplicates`, each earlier start of a requeued job is a line of its own under the
    same id (state REQUEUED, PREEMPTED, NODE_FAIL, ...), before the newest one: a job's requeues
    are its lines less one (sacct has no restart count). `CANCELLED by 0` is CANCELLED; a job
    that never ran has the node list `None assigned` (no node).
    """
    lines: dict[str, list[list[str]]] = {}
    names: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != len(_SACCT_FIELDS) or "." in fields[0]:  # not a job step's line
            continue
        lines.setdefault(fields[0], []).append(fields)
        names[fields[0]] = fields[1]
    jobs: dict[str, SlurmJob] = {}
    for job_id, attempts in lines.items():
        _, name, state, reason, elapsed, nodes, exit_code = attempts[-1]
        job = SlurmJob(
            job_id=job_id,
            state=state.split(" ")[0],
            reason=reason,
            elapsed=elapsed,
            nodes="" if nodes == "None assigned" else nodes,
            restarts=len(attempts) - 1,
            exit_code=exit_code,
        )
        if name not in jobs or _job_number(job) > _job_number(jobs[name]):
            jobs[name] = job
    return jobs


def merge_jobs(
    queued: dict[str, SlurmJob] | None, accounted: dict[str, SlurmJob] | None
) -> dict[str, SlurmJob] | None:
    """Run id -> newest job, from the queue (`squeue`: live state and restart count) and
    accounting (`sacct`: jobs finished long ago, exit codes); the queue wins for the same job,
    keeping accounting's exit code. None when neither answered."""
    if queued is None and accounted is None:
        return None
    jobs = dict(accounted or {})
    for name, job in (queued or {}).items():
        old = jobs.get(name)
        if old is None or _job_number(job) > _job_number(old):
            jobs[name] = job
        elif old.job_id == job.job_id:
            jobs[name] = dataclasses.replace(
                job,
                exit_code=job.exit_code or old.exit_code,
                restarts=max(job.restarts, old.restarts),
            )
    return jobs


def slurm_configured() -> bool:
    """Whether this machine is a SLURM client: `squeue` installed and a configuration to read
    (SLURM_CONF or a standard path), so asking the queue cannot hang or search the network."""
    if shutil.which("squeue") is None:
        return False
    paths = [os.environ["SLURM_CONF"]] if os.environ.get("SLURM_CONF") else CONFIG_PATHS
    return any(Path(p).is_file() for p in paths)


def scheduler_jobs(run_ids: Sequence[str]) -> dict[str, SlurmJob] | None:
    """This user's newest SLURM job for each run id (job name = run id): queued and running
    jobs, and finished ones from `sacct` where accounting is on (any age: state, exit code,
    elapsed, node, requeues), else from `squeue --states=all` while slurmctld remembers them
    (MinJobAge; clusters without slurmdbd, such as the single-node test cluster). None where
    neither answers (not installed, no controller), so callers can tell "no scheduler" from
    "not queued"."""
    wanted = set(run_ids)
    argv = ["squeue", "--me", "--states=all", "--noheader"]
    argv.append("--Format=" + ",".join(f"{field}:|" for field in _SQUEUE_FIELDS))
    out = _client(argv)
    queued = None if out is None else parse_squeue(out)
    accounted = None
    if wanted:
        user = pwd.getpwuid(os.getuid()).pw_name
        argv = ["sacct", "--allocations", "--duplicates", "--parsable2", "--noheader"]
        argv += [f"--user={user}", "--starttime=1970-01-01", f"--name={','.join(sorted(wanted))}"]
        argv.append("--format=" + ",".join(_SACCT_FIELDS))
        out = _client(argv)  # fails where accounting storage is disabled
        accounted = None if out is None else parse_sacct(out)
    jobs = merge_jobs(queued, accounted)
    return None if jobs is None else {name: j for name, j in jobs.items() if name in wanted}


def _client(argv: list[str]) -> str | None:
    """A SLURM client's output, or None when it is missing, times out or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None
