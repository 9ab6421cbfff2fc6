"""What the fitting tests share: a small start grid, fit results made from given parameters, and
the run.json of a small scratch run (`RUN_META`)."""

from __future__ import annotations

from collections.abc import Mapping

from fitting.laws.robust_fit import FitResult

# A few Chinchilla starts around the usual basin: they exercise the same code as the default
# (Hoffmann) grid without its 4,500-start cost.
SMALL_GRID = {
    "a": [0.0, 5.0, 10.0],
    "b": [0.0, 5.0, 10.0],
    "e": [0.0, 0.5],
    "alpha": [0.5],
    "beta": [0.5],
}

# The run.json of a scratch run into French of 1e8 non-embedding parameters, 4 rows of 8 tokens a
# step, 6e8 FLOPs a token: what the fit readers need of a run directory written by hand.
RUN_META = {
    "strategy": "scratch",
    "target_lang": "fr",
    "params_non_embedding": 1e8,
    "batch_size": 4,
    "seq_len": 8,
    "flops_per_token": 6e8,
}


def given_fit(
    law: str,
    params: Mapping[str, float],
    samples=(),
    *,
    objective: float = 0.0,
    converged: bool = True,
    grad_norm: float = 0.0,
    n_points: int = 1,
    n_runs: int = 1,
) -> FitResult:
    """A `FitResult` of `params` as a fit would return them: by default converged at zero
    objective and gradient, from one start, on one point of one run, δ = 1e-3, with bootstrap
    `samples`."""
    return FitResult(
        law=law,
        params=params,
        objective=objective,
        converged=converged,
        grad_norm=grad_norm,
        n_starts=1,
        n_finite=1,
        n_at_best=1,
        n_points=n_points,
        n_runs=n_runs,
        delta=1e-3,
        samples=samples,
    )
