"""The subprocess harness of the accelerator benchmark: one child process per row, each row
printed and appended to a JSON-lines file as it finishes, failures as rows, a wall-clock budget.

Why: an accelerator is lent for minutes. Everything measured before the lease ends must survive,
and one row's failure (out of memory, a compile error, a hang) must not take the rows after it
down. So every configuration and every peer runs in its own process (device memory starts fresh
for each: a torch peer's cached blocks can no longer starve the JAX rows), the parent writes each
row the moment it has it, and the parent itself imports neither JAX nor torch, so it holds no
device memory the children need. Stdlib only.

A child prints one line `ROW_MARK + json` as its result. A child that dies without it becomes a
row from its exit status and the tail of its stderr; one that outlives its timeout is killed with
its whole process group (torch.compile's workers included) and becomes a `timeout` row.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

# A row's outcome: measured, out of device memory, the compile failed, any other failure, killed
# after its timeout, or never started because the budget could not hold it.
STATUSES = ("ok", "oom", "compile_error", "error", "timeout", "skipped")
ROW_MARK = "@@bench-row "
# Test-only fault injection: `action=glob[;action=glob...]` makes a child whose row name matches
# `glob` fail before it does any work (`oom`: raise XLA's out-of-memory error; `die-oom`: print
# torch's out-of-memory error to stderr and exit 1 without a result line; `hang`: sleep until
# killed). Never set outside tests.
INJECT_ENV = "XLSCALE_BENCH_INJECT"
PR_SET_PDEATHSIG = 1  # prctl(2)
INJECTED_XLA_OOM = (
    "jaxlib._jax.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
    "33.74GiB."
)
INJECTED_TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.18 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process "
    "has 77.94 GiB memory in use."
)
# Bytes per unit of the sizes in out-of-memory messages (binary, as XLA and torch print them).
_UNITS = {"": 1, "b": 1, "bytes": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_OOM_MARKERS = re.compile(
    r"out of memory|OutOfMemoryError|RESOURCE_EXHAUSTED|ran out of memory|Exceeded hbm capacity",
    re.IGNORECASE,
)
# Sizes asked for, most specific first: torch ("Tried to allocate 2.00 GiB"), XLA's allocator
# ("trying to allocate 33.74GiB", "... 35232890624 bytes", "allocating 1024 bytes"), libtpu
# ("Used 20.50G of 15.48G hbm").
_OOM_SIZES = (
    re.compile(r"[Tt]ried to allocate ([\d.]+)\s*([KMGT]?)i?B\b"),
    re.compile(r"trying to allocate ([\d.]+)\s*(bytes|[KMGT]?i?B)\b"),
    re.compile(r"allocating ([\d.]+)\s*(bytes|[KMGT]?i?B)\b"),
    re.compile(r"Used ([\d.]+)\s*([KMGT]?)i?B? of [\d.]+\s*[KMGT]?i?B? hbm"),
)


def oom_bytes(text: str) -> float | None:
    """The size an out-of-memory message says was asked for, in bytes (None when `text` is no
    out-of-memory error or names no size)."""
    if not _OOM_MARKERS.search(text):
        return None
    for pattern in _OOM_SIZES:
        match = pattern.search(text)
        if match:
            unit = match.group(2).lower().rstrip("ib") if match.group(2) != "bytes" else ""
            return float(match.group(1)) * _UNITS[unit]
    return None


def is_oom(text: str) -> bool:
    """Whether `text` holds an out-of-memory error of XLA, libtpu or torch (RESOURCE_EXHAUSTED
    counts: on accelerators XLA raises it for device memory)."""
    return bool(_OOM_MARKERS.search(text))


def gib(n: float | None) -> str:
    """Bytes as GiB with two decimals ("?" when unknown)."""
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def last_line(text: str) -> str:
    """The last non-empty line of `text`, at most 300 characters (an exception's own line)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def classify_failure(text: str, *, phase: str) -> tuple[str, str, float | None]:
    """`(status, error, oom_bytes)` of a failed row from its error text and the phase it failed
    in (`setup`, `compile`, `run`, or `unknown` for a child that died without a result)."""
    if is_oom(text):
        asked = oom_bytes(text)
        line = next((ln for ln in text.splitlines() if _OOM_MARKERS.search(ln)), "")
        return "oom", f"out of memory asking {gib(asked)} ({phase}): {line.strip()[:200]}", asked
    if phase == "compile":
        return "compile_error", last_line(text), None
    return "error", last_line(text), None


class RowFailed(Exception):
    """A child's row failed in `phase`; `text` is the formatted exception."""

    def __init__(self, *, phase: str, text: str):
        super().__init__(text)
        self.phase = phase
        self.text = text


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Labels any exception raised inside with the phase it happened in, so the row can say
    `compile_error` rather than `error` (out of memory wins in either)."""
    try:
        yield
    except RowFailed:
        raise
    except Exception as e:  # noqa: BLE001 -- every failure becomes a row
        raise RowFailed(phase=name, text="".join(traceback.format_exception(e))) from e


def injected_action(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The test-only fault injected for row `name` (see `INJECT_ENV`), or None."""
    for item in filter(None, environ.get(INJECT_ENV, "").split(";")):
        action, _, pattern = item.partition("=")
        if fnmatch.fnmatchcase(name, pattern):
            return action
    return None


def apply_injection(name: str) -> None:
    """Test-only: performs the fault injected for row `name`, if any (cheap: before any JAX or
    torch work, so a test pays no compile for it)."""
    action = injected_action(name)
    if action == "oom":
        raise RowFailed(phase="run", text=INJECTED_XLA_OOM)
    if action == "die-oom":
        print(INJECTED_TORCH_OOM, file=sys.stderr, flush=True)
        os._exit(1)
    if action == "hang":
        time.sleep(3600)


def emit(result: Mapping[str, Any]) -> None:
    """A child's last word: its result as one marked JSON line on stdout."""
    print(ROW_MARK + json.dumps(result), flush=True)


def child_main(name: str, body) -> int:
    """Runs a child's row: `body()` returns the measured fields; any failure becomes a result
    with its status and error. Always emits exactly one result line; returns the exit code."""
    try:
        apply_injection(name)
        with phase("setup"):
            result = {"status": "ok", "error": None, **body()}
    except RowFailed as failed:
        status, error, asked = classify_failure(failed.text, phase=failed.phase)
        print(failed.text, file=sys.stderr, flush=True)
        result = {"status": status, "error": error, "oom_bytes": asked, "phase": failed.phase}
    emit(result)
    return 0 if result["status"] == "ok" else 1


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """What a finished (or killed) child left: exit code, its output, how long it ran."""

    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool


def die_with_parent() -> None:
    """Runs in a child before it starts (Linux): the kernel kills the child when the parent
    dies, however the parent dies (a lease ending in SIGKILL included), so no orphaned row keeps
    holding device memory."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def run_child(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str, timeout_s: float | None
) -> ChildRun:
    """Runs `argv` in its own session; past `timeout_s` (or when the parent is interrupted) the
    whole process group is killed (a hung compile, torch.compile's worker pool) and what it
    printed so far is kept."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        timed_out = True
    except BaseException:  # Ctrl-C, SystemExit: take the row down with us
        _kill_group(proc)
        raise
    return ChildRun(proc.returncode, out or "", err or "", time.monotonic() - start, timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def tail(text: str, lines: int = 20) -> str:
    """The last `lines` lines of `text`, at most 4,000 characters (kept in failed rows)."""
    return "\n".join(text.strip().splitlines()[-lines:])[-4000:]


def child_result(run: ChildRun) -> dict[str, Any]:
    """A child's result fields: its own result line when it printed one, else a failure made from
    how it ended (timeout, signal, exit code) and the tail of its stderr."""
    if run.timed_out:
        return {"status": "timeout", "error": f"no result within {run.wall_s:.0f} s (killed)"}
    for line in reversed(run.stdout.splitlines()):
        if line.startswith(ROW_MARK):
            return json.loads(line[len(ROW_MARK) :])
    status, error, asked = classify_failure(run.stderr, phase="unknown")
    code = run.returncode
    how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
    return {"status": status, "error": f"{how}: {error}" if error else how, "oom_bytes": asked}


@dataclasses.dataclass(frozen=True)
class Task:
    """One row to run: its unique name, the fields every row of it carries (whatever happens),
    the budget key its duration is learnt under, the prior duration, and the child command."""

    name: str
    fields: Mapping[str, Any]
    key: str
    prior_s: float
    argv: tuple[str, ...]
    env: Mapping[str, str]


class Budget:
    """The run's wall-clock budget and the expected duration of a row: the measured duration of
    the slowest earlier row with the same key (impl and model), else the task's stated prior."""

    def __init__(self, total_s: float | None, *, clock=time.monotonic):
        self.total_s = total_s
        self._clock = clock
        self._start = clock()
        self._measured: dict[str, float] = {}

    def remaining(self) -> float | None:
        """Seconds left (None: no budget)."""
        return None if self.total_s is None else self.total_s - (self._clock() - self._start)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return self._clock() - self._start

    def estimate(self, key: str, prior_s: float) -> tuple[float, str]:
        """`(seconds, basis)` a row of `key` is expected to take."""
        if key in self._measured:
            return self._measured[key], "measured"
        return prior_s, "prior"

    def record(self, key: str, wall_s: float) -> None:
        """Learns a finished row's duration."""
        self._measured[key] = max(wall_s, self._measured.get(key, 0.0))


def _fmt(value, spec: str, scale: float = 1.0) -> str:
    return "–" if value is None else format(value * scale, spec)


# (header, width, cell) per column; the table and the header line come from this one list.
COLUMNS: tuple[tuple[str, int, Any], ...] = (
    ("impl", 10, lambda r: str(r.get("impl"))),
    ("model", 14, lambda r: str(r.get("model"))),
    ("remat", 13, lambda r: str(r.get("remat"))),
    ("attn", 6, lambda r: str(r.get("attention"))),
    ("packed", 6, lambda r: str(r.get("packed"))),
    ("batch", 5, lambda r: str(r.get("batch"))),
    ("status", 13, lambda r: str(r.get("status"))),
    ("step ms", 9, lambda r: _fmt(r.get("step_ms"), ".1f")),
    ("tokens/s", 10, lambda r: _fmt(r.get("tokens_per_s"), ",.0f")),
    ("MFU %", 6, lambda r: _fmt(r.get("mfu"), ".1f", 100)),
    ("peak GiB", 8, lambda r: _fmt(r.get("peak_bytes"), ".2f", 2**-30)),
    ("XLA GiB", 8, lambda r: _fmt(r.get("xla_bytes"), ".2f", 2**-30)),
    ("est GiB", 8, lambda r: _fmt(r.get("est_bytes"), ".2f", 2**-30)),
    ("vs HF", 6, lambda r: _fmt(r.get("vs_hf"), ".2f")),
    ("wall s", 6, lambda r: _fmt(r.get("wall_s"), ".0f")),
)


def table_header() -> str:
    """The table's column header line."""
    return " ".join(f"{h:>{w}}" if i >= 7 else f"{h:<{w}}" for i, (h, w, _) in enumerate(COLUMNS))


def table_row(row: Mapping[str, Any]) -> str:
    """One row of the table; a failed or skipped row adds its error text."""
    cells = [
        f"{cell(row):>{w}}" if i >= 7 else f"{cell(row):<{w}}"
        for i, (_, w, cell) in enumerate(COLUMNS)
    ]
    line = " ".join(cells)
    return line if row.get("status") == "ok" else f"{line}  {row.get('error') or ''}".rstrip()


class JsonLines:
    """Appends records to a JSON-lines file, one open-append-fsync-close per record, so a run
    killed at any moment leaves every finished record on disk (no file: nothing written)."""

    def __init__(self, path: str | None):
        self.path = path

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends one record."""
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def ratio_to_peer(row: Mapping[str, Any], peer: Mapping[str, Any]) -> float | None:
    """xlscale tokens/s ÷ the peer's, both measured in this run (None unless both are ok)."""
    if row.get("status") != "ok" or peer.get("status") != "ok":
        return None
    return row["tokens_per_s"] / peer["tokens_per_s"]


class Session:
    """Runs tasks one at a time within the budget, streams each row (table line on `stream`,
    record to `out`), compares xlscale rows with the peer of their model, and ends with a
    summary. Rows are dicts: the task's fields, the child's result, `name`, `wall_s`."""

    def __init__(
        self,
        *,
        budget: Budget,
        out: JsonLines,
        cwd: str,
        row_timeout_s: float | None,
        logs: str | None = None,
        stream=None,
    ):
        self.budget = budget
        self.out = out
        self.cwd = cwd
        self.row_timeout_s = row_timeout_s
        self.logs = logs  # a directory for each child's whole output (None: failed rows' tails)
        self.stream: TextIO = stream or sys.stdout
        self.rows: list[dict[str, Any]] = []
        self.ratios: dict[str, float] = {}

    def say(self, text: str) -> None:
        """Prints a line now (a lease may end at any moment)."""
        print(text, file=self.stream, flush=True)

    def _timeout(self) -> tuple[float | None, str]:
        """A child's timeout and what set it: what is left of the budget, or the row cap."""
        caps = [(c, why) for c, why in self._caps() if c is not None]
        if not caps:
            return None, ""
        cap, why = min(caps)
        return max(1.0, cap), why

    def _caps(self):
        return ((self.budget.remaining(), "the budget's end"), (self.row_timeout_s, "row timeout"))

    def run(self, task: Task) -> dict[str, Any]:
        """Runs one task (or skips it when its expected duration exceeds what is left of the
        budget) and streams its row."""
        row: dict[str, Any] = {"record": "row", "name": task.name, **task.fields}
        left = self.budget.remaining()
        need, basis = self.budget.estimate(task.key, task.prior_s)
        if left is not None and need > left:
            row.update(status="skipped", error=f"needs ~{need:.0f} s ({basis}), {left:.0f} s left")
            return self._finish(row)
        timeout, why = self._timeout()
        run = run_child(task.argv, env=task.env, cwd=self.cwd, timeout_s=timeout)
        row.update(child_result(run))
        row.update(wall_s=run.wall_s, exit_code=run.returncode)
        if row["status"] == "timeout":
            row["error"] += f" at {why}"
        else:
            self.budget.record(task.key, run.wall_s)
        if row["status"] != "ok":
            row["log_tail"] = tail(run.stderr)
        if self.logs is not None:
            log = os.path.join(self.logs, task.name.replace("/", "__") + ".log")
            with open(log, "w", encoding="utf-8") as f:
                f.write(
                    f"$ {' '.join(task.argv)}\n--- stdout\n{run.stdout}--- stderr\n{run.stderr}"
                )
        return self._finish(row)

    def first_fit(self, tasks: Sequence[Task]) -> dict[str, Any] | None:
        """Runs `tasks` in order until one does not run out of memory; returns that row if it is
        ok, else None (a remat search, a batch halving)."""
        for task in tasks:
            row = self.run(task)
            if row["status"] != "oom":
                return row if row["status"] == "ok" else None
        return None

    def _finish(self, row: dict[str, Any]) -> dict[str, Any]:
        peers = [p for p in self.rows if _is_peer(p) and p.get("model") == row.get("model")]
        if row.get("impl") == "xlscale" and peers:
            row["vs_hf"] = ratio_to_peer(row, peers[-1])
        if len(self.rows) == 0:
            self.say(table_header())
        self.rows.append(row)
        self.out.write(row)
        self.say(table_row(row))
        if _is_peer(row) and row["status"] == "ok":
            self._compare(row)
        return row

    def _compare(self, peer: Mapping[str, Any]) -> None:
        mine = [r for r in self.rows if r.get("impl") == "xlscale" and r["model"] == peer["model"]]
        for row in mine:
            ratio = ratio_to_peer(row, peer)
            if ratio is not None:
                self.ratios[row["name"]] = ratio
                at = "" if peer["batch"] == row["batch"] else f", peer at batch {peer['batch']}"
                self.say(
                    f"  vs HF: {row['name']} {ratio:.2f}x {peer['impl']} "
                    f"({row['tokens_per_s']:,.0f} / {peer['tokens_per_s']:,.0f} tokens/s{at})"
                )

    def summary(self) -> dict[str, Any]:
        """Prints and records the run's summary: rows by status, which were skipped and why,
        the ratios to the peers."""
        by_status = {s: sum(r["status"] == s for r in self.rows) for s in STATUSES}
        skipped = {r["name"]: r["error"] for r in self.rows if r["status"] == "skipped"}
        record = {
            "record": "summary",
            "wall_s": self.budget.elapsed(),
            "by_status": {s: n for s, n in by_status.items() if n},
            "skipped": skipped,
            "vs_hf": dict(self.ratios),
        }
        self.say(
            f"done in {record['wall_s']:.0f} s: "
            + ", ".join(f"{n} {s}" for s, n in record["by_status"].items())
        )
        if skipped:
            self.say(f"skipped {len(skipped)} row(s) for the budget:")
            for name, why in skipped.items():
                self.say(f"  {name}: {why}")
        self.out.write(record)
        return record


def _is_peer(row: Mapping[str, Any]) -> bool:
    return str(row.get("impl", "")).startswith("hf")
