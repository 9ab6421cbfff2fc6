"""The MT paper's downstream laws (Isik et al. 2024, §3 and Appendix A.2) with held-out error.

- Translation scores (BLEU, ROUGE, COMET): f(Dp) = (log(A·Dp^α))^β (its eq. 1), Huber δ = 0.1 on
  log f (its eq. 6).
- Downstream cross-entropy: L(Dp) = E + A/Dp^α (its eq. 3), Huber δ = 1e-3 on log L (its eq. 7).

Both are fitted by damped Newton (the exact-Hessian cousin of the paper's L-BFGS) from a grid of
initialisations on the first `n_fit` points by pretraining size (the paper uses four: three
coefficients, one spare against outliers); the rest are held out and scored by the same Huber loss.

Internally the log-law uses q(Dp) = log(A·Dp^α) = e^v + e^u·(log Dp − z̄), so A·Dp^α stays
positive-logged (q > 0) where the data are and α = e^u > 0 (a decreasing score is β < 0); the
result reports log A = e^v − e^u·z̄, α and β, the paper's parameterisation (A itself spans
hundreds of orders of magnitude).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.stats

from fitting.checks import FitInputError, as_points, require_distinct
from fitting.formats import json_safe
from fitting.laws import formulas, optim
from fitting.laws.robust_fit import LawFit, fit_univariate, percentile_cis

# What the MT paper fits laws to (eval/<task>/<metric>): the translation scores of its eq. 1
# (BLEU, ROUGE-L, COMET) and the downstream cross-entropy ("loss", eq. 3). Anything else a run
# logs -- BLEU's parts (`pipelines.text_metrics.BLEU_PARTS`: brevity penalty, n-gram precisions,
# lengths; kept for Remark 2), chrF++, the decoded count -- is data, never fitted.
SCORES = ("bleu", "rouge_l", "comet")
CE = "loss"
FITTED = (*SCORES, CE)


@dataclasses.dataclass(frozen=True)
class DownstreamFit(LawFit):
    """A downstream law fitted on the first points and checked on the rest.

    Attributes (after `fitting.laws.robust_fit.LawFit`'s law, params, objective, converged, grad_norm,
    n_starts; law is "log_law" for scores or "power_law" for cross-entropy):
      n_at_best: starts that reached the best basin.
      n_fit: points used for the fit (the smallest Dp).
      delta: Huber threshold.
      Dp, observed, predicted: every point, sorted by Dp.
      residuals: log observed − log predicted, per point.
      fitted: which points were used for the fit.
      prediction_error: Huber loss (δ) summed over the held-out points' log residuals (NaN when
        nothing is held out or the law is undefined at a held-out point).
      samples: parameters of each converged residual-bootstrap refit (`bootstrap_series`;
        empty without one), for intervals on predictions.
      ci: parameter → (lo, hi) 95% percentile interval over `samples` (empty without them).
    """

    n_at_best: int
    n_fit: int
    delta: float
    Dp: np.ndarray
    observed: np.ndarray
    predicted: np.ndarray
    residuals: np.ndarray
    fitted: np.ndarray
    prediction_error: float
    samples: tuple[dict[str, float], ...] = ()
    ci: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (unrounded; NaN as null)."""
        return {
            "law": self.law,
            "params": dict(self.params),
            "objective": self.objective,
            "converged": self.converged,
            "grad_norm": self.grad_norm,
            "n_starts": self.n_starts,
            "n_at_best": self.n_at_best,
            "n_fit": self.n_fit,
            "delta": self.delta,
            **{
                k: json_safe(np.asarray(getattr(self, k), float).tolist())
                for k in ("Dp", "observed", "predicted", "residuals")
            },
            "fitted": [bool(b) for b in self.fitted],
            "prediction_error": json_safe(float(self.prediction_error)),
        }


@dataclasses.dataclass(frozen=True)
class LogLawProblem:
    """Huber objective of the log-law in (v, u, β), for `fitting.laws.optim` (numpy only)."""

    z: np.ndarray  # log Dp − z̄ of the fitted points
    target: np.ndarray  # log score
    weights: np.ndarray
    delta: float
    n_params: int = 3

    def _parts(self, xp: Any, theta: Any):
        v, u, beta = theta[..., 0:1], theta[..., 1:2], theta[..., 2:3]
        ev, t = xp.exp(v), xp.exp(u) * self.z
        q = ev + t
        with np.errstate(invalid="ignore", divide="ignore"):
            logq = xp.where(q > 0, xp.log(xp.where(q > 0, q, 1.0)), xp.nan)
        return ev, t, q, logq, beta

    def value(self, xp: Any, theta: Any, weights: Any) -> Any:
        """Objective for theta [..., 3] (NaN where q ≤ 0 at a point)."""
        _, _, _, logq, beta = self._parts(xp, theta)
        r = beta * logq - self.target
        return xp.sum(weights * optim.huber(r, self.delta, xp), axis=-1)

    def derivs(self, xp: Any, theta: Any, weights: Any):
        """Objective, gradient and exact Hessian for theta [S, 3]."""
        ev, t, q, logq, beta = self._parts(xp, theta)
        r = beta * logq - self.target
        f = xp.sum(weights * optim.huber(r, self.delta, xp), axis=-1)
        psi = weights * xp.clip(r, -self.delta, self.delta)
        dpsi = weights * (xp.abs(r) <= self.delta)
        j = [beta * ev / q, beta * t / q, logq]  # ∂p/∂(v, u, β), each [S, P]
        q2 = q * q
        hp = {
            (0, 0): beta * ev * (q - ev) / q2,
            (0, 1): -beta * ev * t / q2,
            (1, 1): beta * t * (q - t) / q2,
            (0, 2): ev / q,
            (1, 2): t / q,
            (2, 2): xp.zeros_like(q),
        }
        g = xp.stack([xp.sum(psi * ji, axis=-1) for ji in j], axis=-1)
        h = [[None] * 3 for _ in range(3)]
        for a in range(3):
            for b in range(a, 3):
                val = xp.sum(dpsi * j[a] * j[b] + psi * hp[(a, b)], axis=-1)
                h[a][b] = h[b][a] = val
        return f, g, xp.stack([xp.stack(row, axis=-1) for row in h], axis=-2)


def _sorted_points(Dp, y, name: str, n_fit: int, law: str):
    pts = as_points({"Dp": Dp, name: y}, n_params=3, law=law)
    if n_fit < 3:
        raise FitInputError(f"{law}: n_fit={n_fit} cannot determine 3 coefficients")
    if len(pts["Dp"]) < n_fit:
        raise FitInputError(f"{law}: {len(pts['Dp'])} points, fewer than n_fit={n_fit}")
    order = np.argsort(pts["Dp"], kind="stable")
    Dp = pts["Dp"][order]
    # Three coefficients need three distinct checkpoints among the fitted ones (a merged series,
    # two models at one Dp, would otherwise "fit" a zig-zag).
    require_distinct(
        law=law,
        series="",
        what=f"distinct Dp among the first {n_fit}",
        values=Dp[:n_fit],
        minimum=3,
    )
    return Dp, pts[name][order]


def _checked(
    law: str, params: dict[str, float], fit: Any, *, grad_norm: float, Dp, obs, n_fit: int, delta
) -> DownstreamFit:
    """The fit on the first `n_fit` points, scored on the rest by the same Huber loss.

    `fit` is the optimiser's result (`optim.MultiStartResult` or `FitResult`): its objective,
    converged, n_starts and n_at_best are recorded.
    """
    pred = formulas.predict(law, params, Dp)
    with np.errstate(invalid="ignore", divide="ignore"):
        res = np.log(obs) - np.log(pred)
    fitted = np.arange(len(Dp)) < n_fit
    held = res[~fitted]
    err = float(np.sum(optim.huber(held, delta))) if held.size else math.nan
    return DownstreamFit(
        law=law,
        params=params,
        n_fit=n_fit,
        delta=float(delta),
        Dp=Dp,
        observed=obs,
        predicted=pred,
        residuals=res,
        fitted=fitted,
        prediction_error=err,
        objective=fit.objective,
        converged=fit.converged,
        grad_norm=grad_norm,
        n_starts=fit.n_starts,
        n_at_best=fit.n_at_best,
    )


def fit_bleu_law(Dp, score, *, n_fit: int = 4, delta: float = 0.1) -> DownstreamFit:
    """Fits f(Dp) = (log(A·Dp^α))^β to a translation score on its first `n_fit` points.

    Args:
      Dp: pretraining tokens of each checkpoint.
      score: the finetuned checkpoint's score (BLEU, ROUGE, COMET; positive).
      n_fit: points by increasing Dp used for the fit; the rest are held out.
      delta: Huber threshold on log score (0.1, as the paper).

    Raises:
      FitInputError: fewer than n_fit points, n_fit < 3, non-positive or non-finite values.
    """
    Dp, obs = _sorted_points(Dp, score, "score", n_fit, "log_law")
    z = np.log(Dp[:n_fit])
    zbar = float(np.mean(z))
    y = np.log(obs[:n_fit])
    problem = LogLawProblem(z=z - zbar, target=y, weights=np.ones(n_fit), delta=float(delta))
    ybar = float(np.mean(y))
    starts = []
    for beta in (-2.0, -1.0, -0.5, -0.25, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0):
        for u in np.arange(-8.0, 6.0 + 1e-9, 2.0):
            for dv in (-1.0, 0.0, 1.0):
                # e^v ≈ q̄ with q̄^β ≈ the scores' geometric mean
                starts.append((math.log(max(math.exp(ybar / beta), 1e-300)) + dv, u, beta))
    res = optim.multistart(problem, np.asarray(starts), iters=60)
    v, u, beta = res.theta
    params = {
        "log_A": float(math.exp(v) - math.exp(u) * zbar),
        "alpha": float(math.exp(u)),
        "beta": float(beta),
    }
    grad_norm = float(np.max(np.abs(res.grad)))
    return _checked(
        "log_law", params, res, grad_norm=grad_norm, Dp=Dp, obs=obs, n_fit=n_fit, delta=delta
    )


def fit_ce_law(Dp, ce, *, n_fit: int = 4, delta: float = 1e-3) -> DownstreamFit:
    """Fits L(Dp) = E + A/Dp^α to downstream cross-entropy on its first `n_fit` points.

    Args:
      Dp: pretraining tokens of each checkpoint.
      ce: the finetuned checkpoint's downstream cross-entropy (nats, positive).
      n_fit: points by increasing Dp used for the fit; the rest are held out.
      delta: Huber threshold on log L (1e-3, as the paper's main text).

    Raises:
      FitInputError: fewer than n_fit points, n_fit < 3, non-positive or non-finite values.
    """
    Dp, obs = _sorted_points(Dp, ce, "ce", n_fit, "power_law")
    r = fit_univariate("power_law", Dp[:n_fit], obs[:n_fit], delta=delta, input_name="Dp")
    return _checked(
        "power_law", r.params, r, grad_norm=r.grad_norm, Dp=Dp, obs=obs, n_fit=n_fit, delta=delta
    )


def fit_series(Dp: Sequence[float], values: Sequence[float], *, metric: str, n_fit: int = 4):
    """The MT paper's law for a metric: cross-entropy ("loss") → `fit_ce_law`, a score of
    `SCORES` → the log-law.

    Raises:
      ValueError: a metric the paper fits no law to (BLEU's parts, chrF++, ...).
    """
    if metric not in FITTED:
        raise ValueError(
            f"{metric!r} is logged, not fitted: the MT paper's laws are for {', '.join(FITTED)}"
        )
    fitter = fit_ce_law if metric == CE else fit_bleu_law
    return fitter(Dp, values, n_fit=n_fit)


_FITTERS = {"log_law": fit_bleu_law, "power_law": fit_ce_law}  # DownstreamFit.law -> its fitter


def bootstrap_series(fit: DownstreamFit, *, n: int, seed: int) -> DownstreamFit:
    """`fit` with `samples` and `ci` from a residual bootstrap of its fitted points, so that its
    predictions carry an interval (the adaptive sweep's `--tolerance` on MT runs needs one).

    A series has one point per checkpoint, too few to resample points (a draw often lacks the
    three distinct Dp a law needs). So the checkpoints stay: each refit sees the fitted values
    times exp of log residuals drawn with replacement. The residuals are centred and scaled by
    sqrt(n/(n − 3)) (the three coefficients the fit spent) times t(0.975, n − 3)/z(0.975): with
    two to four points to spare, the plain percentile interval held the truth in about 75% of
    synthetic series instead of 95% (`benchmarks/mt_intervals.py`). A fit with no point to spare
    (n_fit = 3: zero residuals, which would claim a certain prediction) gets no samples. Refits
    that do not converge are dropped.

    Args:
      fit: a converged `fit_bleu_law` / `fit_ce_law` result.
      n: resamples (0: `fit` unchanged).
      seed: the resampling seed.
    """
    k = int(np.sum(fit.fitted))
    if n <= 0 or k <= 3 or not fit.converged:
        return fit
    Dp, pred = fit.Dp[fit.fitted], fit.predicted[fit.fitted]
    res = fit.residuals[fit.fitted]
    small_sample = scipy.stats.t.ppf(0.975, k - 3) / scipy.stats.norm.ppf(0.975)
    res = (res - np.mean(res)) * math.sqrt(k / (k - 3)) * small_sample
    rng = np.random.default_rng(seed)
    fitter, samples = _FITTERS[fit.law], []
    for _ in range(n):
        drawn = pred * np.exp(rng.choice(res, size=k, replace=True))
        try:
            refit = fitter(Dp, drawn, n_fit=k, delta=fit.delta)
        except FitInputError:  # e.g. a drawn score at or below zero has no log-law
            continue
        if refit.converged:
            samples.append(dict(refit.params))
    return dataclasses.replace(fit, samples=tuple(samples), ci=percentile_cis(samples))
