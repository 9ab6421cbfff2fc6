"""How noisy a law's points are, within a run and between runs: the σ and τ of `Block`.

A run's evaluations share its seed, so its whole curve sits above or below the law: a log
residual is r_ij = u_i + e_ij, the run's offset u_i ~ N(0, τ²) and the evaluation's own noise
e_ij ~ N(0, σ²). `run_noise` estimates both from a fit's log residuals grouped by run, with the
one-way random-effects ANOVA (method of moments, unbalanced groups; e.g. Searle, Casella &
McCulloch, *Variance Components*, §3.6): σ² is the within-run mean square, and
τ² = max(0, (MS_between − σ²)/n₀), n₀ = (N − Σnᵢ²/N)/(k − 1) the effective run length. The
estimate is a moment one: the residuals come from a fit that absorbed some of the noise, and
a law that misses the curves' shape shows up as within-run noise — it is what the design's
information (`fitting.design.information`) needs to stop counting a run's tenth checkpoint as a
tenth run, not a variance to report on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RunNoise:
    """σ (within a run) and τ (between runs) of a block's log metric, and what they came from.

    Attributes:
      sigma: standard deviation of one evaluation's log residual around its run's offset.
      run_sigma: standard deviation of the runs' offsets (τ; 0 when the runs' means spread no
        more than their own noise explains).
      runs: runs with points.
      points: points in all.
    """

    sigma: float
    run_sigma: float
    runs: int
    points: int

    def to_json(self) -> dict[str, float | int]:
        """JSON-ready."""
        return dataclasses.asdict(self)


def run_noise(log_residuals: Sequence[float], runs: Sequence[str]) -> RunNoise | None:
    """σ and τ of log residuals grouped by run (see the module docstring); None when they
    cannot be told apart: fewer than two runs, or no run with two points."""
    r = np.asarray(log_residuals, np.float64)
    ids = np.asarray(runs)
    if r.shape != ids.shape:
        raise ValueError(f"{r.size} residuals but {ids.size} run ids")
    keep = np.isfinite(r)
    r, ids = r[keep], ids[keep]
    names, group = np.unique(ids, return_inverse=True)
    k, n = len(names), r.size
    counts = np.bincount(group, minlength=k).astype(np.float64)
    if k < 2 or n - k < 1:
        return None
    means = np.bincount(group, weights=r, minlength=k) / counts
    within = float(np.sum((r - means[group]) ** 2) / (n - k))
    between = float(np.sum(counts * (means - r.mean()) ** 2) / (k - 1))
    n0 = (n - float(np.sum(counts**2)) / n) / (k - 1)
    tau2 = max(0.0, (between - within) / n0)
    return RunNoise(float(np.sqrt(within)), float(np.sqrt(tau2)), int(k), int(n))


def run_offset(log_residuals: Sequence[float], noise: RunNoise | None) -> tuple[float, float]:
    """One run's own offset, from its observed log residuals: the posterior mean and standard
    deviation of u under u ~ N(0, τ²) and P points of noise σ (the best linear unbiased
    predictor: the residuals' mean shrunk by Pτ²/(σ² + Pτ²)). With no points, (0, τ); with no
    noise estimate, (0, 0)."""
    if noise is None or noise.run_sigma == 0.0:
        return 0.0, 0.0
    r = np.asarray(log_residuals, np.float64)
    r = r[np.isfinite(r)]
    tau2, sigma2, p = noise.run_sigma**2, noise.sigma**2, r.size
    if p == 0:
        return 0.0, noise.run_sigma
    shrink = p * tau2 / (sigma2 + p * tau2)
    return float(shrink * r.mean()), float(np.sqrt(tau2 * sigma2 / (sigma2 + p * tau2)))
