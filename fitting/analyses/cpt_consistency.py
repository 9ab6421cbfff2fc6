"""What the CPT paper's Table 2 implies for its own headline claims (Zheng et al. 2024).

The paper fits the Chinchilla law (eq. 1) to its from-scratch runs and the extended law (eq. 4) to
its CPT runs with E, A, α fixed from the first fit [q:cpt.s3_2_fixed], so the two laws differ only
in their data terms: B/D^β from scratch, B'/(D^β'·N^γ) for CPT. Evaluated at the paper's own sizes
and token counts, that pair of laws can be set against what its text claims from the same runs.
Everything here is computed from the laws' coefficients, none of it is read off the paper; the
functions take arrays of coefficients too, so that `fitting.reports.cpt_comparison` evaluates them
over every value the printed digits allow (`fitting.printed_box`):

- `crossover_tokens`: the D at which the two laws give the same loss at size N; CPT is below
  scratch only for fewer tokens (β' < β), so at 20 tokens per parameter, where the paper trains,
  it can be above.
- `scratch_tokens`, `flops_saved`: Fig. 2's quantities from the laws (same N, so compute is
  proportional to tokens): D_PT with L_scratch(N, D_PT) = L_CPT(N, D), 1 − D/D_PT, D_PT − D.
- `saved_window`: the tokens over which the laws' FLOPs saved lies between two fractions (the
  paper's "25% to 50%").
- `implied_frontier`: eq. 3's pure power k·C^(−g), fitted the paper's way (the lowest loss at
  each compute level, `fitting.analyses.frontier`) to the laws' training curves of the paper's
  sizes; its exponent depends on where the curves start, so the start is an argument.

All functions take parameter mappings as `fitting.laws.formulas` names them: the scratch law's
E, A, B, alpha, beta and the CPT law's B, beta, gamma (E, A, alpha taken from the scratch law).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fitting.analyses import frontier
from fitting.laws import formulas, robust_fit


def cpt_params(scratch: Mapping[str, float], cpt: Mapping[str, float]) -> dict[str, float]:
    """The full CPT law: E, A, α of the scratch law (eqs. 6-7 fix them), B', β', γ of `cpt`."""
    return {
        "E": scratch["E"],
        "A": scratch["A"],
        "alpha": scratch["alpha"],
        "B": cpt["B"],
        "beta": cpt["beta"],
        "gamma": cpt["gamma"],
    }


def losses(scratch: Mapping[str, float], cpt: Mapping[str, float], N, D) -> tuple:
    """(L_scratch, L_CPT) at (N, D)."""
    s = {k: scratch[k] for k in ("E", "A", "B", "alpha", "beta")}
    return formulas.chinchilla(N, D, **s), formulas.cpt(N, D, **cpt_params(scratch, cpt))


def crossover_tokens(scratch: Mapping[str, float], cpt: Mapping[str, float], N) -> np.ndarray:
    """The tokens D* at which the two laws give the same loss at size N: B/D^β = B'/(D^β'·N^γ),
    so D* = ((B'/B)·N^−γ)^(1/(β'−β)). With β' < β, CPT is the lower one only below D*."""
    N = np.asarray(N, np.float64)
    return ((cpt["B"] / scratch["B"]) * N ** -cpt["gamma"]) ** (
        1.0 / (cpt["beta"] - scratch["beta"])
    )


def scratch_tokens(scratch: Mapping[str, float], cpt: Mapping[str, float], N, D) -> np.ndarray:
    """D_PT: the from-scratch tokens reaching the loss the CPT law gives for D tokens at size N
    (NaN where the scratch law never gets that low)."""
    N, D = np.asarray(N, np.float64), np.asarray(D, np.float64)
    _, l_cpt = losses(scratch, cpt, N, D)
    excess = l_cpt - scratch["E"] - scratch["A"] * N ** -scratch["alpha"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(excess > 0, (scratch["B"] / excess) ** (1.0 / scratch["beta"]), np.nan)


def flops_saved(scratch: Mapping[str, float], cpt: Mapping[str, float], N, D) -> np.ndarray:
    """Fig. 2 (top) from the laws: (C_PT − C_CPT)/C_PT = 1 − D/D_PT at the same N (negative
    where CPT needs more compute than training from scratch)."""
    return 1.0 - np.asarray(D, np.float64) / scratch_tokens(scratch, cpt, N, D)


def saved_window(
    scratch: Mapping[str, float], cpt: Mapping[str, float], N: float, saved: Sequence[float]
) -> tuple[float, ...]:
    """The tokens D at which `flops_saved` equals each fraction in `saved`, at size N.

    With E, A, α shared, D_PT/D = (B/B')^(1/β)·N^(γ/β)·D^(β'/β − 1), so the fraction s is
    reached at D = (1/(1−s) / ((B/B')^(1/β)·N^(γ/β)))^(1/(β'/β − 1)).
    """
    b, bp = scratch["beta"], cpt["beta"]
    scale = (scratch["B"] / cpt["B"]) ** (1.0 / b) * N ** (cpt["gamma"] / b)
    return tuple(float((1.0 / (1.0 - s) / scale) ** (1.0 / (bp / b - 1.0))) for s in saved)


def implied_frontier(
    loss,
    sizes: Sequence[float],
    *,
    tokens_per_param: float,
    start_fraction: float,
    points: int = 20,
) -> dict[str, float]:
    """Eq. 3's pure power L = k·C^(−g) as the paper fits it (the lowest loss at each compute
    level over all runs, `frontier.frontier_points`), to the curves `loss(N, D)` of runs of
    `sizes` trained on `tokens_per_param`·N tokens, each evaluated at `points` log-spaced token
    counts from `start_fraction` of its run to its end (1: the run's end only); C = 6·N·D.

    Returns:
      {"k", "g", "C_min", "C_max"}: the fitted power and the compute range of its frontier.
    """
    C, L, runs = [], [], []
    points = 1 if start_fraction >= 1.0 else points  # from the run ends only: one point per run
    for n in sizes:
        d = np.geomspace(
            min(start_fraction, 1.0) * tokens_per_param * n, tokens_per_param * n, points
        )
        C.append(6.0 * n * d)
        L.append(np.asarray(loss(n, d), np.float64))
        runs += [f"{n:g}"] * points
    fc, fl, fr = frontier.frontier_points(np.concatenate(C), np.concatenate(L), runs)
    fit = robust_fit.fit_power(fc, fl, runs=fr)
    return {**fit.params, "C_min": float(fc[0]), "C_max": float(fc[-1])}
