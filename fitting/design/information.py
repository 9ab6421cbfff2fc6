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

The evaluations of one run also share its offset N(0, τ²) (`Block.run_sigma`: its seed moves the
whole curve), so their covariance is σ²(I + ρ11ᵀ), ρ = τ²/σ². The project's fits weight every
evaluation alike (least squares and Huber, not generalised least squares), so what they estimate
varies as the sandwich A⁻¹ + A⁻¹BA⁻¹, A = ΣJᵀJ/σ² as above and B = ρ·Σ_runs (Jᵀ1)(1ᵀJ)/σ²: a
run's tenth checkpoint adds its shape but not a tenth offset, and the parameters that only the
spread of sizes pins (E, A, α) come out as uncertain as the few runs behind them make them.
`benchmarks/run_noise.py` measures it: with τ = 3σ, fitted parameters spread a median 3.1
times the independent prediction, and 1.13 times the sandwich's. Both A and B add over runs, so
with a τ in the model an information is the pair stacked, [2, n, n], and sums of runs stay sums;
with no τ it is A alone, [n, n], as before. The "information" of the pair, for log det and gains, is
the inverse of the sandwich: A(A + B)⁻¹A.
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
    """Information of `points` about the internal parameters, at `params` (the prior): [n, n],
    or with a block's τ in the model the pair [A, B] stacked, [2, n, n], points of one run
    (`Point.run`; "": a run of its own) sharing its offset (see the module docstring)."""
    theta = model.to_internal(params or model.prior)
    A, B = np.zeros((theta.size, theta.size)), np.zeros((theta.size, theta.size))
    points = list(points)
    for block, inputs in points_by_block(points).items():
        J = jacobian(model, block, inputs, theta)
        A += J.T @ J
        ratio = (model.block(block).run_sigma / model.block(block).sigma) ** 2
        if ratio > 0:
            runs = np.asarray([p.run or f"#{i}" for i, p in enumerate(points) if p.block == block])
            for run in set(runs.tolist()):
                s = J[runs == run].sum(axis=0)  # Jᵀ1 of the run's points (σ already divided)
                B += ratio * np.outer(s, s)
    return np.stack([A, B]) if any(b.run_sigma > 0 for b in model.blocks) else A


def _pair(F: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(A, B) of an information: B None for one without run offsets ([n, n])."""
    F = np.asarray(F)
    return (F, None) if F.ndim == 2 else (F[0], F[1])


def run_points(points: Iterable[Point], run: str) -> tuple[Point, ...]:
    """`points` as the evaluations of one run `run` (for points made without a run)."""
    return tuple(dataclasses.replace(p, run=run) for p in points)


def candidate_information(
    model: StudyModel, candidates: Sequence[Candidate], params: Mapping[str, float] | None = None
) -> dict[str, np.ndarray]:
    """Each candidate's own information, its points one run's (different runs add)."""
    return {c.key: fisher(model, run_points(c.points, c.key), params) for c in candidates}


def regularised(F: np.ndarray) -> np.ndarray:
    """F plus the weak prior (see the module docstring)."""
    return F + np.eye(F.shape[0]) / PRIOR_SD**2


def parameter_groups(model: StudyModel) -> tuple[np.ndarray, ...]:
    """Indices of the study parameters that share a law, joined transitively: the information
    is block diagonal over these groups (no point informs two of them), so inverses and
    determinants are taken group by group (an MT study has one small group per law)."""
    names = model.names
    parent = list(range(len(names)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index = {n: i for i, n in enumerate(names)}
    for b in model.blocks:
        members = [index[p] for p in b.params.values()]
        for m in members[1:]:
            parent[root(m)] = root(members[0])
    groups: dict[int, list[int]] = {}
    for i in range(len(names)):
        groups.setdefault(root(i), []).append(i)
    return tuple(np.asarray(g) for g in groups.values())


def _by_size(groups: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Groups of equal size stacked ([G, k] index arrays), for batched linear algebra."""
    sizes: dict[int, list[np.ndarray]] = {}
    for g in groups:
        sizes.setdefault(len(g), []).append(g)
    return [np.stack(gs) for gs in sizes.values()]


def log_det(F: np.ndarray, groups: Sequence[np.ndarray] | None = None) -> float:
    """log det of the regularised information: the D-optimal criterion (larger is better); for
    a pair, of A(A + B)⁻¹A, the inverse of the sandwich (2 log det A − log det(A + B)).
    With `groups` (`parameter_groups`), F is taken as block diagonal over them."""
    A, B = _pair(F)
    R = regularised(A)
    blocks = [None] if groups is None else _by_size(groups)
    total = 0.0
    for idx in blocks:
        sub = (lambda M: M) if idx is None else (lambda M, i=idx: M[i[:, :, None], i[:, None, :]])
        sign, value = np.linalg.slogdet(sub(R))
        if np.any(sign <= 0):
            return -np.inf
        total += float(np.sum(value))
        if B is not None:
            sign, wide = np.linalg.slogdet(sub(R + B))
            if np.any(sign <= 0):
                return -np.inf
            total += float(np.sum(value) - np.sum(wide))
    return total


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
    param: str | None = None  # the study parameter itself (its gradient is known exactly)


def parameter_targets(model: StudyModel) -> list[Target]:
    """One target per study parameter (scales relative, exponents and log A absolute)."""
    return [
        Target(name, (lambda p, name=name: p[name]), relative=log, param=name)
        for name, log in zip(model.names, model.log_scaled, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class Gradients:
    """The targets' gradients in the internal parameters at one point (they do not depend on the
    design, so a search computes them once)."""

    names: tuple[str, ...]
    grads: np.ndarray  # [T, n]
    scales: np.ndarray  # [T]: |value| for relative targets, else 1
    groups: tuple[np.ndarray, ...] = ()  # `parameter_groups` (empty: one group)


def target_gradients(
    model: StudyModel, targets: Sequence[Target], params: Mapping[str, float] | None = None
) -> Gradients:
    """Central-difference gradients of the targets at `params` (default: the prior)."""
    params = dict(params or model.prior)
    theta = model.to_internal(params)
    grads = np.zeros((len(targets), theta.size))
    scales = np.ones(len(targets))
    index = {n: j for j, n in enumerate(model.names)}
    for i, t in enumerate(targets):
        centre = t.value(params)
        if t.relative and centre:
            scales[i] = abs(centre)
        if t.param in index:  # d p / d θ: p for a log-scaled parameter (θ = log p), else 1
            j = index[t.param]
            grads[i, j] = centre if model.log_scaled[j] else 1.0
            continue
        for j in range(theta.size):
            up, down = theta.copy(), theta.copy()
            up[j] += _STEP
            down[j] -= _STEP
            diff = t.value(model.to_params(up)) - t.value(model.to_params(down))
            grads[i, j] = diff / (2 * _STEP)
    return Gradients(tuple(t.name for t in targets), grads, scales, parameter_groups(model))


def _sandwich(R: np.ndarray, B: np.ndarray | None) -> np.ndarray:
    """R⁻¹, or R⁻¹(R + B)R⁻¹ with run offsets (module docstring); batched over leading axes."""
    inv = np.linalg.inv(R)
    return inv if B is None else inv @ (R + B) @ inv


def covariance(F: np.ndarray) -> np.ndarray:
    """[n, n] asymptotic covariance of the fitted internal parameters under information F
    (regularised; the sandwich for a pair)."""
    A, B = _pair(F)
    return _sandwich(regularised(A), B)


def widths_from(F: np.ndarray, gradients: Gradients) -> dict[str, float]:
    """Predicted 95% half-widths of the targets under information F (delta method); F is
    inverted group by group (`Gradients.groups`, block diagonal)."""
    A, B = _pair(F)
    R = regularised(A)
    G = gradients.grads
    if not gradients.groups:
        var = np.einsum("tn,nm,tm->t", G, _sandwich(R, B), G)
    else:
        var = np.zeros(G.shape[0])
        for idx in _by_size(gradients.groups):  # idx [B, k]
            block = (idx[:, :, None], idx[:, None, :])
            cov = _sandwich(R[block], None if B is None else B[block])  # [B, k, k]
            g = G[:, idx]  # [T, B, k]
            var += np.einsum("tbk,bkl,tbl->t", g, cov, g)
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
