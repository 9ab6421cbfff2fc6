"""What a set of points tells about a study's parameters: Fisher information and the intervals
it predicts.

With log metric = log law(x; θ) + N(0, σ²) per point, the information of points x₁…x_P about the
internal parameters θ (`StudyModel.to_internal`) is F = Σ J(xᵢ)ᵀJ(xᵢ)/σ², J the gradient of the
log law (central differences). F⁻¹ is the asymptotic covariance of the fit, so a design is judged
before any run: log det F (D-optimality: the volume of the joint confidence region) and, by the
delta method, the 95% interval of any derived quantity — a parameter, the compute-optimal
allocation at a target compute, the loss of the largest run. A weak prior (`PRIOR_SD` per
internal parameter) keeps F invertible for designs that cannot identify every parameter, so
those come out with wide intervals rather than an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from fitting.design.study import Candidate, Point, StudyModel, points_by_block

Z95 = 1.959963984540054
PRIOR_SD = 10.0  # per internal parameter (log-scales and exponents): weak, only for invertibility
_STEP = 1e-5


def jacobian(model: StudyModel, block: str, inputs: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """[P, n]: ∂ log law / ∂θ at each point of `block` (central differences in θ), divided by
    the block's σ."""
    n = theta.size
    rows = np.zeros((len(inputs), n))
    used = set(model.block(block).params.values())
    for j, name in enumerate(model.names):
        if name not in used:
            continue
        up, down = theta.copy(), theta.copy()
        up[j] += _STEP
        down[j] -= _STEP
        with np.errstate(all="ignore"):
            hi = np.log(model.predict(block, model.to_params(up), inputs))
            lo = np.log(model.predict(block, model.to_params(down), inputs))
        rows[:, j] = (hi - lo) / (2 * _STEP)
    rows = np.where(np.isfinite(rows), rows, 0.0)  # an undefined point (log law ≤ 0) says nothing
    return rows / model.block(block).sigma


def fisher(
    model: StudyModel, points: Iterable[Point], params: Mapping[str, float] | None = None
) -> np.ndarray:
    """[n, n] information of `points` about the internal parameters, at `params` (the prior)."""
    theta = model.to_internal(params or model.prior)
    total = np.zeros((theta.size, theta.size))
    for block, inputs in points_by_block(points).items():
        J = jacobian(model, block, inputs, theta)
        total += J.T @ J
    return total


def candidate_information(
    model: StudyModel, candidates: Sequence[Candidate], params: Mapping[str, float] | None = None
) -> dict[str, np.ndarray]:
    """Each candidate's own information (points of different runs add)."""
    return {c.key: fisher(model, c.points, params) for c in candidates}


def regularised(F: np.ndarray) -> np.ndarray:
    """F plus the weak prior (see the module docstring)."""
    return F + np.eye(F.shape[0]) / PRIOR_SD**2


def log_det(F: np.ndarray) -> float:
    """log det of the regularised information: the D-optimal criterion (larger is better)."""
    sign, value = np.linalg.slogdet(regularised(F))
    return float(value) if sign > 0 else -np.inf


def info_gain(F_now: np.ndarray, F_more: np.ndarray) -> float:
    """Nats the extra information adds to the joint confidence region (log det increase)."""
    return log_det(F_now + F_more) - log_det(F_now)


@dataclasses.dataclass(frozen=True)
class Target:
    """A quantity the study reports, as a function of the study parameters.

    Attributes:
      name: how reports name it ("scratch.alpha", "N_opt(1e21)", "loss(largest)").
      value: study parameters → the quantity.
      relative: report the width relative to the value (positive quantities).
    """

    name: str
    value: Callable[[Mapping[str, float]], float]
    relative: bool = True


def parameter_targets(model: StudyModel) -> list[Target]:
    """One target per study parameter (scales relative, exponents and log A absolute)."""
    return [
        Target(name, (lambda p, name=name: p[name]), relative=log)
        for name, log in zip(model.names, model.log_scaled, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class Gradients:
    """The targets' gradients in the internal parameters at one point (they do not depend on the
    design, so a search computes them once)."""

    names: tuple[str, ...]
    grads: np.ndarray  # [T, n]
    scales: np.ndarray  # [T]: |value| for relative targets, else 1


def target_gradients(
    model: StudyModel, targets: Sequence[Target], params: Mapping[str, float] | None = None
) -> Gradients:
    """Central-difference gradients of the targets at `params` (default: the prior)."""
    params = dict(params or model.prior)
    theta = model.to_internal(params)
    grads = np.zeros((len(targets), theta.size))
    scales = np.ones(len(targets))
    for i, t in enumerate(targets):
        centre = t.value(params)
        if t.relative and centre:
            scales[i] = abs(centre)
        for j in range(theta.size):
            up, down = theta.copy(), theta.copy()
            up[j] += _STEP
            down[j] -= _STEP
            diff = t.value(model.to_params(up)) - t.value(model.to_params(down))
            grads[i, j] = diff / (2 * _STEP)
    return Gradients(tuple(t.name for t in targets), grads, scales)


def widths_from(F: np.ndarray, gradients: Gradients) -> dict[str, float]:
    """Predicted 95% half-widths of the targets under information F (delta method)."""
    cov = np.linalg.inv(regularised(F))
    var = np.einsum("tn,nm,tm->t", gradients.grads, cov, gradients.grads)
    widths = Z95 * np.sqrt(np.maximum(var, 0.0)) / gradients.scales
    return dict(zip(gradients.names, widths.tolist(), strict=True))


def half_widths(
    model: StudyModel,
    F: np.ndarray,
    targets: Sequence[Target],
    params: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Predicted 95% half-widths of the targets under information F (delta method); relative
    targets as a fraction of their value."""
    return widths_from(F, target_gradients(model, targets, params))
