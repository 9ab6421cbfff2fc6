"""The papers' scaling laws as pure, vectorised numpy functions.

Upstream (CPT paper, Zheng et al. 2024):
- `chinchilla`: L = E + A/N^α + B/D^β (its eq. 1, Hoffmann et al. 2022);
- `cpt`: L = E + A/N^α + B'/(D^β'·N^γ) (its eq. 4), D counting only continual-pre-training tokens;
- `loss_compute`: L = E' + A'/C^γ (its eq. 3) and `power`: L = k·C^(−g) (the form of its §4.2 fits).

Downstream (MT paper, Isik et al. 2024):
- `log_law`: f(Dp) = (log(A·Dp^α))^β (its eq. 1), parameterised by log A because A spans hundreds
  of orders of magnitude; the value is NaN where log(A·Dp^α) ≤ 0 (the law is undefined there);
- `power_law`: L(Dp) = E + A/Dp^α (its eq. 3).

`PARAMS` names each law's parameters in the order fits report them, and `PREDICT` maps a law name
to its function, so that results and readers can dispatch without string `if` chains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def chinchilla(N, D, *, E: float, A: float, B: float, alpha: float, beta: float) -> np.ndarray:
    """Chinchilla loss L(N, D) = E + A/N^α + B/D^β (N parameters, D training tokens)."""
    N, D = _arr(N), _arr(D)
    return E + A * N**-alpha + B * D**-beta


def cpt(
    N, D, *, E: float, A: float, alpha: float, B: float, beta: float, gamma: float
) -> np.ndarray:
    """Extended CPT loss L(N, D) = E + A/N^α + B'/(D^β'·N^γ) (B, beta, gamma are B', β', γ).

    The joint D–N term lets a larger model turn the same continual-pre-training tokens into more
    effective data, the cross-lingual transfer that the plain Chinchilla law cannot express.
    """
    N, D = _arr(N), _arr(D)
    return E + A * N**-alpha + B * D**-beta * N**-gamma


def loss_compute(C, *, E: float, A: float, gamma: float) -> np.ndarray:
    """Compute-frontier loss L(C) = E' + A'/C^γ (CPT paper eq. 3; E, A stand for E', A')."""
    return E + A * _arr(C) ** -gamma


def power(C, *, k: float, g: float) -> np.ndarray:
    """Pure power law L(C) = k·C^(−g), the form of the CPT paper's §4.2 frontier fits."""
    return k * _arr(C) ** -g


def log_law(Dp, *, log_A: float, alpha: float, beta: float) -> np.ndarray:
    """MT-paper score law f(Dp) = (log(A·Dp^α))^β = (log A + α·log Dp)^β; NaN where undefined."""
    q = log_A + alpha * np.log(_arr(Dp))
    with np.errstate(invalid="ignore"):
        return np.where(q > 0, np.abs(q) ** beta, np.nan)


def power_law(Dp, *, E: float, A: float, alpha: float) -> np.ndarray:
    """MT-paper downstream cross-entropy law L(Dp) = E + A/Dp^α."""
    return E + A * _arr(Dp) ** -alpha


PARAMS: Mapping[str, tuple[str, ...]] = {
    "chinchilla": ("E", "A", "B", "alpha", "beta"),
    "cpt": ("E", "A", "alpha", "B", "beta", "gamma"),
    "loss_compute": ("E", "A", "gamma"),
    "power": ("k", "g"),
    "log_law": ("log_A", "alpha", "beta"),
    "power_law": ("E", "A", "alpha"),
}

PREDICT: Mapping[str, Callable[..., np.ndarray]] = {
    "chinchilla": chinchilla,
    "cpt": cpt,
    "loss_compute": loss_compute,
    "power": power,
    "log_law": log_law,
    "power_law": power_law,
}


def predict(law: str, params: Mapping[str, float], *inputs) -> np.ndarray:
    """Evaluates a law by name with a parameter mapping (extra keys are ignored)."""
    if law not in PREDICT:
        raise ValueError(f"unknown law {law!r}; known: {', '.join(sorted(PREDICT))}")
    return PREDICT[law](*inputs, **{k: float(params[k]) for k in PARAMS[law]})
