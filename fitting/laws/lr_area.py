"""A schedule-aware loss law, for fitting every evaluation along runs on a decaying schedule.

The L(N, D) laws (Chinchilla, the CPT law) describe the *final* loss of a run of D tokens. Fitted
on every evaluation along a cosine-scheduled run (as our fits do; the CPT paper fits "across all
trained models" [q:cpt.appB_procedure] without saying which evaluations), they read the loss at
step s as if it were the final loss of an s-step run, which it is not: its learning rate has not
been annealed yet. At the demo's scale (160-step runs) that misfit, 1-2% within each run, is
larger than the seed scatter, and the laws fitted on some sizes miss the others by up to 3%
(`benchmarks/law_design_real.py`). This law reads the schedule instead:

    L(N, s) = E + A·(N/N₀)^-α + (N/N₀)^-γ · (B·(S₁(s)/S₀)^-β − C·S₂(s))

- S₁(s) = Σ_{i≤s} η_i/η_max, the forward area: how far the optimiser has travelled;
- S₂(s) = Σ_{i≤s} m_i, m_i = λ·m_{i−1} + (η_{i−1} − η_i)/η_max, the annealing area: the loss
  drop a learning-rate decrease buys, with momentum λ (the drop shows with a delay).

Both, and L(s) = L₀ + A·S₁^-α − C·S₂ for one model, are Tissue et al. 2024 ("Scaling Law with
Learning Rate Annealing", arXiv:2408.11029, with λ ≈ 0.999 on their long runs). The
Chinchilla-style N term and the factor (N/N₀)^-γ on the schedule terms are this project's: at
small scale, how far a run's loss drops per unit of learning-rate area depends on its size (from
step 40 to 160, the demo's largest scratch model's loss drops 2.7 times as far as its smallest's),
which an additive law cannot express; γ = 0 is Tissue et al.'s law with an additive N term. N₀
and S₀ are the fit's reference scales (the geometric mean of its N, the largest S₁), stored with
it, so the fitted A and B are in loss units.

λ is not a fitted parameter: it is given, or chosen by `choose_decay` (the λ under which the
first three quarters of each run best forecast its last quarter, from the fitted runs alone).
1/(1 − λ) is the delay in steps: Tissue et al.'s 0.999 (1,000 steps) is longer than a whole
160-step demo run, and on the demo's runs `choose_decay` picks 0. Which λ, and which evaluations
(the early ones are the fastest part of the drop), decide whether the law predicts sizes it was
not fitted on within the seed noise: `benchmarks/law_design_real.py --law lr_area --decays
0,0.9,0.999 --grid 0,0.25,0.5` prints the verdict for each (README, "Measured").
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import optimize, signal

from fitting.checks import FitInputError, Unidentifiable, require_distinct

LAW = "lr_area"
PARAMS = ("E", "A", "alpha", "B", "beta", "C", "gamma")
DEFAULT_DECAY = 0.999  # Tissue et al.'s λ, for runs of thousands of steps
# Starting values for the exponents (alpha, beta, gamma); every combination is one start.
_STARTS = ((0.1, 0.3, 0.6), (0.2, 0.5), (0.0, 0.3))
# Bounds of (E, log A, alpha, log B, beta, C, gamma).
_LOWER = (0.0, -20.0, 0.0, -20.0, 0.0, -10.0, -3.0)
_UPPER = (50.0, 20.0, 3.0, 20.0, 3.0, 10.0, 3.0)


def areas(lrs: Sequence[float], *, decay: float = DEFAULT_DECAY) -> tuple[np.ndarray, np.ndarray]:
    """The forward area S₁ and the annealing area S₂ after each step of a schedule.

    Args:
      lrs: the learning rate of each update, in order (`lrs[k - 1]` is step k's).
      decay: the annealing momentum λ, in [0, 1).

    Returns:
      (S1, S2), each of length len(lrs) + 1, indexed by step (step 0: both 0), in units of the
      schedule's peak learning rate (so that a schedule and its rescaled copy give equal areas).

    Raises:
      FitInputError: an empty schedule, a non-finite or negative rate, a zero peak, or `decay`
        outside [0, 1).
    """
    eta = np.asarray(lrs, np.float64)
    if eta.ndim != 1 or eta.size == 0 or not np.all(np.isfinite(eta)) or np.any(eta < 0):
        raise FitInputError(
            f"learning rates must be a non-empty list of finite non-negative numbers, got {eta!r}"
        )
    if not 0.0 <= decay < 1.0:
        raise FitInputError(f"the annealing momentum decay must be in [0, 1), got {decay}")
    peak = float(eta.max())
    if peak <= 0:
        raise FitInputError("learning rates are all zero: the schedule has no area")
    eta = eta / peak
    s1 = np.concatenate([[0.0], np.cumsum(eta)])
    # m_k = λ·m_{k−1} + (η_{k−1} − η_k): the first step has no predecessor, so no drop.
    drops = np.concatenate([[0.0], eta[:-1] - eta[1:]])
    m = signal.lfilter([1.0], [1.0, -decay], drops)  # the recursion, without a Python loop
    s2 = np.concatenate([[0.0], np.cumsum(m)])
    return s1, s2


def formula(N, S1, S2, *, E, A, alpha, B, beta, C, gamma, n_ref=1.0, s_ref=1.0) -> np.ndarray:
    """The law (module docstring) at N parameters and areas S1, S2 (N and S1 over their
    reference scales `n_ref`, `s_ref`)."""
    n = np.asarray(N, np.float64) / n_ref
    s1 = np.asarray(S1, np.float64) / s_ref
    s2 = np.asarray(S2, np.float64)
    return E + A * n**-alpha + n**-gamma * (B * s1**-beta - C * s2)


@dataclasses.dataclass(frozen=True)
class LrAreaFit:
    """A fitted schedule-aware law.

    Attributes:
      params: E, A, alpha, B, beta, C, gamma (module docstring).
      decay: the λ the areas were computed with.
      n_ref, s_ref: the reference scales of N and S₁.
      rms: root mean square of the fit's relative residuals (L_fit/L − 1).
      converged: the best start's optimiser reported success; a False here must be reported.
      n_points, n_runs, n_starts: data and starts used.
      samples: parameters of each converged bootstrap refit (`parametric_bootstrap`; none by
        default), for intervals on predictions.
      ci: 95% percentile interval of each parameter over `samples`.
    """

    params: dict[str, float]
    decay: float
    n_ref: float
    s_ref: float
    rms: float
    converged: bool
    n_points: int
    n_runs: int
    n_starts: int

    law: str = LAW
    samples: tuple[dict[str, float], ...] = ()
    ci: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def predict(self, N, S1, S2) -> np.ndarray:
        """The fitted law at N parameters after areas S1, S2 (`areas` with this fit's decay)."""
        return formula(N, S1, S2, **self.params, n_ref=self.n_ref, s_ref=self.s_ref)

    @property
    def status(self) -> str:
        """ "converged" or a warning that must accompany any use of the numbers."""
        return "converged" if self.converged else "NOT CONVERGED"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (floats unrounded; the bootstrap's samples and intervals only where
        there are some)."""
        out = dataclasses.asdict(self)
        if not self.samples:
            del out["samples"], out["ci"]
        return out


def fit(
    N,
    S1,
    S2,
    L,
    *,
    decay: float,
    runs: Sequence[str] | None = None,
    series: str = "runs",
    n_ref: float | None = None,
    s_ref: float | None = None,
) -> LrAreaFit:
    """Least squares on the log residuals, from every combination of `_STARTS`; the best end.

    Args:
      N, S1, S2, L: one entry per evaluation: the model's parameters, the areas at its step
        (`areas`), its loss.
      decay: the λ S2 was computed with (recorded in the fit).
      runs: the run of each evaluation (for `n_runs`).
      series: what is fitted, for error messages.
      n_ref, s_ref: the reference scales of N and S₁ (default: the geometric mean of N, the
        largest S₁); given, e.g. a pilot fit's, the fitted A and B are on the same scales as
        its (an adaptive sweep refits the law whose prior that fit is).

    Raises:
      FitInputError: mismatched lengths, non-positive N, S1 or L.
      Unidentifiable: fewer than three model sizes, or fewer points than parameters.
    """
    N, S1, S2, L = (np.asarray(x, np.float64).ravel() for x in (N, S1, S2, L))
    if not len(N) == len(S1) == len(S2) == len(L):
        raise FitInputError(
            f"{series}: N, S1, S2 and L differ in length ({len(N)}, {len(S1)}, {len(S2)}, {len(L)})"
        )
    for name, x in (("N", N), ("S1", S1), ("L", L)):
        if not np.all(np.isfinite(x) & (x > 0)):
            raise FitInputError(f"{series}: every {name} must be a positive number")
    require_distinct(law=LAW, series=series, what="model sizes", values=N, minimum=3)
    if len(L) < len(PARAMS) + 1:
        raise Unidentifiable(
            f"{LAW} law ({series}): {len(L)} points for {len(PARAMS)} parameters; need at least "
            f"{len(PARAMS) + 1}"
        )
    n_ref = float(np.exp(np.mean(np.log(N)))) if n_ref is None else float(n_ref)
    s_ref = float(S1.max()) if s_ref is None else float(s_ref)
    n, s1, log_l = N / n_ref, S1 / s_ref, np.log(L)

    def residuals(theta):
        E, log_a, alpha, log_b, beta, C, gamma = theta
        pred = E + np.exp(log_a) * n**-alpha + n**-gamma * (np.exp(log_b) * s1**-beta - C * S2)
        # A negative prediction has no log: a large residual steers the optimiser away.
        return np.where(pred > 0, np.log(np.maximum(pred, 1e-300)) - log_l, 10.0)

    floor = float(L.min())
    best, n_starts = None, 0
    for alpha, beta, gamma in itertools.product(*_STARTS):
        theta0 = (
            0.5 * floor,
            math.log(0.25 * floor),
            alpha,
            math.log(0.25 * floor),
            beta,
            0.0,
            gamma,
        )
        r = optimize.least_squares(residuals, theta0, bounds=(_LOWER, _UPPER))
        n_starts += 1
        if best is None or r.cost < best.cost:
            best = r
    E, log_a, alpha, log_b, beta, C, gamma = (float(v) for v in best.x)
    params = dict(
        E=E, A=math.exp(log_a), alpha=alpha, B=math.exp(log_b), beta=beta, C=C, gamma=gamma
    )
    rel = formula(N, S1, S2, **params, n_ref=n_ref, s_ref=s_ref) / L - 1
    return LrAreaFit(
        params=params,
        decay=decay,
        n_ref=n_ref,
        s_ref=s_ref,
        rms=float(np.sqrt(np.mean(rel**2))),
        converged=bool(best.success),
        n_points=len(L),
        n_runs=len(set(runs)) if runs is not None else len(np.unique(N)),
        n_starts=n_starts,
    )


def parametric_bootstrap(
    result: LrAreaFit,
    N,
    S1,
    S2,
    runs: Sequence[str],
    *,
    sigma: float,
    run_sigma: float,
    n: int,
    seed: int,
) -> LrAreaFit:
    """`result` with `samples` and `ci` from `n` refits of simulated evaluations: the fitted law
    at the same (N, S1, S2) times exp of a run offset N(0, run_sigma²) shared by each run's points
    and a point's own N(0, sigma²) (`fitting.design.noise.run_noise` of the fit's residuals).
    Resampling whole runs, as the L(N, D) fits do, leaves a three-size study with fewer than
    three distinct sizes in most draws; simulating keeps every size. Refits at the fit's λ and
    reference scales; those that fail or do not converge are dropped.
    """
    if n <= 0 or not result.converged:
        return result
    N, S1, S2 = (np.asarray(x, np.float64) for x in (N, S1, S2))
    runs = np.asarray(runs)
    pred = result.predict(N, S1, S2)
    names, which = np.unique(runs, return_inverse=True)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        log_noise = run_sigma * rng.standard_normal(len(names))[which]
        drawn = pred * np.exp(log_noise + sigma * rng.standard_normal(len(pred)))
        try:
            refit = fit(
                N, S1, S2, drawn, decay=result.decay, n_ref=result.n_ref, s_ref=result.s_ref
            )
        except FitInputError:
            continue
        if refit.converged:
            samples.append(dict(refit.params))
    ci = {}
    for p in PARAMS:
        values = np.asarray([s[p] for s in samples])
        if values.size:
            lo, hi = np.percentile(values, [2.5, 97.5])
            ci[p] = (float(lo), float(hi))
    return dataclasses.replace(result, samples=tuple(samples), ci=ci)


@dataclasses.dataclass(frozen=True)
class RunCurve:
    """One run as the law sees it: its size, its schedule and its evaluations.

    Attributes:
      run_id: the run, for messages and `LrAreaFit.n_runs`.
      n_params: N.
      lrs: the learning rate of each update (`fitting.readers.points.learning_rates`).
      steps, loss: the evaluations: step (1 to len(lrs)) and loss.
    """

    run_id: str
    n_params: float
    lrs: np.ndarray
    steps: np.ndarray
    loss: np.ndarray

    def at(self, decay: float, keep: np.ndarray | None = None):
        """(N, S1, S2, L) of the evaluations `keep` selects (a boolean mask; default all), with
        the areas of this run's schedule under `decay`.

        Raises:
          FitInputError: an evaluation after the schedule's last logged step.
        """
        steps = np.asarray(self.steps, int)
        keep = np.ones(steps.shape, bool) if keep is None else np.asarray(keep, bool)
        if steps.size and steps.max() > len(self.lrs):
            raise FitInputError(
                f"run {self.run_id!r}: evaluated at step {steps.max()}, its schedule has "
                f"{len(self.lrs)} steps"
            )
        s1, s2 = areas(self.lrs, decay=decay)
        at = steps[keep]
        return np.full(at.shape, float(self.n_params)), s1[at], s2[at], np.asarray(self.loss)[keep]


def pooled(curves: Sequence[RunCurve], decay: float, keep=None):
    """The curves' evaluations pooled: N, S1, S2, L and the run of each; `keep(curve)` gives a
    curve's mask (default: every evaluation)."""
    parts = [c.at(decay, None if keep is None else keep(c)) for c in curves]
    runs = [c.run_id for c, p in zip(curves, parts, strict=True) for _ in p[3]]
    N, S1, S2, L = (np.concatenate(x) if parts else np.zeros(0) for x in zip(*parts, strict=True))
    return N, S1, S2, L, runs


def fit_curves(
    curves: Sequence[RunCurve], *, decay: float, series: str = "runs", **scales: float | None
) -> LrAreaFit:
    """`fit` on every evaluation of `curves` (see there for the errors and the reference
    `scales`, n_ref and s_ref)."""
    N, S1, S2, L, runs = pooled(curves, decay)
    return fit(N, S1, S2, L, decay=decay, runs=runs, series=series, **scales)


DECAYS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999)


@dataclasses.dataclass(frozen=True)
class DecayChoice:
    """λ chosen by forecasting the end of each run from its beginning (`choose_decay`).

    Attributes:
      decay: the λ with the smallest forecast error.
      errors: λ -> RMS relative error of the held-out evaluations (NaN: no fit at that λ).
      holdout: the share of each run's steps held out.
    """

    decay: float
    errors: dict[float, float]
    holdout: float


def choose_decay(
    curves: Sequence[RunCurve],
    *,
    decays: Sequence[float] = DECAYS,
    holdout: float = 0.25,
    series: str = "runs",
) -> DecayChoice:
    """The annealing momentum λ under which the law, fitted on the evaluations in the first
    1 − `holdout` of each run's steps, best forecasts the rest (RMS relative error): a choice
    made from the fitted runs alone, never from the runs to be predicted. The held-out end is
    where a cosine schedule anneals, the part of the curve λ shapes.

    Raises:
      FitInputError: `holdout` outside (0, 1), no λ given, or no λ whose fit succeeds (the
        last fit's error).
    """
    if not 0.0 < holdout < 1.0 or not decays:
        raise FitInputError(
            f"holdout must be in (0, 1) and decays non-empty, got {holdout}, {decays}"
        )

    def early(c: RunCurve) -> np.ndarray:
        return np.asarray(c.steps) <= (1.0 - holdout) * len(c.lrs)

    errors, last_error = {}, None
    for decay in decays:
        try:
            f = fit(*pooled(curves, decay, early)[:4], decay=decay, series=series)
        except FitInputError as e:
            errors[float(decay)], last_error = math.nan, e
            continue
        N, S1, S2, L, _ = pooled(curves, decay, lambda c: ~early(c))
        errors[float(decay)] = float(np.sqrt(np.mean((f.predict(N, S1, S2) / L - 1) ** 2)))
    finite = {k: v for k, v in errors.items() if np.isfinite(v)}
    if not finite:
        raise last_error or FitInputError(f"{series}: no evaluation held out to choose λ")
    return DecayChoice(decay=min(finite, key=finite.get), errors=errors, holdout=holdout)
