"""Batched multi-start robust fitting: damped Newton over many starts at once, then a float64 polish.

Hoffmann et al. fit their law by L-BFGS from a grid of thousands of starts, because most starts end
in poor basins. A Python loop of scipy calls spends its time in per-call overhead, and a `vmap` of
per-start while-loops makes every lane wait for the slowest. Here starts advance together in
blocks of lanes, a *fixed* number of Levenberg–Marquardt iterations per round: the gradient and
exact Hessian are analytic, the small (≤ 6×6) damped systems are solved by an unrolled Cholesky,
and several damping levels are tried at once instead of a sequential line search, so no lane
waits within a round. Between rounds, lanes that stopped improving retire and the rest are
regrouped into full blocks (`lm_rounds`), up to a cap on iterations. Large batches run in a
jitted block (float32 is enough to find the basins); small ones in numpy, which needs no
compilation. The best few distinct end points are then polished in float64 to a tiny gradient,
and `converged` is read off that gradient.

Objectives are written once against an array namespace `xp` (`numpy` or `jax.numpy`), so the
compiled screen and the float64 polish evaluate the same function. A problem object supplies
`value(xp, theta, weights)` (theta [..., n] → f [...]) and `derivs(xp, theta, weights)`
(theta [S, n] → f, g [S, n], H [S, n, n]); `fitting.laws.lse.LseProblem` is the one used by every
upstream law, `fitting.laws.downstream_laws` defines the MT paper's log-law.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

# Damping levels tried together each iteration, relative to the lane's current level; after a
# success the level moves to the winner's times _DOWN, after a failure to the largest one's.
_DAMPING = (1e-2, 1e-1, 1.0, 1e2)
_DOWN = 0.3
_LAM0 = 1e-3
_LAM_RANGE = (1e-12, 1e12)


class Problem(Protocol):
    """What the optimiser needs from a fit."""

    weights: np.ndarray  # [P]
    delta: float

    @property
    def n_params(self) -> int:
        """Number of fitted parameters."""
        ...

    def value(self, xp: Any, theta: Any, weights: Any) -> Any:
        """Objective for theta [..., n] with point weights broadcastable to [..., P]."""
        ...

    def derivs(self, xp: Any, theta: Any, weights: Any) -> tuple[Any, Any, Any]:
        """Objective [S], gradient [S, n] and Hessian [S, n, n] for theta [S, n]."""
        ...


@dataclasses.dataclass(frozen=True)
class MultiStartResult:
    """Outcome of a multi-start fit, in the problem's own parameterisation.

    Attributes:
      theta: polished best parameters.
      objective: summed Huber objective at `theta` (float64).
      grad: gradient at `theta`.
      converged: the polish reached ‖∇f‖∞ ≤ grad_rtol·δ·Σw.
      n_starts: number of starts, non-finite ones included.
      n_finite: starts whose initial objective was finite (the others are masked, never chosen).
      n_at_best: starts that reached the best basin (see `basin_rtol` of `multistart`).
      finals: [S, n] end points of all starts (NaN where masked).
      final_objectives: [S] float64 objectives at `finals` (inf where masked).
    """

    theta: np.ndarray
    objective: float
    grad: np.ndarray
    converged: bool
    n_starts: int
    n_finite: int
    n_at_best: int
    finals: np.ndarray
    final_objectives: np.ndarray


def huber(r: Any, delta: Any, xp: Any = np) -> Any:
    """Elementwise Huber loss: ½r² within ±δ, δ(|r| − ½δ) outside (Huber 1964; δ as in the papers)."""
    ar = xp.abs(r)
    return xp.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


def cholesky_solve(xp: Any, a: Any, b: Any) -> Any:
    """Solves a·x = b for a batch of small SPD matrices [..., n, n] by an unrolled Cholesky.

    A matrix that is not positive definite yields NaN, which the caller treats as a rejected step.
    Unrolled, this is an order of magnitude cheaper than a batched LAPACK call for n ≤ 6.
    """
    n = a.shape[-1]
    low: list[list[Any]] = [[None] * n for _ in range(n)]
    for j in range(n):
        s = a[..., j, j]
        for k in range(j):
            s = s - low[j][k] * low[j][k]
        d = xp.sqrt(s)
        low[j][j] = d
        for i in range(j + 1, n):
            t = a[..., i, j]
            for k in range(j):
                t = t - low[i][k] * low[j][k]
            low[i][j] = t / d
    z: list[Any] = [None] * n
    for i in range(n):
        t = b[..., i]
        for k in range(i):
            t = t - low[i][k] * z[k]
        z[i] = t / low[i][i]
    x: list[Any] = [None] * n
    for i in reversed(range(n)):
        t = z[i]
        for k in range(i + 1, n):
            t = t - low[k][i] * x[k]
        x[i] = t / low[i][i]
    return xp.stack(x, axis=-1)


def lm_step(
    xp: Any,
    problem: Problem,
    theta: Any,
    f: Any,
    lam: Any,
    weights: Any,
    *,
    with_grad: bool = False,
) -> tuple[Any, ...]:
    """One batched Levenberg–Marquardt iteration for every lane.

    Each lane solves (H + μ_c·s·I)·d = −g for all damping levels μ_c at once (s: the lane's mean
    |diag H| plus its largest |g|, so μ is scale free), keeps the candidate with the lowest objective if it improves,
    and adapts its level. A level that leaves H + μI indefinite gives NaN and is simply not chosen.

    Args:
      xp: array namespace.
      problem: supplies `value` and `derivs`.
      theta: [S, n]; f: [S] current objectives; lam: [S] damping levels.
      weights: [P] or [S, P] point weights.
      with_grad: also return ‖g‖∞ at the *incoming* theta (a convergence test for free).

    Returns:
      (theta, f, lam) after the iteration, plus the gradient norm when asked.
    """
    dtype = theta.dtype
    facs = xp.asarray(_DAMPING, dtype=dtype)
    _, g, h = problem.derivs(xp, theta, weights)
    n = theta.shape[-1]
    diag = xp.stack([h[:, i, i] for i in range(n)], axis=-1)
    # Where the Huber loss is linear at every point the Hessian vanishes; the gradient then sets
    # the scale, so that λ ~ 1 means a unit step in the (standardised) parameters.
    scale = xp.mean(xp.abs(diag), axis=-1) + xp.max(xp.abs(g), axis=-1) + 1e-30
    mu = lam[:, None] * facs[None, :] * scale[:, None]  # [S, C]
    shifted = h[:, None, :, :] + mu[..., None, None] * xp.eye(n, dtype=dtype)
    rhs = xp.broadcast_to(-g[:, None, :], mu.shape + (n,))
    cand = theta[:, None, :] + cholesky_solve(xp, shifted, rhs)  # [S, C, n]
    w = weights[:, None, :] if weights.ndim == 2 else weights
    fc = problem.value(xp, cand, w)
    fc = xp.where(xp.isfinite(fc), fc, xp.inf)
    best = xp.argmin(fc, axis=1)
    fbest = xp.min(fc, axis=1)
    ok = fbest < f
    chosen = xp.take_along_axis(cand, best[:, None, None], axis=1)[:, 0]
    theta = xp.where(ok[:, None], chosen, theta)
    f = xp.where(ok, fbest, f)
    lam = xp.clip(xp.where(ok, lam * facs[best] * _DOWN, lam * facs[-1]), *_LAM_RANGE)
    if with_grad:
        return theta, f, lam, xp.max(xp.abs(g), axis=-1)
    return theta, f, lam


def lm_numpy(
    problem: Problem,
    starts: np.ndarray,
    *,
    iters: int,
    lane_weights: np.ndarray | None = None,
    gtol: float = 0.0,
) -> np.ndarray:
    """Runs the batched LM in float64 numpy for a fixed number of iterations (the polish).

    Stops early once every lane's gradient is at most `gtol` (infinity norm), when gtol > 0.
    """
    theta = np.array(starts, np.float64)
    weights = problem.weights if lane_weights is None else lane_weights
    with np.errstate(all="ignore"):
        f = problem.value(np, theta, weights)
        f = np.where(np.isfinite(f), f, np.inf)
        lam = np.full(theta.shape[0], _LAM0)
        for _ in range(iters):
            before = theta
            theta, f, lam, gnorm = lm_step(np, problem, theta, f, lam, weights, with_grad=True)
            if gtol > 0 and np.all(gnorm <= gtol):
                return before  # every lane was already converged where this step began
    return theta


def _numpy_runner(problem: Problem, lane_weights: np.ndarray | None):
    """A block runner for `lm_rounds` in float64 numpy."""

    def runner(theta, f, lam, lanes, iters):
        w = problem.weights if lane_weights is None else lane_weights[lanes]
        with np.errstate(all="ignore"):
            f = np.where(np.isnan(f), problem.value(np, theta, w), f)
            f = np.where(np.isfinite(f), f, np.inf)
            for _ in range(iters):
                theta, f, lam = lm_step(np, problem, theta, f, lam, w)
        return theta, f, lam

    return runner


def lm_rounds(
    problem: Problem,
    starts: np.ndarray,
    *,
    max_iters: int,
    lane_weights: np.ndarray | None = None,
    runner: Any = None,
    block: int | None = None,
    round_iters: int = 4,
    rtol: float = 1e-6,
) -> np.ndarray:
    """Batched LM in rounds; a lane retires once a round no longer lowers its objective.

    Within a round every lane of a block runs the same `round_iters` iterations (no lane waits
    for another); between rounds, lanes that stalled (relative decrease ≤ rtol: converged, or
    stuck) leave and the rest are regrouped into full blocks. Per-start stopping thus costs no
    wasted work on finished lanes, and the compiled block keeps one shape.

    Args:
      problem: the fit.
      starts: [S, n].
      max_iters: the most iterations any lane runs.
      lane_weights: optional [S, P] per-lane point weights.
      runner: (theta, f, lam, lane indices, iters) → (theta, f, lam) for one block; f = NaN
        asks for the objective. Default: float64 numpy.
      block: lanes per runner call (None: all active lanes at once).
      round_iters: iterations per round.
      rtol: relative objective decrease below which a lane retires.

    Returns:
      [S, n] float64 end points.
    """
    theta = np.array(starts, np.float64)
    s = theta.shape[0]
    f = np.full(s, np.nan)
    lam = np.full(s, _LAM0)
    runner = runner or _numpy_runner(problem, lane_weights)
    active = np.arange(s)
    done = 0
    while active.size and done < max_iters:
        it = min(round_iters, max_iters - done)
        f_before = f[active].copy()
        size = block or active.size
        for start in range(0, active.size, size):
            lanes = active[start : start + size]
            idx = np.concatenate([lanes, np.repeat(lanes[:1], size - lanes.size)])
            t, fv, lv = runner(theta[idx], f[idx], lam[idx], idx, it)
            theta[lanes], f[lanes], lam[lanes] = t[: lanes.size], fv[: lanes.size], lv[: lanes.size]
        done += it
        with np.errstate(invalid="ignore"):
            gain = f_before - f[active]
            moving = np.isnan(f_before) | (gain > rtol * np.abs(f[active]) + 1e-300)
        active = active[moving & np.isfinite(f[active])]
    return theta


def multistart(
    problem: Problem,
    starts: np.ndarray,
    *,
    iters: int,
    screen: Any = None,
    n_polish: int = 4,
    basin_rtol: float = 1e-6,
    grad_rtol: float = 1e-7,
    extra_polish: int = 1000,
) -> MultiStartResult:
    """Fits from every start at once, then polishes the best few distinct end points in float64.

    Args:
      problem: the fit.
      starts: [S, n] initial parameters (e.g. a `product_grid`).
      iters: the most LM iterations of the batched screen any lane runs (each stops once it
        stalls).
      screen: callable (problem, finite starts, iters) → end points; default `lm_rounds` in
        numpy. `fitting.laws.lse.screen` runs large LSE problems in a compiled float32 block.
      n_polish: how many of the best distinct end points get the float64 polish.
      basin_rtol: a start "reached the best basin" when its end objective is within this relative
        tolerance of the polished best, plus a floor of 1e-6·½δ²Σw (noise-free data have a
        best objective of ~0, which float32 end points cannot match relatively), or no higher
        than the end point of a polished pick that reached the best.
      grad_rtol: `converged` requires ‖∇f‖∞ ≤ grad_rtol · δ·Σw after the polish (δ·Σw bounds the
        gradient a unit feature can produce, so the test is scale free).
      extra_polish: further float64 LM iterations for the best pick when the gradient test fails
        after the first polish (0: none).
    """
    starts = np.asarray(starts, np.float64)
    with np.errstate(all="ignore"):
        f_start = _values(problem, starts)
    finite = np.isfinite(f_start) & np.all(np.isfinite(starts), axis=1)
    finals = np.full_like(starts, np.nan)
    f_final = np.full(starts.shape[0], np.inf)
    if np.any(finite):
        run = screen or (lambda p, s, i: lm_rounds(p, s, max_iters=i))
        finals[finite] = run(problem, starts[finite], iters)
        with np.errstate(all="ignore"):
            f_final[finite] = _values(problem, finals[finite])
    f_final = np.where(np.isfinite(f_final), f_final, np.inf)
    scale = problem.delta * float(np.sum(problem.weights))
    gtol = grad_rtol * scale
    if not np.any(np.isfinite(f_final)):
        nan = np.full(problem.n_params, np.nan)
        return MultiStartResult(
            nan, math.inf, nan, False, len(starts), int(finite.sum()), 0, finals, f_final
        )
    picks = distinct_best(finals, f_final, n_polish)
    polished = lm_numpy(problem, finals[picks], iters=100, gtol=gtol * 1e-3)
    with np.errstate(all="ignore"):
        f_pol, g_pol, _ = problem.derivs(np, polished, problem.weights)
    f_pol = np.where(np.isfinite(f_pol), f_pol, np.inf)
    i = int(np.argmin(f_pol))
    best_f, best_g = float(f_pol[i]), g_pol[i]
    converged = bool(np.isfinite(best_f) and np.max(np.abs(best_g)) <= gtol)
    if not converged and np.isfinite(best_f) and extra_polish > 0:
        # Slow valleys (an optimum at a boundary such as E -> 0 in E + A/x^alpha, where the
        # gradient in log E shrinks with E) need more than the first polish; only the best pick
        # pays for it, and only when the gradient test failed.
        more = lm_numpy(problem, polished[i : i + 1], iters=extra_polish, gtol=gtol * 1e-3)
        with np.errstate(all="ignore"):
            f_more, g_more, _ = problem.derivs(np, more, problem.weights)
        if np.isfinite(f_more[0]) and f_more[0] <= best_f:
            polished[i], f_pol[i] = more[0], f_more[0]
            best_f, best_g = float(f_more[0]), g_more[0]
            converged = bool(np.max(np.abs(best_g)) <= gtol)
    # Floor: 1e-6 of the objective with every residual at δ (noise-free data have a best ~0).
    floor = 1e-6 * 0.5 * problem.delta**2 * float(np.sum(problem.weights))
    tol = basin_rtol * abs(best_f) + floor
    # The screen stops short of the optimum in flat valleys, so its end points can sit well above
    # the polished best although they lie in its basin. Polished picks that reached the best show
    # how far above it a basin member may end; every start that ended no higher counts too.
    reached = np.asarray(picks)[f_pol <= best_f + tol]
    threshold = max(best_f + tol, float(np.max(f_final[reached])) + tol)
    n_at_best = int(np.sum(f_final <= threshold))
    return MultiStartResult(
        polished[i],
        best_f,
        best_g,
        converged,
        len(starts),
        int(finite.sum()),
        n_at_best,
        finals,
        f_final,
    )


def _values(problem: Problem, theta: np.ndarray, step: int = 512) -> np.ndarray:
    """Float64 objectives of many parameter vectors, in chunks that stay in cache."""
    out = np.empty(theta.shape[0])
    for i in range(0, theta.shape[0], step):
        out[i : i + step] = problem.value(np, theta[i : i + step], problem.weights)
    return out


def distinct_best(finals: np.ndarray, f: np.ndarray, k: int, tol: float = 1e-6) -> list[int]:
    """Indices of up to k lowest-objective end points that differ from each other by > tol."""
    chosen: list[int] = []
    for i in np.argsort(f):
        if not np.isfinite(f[i]):
            break
        if all(np.max(np.abs(finals[i] - finals[j])) > tol for j in chosen):
            chosen.append(int(i))
        if len(chosen) >= k:
            break
    return chosen


def product_grid(axes: Sequence[Sequence[float]]) -> np.ndarray:
    """Cartesian product of per-parameter start values, as [S, n] (first axis varies slowest)."""
    mesh = np.meshgrid(*[np.asarray(a, np.float64) for a in axes], indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)
