"""Robust multi-start fits of the CPT paper's laws, with bootstrap over runs.

The objective is exactly Hoffmann et al.'s and the CPT paper's eqs. 6–7: Huber (δ = 1e-3) between
LSE(a − α log N, b − β log D, e) and log L, with A = exp(a), B = exp(b), E = exp(e), **summed** over
points (the mean-scaled objective made Hoffmann's L-BFGS stop early; Besiroglu et al. 2024), in
float64, from a grid of starts (default the Hoffmann/Epoch grid, 4,500 starts), then a tight polish
of the best. In place of Hoffmann's per-start L-BFGS, every start runs a batched exact-Hessian
damped Newton (`fitting.laws.optim`, `fitting.laws.lse`), which reaches the same optimum several times faster
(benchmarks/fit.py). `fit_cpt` is the paper's two-stage fit: E, A and α come from the from-scratch fit and
only B', β', γ are fitted. Every result says whether it converged; bootstrap CIs resample whole runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Unpack

import numpy as np

from fitting.checks import FitInputError, Unidentifiable, as_points, require_distinct
from fitting.laws import formulas, lse, optim

CI_LEVEL = 0.95
DELTA = 1e-3  # Huber threshold on log residuals (Hoffmann et al.; CPT paper eqs. 6-7)
_BOOT_STARTS = 8  # starts per bootstrap resample: the fit's optimum plus its best other basins


@dataclasses.dataclass(frozen=True)
class LawFit:
    """What every fitted law records first (`FitResult`, `fitting.laws.downstream_laws.DownstreamFit`).

    Attributes:
      law: key into `fitting.laws.formulas.LAWS` ("chinchilla", "cpt", "loss_compute", "power", ...).
      params: parameter name → value (e.g. E, A, B, alpha, beta).
      objective: the summed Huber objective at the optimum.
      converged: the polish reached a vanishing gradient; a False here must be reported.
      grad_norm: ‖∇objective‖∞ with respect to the fitted parameters.
      n_starts: starts in the grid.
    """

    law: str
    params: dict[str, float]
    objective: float
    converged: bool
    grad_norm: float
    n_starts: int

    def predict(self, *inputs) -> np.ndarray:
        """The fitted law at `inputs` (N, D for chinchilla/cpt; C for the compute laws; Dp)."""
        return formulas.predict(self.law, self.params, *inputs)

    @property
    def status(self) -> str:
        """ "converged" or a warning that must accompany any use of the numbers."""
        if self.converged:
            return "converged"
        return f"NOT CONVERGED (gradient {self.grad_norm:.3g})"


@dataclasses.dataclass(frozen=True)
class FitResult(LawFit):
    """A fitted LSE-affine law (`LawFit` plus the fit's diagnostics). Frozen; every number is
    unrounded.

    Attributes:
      n_finite: starts with a finite initial objective.
      n_at_best: starts whose end point reached the best basin (objective within 1e-6 relative).
      n_points, n_runs: data used.
      delta: Huber threshold.
      log_params: the fitted variables themselves (a = log A, ...).
      fixed: parameters held fixed (the CPT law's second stage holds E, A, alpha).
      ci: parameter → (lo, hi) percentile interval from the bootstrap (empty without one).
      samples: parameters of each converged bootstrap refit, for intervals on derived quantities.
      n_bootstrap: resamples requested; n_bootstrap_converged: those whose refit converged.
    """

    n_finite: int
    n_at_best: int
    n_points: int
    n_runs: int
    delta: float
    log_params: dict[str, float] = dataclasses.field(default_factory=dict)
    fixed: tuple[str, ...] = ()
    ci: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    samples: tuple[dict[str, float], ...] = ()
    n_bootstrap: int = 0
    n_bootstrap_converged: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (floats unrounded; intervals as [lo, hi])."""
        return {
            "law": self.law,
            "params": dict(self.params),
            "log_params": dict(self.log_params),
            "fixed": list(self.fixed),
            "objective": self.objective,
            "converged": self.converged,
            "grad_norm": self.grad_norm,
            "n_starts": self.n_starts,
            "n_finite": self.n_finite,
            "n_at_best": self.n_at_best,
            "n_points": self.n_points,
            "n_runs": self.n_runs,
            "delta": self.delta,
            "ci_level": CI_LEVEL,
            "ci": {k: [lo, hi] for k, (lo, hi) in self.ci.items()},
            "n_bootstrap": self.n_bootstrap,
            "n_bootstrap_converged": self.n_bootstrap_converged,
            "samples": [dict(s) for s in self.samples],
        }


def _starts(
    spec: lse.LawSpec, grid: Mapping[str, Sequence[float]] | None, fixed: Mapping[str, float]
):
    """The start grid [S, n] in internal order; fixed variables take their given values."""
    grid = dict(spec.grid) if grid is None else {**spec.grid, **grid}
    unknown = set(grid) - set(spec.names)
    if unknown:
        raise ValueError(f"{spec.law}: unknown grid variables {sorted(unknown)}; use {spec.names}")
    axes = [[fixed[n]] if n in fixed else grid[n] for n in spec.names]
    return optim.product_grid(axes)


def _run_codes(runs: Sequence[str] | None, fallback: np.ndarray) -> tuple[np.ndarray, int]:
    """Integer run index of every point; without run ids each distinct `fallback` value is a run."""
    keys = list(runs) if runs is not None else list(np.asarray(fallback))
    _, codes = np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)
    return codes.ravel(), int(codes.max()) + 1 if len(codes) else 0


def fit_law(
    spec: lse.LawSpec,
    inputs: Sequence[np.ndarray],
    y: np.ndarray,
    *,
    delta: float = DELTA,
    grid: Mapping[str, Sequence[float]] | None = None,
    bootstrap: int = 0,
    seed: int = 0,
    runs: Sequence[str] | None = None,
    fixed: Mapping[str, float] | None = None,
    fixed_samples: Sequence[Mapping[str, float]] | None = None,
    iters: int = 40,
    input_names: Sequence[str] | None = None,
    starts: np.ndarray | None = None,
    series: str = "",
) -> FitResult:
    """Fits an LSE-affine law by the batched multi-start screen plus polish (optionally bootstrapped).

    Args:
      spec: the law.
      inputs: the law's inputs (e.g. N, D), positive 1-D arrays.
      y: observed values (losses), positive.
      delta: Huber threshold on log residuals.
      grid: start values per variable (missing variables use the law's default grid).
      bootstrap: number of resamples of whole runs (0: none).
      seed: bootstrap seed.
      runs: run id of each point (bootstrap unit and error messages); default: one run per
        distinct value of the first input (e.g. one per model size).
      fixed: values of the variables that are not fitted (spec.free False).
      fixed_samples: per-resample values of the fixed variables (e.g. the from-scratch fit's own
        bootstrap), so that their uncertainty propagates; resample b uses entry b mod len.
      iters: the most batched LM iterations a start runs (each stops once it stalls).
      input_names: names of the inputs, for messages.
      starts: explicit [S, n] starts in the variables' internal order, instead of the grid
        (e.g. a previous optimum when refitting resampled data).
      series: what is fitted (a language, a run group), named in messages.

    Raises:
      FitInputError: bad inputs (naming the point or run); `Unidentifiable` when the data cannot
        determine the parameters (fewer points than parameters, or fewer distinct values of an
        input than the law's `min_distinct`, e.g. one model size for the Chinchilla law).
    """
    names = list(input_names or [f"x{i}" for i in range(len(inputs))])
    n_free = sum(spec.free) if spec.free is not None else len(spec.names)
    where = f"{spec.law}/{series}" if series else spec.law
    pts = as_points(
        {**dict(zip(names, inputs, strict=True)), "L": y}, runs=runs, n_params=n_free, law=where
    )
    xs = [pts[n] for n in names]
    law = formulas.LAWS.get(spec.law)
    for name, x, minimum in zip(names, xs, law.min_distinct if law else (), strict=False):
        require_distinct(
            law=spec.law,
            series=series,
            what=f"distinct values of {name}",
            values=x,
            minimum=minimum,
        )
    fixed = dict(fixed or {})
    problem = lse.LseProblem(
        terms=spec.terms,
        features=spec.features(*xs),
        target=np.log(pts["L"]),
        weights=np.ones(len(pts["L"])),
        delta=float(delta),
        free=spec.free,
    )
    std, r = lse.standardise(problem)
    r_inv = np.linalg.inv(r)
    if starts is None:
        starts = _starts(spec, grid, fixed)
    res = optim.multistart(
        std, np.asarray(starts, np.float64) @ r.T, iters=iters, screen=lse.screen
    )
    theta = r_inv @ res.theta
    values = dict(zip(spec.names, theta.tolist(), strict=True))
    grad = r.T @ res.grad
    free_idx = [i for i in range(len(spec.names)) if spec.free is None or spec.free[i]]
    codes, n_runs = _run_codes(runs, xs[0])
    params = spec.to_params(values)
    result = FitResult(
        law=spec.law,
        params=params,
        objective=res.objective,
        # A runaway optimum (a parameter past float range) is never called converged.
        converged=res.converged and all(math.isfinite(v) for v in params.values()),
        grad_norm=float(np.max(np.abs(grad[free_idx]))) if np.all(np.isfinite(grad)) else math.inf,
        n_starts=res.n_starts,
        n_finite=res.n_finite,
        n_at_best=res.n_at_best,
        n_points=len(pts["L"]),
        n_runs=n_runs,
        delta=float(delta),
        log_params={k: float(v) for k, v in values.items()},
        fixed=spec.fixed_params,
    )
    if bootstrap <= 0 or not np.all(np.isfinite(res.theta)):
        return result
    thetas, ok = _bootstrap(
        std,
        r,
        res,
        codes,
        n_runs,
        bootstrap,
        seed,
        iters,
        [_fixed_vector(spec, s) for s in fixed_samples] if fixed_samples else None,
    )
    samples = tuple(
        spec.to_params(dict(zip(spec.names, (r_inv @ t).tolist(), strict=True)))
        for t, good in zip(thetas, ok, strict=True)
        if good
    )
    return dataclasses.replace(
        result,
        ci=percentile_cis(samples),
        samples=samples,
        n_bootstrap=int(bootstrap),
        n_bootstrap_converged=len(samples),
    )


def _fixed_vector(spec: lse.LawSpec, values: Mapping[str, float]) -> dict[int, float]:
    """Internal indices → values of the fixed variables, from public parameters (E, A, alpha)."""
    fixed = formulas.to_internal({p: values[p] for p in spec.fixed_params})
    return {spec.names.index(name): v for name, v in fixed.items()}


def _bootstrap(
    std: lse.LseProblem,
    r: np.ndarray,
    res: optim.MultiStartResult,
    codes: np.ndarray,
    n_runs: int,
    n_boot: int,
    seed: int,
    iters: int,
    fixed_samples: list[dict[int, float]] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Refits on run-resampled data; all resamples run in one batch (per-lane point weights).

    Each resample starts from the fit's optimum and its best other basins (not the whole grid:
    the resampled optimum lies near the original one, and the other basins guard against a jump).

    Returns:
      ([B, n] optima in standardised coordinates, [B] converged flags).
    """
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_runs, size=(n_boot, n_runs))
    counts = np.stack([np.bincount(d, minlength=n_runs) for d in draws])
    weights = counts[:, codes].astype(np.float64)  # [B, P]
    picks = optim.distinct_best(res.finals, res.final_objectives, _BOOT_STARTS)[1:]
    base = np.concatenate([res.theta[None], res.finals[picks]])  # the optimum replaces the best
    k = base.shape[0]
    starts = np.repeat(base[None], n_boot, axis=0)  # [B, k, n] (standardised)
    if fixed_samples:
        r_inv = np.linalg.inv(r)
        theta = starts @ r_inv.T
        for b in range(n_boot):
            for i, v in fixed_samples[b % len(fixed_samples)].items():
                theta[b, :, i] = v
        starts = theta @ r.T
    lane_w = np.repeat(weights, k, axis=0)
    finals = lse.screen(std, starts.reshape(n_boot * k, -1), iters, lane_weights=lane_w)
    with np.errstate(all="ignore"):
        f = std.value(np, finals, lane_w).reshape(n_boot, k)
    f = np.where(np.isfinite(f), f, np.inf)
    best = finals.reshape(n_boot, k, -1)[np.arange(n_boot), np.argmin(f, axis=1)]
    scale = std.delta * weights.sum(axis=1)
    polished = optim.lm_numpy(
        std, best, iters=100, lane_weights=weights, gtol=1e-10 * float(scale.min())
    )
    with np.errstate(all="ignore"):
        fp, g, _ = std.derivs(np, polished, weights)
    ok = np.isfinite(fp) & (np.max(np.abs(g), axis=1) <= 1e-7 * scale)
    return polished, ok


def percentile_cis(
    samples: Sequence[Mapping[str, float]], level: float = CI_LEVEL
) -> dict[str, tuple[float, float]]:
    """Percentile intervals of every key over bootstrap samples (finite values only)."""
    if not samples:
        return {}
    lo_q, hi_q = 50 * (1 - level), 50 * (1 + level)
    out: dict[str, tuple[float, float]] = {}
    for key in samples[0]:
        v = np.array([s[key] for s in samples], dtype=np.float64)
        v = v[np.isfinite(v)]
        if v.size:
            out[key] = (float(np.percentile(v, lo_q)), float(np.percentile(v, hi_q)))
    return out


class FitOptions(TypedDict, total=False):
    """The options every `fit_*` takes, passed on to `fit_law` (see its Args).

    Attributes:
      delta: Huber threshold on log residuals (default `DELTA`).
      grid: start values per variable (missing variables use the law's default grid).
      bootstrap: resamples of whole runs for percentile CIs (0: none).
      seed: bootstrap seed.
      runs: run id of each point (default: one run per distinct value of the first input).
      iters: the most batched LM iterations a start runs (each stops once it stalls).
      series: what is fitted (e.g. the language), named in messages.
    """

    delta: float
    grid: Mapping[str, Sequence[float]] | None
    bootstrap: int
    seed: int
    runs: Sequence[str] | None
    iters: int
    series: str


def fit_chinchilla(N, D, L, **options: Unpack[FitOptions]) -> FitResult:
    """Fits L = E + A/N^α + B/D^β (CPT paper eqs. 1 and 6) from the Hoffmann grid of starts.

    Args:
      N: parameters of each point (non-embedding by convention).
      D: training tokens of each point.
      L: loss (nats) of each point.
      **options: `FitOptions`; the grid's variables are `a, b, e, alpha, beta` (default α, β ∈
        {0, 0.5, …, 2}, e ∈ {−1, −0.5, …, 1}, a, b ∈ {0, 5, …, 25}: 4,500 starts).

    Raises:
      Unidentifiable: fewer than 3 model sizes (distinct N) or 3 distinct D, or fewer points
        than parameters.
    """
    return fit_law(formulas.fit_spec("chinchilla"), [N, D], L, input_names=("N", "D"), **options)


def fit_cpt(N, D, L, *, base: FitResult, **options: Unpack[FitOptions]) -> FitResult:
    """Second stage of the CPT paper's fit (eq. 7): L = E + A/N^α + B'/(D^β'·N^γ) with E, A, α
    taken from the from-scratch fit `base`; only B' (B), β' (beta) and γ (gamma) are fitted.

    D counts continual-pre-training tokens of the target language. With `bootstrap`, resample b
    also takes E, A, α from `base`'s own bootstrap sample b (when `base` has samples), so the
    intervals carry the first stage's uncertainty.

    Args:
      N, D, L: points of the CPT runs.
      base: a `fit_chinchilla` result on the from-scratch runs.
      **options: `FitOptions`; the grid's variables are `b, beta, gamma` (default b ∈ {0, 5, …,
        25}, β' ∈ {0, 0.25, …, 2}, γ ∈ {−1, …, 1}).

    Raises:
      Unidentifiable: fewer than 2 model sizes (γ) or 2 distinct D (β'), or fewer points than
        the 3 fitted parameters.
    """
    series = options.get("series", "")
    if base.law != "chinchilla":
        raise FitInputError(f"cpt: base must be a chinchilla fit, got {base.law!r}")
    if not all(np.isfinite(base.params[k]) for k in ("E", "A", "alpha")):
        where = f"cpt/{series}" if series else "cpt"
        raise Unidentifiable(f"{where}: base fit has non-finite E, A or alpha")
    spec = formulas.fit_spec("cpt")
    names = [formulas.LOG_VARIABLES.get(p, p) for p in spec.fixed_params]
    if all(n in base.log_params for n in names):
        # Stage one's own variables, not log(exp(·)): a scale it fitted away (A·N^-α where the
        # sizes' losses do not differ yet) underflows to A = 0, which has no log.
        fixed = {n: base.log_params[n] for n in names}
    else:
        fixed = formulas.to_internal({p: base.params[p] for p in spec.fixed_params})
    # A resample whose stage one fitted a scale away cannot seed its lane (see above).
    samples = [s for s in base.samples if _positive_scales(s, spec.fixed_params)]
    res = fit_law(
        spec,
        [N, D],
        L,
        fixed=fixed,
        fixed_samples=samples or None,
        input_names=("N", "D"),
        **options,
    )
    # Report stage one's values bit for bit (not their exp(log(·)) round trip).
    params = {**res.params, **{k: base.params[k] for k in spec.fixed_params}}
    return dataclasses.replace(res, params=params)


def _positive_scales(values: Mapping[str, float], params: Sequence[str]) -> bool:
    """Whether every scale among `params` (`formulas.LOG_VARIABLES`) is positive and finite."""
    scales = [values[p] for p in params if p in formulas.LOG_VARIABLES]
    return all(0 < v < math.inf for v in scales)


def fit_loss_compute(C, L, **options: Unpack[FitOptions]) -> FitResult:
    """Fits the frontier law L = E' + A'/C^γ (CPT paper eq. 3) to (compute, loss) points."""
    return fit_univariate("loss_compute", C, L, **options)


def fit_power(C, L, **options: Unpack[FitOptions]) -> FitResult:
    """Fits the pure power law L = k·C^(−g) (the form of the CPT paper's §4.2 frontier fits)."""
    return fit_univariate("power", C, L, **options)


def fit_univariate(
    law: str, x, y, *, input_name: str = "C", **options: Unpack[FitOptions]
) -> FitResult:
    """Fits a one-input law of `fitting.laws.formulas` (loss against compute C, cross-entropy
    against Dp) by `fit_law` with the law's own spec and 60 LM iterations unless `iters` says."""
    options.setdefault("iters", 60)
    return fit_law(formulas.fit_spec(law), [x], y, input_names=(input_name,), **options)
