"""What an adaptive sweep knows at one moment: the runs' progress, the study's laws refitted on
every evaluation so far, and each unfinished run's `launch.adaptive.RunState`.

`observe` reads every run's state (`launch.status.run_status`) and run directory
(`fitting.readers.run_dirs.read_run`); its digest changes whenever a run logs a new evaluation.
`refit` fits each block of the study model (`launch.design.study_model`) with fitting's own
steps (`fitting.reports.fit_steps.Study`, as `xlscale fit` does: the Chinchilla law on a
language's source and scratch runs, the CPT law's second stage on its CPT runs; every
evaluation after the first token a point, intermediate checkpoints included; bootstrap over whole
runs), on the N basis the candidates use; an MT block (BLEU log-law, cross-entropy power law)
on its series' finetunes, every (Dp, final value) fitted (`fitting.laws.downstream_laws`), with
a residual bootstrap (`downstream_laws.bootstrap_series`: a series has one point per checkpoint,
so the checkpoints stay and the noise is redrawn). A schedule-aware block (`--law lr_area`,
`launch.design_schedule`) is refitted as `xlscale fit --law lr_area` fits it, on every evaluation
of the block's runs, at the pilot fit's λ and reference scales so that its parameters stay the
study's, with a parametric bootstrap for its intervals (`lr_area.parametric_bootstrap`: the
fitted law plus the run offsets and evaluation noise its residuals show; resampling whole runs
would leave most draws of a three-size study with fewer than three sizes). A block the data
cannot identify yet (fewer sizes or Dp than its law needs, `fitting.checks.Unidentifiable`)
keeps the prior and is named with the reason. Each law fitted on runs' curves also gets its noise
from its log residuals grouped by run (`fitting.design.noise.run_noise`: σ of one evaluation, τ
of a run's offset, since a seed moves a whole curve), logged in `fits.jsonl`; the information is
the fits' sandwich under that noise (`fitting.design.information`), so a run's checkpoints count
as one run's. `assess` turns
the fit into each unfinished run's numbers: the information its remaining points add
(`fitting.design.information.info_gain` at the fitted parameters: the run as a whole less its
part observed, over the information of every point observed), its remaining chip-hours, and its
final metric predicted by the block's law moved by the run's own offset as its evaluations so
far show it (`run_offset`), with the 95% interval of the bootstrap refits widened by what is
left unknown of that offset and one evaluation's noise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.checks import FitInputError, Unidentifiable, require_distinct
from fitting.design import information
from fitting.design.noise import RunNoise, run_noise, run_offset
from fitting.design.study import Candidate, Point, StudyModel, predict_law, with_noise
from fitting.laws import downstream_laws, formulas, lr_area
from fitting.laws.robust_fit import LawFit
from fitting.readers import points as fit_points
from fitting.readers import run_dirs
from fitting.readers.run_data import RunData
from fitting.reports import fit_steps, schedule_fit
from launch import design, design_schedule
from launch import status as run_states
from launch.adaptive import PENDING, RUNNING, FitRecord, RunState
from launch.runs import Run
from rundir.run_record import FROM_SCRATCH, Strategy

# run_status states -> what a decision sees: pending (not started), running (or interrupted: the
# launcher resumes it), or finished (no decision: done, stopped on request, failed).
DECIDED_STATES: Mapping[str, str] = {
    "pending": PENDING,
    "running": RUNNING,
    "interrupted": RUNNING,
}
MIN_SAMPLES = 10  # bootstrap refits needed for a prediction interval


@dataclasses.dataclass(frozen=True)
class Sources:
    """What one refit fits its blocks from: fitting's study of the runs (its fits cached), the
    target language of each CPT block, the downstream series of each MT block, and the MT
    blocks' bootstrap (resamples and seed; the study carries the CPT blocks' own), and the
    schedule-aware blocks' λ and reference scales (`launch.design_schedule`)."""

    study: fit_steps.Study
    langs: Mapping[str, str]
    series: Mapping[str, fit_points.DownstreamSeries]
    bootstrap: int = 0
    seed: int = 0
    scales: Mapping[str, design_schedule.BlockScales] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BlockResult:
    """One block's refit: the law's fit (None: no points yet), the points it was fitted on, and
    for laws fitted on runs' curves, each point's log residual and run (for `run_noise`)."""

    fit: LawFit | None
    points: Sequence[Point] = ()
    residuals: Sequence[float] = ()
    runs: Sequence[str] = ()


# A block's fit: (sources, block name) -> its `BlockResult`.
BlockFit = Callable[[Sources, str], BlockResult]


def _upstream(strategies: tuple[str, ...], fit: Callable[[fit_steps.Study, str], Any]) -> BlockFit:
    """A CPT-paper law fitted as `xlscale fit` does, on every evaluation of the language's runs
    of `strategies` (`fitting.reports.fit_steps.Study`)."""

    def fit_block(src: Sources, block: str) -> BlockResult:
        lang = src.langs.get(block)
        result = None if lang is None else fit(src.study, lang)
        if result is None:
            return BlockResult(None)
        pooled = fit_points.pool(src.study.curves(strategies, lang), rule=src.study.point_rule)
        with np.errstate(all="ignore"):
            pred = result.predict(pooled.N, pooled.D)
            residuals = np.log(np.asarray(pooled.L, float)) - np.log(pred)
        runs = [str(r) for r in pooled.runs]
        points = [
            Point(block, (n, d), run=r) for n, d, r in zip(pooled.N, pooled.D, runs, strict=True)
        ]
        return BlockResult(result, points, residuals, runs)

    return fit_block


def _downstream(src: Sources, block: str) -> BlockResult:
    """An MT-paper law fitted to its series' every finetune (Dp, final value), as
    `xlscale fit` fits one (`fitting.laws.downstream_laws.fit_series`), all points fitted, with
    its residual bootstrap for prediction intervals."""
    series = src.series.get(block)
    if series is None:
        return BlockResult(None)
    law = formulas.LAWS["power_law" if series.metric == downstream_laws.CE else "log_law"]
    require_distinct(
        law=law.name,
        series=block,
        what="distinct Dp",
        values=series.Dp,
        minimum=law.min_distinct[0],
    )
    fit = downstream_laws.fit_series(
        series.Dp, series.values, metric=series.metric, n_fit=len(series.Dp)
    )
    fit = downstream_laws.bootstrap_series(fit, n=src.bootstrap, seed=src.seed)
    # Each (Dp, value) is a finetune of its own: no run has two points, so σ and τ stay apart
    # only in the prior's σ (no `run_noise`).
    return BlockResult(fit, [Point(block, (float(dp),)) for dp in series.Dp])


def _schedule_aware(src: Sources, block: str) -> BlockResult:
    """The schedule-aware law fitted as `xlscale fit --law lr_area` fits it
    (`fitting.reports.schedule_fit`: the language's from-scratch runs for a source or scratch
    block, its CPT runs for the CPT block; the evaluations the study's point rule keeps, each
    run's schedule whole), at the block's pilot λ and reference scales, so its points are the
    design's (N/N₀, S₁/S₀, S₂)."""
    lang, scales = src.langs.get(block), src.scales.get(block)
    if lang is None or scales is None:
        return BlockResult(None)
    strategies = schedule_fit.GROUPS[design_schedule.GROUP_OF_BLOCK[block]]
    by_id = {r.run_id: r for r in src.study.runs}
    curves = []
    for c in src.study.curves(strategies, lang):
        keep = src.study.point_rule.select(c.tokens)
        lrs = fit_points.learning_rates(by_id[c.run_id])
        curves.append(lr_area.RunCurve(c.run_id, c.n_params, lrs, c.steps[keep], c.loss[keep]))
    if not curves:
        return BlockResult(None)
    fit = lr_area.fit_curves(
        curves, decay=scales.decay, series=f"{block} ({lang})", n_ref=scales.n_ref,
        s_ref=scales.s_ref,
    )  # fmt: skip
    N, S1, S2, L, runs = lr_area.pooled(curves, scales.decay)
    with np.errstate(all="ignore"):
        residuals = np.log(L) - np.log(fit.predict(N, S1, S2))
    noise = run_noise(residuals, runs) if src.bootstrap > 0 else None
    if noise is not None and noise.sigma > 0:  # intervals for the runs' predictions
        fit = lr_area.parametric_bootstrap(
            fit, N, S1, S2, runs, sigma=noise.sigma, run_sigma=noise.run_sigma,
            n=src.bootstrap, seed=src.seed,
        )  # fmt: skip
    inputs = zip(N / scales.n_ref, S1 / scales.s_ref, S2, runs, strict=True)
    points = [Point(block, (n, s1, s2), run=r) for n, s1, s2, r in inputs]
    return BlockResult(fit, points, residuals, list(runs))


# A block's law -> how it is refitted; a block whose law is not here keeps its prior, and its
# runs are decided as unidentifiable.
BLOCK_FITS: Mapping[str, BlockFit] = {
    "chinchilla": _upstream(FROM_SCRATCH, lambda study, lang: study.scratch_fit(lang)),
    "cpt": _upstream((Strategy.CPT,), lambda study, lang: study.cpt_fit(lang)),
    "log_law": _downstream,
    "power_law": _downstream,
    lr_area.LAW: _schedule_aware,
}


@dataclasses.dataclass(frozen=True)
class Observation:
    """The runs at one moment: each one's state and last step, the run directories that hold
    records, and a digest of every evaluation logged so far."""

    states: Mapping[str, str]  # run id -> launch.status state
    steps: Mapping[str, int]  # run id -> last logged step (0 when none)
    data: Mapping[str, RunData]  # run id -> its directory, for runs with records
    digest: str

    def progress(self, run: Run) -> float:
        """The share of the run's steps done (1 when done)."""
        if self.states.get(run.run_id) == "done":
            return 1.0
        return min(self.steps.get(run.run_id, 0) / run.steps, 1.0) if run.steps else 0.0


def observe(runs: Sequence[Run]) -> Observation:
    """Reads the runs' states and run directories (see `Observation`)."""
    states, steps, data, evals = {}, {}, {}, []
    for run in runs:
        status = run_states.run_status(run)
        states[run.run_id], steps[run.run_id] = status.state, int(status.step or 0)
        if status.step is None:
            continue
        try:
            data[run.run_id] = run_dirs.read_run(run.model_dir)
        except FitInputError:
            continue  # no run.json or records yet
        for record in data[run.run_id].records:
            values = sorted((k, v) for k, v in record.items() if k.startswith("eval/"))
            if values:
                evals.append((run.run_id, record.get("step"), values))
    text = json.dumps(evals, sort_keys=True, default=str)
    return Observation(states, steps, data, hashlib.sha256(text.encode()).hexdigest()[:16])


@dataclasses.dataclass(frozen=True)
class FitState:
    """A refit: the logged record, the study parameters as a vector's worth of values, the
    information of the points observed, per block its fit (or why there is none), the study
    model with the noise the residuals showed (`model`: each block's σ and τ from `run_noise`
    where the runs tell them apart, else the prior's), the points observed (each with its run),
    and each (block, run)'s log residuals (a running run's own offset, `run_offset`)."""

    record: FitRecord
    params: Mapping[str, float]
    info: np.ndarray
    fits: Mapping[str, LawFit]
    why_not: Mapping[str, str]
    model: StudyModel | None = None
    noise: Mapping[str, RunNoise] = dataclasses.field(default_factory=dict)
    observed: tuple[Point, ...] = ()
    residuals: Mapping[tuple[str, str], np.ndarray] = dataclasses.field(default_factory=dict)


def block_languages(model: StudyModel, data: Sequence[RunData]) -> dict[str, str]:
    """Block -> the target language of the runs that feed it (`launch.design` blocks: source,
    scratch, cpt by strategy).

    Raises:
      ValueError: a block's runs train several target languages (one study at a time).
    """
    langs: dict[str, set[str]] = {}
    for run in data:
        block = design.BLOCK_OF_STRATEGY.get(run.strategy)
        if block is not None:
            langs.setdefault(block, set()).add(run.target_lang)
    for block, found in langs.items():
        if len(found) > 1:
            raise ValueError(
                f"adaptive sweep: block {block!r} has runs of target languages {sorted(found)}; "
                "fit one language at a time (--only)"
            )
    return {b.name: next(iter(langs[b.name])) for b in model.blocks if b.name in langs}


def series_blocks(
    data: Sequence[RunData], run_blocks: Mapping[str, Sequence[str]]
) -> dict[str, fit_points.DownstreamSeries]:
    """MT block -> its downstream series (`fitting.readers.points.downstream_series`, the
    block's metric), matched through the blocks the series' finetunes feed (`run_blocks`: run
    id -> the blocks of its candidate's points, `launch.design`)."""
    out = {}
    for prefix, metric in design.MT_METRICS.items():
        if not any(b.startswith(f"{prefix}/") for bs in run_blocks.values() for b in bs):
            continue
        for series in fit_points.downstream_series(data, metric=metric):
            blocks = {
                b for r in series.runs for b in run_blocks.get(r, ()) if b.startswith(f"{prefix}/")
            }
            if len(blocks) == 1:
                out[blocks.pop()] = series
    return out


def refit(
    model: StudyModel,
    obs: Observation,
    *,
    run_blocks: Mapping[str, Sequence[str]],
    basis: str,
    bootstrap: int,
    seed: int,
    chip_hours: float,
    scales: Mapping[str, design_schedule.BlockScales] | None = None,
) -> FitState:
    """Fits every block of `model` that the observed runs identify (see the module docstring);
    `run_blocks`: run id -> the blocks its evaluations feed; `scales`: the schedule-aware
    blocks' pilot λ and reference scales."""
    data = list(obs.data.values())
    with tempfile.TemporaryDirectory() as scratch:  # Study's plot folder: nothing is drawn
        study = fit_steps.Study(data, Path(scratch), bootstrap, seed, None, n_basis=basis)
        series = series_blocks(data, run_blocks)
        langs = block_languages(model, data)
        src = Sources(study, langs, series, bootstrap, seed, scales or {})
        params, ci, fits, why_not, observed = dict(model.prior), {}, {}, {}, []
        held: dict[str, tuple[float, str]] = {}  # a degenerate fit's values -> why
        noise: dict[str, RunNoise] = {}
        residuals: dict[tuple[str, str], list[float]] = {}
        for block in model.blocks:
            how = BLOCK_FITS.get(block.law)
            if how is None:
                why_not[block.name] = f"the {block.law} law is not refitted"
                continue
            try:
                result = how(src, block.name)
            except Unidentifiable as e:
                why_not[block.name] = str(e)
                continue
            except FitInputError as e:  # e.g. a BLEU of 0 has no log-law
                why_not[block.name] = f"cannot be fitted: {e}"
                continue
            fit = result.fit
            if fit is None or not fit.converged:
                why_not[block.name] = "no points yet" if fit is None else fit.status
                continue
            fitted = {name: float(fit.params[p]) for p, name in block.params.items()}
            degenerate = (
                model.unusable(fitted)
                or _held_degenerate(fitted, held)
                or _flat(model, block.name, {**params, **fitted}, result.points)
            )
            if degenerate:  # e.g. early curves where a larger model's loss is still higher
                why_not[block.name] = f"the fit is degenerate ({degenerate}): needs more points"
                held.update({name: (value, degenerate) for name, value in fitted.items()})
                continue
            fits[block.name] = fit
            params.update(fitted)
            for law_param, name in block.params.items():
                if law_param in getattr(fit, "ci", {}):
                    ci[name] = tuple(float(x) for x in fit.ci[law_param])
            observed += result.points
            for r, run in zip(result.residuals, result.runs, strict=True):
                residuals.setdefault((block.name, run), []).append(float(r))
            estimate = run_noise(result.residuals, result.runs) if result.runs else None
            if estimate is not None and estimate.sigma > 0:
                noise[block.name] = estimate
    record = FitRecord(
        digest=obs.digest,
        n_points=len(observed),
        params=params,
        ci=ci,
        chip_hours=chip_hours,
        fitted=tuple(fits),
        skipped=why_not,
        noise={b: n.to_json() for b, n in noise.items()},
    )
    noisy = with_noise(model, {b: (n.sigma, n.run_sigma) for b, n in noise.items()})
    info = information.fisher(noisy, observed, params)
    return FitState(
        record,
        params,
        info,
        fits,
        why_not,
        noisy,
        noise,
        tuple(observed),
        {k: np.asarray(v) for k, v in residuals.items()},
    )


def _held_degenerate(fitted: Mapping[str, float], held: Mapping[str, tuple[float, str]]) -> str:
    """Why `fitted` is degenerate when it holds a degenerate block's values (the CPT law's
    second stage holds the from-scratch fit's E, A and α), or ""."""
    for name, value in fitted.items():
        if name in held and held[name][0] == value:
            return held[name][1]
    return ""


def _flat(model: StudyModel, block: str, params: Mapping[str, float], points) -> str:
    """Why the fitted law is degenerate when it does not depend on one of its inputs over its
    own points (`StudyModel.ignored_inputs`: a term gone with neither scale at 0), or ""."""
    inputs = np.array([p.inputs for p in points if p.block == block], np.float64)
    ignored = model.ignored_inputs(block, params, inputs) if len(inputs) else ()
    return f"{block}'s law ignores {' and '.join(ignored)}" if ignored else ""


def _interval(
    model: StudyModel, block: str, fit: LawFit, inputs: tuple[float, ...]
) -> tuple[float, float] | None:
    """95% percentile interval of the block's law at `inputs` over the fit's bootstrap refits
    (None for a fit with fewer than `MIN_SAMPLES`: no bootstrap, or an MT series with no point
    to spare)."""
    samples = getattr(fit, "samples", ())
    if len(samples) < MIN_SAMPLES:
        return None
    law = model.block(block).law
    values = [predict_law(law, {**fit.params, **sample}, inputs) for sample in samples]
    values = [v for v in values if np.isfinite(v)]
    if len(values) < MIN_SAMPLES:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def with_run_offset(
    mean: float,
    interval: tuple[float, float] | None,
    noise: RunNoise | None,
    residuals: Sequence[float],
) -> tuple[float, tuple[float, float] | None]:
    """A run's predicted final value and 95% interval: the law's (`mean`, the bootstrap's
    `interval`) moved by the run's own offset as its evaluations so far show it (`run_offset`),
    and widened, in log space and in quadrature, by what is left unknown of that offset and by
    one evaluation's noise, so the interval is one for the value the run will log, not for the
    law's mean. Without a noise estimate (`run_noise`: too few runs), the law's alone."""
    if noise is None:
        return mean, interval
    offset, offset_sd = run_offset(residuals, noise)
    predicted = mean * float(np.exp(offset))
    if interval is None:
        return predicted, None
    extra = (information.Z95**2) * (offset_sd**2 + noise.sigma**2)
    lo = float(np.log(max(mean / interval[0], 1.0)) if interval[0] > 0 else np.inf)
    hi = float(np.log(max(interval[1] / mean, 1.0)))
    return predicted, (
        predicted * float(np.exp(-np.sqrt(lo**2 + extra))),
        predicted * float(np.exp(np.sqrt(hi**2 + extra))),
    )


def _progress(point: Point, cand: Candidate) -> float:
    """The share of its run done when `point` is observed (`Point.progress`)."""
    if point.progress is not None:
        return point.progress
    return point.inputs[-1] / cand.points[-1].inputs[-1]


def assess(
    model: StudyModel,
    cands: Mapping[str, Candidate],
    runs: Sequence[Run],
    obs: Observation,
    fit: FitState,
) -> dict[str, RunState]:
    """Each unfinished run's `RunState` (needed_by left for `adaptive.decide_all`)."""
    out = {}
    for run in runs:
        status = DECIDED_STATES.get(obs.states.get(run.run_id, "pending"))
        cand = cands.get(run.run_id)
        if status is None or cand is None:
            continue
        done = obs.progress(run)
        left = [p for p in cand.points if _progress(p, cand) > done]
        blocks = {p.block for p in cand.points}
        missing = sorted(b for b in blocks if b not in fit.fits)
        gain = predicted = interval = None
        noisy = fit.model or model
        if not missing:
            # What the rest of this run adds to what its own evaluations told: its points share
            # its offset, so the information of the whole run less that of its observed part.
            seen = tuple(p for p in fit.observed if p.run == run.run_id)
            whole = (*seen, *information.run_points(left, run.run_id))
            more = information.fisher(noisy, whole, fit.params) - information.fisher(
                noisy, seen, fit.params
            )
            gain = information.info_gain(fit.info, more)
        if cand.points and not missing:
            final = cand.points[-1]
            law = model.block(final.block).law
            block_fit = fit.fits[final.block]
            mean = predict_law(law, dict(block_fit.params), final.inputs)
            interval = _interval(model, final.block, block_fit, final.inputs)
            predicted, interval = with_run_offset(
                mean,
                interval,
                fit.noise.get(final.block),
                fit.residuals.get((final.block, run.run_id), ()),
            )
        out[run.run_id] = RunState(
            run_id=run.run_id,
            status=status,
            identifiable=not missing,
            points=len(cand.points),
            points_left=len(left),
            gain=gain,
            cost=cand.cost * (1.0 - done),
            predicted=predicted,
            interval=interval,
            why_not="; ".join(f"{b}: {fit.why_not.get(b, '?')}" for b in missing),
        )
    return out


def spent_and_saved(
    cands: Mapping[str, Candidate], runs: Sequence[Run], obs: Observation
) -> tuple[float, float]:
    """Chip-hours spent (each run's cost × the share of its steps done) and saved (what the
    runs stopped or skipped on request, `rundir.stop_request`, did not run)."""
    spent = saved = 0.0
    for run in runs:
        cand = cands.get(run.run_id)
        if cand is None:
            continue
        spent += cand.cost * obs.progress(run)
        if obs.states.get(run.run_id) == "stopped":
            saved += cand.cost * (1.0 - obs.progress(run))
    return spent, saved
