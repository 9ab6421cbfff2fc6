"""Launchers: run a sweep's `Run`s here (`LocalLauncher`), on a TPU VM (`launch.tpu_vm`), on a
SLURM GPU cluster (`launch.slurm`) or through xmanager (`launch.xm_launch`). Every launcher starts
the same `trainer.train` command line, so what runs on a pod is exactly what runs here.

The common contract: `launcher.launch(runs, dry_run=..., progress=...)` walks the runs in
dependency order, skips those whose `MODEL_DIR/COMPLETED` exists, and (re)starts the others;
an interrupted run resumes because the trainer continues from the checkpoint in its MODEL_DIR.
Dry runs print the commands and start nothing. Each launcher class also has
`add_arguments(group)` and `from_args(args)` for `xlscale sweep run`.
"""

from __future__ import annotations

import abc
import concurrent.futures as futures
import dataclasses
import datetime
import importlib
import json
import logging
import multiprocessing
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from launch import zeroshot_stage
from launch.runs import Run
from launch.status import (
    LAUNCH_FILE,
    LOG_FILE,
    PREEMPTED_EXIT_CODE,
    Progress,
    is_completed,
    last_metrics,
    last_step,
    local_path,
    read_json,
)
from launch.sweep import topological_order
from pipelines import native_logs
from rundir import exits, names, stop_request, storage

# Name -> "module:Class"; imported on use, so `xmanager` costs nothing until chosen.
LAUNCHERS: dict[str, str] = {
    "local": "launch.launchers:LocalLauncher",
    "tpu_vm": "launch.tpu_vm:TpuVmLauncher",
    "slurm": "launch.slurm:SlurmLauncher",
    "xmanager": "launch.xm_launch:XManagerLauncher",
}


def options_from_args(args: Any, same: Sequence[str] = (), **renamed: str) -> dict[str, Any]:
    """A launcher's keyword arguments from parsed command-line options (`from_args`): each name in
    `same` from the option of that dest, each `keyword="dest"` of `renamed` from its option."""
    return {
        **{keyword: getattr(args, keyword) for keyword in same},
        **{keyword: getattr(args, dest) for keyword, dest in renamed.items()},
    }


def get_launcher(name: str) -> type:
    """The launcher class registered as `name`."""
    if name not in LAUNCHERS:
        raise ValueError(f"unknown launcher {name!r}; choose one of {', '.join(LAUNCHERS)}")
    module, cls = LAUNCHERS[name].split(":")
    return getattr(importlib.import_module(module), cls)


@dataclasses.dataclass
class LaunchReport:
    """What a launch did: ids completed now, skipped as already done, failed, blocked by a failed
    dependency, submitted (asynchronous launchers), and the rendered commands of a dry run."""

    completed: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    blocked: list[str] = dataclasses.field(default_factory=list)
    submitted: list[str] = dataclasses.field(default_factory=list)
    commands: list[str] = dataclasses.field(default_factory=list)
    # The zero-shot stage (`launch.zeroshot_stage`): runs scored now, and runs whose scoring failed.
    scored: list[str] = dataclasses.field(default_factory=list)
    score_failed: list[str] = dataclasses.field(default_factory=list)
    # Runs not started or stopped because their MODEL_DIR holds a stop request (`rundir.stop_request`).
    stopped: list[str] = dataclasses.field(default_factory=list)

    def stop_if_requested(self, run: Run, progress: Progress) -> bool:
        """Records `run` as stopped (and says so) when its MODEL_DIR holds a stop request, so
        that it is not started; returns whether it does."""
        if not stop_request.requested(run.model_dir):
            return False
        self.stopped.append(run.run_id)
        progress.skip(run, f"stop requested ({names.STOP_REQUEST_FILE})")
        return True

    def ended(self, run: Run, ok: bool) -> None:
        """Records how `run` ended: completed, stopped on request, or failed."""
        stopped = not ok and stop_request.requested(run.model_dir)
        (self.completed if ok else self.stopped if stopped else self.failed).append(run.run_id)

    @property
    def ok(self) -> bool:
        """True when nothing failed or was blocked (zero-shot scoring included)."""
        return not self.failed and not self.blocked and not self.score_failed

    def block_if_dependency_failed(self, run: Run, progress: Progress) -> bool:
        """Records `run` as blocked (and says so) when a run it depends on failed or was itself
        blocked; returns whether it was. Runs come in dependency order, so whole chains block."""
        bad = set(self.failed) | set(self.blocked)
        stopped = any(dep in self.stopped for dep in run.depends_on)
        if not stopped and not any(dep in bad for dep in run.depends_on):
            return False
        if stopped and self.stop_if_requested(run, progress):  # dropped with its dependency
            return True
        self.blocked.append(run.run_id)
        progress.skip(
            run, "blocked by a stopped dependency" if stopped else "blocked by a failed dependency"
        )
        return True


def start_launch(
    runs: Sequence[Run], progress: Progress | None
) -> tuple[list[Run], Progress, LaunchReport]:
    """What every launcher does first: order `runs` parents first, make the progress display
    (unless given) and a report, and record the runs already COMPLETED as skipped and those with
    a stop request (`rundir.stop_request`) as stopped.

    Returns:
      The runs still to launch (in dependency order), the progress display and the report.
    """
    ordered = topological_order(runs)
    progress = progress or Progress(ordered)
    report = LaunchReport()
    pending = []
    for run in ordered:
        if is_completed(run):
            report.skipped.append(run.run_id)
            progress.skip(run, "completed")
        elif not report.stop_if_requested(run, progress):  # not started while requested
            pending.append(run)
    return pending, progress, report


class SequentialLauncher(abc.ABC):
    """Runs one job at a time in dependency order, retrying failures `retries` times.
    Subclasses say how to start one run (`execute`) and how to show it (`describe`)."""

    name = "sequential"

    def __init__(self, *, retries: int = 0):
        self.retries = retries

    @abc.abstractmethod
    def describe(self, run: Run) -> str:
        """The command that `execute` would start, for dry runs."""

    @abc.abstractmethod
    def execute(self, run: Run, progress: Progress) -> int:
        """Starts one run and waits for it; returns its exit code."""

    def describe_score(self, run: Run) -> str:
        """The command that `execute_score` would start, for dry runs."""
        return shlex.join(zeroshot_stage.run_argv(run, allow_missing=True))

    def execute_score(self, run: Run, progress: Progress) -> int:
        """Scores a completed run's final checkpoint (its zero-shot stage) and waits; returns
        the exit code. Launchers that run the stage override this."""
        raise NotImplementedError(f"the {self.name} launcher has no zero-shot stage")

    def score(self, run: Run, progress: Progress, report: LaunchReport) -> None:
        """The zero-shot stage of a completed run: scored once (`zeroshot_stage.needs_scoring`
        skips a run whose results are all written), recorded in `report`."""
        if not zeroshot_stage.needs_scoring(run):
            return
        progress.note(f"zero-shot: scoring {run.run_id} ({len(run.zeroshot.tasks)} task(s))")
        returncode = self.execute_score(run, progress)
        ok = returncode == 0 and not zeroshot_stage.needs_scoring(run)
        (report.scored if ok else report.score_failed).append(run.run_id)
        progress.note(
            f"zero-shot: {run.run_id} " + ("scored" if ok else f"failed (exit code {returncode})")
        )

    def train_and_score(self, run: Run, progress: Progress, report: LaunchReport) -> bool:
        """`attempt`, then the run's zero-shot stage once it succeeded; returns whether the
        training did."""
        ok = self.attempt(run, progress)
        if ok:
            self.score(run, progress, report)
        return ok

    def succeeded(self, run: Run, returncode: int) -> bool:
        """Exit code 0, and COMPLETED where the MODEL_DIR is readable from here."""
        if returncode != 0:
            return False
        return is_completed(run) or local_path(run.model_dir) is None

    def launch(
        self, runs: Sequence[Run], *, dry_run: bool = False, progress: Progress | None = None
    ) -> LaunchReport:
        """Runs (or, with `dry_run`, prints) every run not yet completed, parents first."""
        pending, progress, report = start_launch(runs, progress)
        self.score_completed(runs, report, progress, dry_run=dry_run)
        for run in pending:
            if dry_run:
                commands = [self.describe(run)]
                commands += [self.describe_score(run)] if run.zeroshot is not None else []
                report.commands += commands
                print("\n".join(commands), file=progress.stream, flush=True)
                continue
            if report.block_if_dependency_failed(run, progress):
                continue
            report.ended(run, self.train_and_score(run, progress, report))
        return report

    def score_completed(
        self, runs: Sequence[Run], report: LaunchReport, progress: Progress, *, dry_run: bool
    ) -> None:
        """The zero-shot stage of the runs found completed (`report.skipped`) but not yet
        scored: a sweep run again finishes the scoring an earlier one left (resumable)."""
        skipped = set(report.skipped)
        for run in runs:
            if run.run_id not in skipped or not zeroshot_stage.needs_scoring(run):
                continue
            if dry_run:
                report.commands.append(self.describe_score(run))
                print(report.commands[-1], file=progress.stream, flush=True)
            else:
                self.score(run, progress, report)

    def attempt(self, run: Run, progress: Progress) -> bool:
        """Starts `run` up to `retries + 1` times until it succeeds; returns whether it did. A
        run with a stop request is not started, one that stopped on it not restarted."""
        for attempt in range(1, self.retries + 2):
            if stop_request.requested(run.model_dir):
                progress.skip(run, f"stop requested ({names.STOP_REQUEST_FILE})")
                return False
            started = progress.start(run, attempt, from_step=last_step(run))
            try:
                returncode = self.execute(run, progress)
            except KeyboardInterrupt:
                progress.note(f"interrupted during {run.run_id}; re-run to resume it")
                raise
            ok = self.succeeded(run, returncode)
            if returncode == exits.STOPPED:  # not a failure: never retried
                progress.skip(run, f"stopped on request ({names.STOP_REQUEST_FILE})")
                return False
            why = "(preempted; checkpoint saved)" if returncode == PREEMPTED_EXIT_CODE else ""
            progress.finish(run, ok, started, why or f"(exit code {returncode})")
            if ok:
                return True
        if not stop_request.requested(run.model_dir):
            progress.fail(run)
        return False


Runner = Callable[[Run, Path], "int | None"]


def _write_record(directory, **record: Any) -> None:
    storage.write_text_atomic(
        storage.as_path(directory) / LAUNCH_FILE, json.dumps(record, indent=1, sort_keys=True)
    )


def log_path(run: Run) -> Path:
    """Where the local launcher keeps a run's process log: `MODEL_DIR/train.log` for a local
    run; for one on object storage (which cannot be appended to line by line),
    `./xlscale_logs/<run_id>/train.log` in the launcher's working directory."""
    local = local_path(run.model_dir)
    directory = local if local is not None else Path("xlscale_logs").resolve() / run.run_id
    directory.mkdir(parents=True, exist_ok=True)
    return directory / LOG_FILE


def _call_in_worker(runner: Runner, run: Run, log_path: str) -> int:
    """Runs `runner(run, log_path)` in a worker process of `LocalLauncher(jobs > 1)`.

    The trainer's log lines (and other Python logging) go to the run's own `train.log`: two runs
    interleaved on one terminal would be unreadable, so the launcher prints progress lines read
    from `metrics.jsonl` instead.
    """
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root, trainer = logging.getLogger(), logging.getLogger("trainer")
    saved = root.handlers[:], trainer.handlers[:], trainer.propagate
    root.handlers, trainer.handlers, trainer.propagate = [handler], [handler], False
    trainer.setLevel(logging.INFO)
    try:
        with native_logs.stderr_to(log_path):  # native lines (TensorFlow's start-up) there too
            return _invoke(runner, run, Path(log_path))
    finally:
        root.handlers, trainer.handlers, trainer.propagate = saved
        handler.close()


def _invoke(runner: Runner, run: Run, log_path: Path) -> int:
    """`runner(run, log_path)` as an exit code: None counts as 0; an exception as 1, with its
    traceback appended to the run's log."""
    try:
        result = runner(run, log_path)
    except Exception:  # noqa: BLE001 -- a failing job, recorded like a non-zero exit
        with open(log_path, "a") as log:
            log.write(traceback.format_exc())
        return 1
    return 0 if result is None else int(result)


def _terminate_workers(pool: futures.ProcessPoolExecutor) -> None:
    """Sends SIGTERM to the pool's worker processes (the trainer saves a checkpoint and exits)."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()


def _terminate_as_interrupt():
    """While a parallel launch runs, SIGTERM to the launcher raises KeyboardInterrupt, so that the
    runs in flight are stopped with it instead of being orphaned. Returns the old handler (None
    off the main thread, where signal handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)


def _restore_terminate(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def default_jobs() -> int:
    """Concurrent local jobs for the demos: 2 where there are at least 2 cores, else 1
    (`XLSCALE_JOBS` overrides).

    A run is not all matrix multiplies: input pipelines, checkpoint writes and reads, decoding and
    scoring are mostly one Python thread, which a second job fills. Measured on this project's
    2-core machine: the translation study 17m04s one by one, 12m29s two at a time (1.37x); its
    smoke profile 126 s vs 91 s. The bare T5 step alone gains 1.1-1.3x
    (`benchmarks/parallel_jobs.py`).
    """
    env = os.environ.get("XLSCALE_JOBS")
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"XLSCALE_JOBS must be a whole number of jobs >= 1, got {env!r}")
        return int(env)
    if _has_accelerator():
        return 1  # one process owns a GPU's memory or a TPU; side-by-side jobs would fight for it
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def _has_accelerator() -> bool:
    """Whether JAX in a job would pick a GPU or TPU, judged without initialising JAX here (which
    would claim the device): `JAX_PLATFORMS` if set, else NVIDIA or TPU device files."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0] != "cpu"
    dev = Path("/dev")
    return (dev / "nvidiactl").exists() or any(dev.glob("accel*")) or any(dev.glob("vfio/[0-9]*"))


class LocalLauncher(SequentialLauncher):
    """Runs each job on this machine: `python -m trainer.train ...` as a subprocess with its own
    log (`MODEL_DIR/train.log`), or, for tests and in-process demos, a Python callable
    `runner(run, log_path) -> exit code` (None counts as 0; an exception as a failure).

    With `jobs > 1`, up to `jobs` runs whose dependencies are done run at once: subprocesses side
    by side, or the callable in a pool of `jobs` spawned worker processes (each keeps its imports
    and compiled steps across the runs it is given; the callable must be importable, i.e. a
    module-level function).
    """

    name = "local"

    def __init__(
        self,
        *,
        runner: Runner | None = None,
        scorer: Runner | None = None,
        python: str | None = None,
        poll_s: float = 10.0,
        retries: int = 0,
        cwd: str | None = None,
        jobs: int = 1,
    ):
        super().__init__(retries=retries)
        # The zero-shot stage in this process (tests, in-process studies), `scorer(run, log)`;
        # None: `python -m evals.score_run` as a subprocess.
        self.scorer = scorer
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.runner = runner
        self.python = python or sys.executable
        self.poll_s = poll_s
        self.cwd = cwd
        self.jobs = jobs
        self._pool: futures.ProcessPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._stop = threading.Event()  # set when a parallel launch is interrupted

    @classmethod
    def add_arguments(cls, group) -> None:
        """Command-line options of this launcher."""
        group.add_argument(
            "--poll", type=float, default=10.0, help="seconds between progress lines"
        )
        group.add_argument(
            "--jobs",
            type=int,
            default=1,
            help="runs at once whose dependencies are done (default 1)",
        )

    @classmethod
    def from_args(cls, args) -> LocalLauncher:
        """Builds the launcher from parsed command-line options."""
        return cls(poll_s=args.poll, retries=args.retries, jobs=getattr(args, "jobs", 1))

    def launch(
        self, runs: Sequence[Run], *, dry_run: bool = False, progress: Progress | None = None
    ) -> LaunchReport:
        """See `SequentialLauncher.launch`; a MODEL_DIR on object storage keeps its process log
        locally (`log_path`)."""
        if self.jobs == 1 or dry_run:
            return super().launch(runs, dry_run=dry_run, progress=progress)
        return self._launch_parallel(runs, progress)

    def _launch_parallel(self, runs: Sequence[Run], progress: Progress | None) -> LaunchReport:
        """Dependency-ordered launch with up to `jobs` runs in flight."""
        pending, progress, report = start_launch(runs, progress)
        self.score_completed(runs, report, progress, dry_run=False)
        progress.workers = self.jobs
        done: set[str] = set(report.skipped)
        running: dict[futures.Future, Run] = {}
        threads = futures.ThreadPoolExecutor(self.jobs, thread_name_prefix="launch")
        self._stop.clear()
        previous = _terminate_as_interrupt()
        try:
            while pending or running:
                # `pending` is in dependency order, so one pass blocks whole chains.
                for run in list(pending):
                    if report.block_if_dependency_failed(run, progress):
                        pending.remove(run)
                ready = [r for r in pending if all(d in done for d in r.depends_on)]
                for run in ready[: self.jobs - len(running)]:
                    pending.remove(run)
                    running[threads.submit(self.train_and_score, run, progress, report)] = run
                if not running:
                    break
                finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
                for future in finished:
                    run = running.pop(future)
                    done.update([run.run_id] if future.result() else [])
                    report.ended(run, future.result())
        except BaseException:
            # Ctrl-C (or SIGTERM) reaches this thread only: tell the runs in flight to stop, which
            # sends their trainers SIGTERM (they save a checkpoint), then re-raise.
            self._stop.set()
            raise
        finally:
            threads.shutdown(wait=True, cancel_futures=True)
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
            _restore_terminate(previous)
        return report

    def describe(self, run: Run) -> str:
        """The subprocess command line, shell-quoted."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in run.environment().items())
        command = shlex.join(run.argv(self.python, allow_missing=True))
        return f"{env} {command}" if env else command

    def execute(self, run: Run, progress: Progress) -> int:
        """Runs the job, polling its metrics for progress lines while it runs."""
        if self._stop.is_set():
            raise KeyboardInterrupt  # a parallel launch is stopping: start nothing new
        directory = storage.as_path(run.model_dir, name="MODEL_DIR")
        directory.mkdir(parents=True, exist_ok=True)
        log_file = log_path(run)
        previous = read_json(directory / LAUNCH_FILE) or {}
        record = {
            "state": "running",
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "attempt": int(previous.get("attempt", 0)) + 1,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "log": str(log_file),
        }
        _write_record(directory, **record)
        returncode = PREEMPTED_EXIT_CODE  # what an interrupt (Ctrl-C) leaves behind
        try:
            returncode = (
                self._run_callable(run, log_file, progress)
                if self.runner
                else self._run_process(run, log_file, progress, record)
            )
        finally:
            state = "completed" if returncode == 0 and is_completed(run) else "failed"
            state = "interrupted" if returncode == PREEMPTED_EXIT_CODE else state
            ended = datetime.datetime.now().isoformat(timespec="seconds")
            _write_record(
                directory, **{**record, "state": state, "returncode": returncode, "ended": ended}
            )
        return returncode

    def execute_score(self, run: Run, progress: Progress) -> int:
        """The zero-shot stage here: `scorer(run, log)` when given, else `python -m
        evals.score_run ...` as a subprocess; its output goes to the run's log."""
        log_file = log_path(run)
        if self.scorer is not None:
            return _invoke(self.scorer, run, log_file)
        argv = zeroshot_stage.run_argv(run, self.python)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **run.environment()}
        with open(log_file, "a") as log:
            log.write(f"$ {shlex.join(argv)}\n")
            log.flush()
            return subprocess.call(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd
            )

    def _worker_pool(self) -> futures.ProcessPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                context = multiprocessing.get_context("spawn")  # no forked JAX/TF state
                self._pool = futures.ProcessPoolExecutor(self.jobs, mp_context=context)
            return self._pool

    def _run_in_pool(self, run: Run, log_path: Path, progress: Progress) -> int:
        """Runs the callable in a worker process, printing progress from its metrics.

        A worker that dies (killed, out of memory) breaks the whole pool and with it the other
        run in flight, so a broken pool is replaced and the run submitted once more.
        """
        for chance in (1, 2):
            pool = self._worker_pool()
            step = None
            try:
                future = pool.submit(_call_in_worker, self.runner, run, str(log_path))
                while True:
                    if self._stop.is_set():
                        _terminate_workers(pool)  # the trainers save a checkpoint on SIGTERM
                        raise KeyboardInterrupt
                    try:
                        return future.result(
                            timeout=min(self.poll_s, 1.0) if step is None else self.poll_s
                        )
                    except futures.TimeoutError:
                        metrics = last_metrics(run.model_dir) or {}
                        if metrics.get("step") != step:
                            step = metrics.get("step")
                            progress.update(run, step, metrics.get("train/loss"))
            except futures.process.BrokenProcessPool:
                with self._pool_lock:
                    if self._pool is pool:
                        self._pool = None
                with open(log_path, "a") as log:
                    again = "; starting the run again in a fresh one" if chance == 1 else ""
                    log.write(f"a worker process of the pool died (see the system log){again}\n")
        return 1

    def _run_callable(self, run: Run, log_path: Path, progress: Progress | None = None) -> int:
        if self.jobs > 1 and progress is not None:
            return self._run_in_pool(run, log_path, progress)
        return _invoke(self.runner, run, log_path)

    def _run_process(self, run: Run, log_path: Path, progress: Progress, record: dict) -> int:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **run.environment()}
        with open(log_path, "a") as log:
            log.write(f"$ {shlex.join(run.argv(self.python))}\n")
            log.flush()
            process = subprocess.Popen(
                run.argv(self.python), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd
            )
            record["child_pid"] = process.pid
            _write_record(run.model_dir, **record)
            last_step = None
            try:
                while process.poll() is None:
                    if self._stop.wait(min(self.poll_s, 1.0) if last_step is None else self.poll_s):
                        raise KeyboardInterrupt  # the parallel launch is stopping
                    metrics = last_metrics(run.model_dir) or {}
                    if metrics.get("step") != last_step:
                        last_step = metrics.get("step")
                        progress.update(run, last_step, metrics.get("train/loss"))
            except KeyboardInterrupt:
                process.terminate()  # the trainer saves a checkpoint on SIGTERM
                process.wait()
                raise
        return process.returncode
