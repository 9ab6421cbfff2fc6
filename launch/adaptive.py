"""An adaptive sweep's decisions and their log: what `xlscale sweep run --adaptive` decides for
each unfinished run, why, and how `sweep status` and `sweep adaptive replay` read it back.

After every refit (`launch.adaptive_fit`) each run that has not finished gets a `RunState`: the
numbers a decision reads — the information its remaining evaluation points add about the study's
law parameters at the current fit (`fitting.design.information.info_gain`, nats), its remaining
chip-hours, its predicted final metric with a 95% interval, whether the fit of its law is
identifiable yet, and the runs that still need it. `decide(state, policy)` is a pure function of
those numbers and the thresholds (`Policy`):

1. RUN while a run that depends on it (a CPT run on its source run) still needs it;
2. RUN while its law's fit is not identifiable (too few sizes) or did not converge;
3. RUN a run whose evaluations are no point of the study's laws (replay runs);
4. SKIP (not started) or STOP (running) when its final value is already predicted within
   `tolerance` (relative 95% half-width);
5. SKIP or STOP when its information per chip-hour is below `min_gain`;
6. else RUN.

Every decision is one line of `<runs_dir>/adaptive/decisions.jsonl` holding the state and the
policy it read and the fit state it came from (points digest and count, fitted parameters), so
`replay` recomputes each logged decision from its own line; each refit is one line of
`fits.jsonl`: {"chip_hours": spent, "params", "ci": {name: [lo, hi]}, ...}.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rundir import names, storage

RUN, SKIP, STOP = "RUN", "SKIP", "STOP"
DECISIONS = (RUN, SKIP, STOP)
PENDING, RUNNING = "pending", "running"  # the statuses a decision is made for


@dataclasses.dataclass(frozen=True)
class Policy:
    """The thresholds of an adaptive sweep.

    Attributes:
      min_gain: nats of information per chip-hour below which a run is skipped or stopped
        (`--min-gain`; 0: never on information alone).
      tolerance: relative 95% half-width of a run's predicted final value within which it is
        skipped or stopped (`--tolerance`; 0: never on prediction alone).
      unit: what costs are counted in: "chip-hour" on the booked hardware, or "PFLOP/s-hour"
        without one (`launch.design.cost_fn`); `min_gain` is in nats per this unit.
    """

    min_gain: float = 0.0
    tolerance: float = 0.02
    unit: str = "chip-hour"

    def __post_init__(self):
        if not (math.isfinite(self.min_gain) and self.min_gain >= 0):
            raise ValueError(f"--min-gain {self.min_gain}: allowed: a number >= 0 (nats/chip-hour)")
        if not (math.isfinite(self.tolerance) and 0 <= self.tolerance < 1):
            raise ValueError(f"--tolerance {self.tolerance}: allowed: 0 <= tolerance < 1")

    def to_json(self) -> dict[str, Any]:
        """The log's record of the thresholds."""
        return {"min_gain": self.min_gain, "tolerance": self.tolerance, "unit": self.unit}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Policy:
        """The thresholds a decision line recorded."""
        return cls(
            min_gain=float(record["min_gain"]),
            tolerance=float(record["tolerance"]),
            unit=str(record.get("unit", "chip-hour")),
        )


@dataclasses.dataclass(frozen=True)
class RunState:
    """What a decision about one run reads (all of it logged with the decision).

    Attributes:
      run_id: the run.
      status: "pending" (not started) or "running".
      identifiable: whether the fit of the run's law is identifiable and converged.
      points: evaluation points the run yields in all; points_left: those still to come.
      gain: nats the remaining points add at the current fit (None: not computed).
      cost: the run's remaining chip-hours.
      predicted: its predicted final metric; interval: the 95% interval of that prediction.
      needed_by: runs that depend on it and still need it (pending, decided RUN).
      why_not: why the fit is not identifiable (empty when it is).
    """

    run_id: str
    status: str
    identifiable: bool
    points: int
    points_left: int
    gain: float | None
    cost: float
    predicted: float | None = None
    interval: tuple[float, float] | None = None
    needed_by: tuple[str, ...] = ()
    why_not: str = ""

    @property
    def rate(self) -> float | None:
        """Information per chip-hour of what is left (None without a gain; inf when free)."""
        if self.gain is None:
            return None
        return self.gain / self.cost if self.cost > 0 else math.inf

    @property
    def half_width(self) -> float | None:
        """The 95% interval's relative half-width around the prediction (None without one)."""
        if self.predicted is None or self.interval is None or not self.predicted:
            return None
        lo, hi = self.interval
        return (hi - lo) / 2 / abs(self.predicted)

    def to_json(self) -> dict[str, Any]:
        """The logged numbers (with the derived rate and half-width, for readers)."""
        record = dataclasses.asdict(self)
        record["interval"] = None if self.interval is None else list(self.interval)
        record["needed_by"] = list(self.needed_by)
        return {**record, "rate": self.rate, "half_width": self.half_width}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> RunState:
        """The state a decision line recorded."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in fields}
        if values.get("interval") is not None:
            values["interval"] = tuple(values["interval"])
        values["needed_by"] = tuple(values.get("needed_by") or ())
        return cls(**values)


def decide(state: RunState, policy: Policy) -> tuple[str, str]:
    """(decision, reason) for one run: RUN, SKIP (pending) or STOP (running); see the module
    docstring for the rules, in order. Pure: the same state and policy, the same answer."""
    if state.status not in (PENDING, RUNNING):
        raise ValueError(f"run {state.run_id}: status {state.status!r}; allowed: pending, running")
    drop = SKIP if state.status == PENDING else STOP
    if state.needed_by:
        return RUN, f"needed by {', '.join(state.needed_by)}"
    if not state.identifiable:
        return RUN, f"fit not identifiable yet ({state.why_not or 'no fit'})"
    if state.points == 0:
        return RUN, "yields no point of the study's laws (kept as the manifest has it)"
    width = state.half_width
    if policy.tolerance > 0 and width is not None and width <= policy.tolerance:
        return drop, (
            f"final value predicted within ±{width:.2%} (95%), tolerance ±{policy.tolerance:.2%}"
        )
    rate = state.rate
    if policy.min_gain > 0 and rate is not None and rate < policy.min_gain:
        return drop, (
            f"information {state.gain:.3g} nats over {state.cost:.3g} {policy.unit}s = "
            f"{rate:.3g} nats per {policy.unit}, below --min-gain {policy.min_gain:.3g}"
        )
    shown = "?" if rate is None else f"{rate:.3g}"
    width_text = "?" if width is None else f"±{width:.2%}"
    return RUN, f"{shown} nats per {policy.unit}, final value {width_text}: worth running"


def decide_all(
    states: Mapping[str, RunState],
    dependents: Mapping[str, Sequence[str]],
    policy: Policy,
) -> dict[str, tuple[RunState, str, str]]:
    """Decisions for runs that depend on one another: a run's dependents are decided first, and
    a pending dependent decided RUN makes the run it needs RUN too (`RunState.needed_by`).

    Args:
      states: run id -> its state (needed_by empty: filled here).
      dependents: run id -> ids of the runs that start from it.
      policy: the thresholds.

    Returns:
      run id -> (its state with needed_by, decision, reason), for every run of `states`.
    """
    out: dict[str, tuple[RunState, str, str]] = {}

    def visit(run_id: str, trail: tuple[str, ...] = ()) -> None:
        if run_id in out or run_id in trail:
            return
        for child in dependents.get(run_id, ()):
            if child in states:
                visit(child, (*trail, run_id))
        needed = tuple(
            c
            for c in dependents.get(run_id, ())
            if c in out and out[c][0].status == PENDING and out[c][1] == RUN
        )
        state = dataclasses.replace(states[run_id], needed_by=needed)
        out[run_id] = (state, *decide(state, policy))

    for run_id in states:
        visit(run_id)
    return {k: out[k] for k in states}


@dataclasses.dataclass(frozen=True)
class FitRecord:
    """The fit state decisions came from: a digest of the points, their count, the study's
    parameters (fitted, or the prior where not yet), their 95% intervals, and compute spent."""

    digest: str
    n_points: int
    params: Mapping[str, float]
    ci: Mapping[str, tuple[float, float]]
    chip_hours: float
    fitted: tuple[str, ...] = ()  # blocks whose fit is identifiable
    skipped: Mapping[str, str] = dataclasses.field(default_factory=dict)  # block -> why not
    # block -> its residuals' noise (`fitting.design.noise.RunNoise.to_json`: σ, τ, runs, points)
    noise: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """One line of fits.jsonl."""
        return {
            "chip_hours": self.chip_hours,
            "params": dict(self.params),
            "ci": {k: [lo, hi] for k, (lo, hi) in self.ci.items()},
            "digest": self.digest,
            "n_points": self.n_points,
            "fitted": list(self.fitted),
            "skipped": dict(self.skipped),
            "noise": {b: dict(n) for b, n in self.noise.items()},
        }


def adaptive_dir(runs_dir: str):
    """`<runs_dir>/adaptive`, where an adaptive sweep logs."""
    return storage.as_path(runs_dir, name="runs_dir") / names.ADAPTIVE_SUBDIR


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _append(path, records: Iterable[Mapping[str, Any]]) -> None:
    text = "".join(json.dumps(r, sort_keys=True, allow_nan=False) + "\n" for r in records)
    if text:
        path.parent.mkdir(parents=True, exist_ok=True)
        storage.append_text(path, text)


def _finite(value: Any) -> Any:
    """JSON without NaN/inf: non-finite floats as None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def decision_record(
    state: RunState, decision: str, reason: str, policy: Policy, fit: FitRecord
) -> dict[str, Any]:
    """One line of decisions.jsonl: time, run id, decision, reason, the numbers behind it and
    the thresholds (top level), and the fit state it used."""
    return _finite(
        {
            "time": _now(),
            **state.to_json(),
            "decision": decision,
            "reason": reason,
            **policy.to_json(),
            "fit": {"digest": fit.digest, "n_points": fit.n_points, "params": dict(fit.params)},
        }
    )


def log_fit(runs_dir: str, fit: FitRecord) -> None:
    """Appends a refit to `<runs_dir>/adaptive/fits.jsonl`."""
    record = _finite({"time": _now(), **fit.to_json()})
    _append(adaptive_dir(runs_dir) / names.ADAPTIVE_FITS_FILE, [record])


def log_decisions(runs_dir: str, records: Sequence[Mapping[str, Any]]) -> None:
    """Appends decision lines to `<runs_dir>/adaptive/decisions.jsonl`."""
    _append(adaptive_dir(runs_dir) / names.ADAPTIVE_DECISIONS_FILE, records)


def write_session(runs_dir: str, settings: Mapping[str, Any]) -> None:
    """Records the settings of the adaptive sweep (thresholds, hardware, bootstrap, start)."""
    path = adaptive_dir(runs_dir) / names.ADAPTIVE_SESSION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_text_atomic(path, json.dumps({"started": _now(), **settings}, indent=1) + "\n")


def write_error(runs_dir: str, text: str) -> str:
    """Writes the traceback of steering that stopped mid-sweep to
    `<runs_dir>/adaptive/steering_error.txt` (a bug to report; the runs go on as planned) and
    returns the file's path."""
    path = adaptive_dir(runs_dir) / names.ADAPTIVE_ERROR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_text_atomic(path, text)
    return str(path)


def read_session(runs_dir: str) -> dict[str, Any] | None:
    """The recorded settings, or None where no adaptive sweep ran."""
    path = adaptive_dir(runs_dir) / names.ADAPTIVE_SESSION_FILE
    return json.loads(path.read_text()) if path.exists() else None


def read_lines(runs_dir: str, file: str) -> list[dict[str, Any]]:
    """The complete lines of an adaptive log (`names.ADAPTIVE_DECISIONS_FILE` or
    `names.ADAPTIVE_FITS_FILE`); a torn last line is left out."""
    path = adaptive_dir(runs_dir) / file
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


@dataclasses.dataclass(frozen=True)
class Replay:
    """`replay`'s answer: decisions recomputed, and those that came out differently (each as
    (line number, logged (decision, reason), recomputed (decision, reason)))."""

    checked: int
    mismatches: tuple[tuple[int, tuple[str, str], tuple[str, str]], ...]

    @property
    def ok(self) -> bool:
        """Every logged decision recomputes to itself."""
        return not self.mismatches


def replay(runs_dir: str) -> Replay:
    """Recomputes every logged decision from its own line (`decide` on the logged state and
    thresholds) and lists those that differ."""
    mismatches = []
    lines = read_lines(runs_dir, names.ADAPTIVE_DECISIONS_FILE)
    for i, line in enumerate(lines, 1):
        got = decide(RunState.from_json(line), Policy.from_json(line))
        if got != (line["decision"], line["reason"]):
            mismatches.append((i, (line["decision"], line["reason"]), got))
    return Replay(len(lines), tuple(mismatches))


def latest_decisions(lines: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Run id -> its last logged decision line."""
    return {line["run_id"]: line for line in lines}
