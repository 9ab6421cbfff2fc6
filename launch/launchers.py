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
import dataclasses
import datetime
import importlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
from launch.sweep import Run, topological_order

# Name -> "module:Class"; imported on use, so `xmanager` costs nothing until chosen.
LAUNCHERS: dict[str, str] = {
    "local": "launch.launchers:LocalLauncher",
    "tpu_vm": "launch.tpu_vm:TpuVmLauncher",
    "slurm": "launch.slurm:SlurmLauncher",
    "xmanager": "launch.xm_launch:XManagerLauncher",
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

    @property
    def ok(self) -> bool:
        """True when nothing failed or was blocked."""
        return not self.failed and not self.blocked


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

    def succeeded(self, run: Run, returncode: int) -> bool:
        """Exit code 0, and COMPLETED where the MODEL_DIR is readable from here."""
        if returncode != 0:
            return False
        return is_completed(run) or local_path(run.model_dir) is None

    def launch(
        self, runs: Sequence[Run], *, dry_run: bool = False, progress: Progress | None = None
    ) -> LaunchReport:
        """Runs (or, with `dry_run`, prints) every run not yet completed, parents first."""
        ordered = topological_order(runs)
        progress = progress or Progress(ordered)
        report = LaunchReport()
        bad: set[str] = set()
        for run in ordered:
            if is_completed(run):
                report.skipped.append(run.run_id)
                progress.skip(run, "completed")
                continue
            if dry_run:
                command = self.describe(run)
                report.commands.append(command)
                print(command, file=progress.stream, flush=True)
                continue
            if any(dep in bad for dep in run.depends_on):
                bad.add(run.run_id)
                report.blocked.append(run.run_id)
                progress.skip(run, "blocked by a failed dependency")
                continue
            for attempt in range(1, self.retries + 2):
                started = progress.start(run, attempt, from_step=last_step(run))
                try:
                    returncode = self.execute(run, progress)
                except KeyboardInterrupt:
                    progress.note(f"interrupted during {run.run_id}; re-run to resume it")
                    raise
                ok = self.succeeded(run, returncode)
                why = "(preempted; checkpoint saved)" if returncode == PREEMPTED_EXIT_CODE else ""
                progress.finish(run, ok, started, why or f"(exit code {returncode})")
                if ok:
                    report.completed.append(run.run_id)
                    break
            else:
                progress.fail(run)
                bad.add(run.run_id)
                report.failed.append(run.run_id)
        return report


Runner = Callable[[Run, Path], "int | None"]


def _write_record(directory: Path, **record: Any) -> None:
    path = directory / LAUNCH_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


class LocalLauncher(SequentialLauncher):
    """Runs each job on this machine: `python -m trainer.train ...` as a subprocess with its own
    log (`MODEL_DIR/train.log`), or, for tests and in-process demos, a Python callable
    `runner(run, log_path) -> exit code` (None counts as 0; an exception as a failure)."""

    name = "local"

    def __init__(
        self,
        *,
        runner: Runner | None = None,
        python: str | None = None,
        poll_s: float = 10.0,
        retries: int = 0,
        cwd: str | None = None,
    ):
        super().__init__(retries=retries)
        self.runner = runner
        self.python = python or sys.executable
        self.poll_s = poll_s
        self.cwd = cwd

    @classmethod
    def add_arguments(cls, group) -> None:
        """Command-line options of this launcher."""
        group.add_argument(
            "--poll", type=float, default=10.0, help="seconds between progress lines"
        )

    @classmethod
    def from_args(cls, args) -> LocalLauncher:
        """Builds the launcher from parsed command-line options."""
        return cls(poll_s=args.poll, retries=args.retries)

    def launch(
        self, runs: Sequence[Run], *, dry_run: bool = False, progress: Progress | None = None
    ) -> LaunchReport:
        """See `SequentialLauncher.launch`; MODEL_DIRs must be local (they hold the logs)."""
        remote = [r.model_dir for r in runs if local_path(r.model_dir) is None]
        if remote and not dry_run:
            raise ValueError(f"the local launcher needs local run directories, got {remote[0]}")
        return super().launch(runs, dry_run=dry_run, progress=progress)

    def describe(self, run: Run) -> str:
        """The subprocess command line, shell-quoted."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in run.environment().items())
        command = shlex.join(run.argv(self.python, allow_missing=True))
        return f"{env} {command}" if env else command

    def execute(self, run: Run, progress: Progress) -> int:
        """Runs the job, polling its metrics for progress lines while it runs."""
        directory = Path(run.model_dir)
        directory.mkdir(parents=True, exist_ok=True)
        log_path = directory / LOG_FILE
        previous = read_json(directory / LAUNCH_FILE) or {}
        record = {
            "state": "running",
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "attempt": int(previous.get("attempt", 0)) + 1,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "log": str(log_path),
        }
        _write_record(directory, **record)
        returncode = PREEMPTED_EXIT_CODE  # what an interrupt (Ctrl-C) leaves behind
        try:
            returncode = (
                self._run_callable(run, log_path)
                if self.runner
                else self._run_process(run, log_path, progress, record)
            )
        finally:
            state = "completed" if returncode == 0 and is_completed(run) else "failed"
            state = "interrupted" if returncode == PREEMPTED_EXIT_CODE else state
            ended = datetime.datetime.now().isoformat(timespec="seconds")
            _write_record(
                directory, **{**record, "state": state, "returncode": returncode, "ended": ended}
            )
        return returncode

    def _run_callable(self, run: Run, log_path: Path) -> int:
        try:
            result = self.runner(run, log_path)
        except Exception:  # noqa: BLE001 -- a failing job, recorded like a non-zero exit
            with open(log_path, "a") as log:
                log.write(traceback.format_exc())
            return 1
        return 0 if result is None else int(result)

    def _run_process(self, run: Run, log_path: Path, progress: Progress, record: dict) -> int:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **run.environment()}
        with open(log_path, "a") as log:
            log.write(f"$ {shlex.join(run.argv(self.python))}\n")
            log.flush()
            process = subprocess.Popen(
                run.argv(self.python), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd
            )
            record["child_pid"] = process.pid
            _write_record(Path(run.model_dir), **record)
            last_step = None
            try:
                while process.poll() is None:
                    time.sleep(min(self.poll_s, 1.0) if last_step is None else self.poll_s)
                    metrics = last_metrics(Path(run.model_dir) / "metrics.jsonl") or {}
                    if metrics.get("step") != last_step:
                        last_step = metrics.get("step")
                        progress.update(run, last_step, metrics.get("train/loss"))
            except KeyboardInterrupt:
                process.terminate()  # the trainer saves a checkpoint on SIGTERM
                process.wait()
                raise
        return process.returncode
