"""`xlscale sweep run --adaptive`: a sweep steered by the law it is estimating.

The launcher (any of `launch.launchers.LAUNCHERS`) runs the sweep as it always does, in this
thread. Beside it an `AdaptiveSweep` polls the run directories every `poll_s` seconds; whenever a
run logs a new evaluation (or completes) it refits the study's laws on every evaluation so far
(`launch.adaptive_fit`), assesses each unfinished run and decides RUN, SKIP or STOP
(`launch.adaptive.decide_all`), logging each decision and each refit under
`<runs_dir>/adaptive/`. A SKIP or STOP is carried out the one way every launcher and every host
honours: a stop request in the run's MODEL_DIR (`rundir.stop_request`). A run not yet started is
then never started (launchers pass it by; a queued SLURM or xmanager job exits at once), a
running one saves a checkpoint and exits (`rundir.exits.STOPPED`), is not requeued, and resumes
exactly where it stopped if the request is removed and the sweep run again.

Asynchronous launchers (SLURM, xmanager) return once their jobs are submitted; the polling then
goes on here until every run has finished, been stopped, or failed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fitting.design.study import Candidate, StudyModel
from launch import adaptive, adaptive_fit, design, sweep_design
from launch.adaptive import RUN, SKIP, Policy
from launch.adaptive_fit import FitState, Observation
from launch.runs import Run
from rundir import names, stop_request
from rundir.run_record import Strategy

FINISHED = ("done", "stopped", "failed")  # launch.status states no launcher changes
BY = "sweep run --adaptive"  # who asks, in the stop requests it writes
TARGET_STRATEGIES = (Strategy.SCRATCH, Strategy.CPT)  # the strategies of a CPT study's target


def dependents_of(runs: Sequence[Run]) -> dict[str, tuple[str, ...]]:
    """Run id -> ids of the runs that start from it."""
    out: dict[str, list[str]] = {}
    for run in runs:
        for dep in run.depends_on:
            out.setdefault(dep, []).append(run.run_id)
    return {k: tuple(v) for k, v in out.items()}


def finished(runs: Sequence[Run], obs: Observation) -> bool:
    """Whether no run will change any more: each is done, stopped or failed, or waits on a run
    that was stopped or failed (its launcher blocks it)."""
    by_id = {r.run_id: r for r in runs}
    memo: dict[str, bool] = {}

    def over(run_id: str) -> bool:
        if run_id not in memo:
            memo[run_id] = False  # a cycle is not finished
            run = by_id.get(run_id)
            state = obs.states.get(run_id)
            dead = [d for d in (run.depends_on if run else ()) if d in by_id]
            blocked = any(obs.states.get(d) in ("stopped", "failed") or over(d) for d in dead)
            memo[run_id] = state in FINISHED or (state == "pending" and blocked)
        return memo[run_id]

    return all(over(r.run_id) for r in runs)


@dataclasses.dataclass
class AdaptiveSweep:
    """One adaptive sweep's state between polls (see the module docstring).

    Attributes:
      runs: the sweep's runs; runs_dir: where `adaptive/` is written.
      model: the study's laws and prior (`launch.design.study_model`).
      cands: run id -> its candidate (cost in chip-hours, points; `launch.design.candidates`).
      policy: the thresholds; bootstrap, seed: of each refit.
      note: where progress lines go.
      scales: the schedule-aware blocks' pilot λ and reference scales (`--law lr_area`).
      cancel_queued: cancels a skipped run's jobs that wait in the launcher's queue
        (`SlurmLauncher.cancel_queued`); returns what it cancelled, or None.
    """

    runs: list[Run]
    runs_dir: str
    model: StudyModel
    cands: Mapping[str, Candidate]
    policy: Policy
    bootstrap: int = 50
    seed: int = 0
    note: Callable[[str], None] = print
    scales: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    cancel_queued: Callable[[Run], str | None] | None = None
    fit: FitState | None = None
    _seen: Any = None

    @classmethod
    def for_runs(
        cls,
        runs: Sequence[Run],
        runs_dir: str,
        policy: Policy,
        *,
        hardware: str | None = None,
        mfu: float = 0.5,
        law: str = "paper",
        prior_path: str | None = None,
        **options: Any,
    ) -> AdaptiveSweep:
        """The sweep of `runs` with the study model and candidates that `--law` and `--prior`
        make of them (`launch.sweep_design.STUDIES`, as `sweep design` does: the papers' laws
        from their values by default); records the settings in `adaptive/session.json`.

        Raises:
          ValueError: the runs train several target languages (the study model has one), or
            the law or prior is refused (`launch.sweep_design.design_sweep`'s messages).
        """
        targets = {r.coord("target_lang") for r in runs if r.strategy in TARGET_STRATEGIES}
        if len(targets) > 1:
            raise ValueError(
                f"--adaptive: the runs train target languages {sorted(targets)}; the study's "
                "laws are one language's: narrow the sweep with --only"
            )
        study = sweep_design.study_of(law, runs, prior_path, hardware=hardware, mfu=mfu)
        unit = "chip-hour" if hardware else "PFLOP/s-hour"  # `launch.design.cost_fn`
        policy = dataclasses.replace(policy, unit=unit)
        sweep = cls(
            list(runs),
            runs_dir,
            study.model,
            {c.key: c for c in study.candidates},
            policy,
            scales=study.scales,
            **options,
        )
        adaptive.write_session(
            runs_dir,
            {
                **policy.to_json(),
                "hardware": hardware,
                "mfu": mfu,
                "cost_unit": f"{unit}s",
                "bootstrap": sweep.bootstrap,
                "seed": sweep.seed,
                "law": law,
                "prior": study.prior,
                "runs": [r.run_id for r in runs],
            },
        )
        return sweep

    def poll(self) -> bool:
        """One look at the runs: on a new evaluation refit, and on any change decide and act.
        Returns whether every run has finished."""
        obs = adaptive_fit.observe(self.runs)
        key = (obs.digest, tuple(sorted(obs.states.items())))
        if key != self._seen:
            self._seen = key
            self._tidy(obs)
            if self.fit is None or self.fit.record.digest != obs.digest:
                self._refit(obs)
            self._decide(obs)
        return finished(self.runs, obs)

    def _tidy(self, obs: Observation) -> None:
        """Withdraws this sweep's stop requests of runs that completed before they noticed one
        (nothing is left to stop; a rerun of the sweep decides afresh)."""
        for run in self.runs:
            if obs.states.get(run.run_id) == "done" and stop_request.requested(run.model_dir):
                if (stop_request.read(run.model_dir) or {}).get("by") == BY:
                    stop_request.withdraw(run.model_dir)

    def _refit(self, obs: Observation) -> None:
        spent, _ = adaptive_fit.spent_and_saved(self.cands, self.runs, obs)
        self.fit = adaptive_fit.refit(
            self.model,
            obs,
            run_blocks={k: sorted({p.block for p in c.points}) for k, c in self.cands.items()},
            basis=design.n_basis(self.runs),  # the basis the candidates' points are on
            bootstrap=self.bootstrap,
            seed=self.seed,
            chip_hours=spent,
            scales=self.scales,
        )
        adaptive.log_fit(self.runs_dir, self.fit.record)
        fitted = ", ".join(self.fit.record.fitted) or "none yet"
        self.note(
            f"adaptive: refit on {self.fit.record.n_points} points ({fitted} identified), "
            f"{spent:.3g} spent"
        )

    def _decide(self, obs: Observation) -> None:
        states = adaptive_fit.assess(self.model, self.cands, self.runs, obs, self.fit)
        decided = adaptive.decide_all(states, dependents_of(self.runs), self.policy)
        records = [
            adaptive.decision_record(state, decision, reason, self.policy, self.fit.record)
            for state, decision, reason in decided.values()
        ]
        adaptive.log_decisions(self.runs_dir, records)
        by_id = {r.run_id: r for r in self.runs}
        # Skips first: a queued job is cancelled before a running one is told to stop, so the
        # allocation a stopped job frees never goes to a job about to be cancelled.
        acted = sorted(decided.items(), key=lambda item: item[1][1] != SKIP)
        for run_id, (_, decision, reason) in acted:
            if decision == RUN:
                continue
            if obs.states.get(run_id) in ("running", "stopped") and stop_request.requested(
                by_id[run_id].model_dir
            ):
                continue  # stopping or stopped on an earlier decision: logged, nothing to do
            stop_request.request(by_id[run_id].model_dir, reason=f"{decision}: {reason}", by=BY)
            self.note(f"adaptive: {decision} {run_id}: {reason}")
            if self.cancel_queued is not None and decision == SKIP:
                cancelled = self.cancel_queued(by_id[run_id])
                if cancelled:
                    self.note(f"adaptive: {cancelled}")


class SteeringError(RuntimeError):
    """The adaptive steering stopped mid-sweep on an error of its own; the launch went on as
    planned. The message names the error and the file that holds its traceback."""


def _stopped(sweep: AdaptiveSweep, error: Exception, after: str) -> SteeringError:
    """The `SteeringError` of `error` (just caught), its traceback written beside the sweep's
    logs (`adaptive.write_error`); notes it, with what happens to the runs (`after`)."""
    what = f"{type(error).__name__}: {error}"
    try:
        where = (
            f"its traceback is in {adaptive.write_error(sweep.runs_dir, traceback.format_exc())}"
        )
    except Exception as io:  # noqa: BLE001 -- the message must reach the user all the same
        where = f"its traceback could not be written ({io})"
    sweep.note(f"adaptive: steering stopped ({what}); {after}")
    return SteeringError(f"adaptive steering stopped mid-sweep ({what}); {where}; {after}")


def run(sweep: AdaptiveSweep, launch: Callable[[], Sequence[Any]], *, poll_s: float) -> list:
    """Runs `launch()` (the launcher, in this thread) with `sweep` polling beside it, then
    polls on until every run has finished where the launcher only submitted jobs; returns
    `launch()`'s reports.

    Raises:
      SteeringError: the polling failed; raised once the launch returned, so no run is lost to
        it. Its traceback is in `<runs_dir>/adaptive/steering_error.txt`.
    """
    launched = threading.Event()
    failure: list[SteeringError] = []

    def watch() -> None:
        try:
            while True:
                sweep.poll()
                if launched.wait(poll_s):
                    return
        except Exception as e:  # noqa: BLE001 -- raised again in the launching thread
            failure.append(_stopped(sweep, e, "the launch goes on as planned"))

    watcher = threading.Thread(target=watch, name="adaptive", daemon=True)
    watcher.start()
    try:
        reports = list(launch())
    finally:
        launched.set()
        watcher.join()
    if failure:
        raise failure[0]
    submitted = any(getattr(r, "submitted", None) for r in reports)
    try:
        while not sweep.poll() and submitted:
            time.sleep(poll_s)
    except Exception as e:
        after = "the submitted jobs go on as planned: `xlscale sweep status` follows them"
        raise _stopped(sweep, e, after) from e
    return reports


def summary_lines(runs: Sequence[Run], runs_dir: str) -> list[str]:
    """`sweep status`'s lines about an adaptive sweep (none where none ran under `runs_dir`):
    compute spent and saved, the current fit with its 95% intervals and each law's noise (σ per
    evaluation, τ per run), the decision counts."""
    session = adaptive.read_session(runs_dir)
    if session is None:
        return []
    known = set(session.get("runs") or [r.run_id for r in runs])
    runs = [r for r in runs if r.run_id in known]
    cands = design.candidates(runs, hardware=session.get("hardware"), mfu=session.get("mfu", 0.5))
    obs = adaptive_fit.observe(runs)
    spent, saved = adaptive_fit.spent_and_saved({c.key: c for c in cands}, runs, obs)
    total = sum(c.cost for c in cands)
    unit = session.get("cost_unit", "chip-hours")
    law = session.get("law", "paper")  # sessions before --adaptive-law refitted the papers' laws
    lines = [
        f"# adaptive (--min-gain {session['min_gain']:g}, --tolerance {session['tolerance']:g}"
        + (f", --adaptive-law {law}" if law != "paper" else "")
        + f"): spent {spent:.4g} {unit}, saved {saved:.4g} (skipped or stopped) of {total:.4g}"
    ]
    fits = adaptive.read_lines(runs_dir, names.ADAPTIVE_FITS_FILE)
    if fits:
        last = fits[-1]
        lines.append(
            f"# adaptive fit {len(fits)} on {last.get('n_points')} points "
            f"(identified: {', '.join(last.get('fitted') or []) or 'none yet'}):"
        )
        ci, fitted = last.get("ci") or {}, set(last.get("fitted") or [])
        lines += [  # the fitted blocks' parameters, 95% bootstrap interval where there is one
            f"#   {name} = {value:.4g}"
            + (f"  [{ci[name][0]:.4g}, {ci[name][1]:.4g}]" if name in ci else "")
            for name, value in last["params"].items()
            if name in ci or name.rsplit(".", 1)[0] in fitted
        ]
        lines += [  # each law's noise from its residuals by run (fitting.design.noise)
            f"#   noise {block}: sigma {n['sigma']:.3%} per evaluation, tau {n['run_sigma']:.3%} "
            f"per run ({n['runs']} runs, {n['points']} points)"
            for block, n in (last.get("noise") or {}).items()
        ]
    decisions = adaptive.read_lines(runs_dir, names.ADAPTIVE_DECISIONS_FILE)
    if decisions:
        latest = adaptive.latest_decisions(decisions)
        counts = {d: sum(v["decision"] == d for v in latest.values()) for d in adaptive.DECISIONS}
        lines.append(
            f"# adaptive decisions: {len(decisions)} logged; latest per run: "
            + ", ".join(f"{d} {n}" for d, n in counts.items())
        )
    return lines
