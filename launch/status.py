"""What a run's MODEL_DIR says about it, and progress lines with an ETA for a running sweep.

A run is done when `MODEL_DIR/COMPLETED` exists (the trainer writes it last). A run whose lease
(`rundir.lease`) has a live holder is running, on any host and on object storage. Launchers that
start processes here also keep `MODEL_DIR/launch.json` (pid, host, attempt, exit code), which
tells a live run from one that died; `metrics.jsonl` gives the last step and losses. Every
`MODEL_DIR` may be local or a URL (`gs://`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from launch.runs import Run
from rundir import durations, lease, names, records, stop_request, storage

LAUNCH_FILE = names.LAUNCH_FILE  # the launcher's own record inside MODEL_DIR
LOG_FILE = names.LOG_FILE
# trainer.train's exit code for a run stopped early with a checkpoint saved (EX_TEMPFAIL).
PREEMPTED_EXIT_CODE = 75


@dataclasses.dataclass(frozen=True)
class RunStatus:
    """What a run's MODEL_DIR says about it.

    `state` is one of: done (COMPLETED exists), running (a live local process, or metrics written
    within the last `stale_s` seconds), stopped (a stop request, `rundir.stop_request`: stopped
    or never started), failed (the last attempt exited non-zero), interrupted (progress on disk
    but no process), pending (nothing yet).
    """

    run_id: str
    state: str
    step: int | None = None
    loss: float | None = None
    evals: tuple[tuple[str, float], ...] = ()
    updated: float | None = None
    message: str = ""


def local_path(path: str) -> Path | None:
    """`path` as a local Path, or None for a URL (gs://...): for what only local disk can do
    (process logs of local launchers)."""
    return None if "://" in path else Path(path)


def any_path(path: str):
    """`path` (local or a URL such as gs://...) as the project's one path type."""
    return storage.as_path(path)


def is_completed(run: Run) -> bool:
    """Whether `MODEL_DIR/COMPLETED` exists (a T5X run's last checkpoint, `Run.done_marker`;
    unreadable remote storage counts as not done)."""
    try:
        return (any_path(run.model_dir) / run.done_marker).exists()
    except Exception:  # noqa: BLE001 -- no filesystem for that scheme here
        return False


def last_metrics(path) -> dict[str, Any] | None:
    """The last complete training record of a run (`rundir.records.last_metrics`); `path` is its
    MODEL_DIR or the metrics.jsonl itself."""
    path = any_path(path)
    return records.last_metrics(path.parent if path.name == names.METRICS_FILE else path)


def last_step(run: Run) -> int:
    """The last logged step in a MODEL_DIR's metrics.jsonl (0 when none)."""
    return int((last_metrics(run.model_dir) or {}).get("step") or 0)


def read_json(path) -> dict[str, Any] | None:
    """The JSON in `path`, or None when it is missing or not (yet) valid JSON."""
    try:
        return json.loads(storage.as_path(path).read_text())
    except (OSError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mtime(path) -> float | None:
    try:
        return storage.mtime(path)
    except (OSError, ValueError):
        return None


def run_status(run: Run, *, stale_s: float = 900.0, now: float | None = None) -> RunStatus:
    """Reads the state of one run from its MODEL_DIR, local or on object storage (see
    `RunStatus`). A run whose lease (`rundir.lease`) is held by a live writer is running, on any
    host; so is one with a live local launcher process, or metrics written within `stale_s`."""
    now = time.time() if now is None else now
    directory = any_path(run.model_dir)
    last = last_metrics(directory) or {}
    step = last.get("step")
    loss = last.get("train/loss")
    evals = tuple(
        sorted(
            (k.split("/")[1], v)
            for k, v in last.items()
            if k.startswith("eval/") and k.endswith("/loss")
        )
    )
    updated = _mtime(records.metrics_file(directory))
    record = read_json(directory / LAUNCH_FILE) or {}
    if is_completed(run):
        step = (records.read_completed(directory) or {}).get("step", step)
        return RunStatus(run.run_id, "done", step, loss, evals, updated)
    holder, stale = lease.holder_state(directory)
    if holder is not None and stale is None:
        return RunStatus(run.run_id, "running", step, loss, evals, updated, lease.describe(holder))
    if record.get("state") == "running":
        alive = record.get("host") != socket.gethostname() or _pid_alive(int(record.get("pid", -1)))
        if alive:
            return RunStatus(run.run_id, "running", step, loss, evals, updated)
    # A stop request (`rundir.stop_request`) without a live writer: stopped, or never started.
    if stop_request.requested(directory):
        why = (stop_request.read(directory) or {}).get("reason", "")
        return RunStatus(
            run.run_id, "stopped", step, loss, evals, updated, f"stop requested: {why}"
        )
    if updated is not None and now - updated < stale_s and record.get("state") != "failed":
        return RunStatus(run.run_id, "running", step, loss, evals, updated)
    if record.get("state") == "failed":
        message = f"exit code {record.get('returncode')}; log {record.get('log')}"
        return RunStatus(run.run_id, "failed", step, loss, evals, updated, message)
    has_progress = step is not None or _has_checkpoint(directory)
    state = "interrupted" if has_progress else "pending"
    message = f"its writer is gone ({stale})" if holder is not None else ""
    if not has_progress and not message:
        message = _refused_attempt(directory)
    return RunStatus(run.run_id, state, step, loss, evals, updated, message)


def _has_checkpoint(directory) -> bool:
    """Whether `checkpoints/` holds a step directory (orbax names a committed step by its number;
    a save in flight has a temporary name): an empty `checkpoints/` is no progress."""
    try:
        return any(p.name.isdigit() for p in (directory / names.CHECKPOINTS_SUBDIR).iterdir())
    except (OSError, ValueError):
        return False


def _refused_attempt(directory) -> str:
    """One line for a MODEL_DIR that holds only what a refused attempt wrote (run files, an empty
    `checkpoints/`, TensorBoard's directory; older versions left these behind): not a started
    run. Empty when the directory holds none of those."""
    try:
        left = sorted(
            p.name
            for p in directory.iterdir()
            if p.name in (names.RUN_FILE, names.CONFIG_FILE, names.CHECKPOINTS_SUBDIR)
            or p.name == names.TB_SUBDIR
        )
    except (OSError, ValueError):
        return ""
    if not left:
        return ""
    return (
        f"not started: holds only a refused attempt's {', '.join(left)} (no metrics, no checkpoint)"
    )


STATES = ("done", "running", "interrupted", "failed", "pending")
# Listed by `count_states` only where a run is in them (sweeps without stop requests read as before).
RARE_STATES = ("stopped",)


def count_states(statuses: Sequence[RunStatus]) -> dict[str, int]:
    """How many runs are in each state (every state of `STATES` listed, in order, then the
    `RARE_STATES` that occur)."""
    counts = {state: sum(s.state == state for s in statuses) for state in STATES + RARE_STATES}
    return {k: n for k, n in counts.items() if n or k in STATES}


def format_seconds(seconds: float | None) -> str:
    """`3h05m`, `4m10s`, `12s`; `?` for unknown (`rundir.durations`, the project's one format)."""
    return durations.format_duration(seconds)


class Progress:
    """Counts runs done/total and estimates the time left from the work done so far.

    Work is each run's computed FLOPs when known (its tokens otherwise), so a 10× larger run
    counts 10×. Before any run finishes, `flops_per_s` (a measured throughput) gives the ETA.
    """

    def __init__(
        self,
        runs: Sequence[Run],
        *,
        stream: TextIO | None = None,
        flops_per_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = len(runs)
        self.done = 0
        self.failed = 0
        self.stream = stream if stream is not None else sys.stdout
        self.flops_per_s = flops_per_s
        self.clock = clock
        self.start_time = clock()
        self.weights = {r.run_id: self._weight(r) for r in runs}
        self.costs_known = all(r.cost is not None for r in runs)
        self.remaining = dict(self.weights)
        self.work_done = 0.0
        self.work_elapsed = 0.0
        self._from_step: dict[str, int] = {}
        self.workers = 1  # runs in flight at once (set by a parallel launcher)
        self._lock = threading.Lock()  # parallel launchers report from several threads

    @staticmethod
    def _weight(run: Run) -> float:
        return float(run.cost if run.cost is not None else run.tokens)

    def _share(self, run: Run, steps: int) -> float:
        return self.weights.get(run.run_id, 0.0) * min(1.0, max(0, steps) / max(1, run.steps))

    def eta(self, current: Run | None = None, step: int | None = None) -> float | None:
        """Seconds left for the runs still to do, `current` being at `step`."""
        left = sum(self.remaining.values())
        if current is not None and step is not None:
            left -= self._share(current, step - self._from_step.get(current.run_id, 0))
        # Elapsed times are per run, so with `workers` runs side by side the wall time is shorter.
        if self.work_done > 0 and self.work_elapsed > 0:
            return left * self.work_elapsed / self.work_done / self.workers
        if self.flops_per_s and self.costs_known:
            return left / self.flops_per_s
        return None

    def _line(self, text: str, eta: float | None = None) -> None:
        head = f"[sweep {self.done}/{self.total} done"
        head += f", {self.failed} failed" if self.failed else ""
        head += f" | ETA {format_seconds(eta)}]" if eta is not None else "]"
        with self._lock:
            print(f"{head} {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """Prints a line with the counters."""
        self._line(text)

    def skip(self, run: Run, reason: str) -> None:
        """A run that needs no work (already completed) or cannot start (a dependency failed)."""
        self.remaining.pop(run.run_id, None)
        if reason == "completed":
            self.done += 1
        self._line(f"skip {run.run_id} ({reason})", self.eta())

    def start(self, run: Run, attempt: int = 1, from_step: int = 0) -> float:
        """Announces a run (resuming at `from_step`); returns its start time for `finish`."""
        self._from_step[run.run_id] = from_step
        self.remaining[run.run_id] = self.weights[run.run_id] - self._share(run, from_step)
        again = f" (attempt {attempt})" if attempt > 1 else ""
        resume = f", resuming at step {from_step}" if from_step else ""
        text = f"start {run.run_id}{again}: {run.steps} steps, {run.tokens:,} tokens{resume}"
        self._line(text, self.eta())
        return self.clock()

    def update(self, run: Run, step: int | None, loss: float | None) -> None:
        """Reports a running run's latest logged step and loss."""
        if step is None:
            return
        loss_text = f", loss {loss:.4f}" if isinstance(loss, int | float) else ""
        self._line(f"  {run.run_id} step {step}/{run.steps}{loss_text}", self.eta(run, step))

    def finish(self, run: Run, ok: bool, started: float, message: str = "") -> None:
        """Records a finished attempt (`ok` false: it failed)."""
        elapsed = self.clock() - started
        if ok:
            self.done += 1
            self.work_done += self.remaining.pop(run.run_id, 0.0)
            self.work_elapsed += elapsed
            self._line(f"done {run.run_id} in {format_seconds(elapsed)}", self.eta())
        else:
            self._line(f"FAILED {run.run_id} after {format_seconds(elapsed)} {message}".rstrip())

    def fail(self, run: Run) -> None:
        """Gives up on a run after its last attempt."""
        self.failed += 1
        self.remaining.pop(run.run_id, None)
