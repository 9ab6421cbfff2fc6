"""The papers' scaling laws as pure, vectorised numpy functions.

Upstream (CPT paper, Zheng et al. 2024):
- `chinchilla`: L = E + A/N^α + B/D^β (its eq. 1, Hoffmann et al. 2022);
- `cpt`: L = E + A/N^α + B'/(D^β'·N^γ) (its eq. 4), D counting only continual-pre-training tokens;
- `loss_compute`: L = E' + A'/C^γ (its eq. 3) and `power`: L = k·C^(−g) (the form of its §4.2 fits).

Downstream (MT paper, Isik et al. 2024):
- `log_law`: f(Dp) = (log(A·Dp^α))^β (its eq. 1), parameterised by log A because A spans hundreds
  of orders of magnitude; the value is NaN where log(A·Dp^α) ≤ 0 (the law is undefined there);
- `power_law`: L(Dp) = E + A/Dp^α (its eq. 3).

`LAWS` holds one `Law` record per law (parameters, formula, fit specification), so that results
and readers dispatch by name without string `if` chains and a new law is one entry.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fitting.laws.lse import LawSpec, neglog_features


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
    """MT-paper score law f(Dp) = (log(A·Dp^α))^β = (log A + α·log Dp)^β [q:mt.eq1_log_law];
    NaN where undefined. `log` is the natural logarithm, ours: the paper never states the base
    (its Tables 3 and 5 give BLEU 1.59-40.9 over the mt_paper grid under it)."""
    q = log_A + alpha * np.log(_arr(Dp))
    with np.errstate(invalid="ignore"):
        return np.where(q > 0, np.abs(q) ** beta, np.nan)


def power_law(Dp, *, E: float, A: float, alpha: float) -> np.ndarray:
    """MT-paper downstream cross-entropy law L(Dp) = E + A/Dp^α."""
    return E + A * _arr(Dp) ** -alpha


def _exp(v: float) -> float:
    """exp(v), inf past float range (a runaway fit is reported as such, never an OverflowError)."""
    try:
        return float(math.exp(v))
    except OverflowError:
        return math.inf


# Public parameters fitted as their logarithm (E = exp(e), A = exp(a), ...), by the name of their
# fitted variable; every other parameter is fitted as itself.
LOG_VARIABLES: Mapping[str, str] = {"E": "e", "A": "a", "B": "b", "k": "log_k"}


def to_internal(params: Mapping[str, float]) -> dict[str, float]:
    """Fitted variables from public parameters (log of those in `LOG_VARIABLES`)."""
    return {
        LOG_VARIABLES.get(p, p): math.log(v) if p in LOG_VARIABLES else float(v)
        for p, v in params.items()
    }


def _to_params(params: tuple[str, ...]) -> Callable[[Mapping[str, float]], dict[str, float]]:
    """A `LawSpec.to_params`: fitted variables → the public `params`, in that order."""

    def to_params(v: Mapping[str, float]) -> dict[str, float]:
        return {p: _exp(v[LOG_VARIABLES[p]]) if p in LOG_VARIABLES else float(v[p]) for p in params}

    return to_params


HOFFMANN_GRID = {
    "alpha": np.arange(0.0, 2.0 + 1e-9, 0.5),
    "beta": np.arange(0.0, 2.0 + 1e-9, 0.5),
    "e": np.arange(-1.0, 1.0 + 1e-9, 0.5),
    "a": np.arange(0.0, 25.0 + 1e-9, 5.0),
    "b": np.arange(0.0, 25.0 + 1e-9, 5.0),
}


@dataclasses.dataclass(frozen=True)
class Law:
    """Everything about one law below the pipeline: its name, parameters, formula and fit.

    Attributes:
      name: the key in `LAWS`, in `FitResult.law` and in fits.json.
      params: the law's parameters in the order fits report them.
      predict: the pure, vectorised formula (inputs positional, parameters by keyword).
      spec: how `fitting.laws.robust_fit.fit_law` fits it as an LSE-affine law (None: fitted otherwise, e.g.
        the log-law by `fitting.laws.downstream_laws.fit_bleu_law`).
      inputs: the names of its inputs, in `predict`'s order.
      min_distinct: the fewest distinct values of each input that identify the parameters. The
        Chinchilla law needs 3 model sizes: each size's curve along D pins only its offset
        E + A/N^α, and two offsets leave E, A, α a one-parameter family of exact fits (the same
        along D). The CPT law's second stage (E, A, α fixed) needs 2 sizes for γ and 2 values
        of D for β'. A one-input law with k parameters needs k distinct inputs.
    """

    name: str
    params: tuple[str, ...]
    predict: Callable[..., np.ndarray]
    spec: LawSpec | None = None
    inputs: tuple[str, ...] = ()
    min_distinct: tuple[int, ...] = ()


def _law(
    *,
    name: str,
    params: tuple[str, ...],
    predict: Callable[..., np.ndarray],
    inputs: tuple[str, ...],
    min_distinct: tuple[int, ...],
    **spec: Any,
) -> Law:
    """A `Law`; given the `LawSpec` fields that say how it is fitted (names, terms, features,
    grid, ...), fitted as an LSE-affine law whose variables map onto `params`."""
    fit = LawSpec(law=name, to_params=_to_params(params), **spec) if spec else None
    return Law(name, params, predict, fit, inputs, min_distinct)


def _offset_power_law(
    *,
    name: str,
    predict: Callable[..., np.ndarray],
    exponent: str,
    inputs: tuple[str],
    a_grid: np.ndarray,
    exponent_grid: np.ndarray,
) -> Law:
    """A one-input law E + A/x^exponent (parameters E, A, `exponent`; 3 distinct inputs),
    fitted as log(exp(a − exponent·log x) + exp(e)) over columns one(a), −log x, one(e); the
    start grid takes `a_grid` and `exponent_grid` with e in [-1, 1] by 0.5."""
    return _law(
        name=name,
        params=("E", "A", exponent),
        predict=predict,
        inputs=inputs,
        min_distinct=(3,),
        names=("a", exponent, "e"),
        terms=(((0, 0), (1, 1)), ((2, 2),)),
        features=lambda x: neglog_features(x, layout=(-1, 0, -1)),
        grid={"a": a_grid, exponent: exponent_grid, "e": np.arange(-1.0, 1.0 + 1e-9, 0.5)},
    )


def _register(*entries: Law) -> Mapping[str, Law]:
    return {law.name: law for law in entries}


# One entry per law. The pipeline step that fits it, its report section and its plot are in
# `fitting.reports.fit_all.STEPS`, which names these laws.
LAWS: Mapping[str, Law] = _register(
    _law(
        name="chinchilla",
        params=("E", "A", "B", "alpha", "beta"),
        predict=chinchilla,
        inputs=("N", "D"),
        min_distinct=(3, 3),
        names=("a", "b", "e", "alpha", "beta"),
        # columns: 0 one(a), 1 −log N, 2 one(b), 3 −log D, 4 one(e)
        terms=(((0, 0), (3, 1)), ((1, 2), (4, 3)), ((2, 4),)),
        features=lambda N, D: neglog_features(N, D, layout=(-1, 0, -1, 1, -1)),
        grid=HOFFMANN_GRID,
    ),
    _law(
        name="cpt",
        params=("E", "A", "alpha", "B", "beta", "gamma"),
        predict=cpt,
        inputs=("N", "D"),
        min_distinct=(2, 2),
        # The paper's second stage: E, A, alpha come from the from-scratch fit.
        names=("a", "b", "e", "alpha", "beta", "gamma"),
        # columns: 0 one(a), 1 −log N, 2 one(b'), 3 −log D, 4 −log N (γ), 5 one(e)
        terms=(((0, 0), (3, 1)), ((1, 2), (4, 3), (5, 4)), ((2, 5),)),
        features=lambda N, D: neglog_features(N, D, layout=(-1, 0, -1, 1, 0, -1)),
        grid={
            "b": np.arange(0.0, 25.0 + 1e-9, 5.0),
            "beta": np.arange(0.0, 2.0 + 1e-9, 0.25),
            "gamma": np.arange(-1.0, 1.0 + 1e-9, 0.5),
        },
        free=(False, True, False, False, True, True),
        fixed_params=("E", "A", "alpha"),
    ),
    _offset_power_law(
        name="loss_compute",
        predict=loss_compute,
        exponent="gamma",
        inputs=("C",),
        a_grid=np.arange(0.0, 25.0 + 1e-9, 2.5),
        exponent_grid=np.array([0.01, 0.03, 0.1, 0.3, 1.0]),
    ),
    _law(
        name="power",
        params=("k", "g"),
        predict=power,
        inputs=("C",),
        min_distinct=(2,),
        names=("log_k", "g"),
        terms=(((0, 0), (1, 1)),),
        features=lambda C: neglog_features(C, layout=(-1, 0)),
        grid={
            "log_k": np.arange(0.0, 10.0 + 1e-9, 2.0),
            "g": np.array([0.0, 0.03, 0.1, 0.3, 1.0]),
        },
    ),
    _law(
        name="log_law",
        params=("log_A", "alpha", "beta"),
        predict=log_law,
        inputs=("Dp",),
        min_distinct=(3,),
    ),
    _offset_power_law(
        name="power_law",
        predict=power_law,
        exponent="alpha",
        inputs=("Dp",),
        a_grid=np.arange(0.0, 25.0 + 1e-9, 5.0),
        exponent_grid=np.arange(0.0, 2.0 + 1e-9, 0.5),
    ),
)


def fit_spec(law: str) -> LawSpec:
    """The LSE-affine fit specification of a law (raises for a law fitted otherwise)."""
    s = LAWS[law].spec
    if s is None:
        raise ValueError(f"{law}: not an LSE-affine law (no fit spec)")
    return s


def predict(law: str, params: Mapping[str, float], *inputs) -> np.ndarray:
    """Evaluates a law by name with a parameter mapping (extra keys are ignored)."""
    if law not in LAWS:
        raise ValueError(f"unknown law {law!r}; known: {', '.join(sorted(LAWS))}")
    entry = LAWS[law]
    return entry.predict(*inputs, **{k: float(params[k]) for k in entry.params})
