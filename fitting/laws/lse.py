"""Robust objectives of laws whose log-prediction is a log-sum-exp of affine terms, and their screen.

Every upstream law of the CPT paper — Chinchilla (its eq. 6), the CPT law (eq. 7, whose second
stage holds E, A and α fixed), the loss–compute law — and the MT paper's cross-entropy law are of
the form

    log L̂_i = LSE_k( Σ_{(j, col) ∈ terms[k]} θ_j · X_i,col ),

fitted by minimising Σ_i w_i · Huber_δ(log L̂_i − log L_i). With ψ = clip(r, ±δ) and the softmax
weights w_ik of the LSE, the gradient is Σ_i ψ_i J_i and the exact Hessian is
Σ_i (ψ'_i − ψ_i) J_i J_iᵀ + ψ_i Σ_k w_ik m_ik m_ikᵀ (J_i = Σ_k w_ik m_ik, m_ik the component's
coefficient vector), so both reduce to a handful of per-point moments. Parameters held fixed
(`free` False) get a zero gradient and a unit Hessian row, so a damped step never moves them and
each lane can carry its own fixed values (the CPT bootstrap pairs each resample with a resample of
the from-scratch fit). `screen` runs the batched
Levenberg–Marquardt of `fitting.laws.optim` for thousands of starts inside one compiled JAX loop.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fitting.laws import optim

# A term is (parameter index, feature column); a component is a tuple of terms.
Terms = tuple[tuple[tuple[int, int], ...], ...]


@dataclasses.dataclass(frozen=True)
class LawSpec:
    """How one LSE-affine law is fitted (`fitting.laws.robust_fit.fit_law`); each law's is in `fitting.laws.formulas`.

    Attributes:
      law: its name in `fitting.laws.formulas.LAWS`.
      names: the fitted (log-space) variables, in internal order.
      terms: LSE components as (variable index, feature column) pairs.
      features: inputs (positive 1-D arrays) → [P, F] feature matrix.
      to_params: variable dict → public parameter dict.
      grid: default start values per variable name.
      free: which variables are fitted (None: all).
      fixed_params: public parameters that come from fixed variables.
    """

    law: str
    names: tuple[str, ...]
    terms: Terms
    features: Callable[..., np.ndarray]
    to_params: Callable[[Mapping[str, float]], dict[str, float]]
    grid: Mapping[str, Sequence[float]]
    free: tuple[bool, ...] | None = None
    fixed_params: tuple[str, ...] = ()


def neglog_features(*xs: np.ndarray, layout: Sequence[int]) -> np.ndarray:
    """Feature matrix whose column c is 1 when layout[c] < 0, else −log xs[layout[c]].

    The columns every LSE-affine law is built from: intercepts (1) and slopes (−log N, −log D...).
    """
    p = len(xs[0])
    return np.stack([np.ones(p) if i < 0 else -np.log(xs[i]) for i in layout], axis=1)


_BLOCK = 256  # lanes per compiled block: a block's (lanes × points) arrays stay in cache
_POINT_BUCKET = 16  # points are padded (with weight 0) to a multiple, so sizes share compilations
JAX_MIN_WORK = 20_000  # lanes × points above which compiling beats numpy's slower iterations


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How per-point moments map onto the gradient and the Hessian (one matrix product)."""

    kinds: tuple[tuple[str, int, int], ...]  # ("g", k, k) or ("h", k, l), k ≤ l
    columns: tuple[tuple[int, int | None], ...]  # feature column (pair) of each moment
    kind_of_column: tuple[int, ...]
    matrix: np.ndarray  # [moments, n + n*n]


@functools.lru_cache(maxsize=64)
def _plan(terms: Terms, n: int) -> _Plan:
    """Plans the assembly of g and H: few large array ops keep compilation short."""
    kinds: list[tuple[str, int, int]] = []
    columns: list[tuple[int, int | None]] = []
    owner: list[int] = []
    rows: list[tuple[int, ...]] = []
    active = [k for k, comp in enumerate(terms) if comp]
    for k in active:
        kinds.append(("g", k, k))
        for j, col in terms[k]:
            columns.append((col, None))
            owner.append(len(kinds) - 1)
            rows.append((j,))
    for i, k in enumerate(active):
        for k2 in active[i:]:
            kinds.append(("h", k, k2))
            for jk, ck in terms[k]:
                for jl, cl in terms[k2]:
                    columns.append((ck, cl))
                    owner.append(len(kinds) - 1)
                    rows.append((jk, jl, int(k != k2)))
    matrix = np.zeros((len(rows), n + n * n))
    for q, row in enumerate(rows):
        if len(row) == 1:
            matrix[q, row[0]] += 1.0
        else:
            a, b, sym = row
            matrix[q, n + a * n + b] += 1.0
            if sym:
                matrix[q, n + b * n + a] += 1.0
    return _Plan(tuple(kinds), tuple(columns), tuple(owner), matrix)


def objective(
    xp: Any,
    terms: Terms,
    n: int,
    theta: Any,
    features: Any,
    target: Any,
    weights: Any,
    delta: Any,
    *,
    derivatives: bool,
    free: tuple[bool, ...] | None = None,
) -> Any:
    """Summed Huber objective of an LSE-affine law (and optionally its gradient and Hessian).

    Args:
      xp: array namespace, `numpy` or `jax.numpy`.
      terms, n: the law's structure and parameter count.
      theta: [..., n] parameter vectors ([S, n] when `derivatives`).
      features: [P, F]; target: [P] observed log values.
      weights: point weights broadcastable to [..., P].
      delta: Huber threshold.
      derivatives: also return g [S, n] and H [S, n, n].
      free: which parameters are fitted (default all); fixed ones get g = 0 and a unit H row.
    """
    dtype = theta.dtype
    us = []
    for comp in terms:
        u = xp.zeros(theta.shape[:-1] + (1,), dtype)
        for j, col in comp:
            u = u + theta[..., j, None] * features[:, col]
        us.append(u)
    m = us[0]
    for u in us[1:]:
        m = xp.maximum(m, u)
    es = [xp.exp(u - m) for u in us]
    s = es[0]
    for e in es[1:]:
        s = s + e
    r = m + xp.log(s) - target
    f = xp.sum(weights * optim.huber(r, delta, xp), axis=-1)
    if not derivatives:
        return f
    ws = [e / s for e in es]
    psi = weights * xp.clip(r, -delta, delta)
    cross = weights * (xp.abs(r) <= delta).astype(dtype) - psi
    plan = _plan(terms, n)
    coefs = []
    for kind, k, k2 in plan.kinds:
        if kind == "g":
            coefs.append(psi * ws[k])
        else:
            c = cross * ws[k] * ws[k2]
            coefs.append(c + psi * ws[k] if k == k2 else c)
    # One matrix product: [S, Q·P] coefficients against the block-diagonal [Q·P, n + n²] routing
    # of each kind's feature products onto g and H (cheaper than Q separate reductions).
    cols = [
        features[:, a] if b is None else features[:, a] * features[:, b] for a, b in plan.columns
    ]
    zero = xp.zeros_like(features[:, 0])
    routing = xp.concatenate(
        [
            xp.stack(
                [cols[i] if plan.kind_of_column[i] == q else zero for i in range(len(cols))], axis=1
            )
            for q in range(len(plan.kinds))
        ],
        axis=0,
    ) @ xp.asarray(plan.matrix, dtype=dtype)
    flat = xp.concatenate(coefs, axis=-1) @ routing
    g, h = flat[:, :n], xp.reshape(flat[:, n:], (-1, n, n))
    if free is not None and not all(free):
        # Fixed rows: zero gradient, a unit-scale diagonal (the free diagonal's mean, so that the
        # damping scale is unchanged), no coupling: the solved step is exactly zero there.
        mask = np.asarray(free, np.float64)
        g = g * xp.asarray(mask, dtype=dtype)
        idx = np.flatnonzero(mask)
        level = xp.mean(xp.stack([xp.abs(h[:, i, i]) for i in idx], axis=-1), axis=-1)
        h = h * xp.asarray(np.outer(mask, mask), dtype=dtype)
        h = h + level[:, None, None] * xp.asarray(np.diag(1 - mask), dtype=dtype)
    return f, g, h


class _Objective:
    """`value` and `derivs` of an LSE-affine problem from its fields (numpy or traced data)."""

    terms: Terms
    features: Any
    target: Any
    delta: Any
    free: tuple[bool, ...] | None

    def value(self, xp: Any, theta: Any, weights: Any) -> Any:
        """Objective for theta [..., n]."""
        return self._objective(xp, theta, weights, derivatives=False)

    def derivs(self, xp: Any, theta: Any, weights: Any) -> tuple[Any, Any, Any]:
        """Objective, gradient and Hessian for theta [S, n]."""
        return self._objective(xp, theta, weights, derivatives=True)

    def _objective(self, xp: Any, theta: Any, weights: Any, *, derivatives: bool) -> Any:
        return objective(
            xp,
            self.terms,
            self.n_params,
            theta,
            self.features,
            self.target,
            weights,
            self.delta,
            derivatives=derivatives,
            free=self.free,
        )


@dataclasses.dataclass(frozen=True)
class LseProblem(_Objective):
    """One robust fit of an LSE-affine law, with its data in float64 numpy.

    Attributes:
      terms: per LSE component, the (parameter index, feature column) pairs of its affine part.
      features: [P, F] feature columns (1, −log N, −log D, ...).
      target: [P] observed log values.
      weights: [P] point weights.
      delta: Huber threshold on the log residual.
      free: which parameters are fitted; None means all.
    """

    terms: Terms
    features: np.ndarray
    target: np.ndarray
    weights: np.ndarray
    delta: float
    free: tuple[bool, ...] | None = None

    @property
    def n_params(self) -> int:
        """Number of fitted parameters."""
        return 1 + max(j for comp in self.terms for j, _ in comp)


def standardise(problem: LseProblem) -> tuple[LseProblem, np.ndarray]:
    """Re-expresses a problem in centred, unit-spread coordinates φ = R·θ.

    A slope feature such as −log N sits near −20 with a spread of ~1.5, so its parameter is almost
    collinear with its component's intercept; centring it (moving the mean into the intercept) and
    scaling it to unit spread makes damping meaningful and float32 accurate enough. The optimum is
    the same point: θ = R⁻¹·φ.

    Fixed parameters must stay fixed: a fixed slope is only folded into a fixed intercept.

    Returns:
      (problem in φ coordinates, R).
    """
    n = problem.n_params
    free = problem.free or (True,) * n
    feats = problem.features.copy()
    r = np.eye(n)
    uses = np.zeros(n, int)
    for comp in problem.terms:
        for j, _ in comp:
            uses[j] += 1
    for comp in problem.terms:
        ones = [j for j, col in comp if uses[j] == 1 and np.all(problem.features[:, col] == 1.0)]
        intercept = ones[0] if ones else None
        for j, col in comp:
            x = problem.features[:, col]
            if uses[j] != 1 or j == intercept:
                continue
            if intercept is not None and free[j] and not free[intercept]:
                intercept = None
            mean, sd = float(np.mean(x)), float(np.std(x))
            if not (np.isfinite(sd) and sd > 0):
                continue
            if intercept is None:
                feats[:, col] = x / sd
            else:
                feats[:, col] = (x - mean) / sd
                r[intercept, j] += mean
            r[j, j] = sd
    return dataclasses.replace(problem, features=feats), r


@functools.lru_cache(maxsize=32)
def _compiled_block(terms: Terms, n: int, free: tuple[bool, ...] | None) -> Any:
    """The jitted LM rounds for one block of lanes of one law structure.

    The returned function maps (theta, f, lam, weights, features, target, delta, iters) to
    (theta, f, lam); f = NaN asks for the objective to be computed first. Shapes are fixed per
    block size and point bucket, so any number of lanes reuses one compilation.
    """
    import jax
    import jax.numpy as jnp

    def run(theta, f, lam, weights, features, target, delta, iters):
        problem = _Traced(terms, n, free, features, target, delta)
        f = jnp.where(jnp.isnan(f), problem.value(jnp, theta, weights), f)
        f = jnp.where(jnp.isfinite(f), f, jnp.inf)

        def body(_, state):
            return optim.lm_step(jnp, problem, *state, weights)

        return jax.lax.fori_loop(0, iters, body, (theta, f, lam))

    return jax.jit(run)


@dataclasses.dataclass(frozen=True)
class _Traced(_Objective):
    """An `LseProblem` whose data are traced JAX arrays (inside the compiled screen)."""

    terms: Terms
    n_params: int
    free: tuple[bool, ...] | None
    features: Any
    target: Any
    delta: Any


def _jax_runner(problem: LseProblem, lane_weights: np.ndarray | None, dtype: Any):
    """A block runner for `optim.lm_rounds` backed by the compiled block function."""
    import jax
    import jax.numpy as jnp

    p = problem.target.shape[0]
    points = -(-p // _POINT_BUCKET) * _POINT_BUCKET
    pad = np.zeros(points - p, int)  # extra points repeat point 0 with weight 0
    run = _compiled_block(problem.terms, problem.n_params, problem.free)
    with jax.enable_x64(True):
        data = [
            jnp.asarray(np.concatenate([problem.features, problem.features[pad]]), dtype),
            jnp.asarray(np.concatenate([problem.target, problem.target[pad]]), dtype),
            jnp.asarray(problem.delta, dtype),
        ]
        shared = None
        if lane_weights is None:
            w = np.zeros((_BLOCK, points))
            w[:, :p] = problem.weights
            shared = jnp.asarray(w, dtype)

    def runner(theta, f, lam, lanes, iters):
        with jax.enable_x64(True):
            if shared is not None:
                w = shared
            else:
                w = np.zeros((_BLOCK, points))
                w[:, :p] = lane_weights[lanes]
                w = jnp.asarray(w, dtype)
            out = run(
                jnp.asarray(theta, dtype),
                jnp.asarray(f, dtype),
                jnp.asarray(lam, dtype),
                w,
                *data,
                jnp.asarray(iters, jnp.int32),
            )
            return tuple(np.asarray(o, np.float64) for o in out)

    return runner


def screen(
    problem: LseProblem,
    starts: np.ndarray,
    iters: int,
    *,
    lane_weights: np.ndarray | None = None,
    dtype: Any = np.float32,
) -> np.ndarray:
    """Batched LM from every start, each lane until it stalls or `iters` iterations have run.

    Large batches run in a compiled JAX block of `_BLOCK` lanes (float32 is enough to find the
    basins; the float64 polish that follows restores full precision); small ones in float64 numpy.

    Args:
      problem: the fit.
      starts: [S, n] initial parameters.
      iters: the most iterations any lane runs.
      lane_weights: optional [S, P] per-lane point weights (bootstrap resamples share one batch).
      dtype: dtype of the compiled block.

    Returns:
      [S, n] float64 end points.
    """
    starts = np.asarray(starts, np.float64)
    s, p = starts.shape[0], problem.target.shape[0]
    if s * p < JAX_MIN_WORK:
        out = optim.lm_rounds(problem, starts, max_iters=iters, lane_weights=lane_weights)
    else:
        runner = _jax_runner(problem, lane_weights, dtype)
        out = optim.lm_rounds(
            problem,
            starts,
            max_iters=iters,
            lane_weights=lane_weights,
            runner=runner,
            block=_BLOCK,
        )
    if problem.free is not None:  # fixed values exactly as given, not as float32 saw them
        fixed = ~np.asarray(problem.free)
        out[:, fixed] = starts[:, fixed]
    return out
