"""Compute-optimal allocation of a FLOP budget between parameters and tokens (CPT paper §3, §5.1).

Minimising L(N, D) under C = 6·N·D gives N_opt = G·(C/6)^a and D_opt = G⁻¹·(C/6)^b:

- Chinchilla (eq. 2): G = (αA/(βB))^(1/(α+β)), a = β/(α+β), b = α/(α+β);
- CPT (eq. 5): G = (αA/((β'−γ)B'))^(1/(α+β'−γ)), a = β'/(α+β'−γ), b = (α−γ)/(α+β'−γ).

`Allocation` also carries the prefactors of the papers' eqs. 8–9 (N_opt = n_coef·C^a,
D_opt = d_coef·C^b), so the paper's numbers (0.324·C^0.429, ...) can be compared directly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fitting.laws import formulas
from fitting.laws.robust_fit import FitResult, percentile_cis

FLOPS_PER_PARAM_TOKEN = 6.0


@dataclasses.dataclass(frozen=True)
class Allocation:
    """Compute-optimal frontier of a fitted law.

    Attributes:
      law: "chinchilla" or "cpt".
      params: the law's parameters.
      G, a, b: the papers' coefficients (N_opt = G·(C/6)^a, D_opt = G⁻¹·(C/6)^b).
      n_coef, d_coef: prefactors in N_opt = n_coef·C^a, D_opt = d_coef·C^b.
      valid: False when the law has no interior optimum (e.g. β' ≤ γ); the numbers are NaN then.
      note: why it is not valid.
    """

    law: str
    params: dict[str, float]
    G: float
    a: float
    b: float
    n_coef: float
    d_coef: float
    valid: bool = True
    note: str = ""

    def n_opt(self, C) -> np.ndarray:
        """Compute-optimal parameter count at budget C (FLOPs)."""
        return self.n_coef * np.asarray(C, np.float64) ** self.a

    def d_opt(self, C) -> np.ndarray:
        """Compute-optimal token count at budget C (FLOPs)."""
        return self.d_coef * np.asarray(C, np.float64) ** self.b

    def loss(self, C) -> np.ndarray:
        """Loss the law predicts at the compute-optimal allocation of C."""
        return formulas.predict(self.law, self.params, self.n_opt(C), self.d_opt(C))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (unrounded): every field but the law's parameters, which the fit
        records beside it."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "params"}


def _law_of(params: Mapping[str, float]) -> str:
    return "cpt" if "gamma" in params else "chinchilla"


def compute_optimal(
    params: Mapping[str, float] | FitResult, *, law: str | None = None
) -> Allocation:
    """The compute-optimal allocation of a Chinchilla or CPT law (eqs. 2 and 5).

    Args:
      params: a fit result or its parameter mapping (E, A, B, alpha, beta[, gamma]).
      law: "chinchilla" or "cpt"; inferred from the parameters (gamma present → cpt) if omitted.
    """
    if isinstance(params, FitResult):
        law = law or params.law
        params = params.params
    law = law or _law_of(params)
    p = {k: float(v) for k, v in params.items()}
    A, B, alpha, beta = p["A"], p["B"], p["alpha"], p["beta"]
    gamma = p.get("gamma", 0.0) if law == "cpt" else 0.0
    if law not in ("chinchilla", "cpt"):
        raise ValueError(f"compute_optimal: law must be chinchilla or cpt, got {law!r}")
    denom = alpha + beta - gamma
    data_exp = beta - gamma
    if not (alpha > 0 and data_exp > 0 and denom > 0 and alpha - gamma > 0 and A > 0 and B > 0):
        nan = math.nan
        note = (
            "no interior optimum: need alpha > 0, beta - gamma > 0 and alpha - gamma > 0 "
            f"(alpha={alpha}, beta={beta}, gamma={gamma})"
        )
        return Allocation(law, p, nan, nan, nan, nan, nan, valid=False, note=note)
    G = (alpha * A / (data_exp * B)) ** (1.0 / denom)
    a = beta / denom
    b = (alpha - gamma) / denom
    n_coef = G * FLOPS_PER_PARAM_TOKEN**-a
    d_coef = FLOPS_PER_PARAM_TOKEN**-b / G
    return Allocation(law, p, G, a, b, n_coef, d_coef)


def allocation_cis(result: FitResult, *, budgets: Sequence[float] = ()) -> dict[str, tuple]:
    """Bootstrap percentile intervals of G, a, b, the prefactors, and N_opt/D_opt/loss at budgets.

    Uses the fit's bootstrap samples (each a refit on run-resampled data).
    """
    rows = []
    for s in result.samples:
        al = compute_optimal(s, law=result.law)
        if not al.valid:
            continue
        row = {k: getattr(al, k) for k in ("G", "a", "b", "n_coef", "d_coef")}
        for c in budgets:
            row[f"N_opt@{c:g}"] = float(al.n_opt(c))
            row[f"D_opt@{c:g}"] = float(al.d_opt(c))
            row[f"loss@{c:g}"] = float(al.loss(c))
        rows.append(row)
    return percentile_cis(rows)


def isoloss_grid(
    law: str,
    params: Mapping[str, float],
    *,
    compute: tuple[float, float],
    n_params: tuple[float, float],
    num: int = 120,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loss over a (C, N) grid with D = C/(6N): the data of IsoLoss contours (CPT paper Fig. 5).

    Returns:
      (C [num, num], N [num, num], L [num, num]).
    """
    c = np.logspace(np.log10(compute[0]), np.log10(compute[1]), num)
    n = np.logspace(np.log10(n_params[0]), np.log10(n_params[1]), num)
    cc, nn = np.meshgrid(c, n)
    return cc, nn, formulas.predict(law, params, nn, cc / (FLOPS_PER_PARAM_TOKEN * nn))
