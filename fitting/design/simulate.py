"""A whole study simulated from its true laws: does a design recover what the full sweep finds?

A `SimStudy` is a design problem whose truth is known: the laws (`StudyModel`, prior = truth), the
candidate runs, the generator's noise per block, and the held-out runs (the largest, which the
design must not contain). `check` draws one noisy realisation of every candidate's points (the
generator's lognormal noise, `fitting.laws.synthetic`), fits the FULL study with its bootstrap
(95% intervals, resampling whole runs) and the DESIGNED subset with the project's own fitters,
and scores the issue-37 targets: every fitted parameter of the subset inside the full sweep's
interval, and the final value of each held-out run predicted within a tolerance (2%).

The fitters are the project's (each study carries its own, `SimStudy.fitter`): CPT studies fit `fit_chinchilla` to the
source and from-scratch runs and `fit_cpt` (E, A, α from the from-scratch fit) to the CPT runs;
MT studies fit `fit_bleu_law` / `fit_ce_law` per series (`fitting.design.simulate_mt`). Studies
are built by `cpt_study` here and `simulate_mt.mt_study`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fitting.checks import FitInputError
from fitting.design import paper_models
from fitting.design.choose import closure
from fitting.design.information import Target
from fitting.design.study import Block, Candidate, Point, StudyModel, with_noise
from fitting.laws import robust_fit, synthetic

TOLERANCE = 0.02  # held-out final values predicted within 2%
H100_CHIP_HOUR_FLOPS = 989e12 * 0.4 * 3600  # bf16 peak at 40% MFU: only ratios matter here
# A coarser start grid than Hoffmann's 4,500 (4 x 3 x 3 x 5 x 5 = 900 starts): synthetic data
# from the law has one basin near the truth, and simulations refit many times.
SIM_GRID: Mapping[str, Sequence[float]] = {
    "e": (-1.0, 0.0, 0.5, 1.0),
    "alpha": (0.0, 0.5, 1.0),
    "beta": (0.0, 0.5, 1.0),
    "a": (0.0, 5.0, 10.0, 15.0, 20.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0),
}
CPT_SIM_GRID: Mapping[str, Sequence[float]] = {
    "b": (0.0, 5.0, 10.0, 15.0, 20.0),
    "beta": (0.0, 0.25, 0.5, 1.0),
    "gamma": (-0.5, 0.0, 0.5),
}


@dataclasses.dataclass(frozen=True)
class SimStudy:
    """A study whose truth is known.

    Attributes:
      kind: what study it is ("cpt", "mt"), for messages and reports.
      model: the laws; its prior is the truth the data are drawn from.
      candidates: every run of the full sweep.
      held_out: the largest runs, predicted by the design's fit and never in it.
      sigma: block → σ of the generator's lognormal noise.
      fitter: fit(study, values, keys, bootstrap=, seed=) → `StudyFit`, the project's fits of
        this kind of study (`fit_cpt_study`, `simulate_mt.fit_mt_study`).
      targets: reported quantities beyond the parameters, for `choose`.
      n_fit: points per series the MT laws are fitted on (None: all; see `simulate_mt`).
      run_sigma: block → τ of the generator's per-run offset, shared by a run's evaluations
        (none: every evaluation's noise independent, as `synthetic.write_study` draws it).
    """

    kind: str
    model: StudyModel
    candidates: tuple[Candidate, ...]
    held_out: tuple[str, ...]
    sigma: Mapping[str, float]
    fitter: Callable[..., StudyFit]
    targets: tuple[Target, ...] = ()
    n_fit: int | None = None
    run_sigma: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def full_cost(self) -> float:
        """Chip-hours of the full sweep."""
        return float(sum(c.cost for c in self.candidates))

    def candidate(self, key: str) -> Candidate:
        """The candidate run `key`."""
        for c in self.candidates:
            if c.key == key:
                return c
        raise KeyError(f"no candidate {key!r} in this {self.kind} study")


@dataclasses.dataclass(frozen=True)
class StudyFit:
    """The study's laws fitted to some of its runs.

    Attributes:
      params: study parameter → value (`StudyModel.names`).
      ci: study parameter → 95% bootstrap interval (empty without a bootstrap).
      converged: every law's fit converged.
      chip_hours: what the fitted runs cost.
    """

    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    converged: bool
    chip_hours: float


def draw(study: SimStudy, seed: int) -> dict[str, np.ndarray]:
    """One realisation: candidate key → its points' values (truth × e^(σ·ε + τ·η), ε ~ N(0, 1)
    per point, η ~ N(0, 1) per run and block, drawn before the run's points; τ from
    `SimStudy.run_sigma`, 0 and not drawn for blocks it lacks)."""
    rng = np.random.default_rng(seed)
    out = {}
    for c in study.candidates:
        offsets = {}
        for p in c.points:
            tau = study.run_sigma.get(p.block, 0.0)
            if tau and p.block not in offsets:
                offsets[p.block] = tau * rng.standard_normal()
        values = np.empty(len(c.points))
        for i, p in enumerate(c.points):
            truth = study.model.predict(p.block, study.model.prior, np.asarray([p.inputs]))[0]
            noise = study.sigma[p.block] * rng.standard_normal() + offsets.get(p.block, 0.0)
            values[i] = truth * math.exp(noise)
        out[c.key] = values
    return out


def block_points(
    study: SimStudy, values: Mapping[str, np.ndarray], keys: Sequence[str]
) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """block → ([P, k] inputs, [P] values, [P] run keys) of the runs `keys`."""
    rows: dict[str, tuple[list, list, list]] = {}
    for key in keys:
        c = study.candidate(key)
        for p, v in zip(c.points, values[key], strict=True):
            x, y, r = rows.setdefault(p.block, ([], [], []))
            x.append(p.inputs)
            y.append(v)
            r.append(key)
    return {b: (np.asarray(x, float), np.asarray(y, float), r) for b, (x, y, r) in rows.items()}


def _study_names(block: Block, values: Mapping[str, object]) -> dict[str, object]:
    return {block.params[k]: v for k, v in values.items() if k in block.params}


def fit_cpt_study(
    study: SimStudy,
    values: Mapping[str, np.ndarray],
    keys: Sequence[str],
    *,
    bootstrap: int = 0,
    seed: int = 0,
) -> StudyFit:
    """The CPT paper's fits on the runs `keys`: Chinchilla for the from-scratch (and source)
    runs, then the CPT law with E, A, α from the from-scratch fit (eq. 7), bootstrapped over
    whole runs; the CPT bootstrap takes the from-scratch fit's samples."""
    points = block_points(study, values, keys)
    params: dict[str, float] = {}
    ci: dict[str, tuple[float, float]] = {}
    converged = True
    fits: dict[str, robust_fit.FitResult] = {}
    for block in sorted(study.model.blocks, key=lambda b: b.law == "cpt"):
        if block.name not in points or (block.law == "cpt" and "scratch" not in fits):
            converged = False  # nothing to fit (a subset without these runs): NaN parameters
            continue
        x, y, runs = points[block.name]
        options = {"runs": runs, "bootstrap": bootstrap, "seed": seed, "series": block.name}
        try:
            if block.law == "chinchilla":
                fit = robust_fit.fit_chinchilla(x[:, 0], x[:, 1], y, grid=SIM_GRID, **options)
            else:
                fit = robust_fit.fit_cpt(
                    x[:, 0], x[:, 1], y, base=fits["scratch"], grid=CPT_SIM_GRID, **options
                )
        except FitInputError:  # too few sizes or points for this law: NaN parameters
            converged = False
            continue
        fits[block.name] = fit
        converged &= fit.converged
        for name, v in _study_names(block, fit.params).items():
            params.setdefault(name, v)
        for name, v in _study_names(block, fit.ci).items():
            ci.setdefault(name, v)
    return StudyFit(_complete(study, params), ci, converged, cost_of(study, keys))


def _complete(study: SimStudy, params: Mapping[str, float]) -> dict[str, float]:
    """Every study parameter, NaN where the runs could not determine it."""
    return {n: float(params.get(n, math.nan)) for n in study.model.names}


def cost_of(study: SimStudy, keys: Sequence[str]) -> float:
    """Chip-hours of the runs `keys`."""
    by_key = {c.key: c for c in study.candidates}
    return float(sum(by_key[k].cost for k in keys))


def fit(
    study: SimStudy, values: Mapping[str, np.ndarray], keys: Sequence[str], **options: int
) -> StudyFit:
    """The study's laws fitted to the runs `keys` by the study's own fitter; `options` are the
    fitter's keywords (`bootstrap=0`, `seed=0`: see `fit_cpt_study`)."""
    unknown = sorted(set(keys) - {c.key for c in study.candidates})
    if unknown:
        raise ValueError(f"runs {unknown[:5]} are not candidates of this {study.kind} study")
    return study.fitter(study, values, keys, **options)


@dataclasses.dataclass(frozen=True)
class ParamCheck:
    """One parameter: the full sweep's value and interval, and the design's value."""

    name: str
    full: float
    lo: float
    hi: float
    design: float

    @property
    def inside(self) -> bool:
        """The design's value lies in the full sweep's 95% interval."""
        return self.lo <= self.design <= self.hi


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """A held-out run's final value: observed, and predicted by the design's fit."""

    key: str
    block: str
    observed: float
    predicted: float

    @property
    def error(self) -> float:
        """|predicted / observed − 1| (inf when the fit could not predict it)."""
        e = abs(self.predicted / self.observed - 1.0)
        return e if math.isfinite(e) else math.inf


@dataclasses.dataclass(frozen=True)
class Check:
    """A design scored against the full sweep on one realisation of the study."""

    keys: tuple[str, ...]
    fraction: float
    params: tuple[ParamCheck, ...]
    held_out: tuple[HeldOut, ...]
    full: StudyFit
    design: StudyFit
    tolerance: float = TOLERANCE

    @property
    def n_inside(self) -> int:
        """Parameters inside the full sweep's interval."""
        return sum(p.inside for p in self.params)

    @property
    def max_error(self) -> float:
        """The largest held-out prediction error."""
        return max((h.error for h in self.held_out), default=math.nan)

    @property
    def params_pass(self) -> bool:
        """Every parameter inside."""
        return self.n_inside == len(self.params)

    @property
    def held_out_pass(self) -> bool:
        """Every held-out run predicted within the tolerance."""
        return bool(self.held_out) and self.max_error <= self.tolerance


def check(
    study: SimStudy,
    keys: Sequence[str],
    *,
    seed: int = 0,
    bootstrap: int = 100,
    values: Mapping[str, np.ndarray] | None = None,
    full: StudyFit | None = None,
    tolerance: float = TOLERANCE,
) -> Check:
    """Scores the design `keys` on realisation `seed` (see the module docstring).

    Args:
      study: the simulated study.
      keys: the design's runs (closed under `requires`; none of `study.held_out`).
      seed: the realisation drawn (and the bootstrap's seed).
      bootstrap: resamples of the full sweep's fit.
      values, full: a realisation and full fit already computed (several designs on one draw).
      tolerance: the held-out target.

    Raises:
      ValueError: a held-out run in the design, or a run without the runs it requires.
    """
    keys = tuple(keys)
    inside = sorted(set(keys) & set(study.held_out))
    if inside:
        raise ValueError(f"the design contains held-out runs {inside}: they must stay out")
    by_key = {c.key: c for c in study.candidates}
    for k in keys:
        missing = [r for r in closure(k, by_key, set()) if r not in keys]
        if missing:
            raise ValueError(f"design run {k!r} needs {missing}, which the design lacks")
    values = draw(study, seed) if values is None else values
    if full is None:
        everything = [c.key for c in study.candidates]
        full = fit(study, values, everything, bootstrap=bootstrap, seed=seed)
    design = fit(study, values, keys)
    params = tuple(
        ParamCheck(n, full.params[n], *full.ci.get(n, (math.nan, math.nan)), design.params[n])
        for n in study.model.names
    )
    held = []
    for key in study.held_out:
        c = by_key[key]
        last: dict[str, int] = {}  # block → its final point in this run
        for i, p in enumerate(c.points):
            if p.block not in last or p.inputs[-1] >= c.points[last[p.block]].inputs[-1]:
                last[p.block] = i
        for block, i in last.items():
            x = np.asarray([c.points[i].inputs])
            with np.errstate(all="ignore"):
                pred = study.model.predict(block, design.params, x)[0]
            held.append(HeldOut(key, block, float(values[key][i]), float(pred)))
    return Check(
        keys=keys,
        fraction=design.chip_hours / study.full_cost,
        params=params,
        held_out=tuple(held),
        full=full,
        design=design,
        tolerance=tolerance,
    )


def paper_sizes() -> list[float]:
    """The CPT paper's 42 model sizes (Table 4's nominal N, the basis we read its laws as fitted on),
    from the LLaMA2 size table."""
    from modeling import family  # the size table: only when a study needs the paper's sizes

    llama = family.get("llama2")
    nominal = (llama.nominal_params(s) for s in llama.sizes())
    return sorted(float(n) for n in nominal if n is not None)


def eval_tokens(total: float, *, log_points: int, periodic: int, start: float) -> np.ndarray:
    """Tokens at a run's evaluations: `log_points` log-spaced from `start`·total to total (the
    trainer's 'log' schedule, `trainer.eval_schedule`), plus `periodic` evenly spaced ones."""
    log = np.geomspace(start * total, total, log_points) if log_points else np.empty(0)
    even = total * np.arange(1, periodic + 1) / periodic if periodic else np.empty(0)
    return np.unique(np.concatenate([log, even, [total]]))


def cpt_study(
    sizes: Sequence[float],
    *,
    tokens_per_param: float = 20.0,
    log_points: int = 20,
    periodic: int = 10,
    log_start: float = 1e-3,
    min_fraction: float = 0.0,
    held_out: int = 2,
    sigma: float = 0.005,
    run_sigma: float = 0.0,
    chip_hour_flops: float = H100_CHIP_HOUR_FLOPS,
    scratch: Mapping[str, float] = synthetic.SCRATCH,
    cpt: Mapping[str, float] = synthetic.CPT,
    source: Mapping[str, float] = synthetic.SOURCE,
) -> SimStudy:
    """The CPT study shaped like `cpt_paper`: per size a source, a from-scratch and a CPT run
    (which needs its source run) of tokens_per_param·N tokens, each evaluated on the trainer's
    log schedule plus periodic points; a run costs 6·N·D FLOPs.

    Args:
      sizes: model sizes N (the paper's: `paper_sizes()`).
      min_fraction: points used by the fits start at this fraction of a run's tokens (as
        `xlscale fit --points-min-fraction`).
      held_out: the `held_out` largest sizes' runs are held out of any design.
      sigma: the generator's noise of one evaluation's log loss (`synthetic.write_study`'s).
      run_sigma: the generator's per-run offset of the log loss (τ), shared by the run's
        evaluations; the model's blocks carry it too, so designs count a run's points as one
        run's (`fitting.design.information`).
      chip_hour_flops: FLOPs per chip-hour (only ratios matter for a design's fraction).
    """
    if held_out < 1 or held_out >= len(sizes) - 2:
        raise ValueError(f"held_out = {held_out}: allowed 1 to {len(sizes) - 3} largest sizes")
    model = paper_models.cpt_model(scratch=scratch, cpt=cpt, source=source, sigma=sigma)
    model = with_noise(model, {b.name: (sigma, run_sigma) for b in model.blocks})
    candidates = []
    for n in sorted(sizes):
        total = tokens_per_param * n
        tokens = eval_tokens(total, log_points=log_points, periodic=periodic, start=log_start)
        tokens = tokens[tokens >= min_fraction * total]
        cost = 6.0 * n * total / chip_hour_flops
        for block in ("source", "scratch", "cpt"):
            needs = (f"source_{n:.4g}",) if block == "cpt" else ()
            pts = tuple(Point(block, (n, float(d))) for d in tokens)
            candidates.append(Candidate(f"{block}_{n:.4g}", cost, pts, needs))
    largest = sorted(sizes)[-held_out:]
    held = tuple(f"{b}_{n:.4g}" for n in largest for b in ("source", "scratch", "cpt"))
    targets = [
        paper_models.allocation_target(model, "scratch", 1e21),
        *(
            paper_models.loss_target(
                model, b, (largest[-1], tokens_per_param * largest[-1]), "loss(largest)"
            )
            for b in ("source", "scratch", "cpt")
        ),
    ]
    sig = {b.name: sigma for b in model.blocks}
    tau = {b.name: run_sigma for b in model.blocks if run_sigma}
    return SimStudy(
        "cpt", model, tuple(candidates), held, sig, fit_cpt_study, tuple(targets), run_sigma=tau
    )
