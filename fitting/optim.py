"""Batched multi-start robust fitting of laws whose log-prediction is a log-sum-exp of affine terms.

Every upstream law of the CPT paper (Chinchilla, its CPT extension with the second stage's fixed
terms as offsets, the loss–compute law) and the MT paper's cross-entropy law has the form

    log L̂_i = LSE_k( c_ik + Σ_{(j, col) ∈ terms[k]} θ_j · X_i,col ),

and is fitted by minimising Σ_i w_i · Huber_δ(log L̂_i − log L_i). Hoffmann et al. run L-BFGS from a
grid of thousands of starts; most land in poor basins, so the grid is needed. A Python loop of
scipy calls spends its time in per-call overhead, and a `vmap` of per-start while-loops makes every
lane wait for the slowest. Here all starts advance together for a fixed number of damped-Newton
(Levenberg–Marquardt) iterations inside one compiled loop: the gradient and the exact Hessian are
analytic and cost a few small matrix products per iteration (the law has at most a handful of
parameters), the 5×5 systems are solved by an unrolled Cholesky, and several damping levels are
tried at once instead of a sequential line search. The best starts are then polished in float64
with scipy's exact-Hessian trust-region method, and convergence is judged on the polished gradient.

The evaluation code is written once against an array namespace (`numpy` or `jax.numpy`), so the
compiled batch loop and the float64 polish compute the same objective.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.optimize

# A term is (parameter index, feature column); a component is a tuple of terms.
Terms = tuple[tuple[tuple[int, int], ...], ...]

import os
_MODE = os.environ.get("LM_MODE", "chol")
_CHUNK = int(os.environ.get("LM_CHUNK", "256"))  # lanes per compiled block: keeps a block's (lanes × points) arrays in cache
_DAMPING = tuple(float(v) for v in os.environ.get("LM_FACS", "1e-2,1,1e2").split(","))
_LAM0 = float(os.environ.get("LM_LAM0", "1e-3"))
_UP = float(os.environ.get("LM_UP", "4"))
_DOWN = float(os.environ.get("LM_DOWN", "0.5"))  # damping levels tried together, relative to the current one


@dataclasses.dataclass(frozen=True)
class LseProblem:
    """One robust fit: the law's structure plus its data, in float64 numpy.

    Attributes:
      terms: per LSE component, the (parameter index, feature column) pairs of its affine part.
      features: [P, F] feature columns (e.g. 1, −log N, −log D).
      offsets: [P, K] constant part of each component (fixed terms of a two-stage fit), or zeros.
      target: [P] observed log values.
      weights: [P] point weights (1 for a plain fit; run multiplicities for a bootstrap resample).
      delta: Huber threshold on the log residual.
    """

    terms: Terms
    features: np.ndarray
    offsets: np.ndarray
    target: np.ndarray
    weights: np.ndarray
    delta: float

    @property
    def n_params(self) -> int:
        """Number of fitted parameters."""
        return 1 + max(j for comp in self.terms for j, _ in comp)


@dataclasses.dataclass(frozen=True)
class MultiStartResult:
    """Outcome of a multi-start fit in the problem's own parameterisation.

    Attributes:
      theta: polished best parameters.
      objective: summed Huber objective at `theta` (float64).
      grad_norm: infinity norm of the objective's gradient at `theta`.
      grad_scale: δ·Σw, the largest gradient a single unit feature can produce; `grad_norm` is
        judged relative to it.
      converged: the polish stopped on its gradient test and the relative gradient is tiny.
      n_starts: number of starts, non-finite ones included.
      n_finite: starts whose initial objective was finite.
      n_at_best: starts whose final objective lies within `basin_rtol` of the best.
      finals: [S, n] end points of all starts (NaN where the start was not finite).
      final_objectives: [S] float64 objectives at `finals` (inf where not finite).
      message: the polish's own message.
    """

    theta: np.ndarray
    objective: float
    grad_norm: float
    grad_scale: float
    converged: bool
    n_starts: int
    n_finite: int
    n_at_best: int
    finals: np.ndarray
    final_objectives: np.ndarray
    message: str


def huber(r: Any, delta: float, xp: Any = np) -> Any:
    """Elementwise Huber loss: quadratic within ±δ, linear outside (Huber 1964, δ as in the papers)."""
    ar = xp.abs(r)
    return xp.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


def lse_objective(
    xp: Any,
    terms: Terms,
    n_params: int,
    theta: Any,
    features: Any,
    offsets: Any,
    target: Any,
    weights: Any,
    delta: Any,
    *,
    derivatives: bool,
) -> Any:
    """Summed Huber objective of an LSE-affine law for a batch of parameter vectors.

    Args:
      xp: array namespace, `numpy` or `jax.numpy`.
      terms, n_params: the law's structure (see `LseProblem`).
      theta: [S, n] parameter vectors.
      features, offsets, target: the data (see `LseProblem`).
      weights: [P] or [S, P] point weights.
      delta: Huber threshold.
      derivatives: also return the gradient [S, n] and the exact Hessian [S, n, n].

    Returns:
      f [S], or (f, g, H).
    """
    dtype = theta.dtype
    us = []
    for k, comp in enumerate(terms):
        u = offsets[:, k][None, :] + xp.zeros((theta.shape[0], 1), dtype)
        for j, col in comp:
            u = u + theta[:, j, None] * features[None, :, col]
        us.append(u)
    m = us[0]
    for u in us[1:]:
        m = xp.maximum(m, u)
    es = [xp.exp(u - m) for u in us]
    s = es[0]
    for e in es[1:]:
        s = s + e
    r = m + xp.log(s) - target
    f = xp.sum(weights * huber(r, delta, xp), axis=-1)
    if not derivatives:
        return f
    ws = [e / s for e in es]
    psi = weights * xp.clip(r, -delta, delta)
    # Hessian of Σ w·Huber(LSE(u)): Σ (ψ' − ψ) J Jᵀ + ψ Σ_k w_k m_k m_kᵀ, with J = Σ_k w_k m_k.
    cross = weights * (xp.abs(r) <= delta).astype(dtype) - psi
    grad: list[Any] = [0.0] * n_params
    hess: list[list[Any]] = [[0.0] * n_params for _ in range(n_params)]
    for k, comp_k in enumerate(terms):
        if not comp_k:
            continue
        cols_k = xp.stack([features[:, col] for _, col in comp_k], axis=1)
        gk = (psi * ws[k]) @ cols_k
        for q, (j, _) in enumerate(comp_k):
            grad[j] = grad[j] + gk[:, q]
        for l in range(k, len(terms)):
            comp_l = terms[l]
            if not comp_l:
                continue
            coef = cross * ws[k] * ws[l]
            if k == l:
                coef = coef + psi * ws[k]
            pairs = [(tk, tl) for tk in comp_k for tl in comp_l]
            prods = xp.stack([features[:, tk[1]] * features[:, tl[1]] for tk, tl in pairs], axis=1)
            hk = coef @ prods
            for q, (tk, tl) in enumerate(pairs):
                hess[tk[0]][tl[0]] = hess[tk[0]][tl[0]] + hk[:, q]
                if k != l:
                    hess[tl[0]][tk[0]] = hess[tl[0]][tk[0]] + hk[:, q]
    zero = xp.zeros_like(f)
    g = xp.stack([gi + zero for gi in grad], axis=-1)
    h = xp.stack([xp.stack([hij + zero for hij in row], axis=-1) for row in hess], axis=-2)
    return f, g, h


def _modified_ldl_solve(xp: Any, a: Any, b: Any) -> Any:
    """Solves (A + E) x = b with E ≥ 0 diagonal chosen during the factorisation so that A + E is
    safely positive definite (Gill–Murray–Wright modified Cholesky, Nocedal & Wright §3.4).

    Far from the optimum the Huber objective is nearly piecewise linear and its Hessian indefinite;
    this turns such a Hessian into a usable descent metric at the price of one unrolled LDLᵀ.
    """
    n = a.shape[-1]
    eps = float(np.finfo(np.dtype(a.dtype.name)).eps)
    diag = [a[:, i, i] for i in range(n)]
    off = [xp.abs(a[:, i, j]) for i in range(n) for j in range(n) if i != j]
    gamma = functools.reduce(xp.maximum, [xp.abs(d) for d in diag])
    xi = functools.reduce(xp.maximum, off) if off else xp.zeros_like(gamma)
    beta2 = xp.maximum(xp.maximum(gamma, xi / math.sqrt(max(n * n - 1, 1))), eps)
    tiny = eps * xp.maximum(gamma + xi, 1.0)
    low: list[list[Any]] = [[None] * n for _ in range(n)]
    d: list[Any] = [None] * n
    for j in range(n):
        c = [None] * n
        for i in range(j, n):
            t = a[:, i, j]
            for k in range(j):
                t = t - d[k] * low[i][k] * low[j][k]
            c[i] = t
        theta = functools.reduce(xp.maximum, [xp.abs(c[i]) for i in range(j + 1, n)]) if j < n - 1 else 0.0
        d[j] = xp.maximum(xp.maximum(xp.abs(c[j]), theta * theta / beta2), tiny)
        low[j][j] = 1.0
        for i in range(j + 1, n):
            low[i][j] = c[i] / d[j]
    z: list[Any] = [None] * n
    for i in range(n):
        t = b[:, i]
        for k in range(i):
            t = t - low[i][k] * z[k]
        z[i] = t
    x: list[Any] = [None] * n
    for i in reversed(range(n)):
        t = z[i] / d[i]
        for k in range(i + 1, n):
            t = t - low[k][i] * x[k]
        x[i] = t
    return xp.stack(x, axis=-1)


def _cholesky_solve(xp: Any, a: Any, b: Any) -> Any:
    """Solves a x = b for a batch of small SPD matrices by an unrolled Cholesky factorisation.

    A matrix that is not positive definite yields NaN, which the caller treats as a rejected step.
    Unrolling beats a batched LAPACK call by two orders of magnitude for 3×3 to 6×6 systems.
    """
    n = a.shape[-1]
    low: list[list[Any]] = [[None] * n for _ in range(n)]
    for j in range(n):
        s = a[:, j, j]
        for k in range(j):
            s = s - low[j][k] * low[j][k]
        d = xp.sqrt(s)
        low[j][j] = d
        for i in range(j + 1, n):
            t = a[:, i, j]
            for k in range(j):
                t = t - low[i][k] * low[j][k]
            low[i][j] = t / d
    z: list[Any] = [None] * n
    for i in range(n):
        t = b[:, i]
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


@functools.lru_cache(maxsize=32)
def _compiled_lm(terms: Terms, n_params: int) -> Any:
    """Builds (once per law structure and iteration count) the jitted batched LM loop."""
    import jax
    import jax.numpy as jnp

    damping = jnp.asarray(_DAMPING)

    def one_block(theta0, weights, features, offsets, target, delta, iters):
        dtype = theta0.dtype
        facs = damping.astype(dtype)
        eye = jnp.eye(n_params, dtype=dtype)

        def f_only(theta, w):
            return lse_objective(
                jnp, terms, n_params, theta, features, offsets, target, w, delta, derivatives=False
            )

        f0 = f_only(theta0, weights)
        f0 = jnp.where(jnp.isfinite(f0), f0, jnp.inf)
        lam0 = jnp.full(f0.shape, _LAM0, dtype)

        def body(_, state):
            theta, f, lam = state
            _, g, h = lse_objective(
                jnp, terms, n_params, theta, features, offsets, target, weights, delta,
                derivatives=True,
            )
            scale = jnp.maximum(jnp.mean(jnp.abs(jnp.diagonal(h, axis1=1, axis2=2)), -1), 1e-30)
            cands = []
            if _MODE == "eig":
                ev, q = jnp.linalg.eigh(h)
                aev = jnp.abs(ev)
                gq = jnp.einsum("snm,sn->sm", q, g)
                sc = jnp.max(aev, -1) + 1e-30
            for c in range(len(_DAMPING)):
                mu = (lam * facs[c] * scale)[:, None, None]
                if _MODE == "eig":
                    step = -jnp.einsum("snm,sm->sn", q, gq / (aev + (lam * facs[c] * sc)[:, None]))
                elif _MODE == "mchol":
                    step = _modified_ldl_solve(jnp, h + mu * eye, -g)
                else:
                    step = _cholesky_solve(jnp, h + mu * eye, -g)
                cands.append(theta + step)
            cand = jnp.stack(cands, axis=1)  # [B, C, n]
            fc = jax.vmap(f_only, in_axes=(1, None), out_axes=1)(cand, weights)
            fc = jnp.where(jnp.isfinite(fc), fc, jnp.inf)
            best = jnp.argmin(fc, axis=1)
            fbest = jnp.min(fc, axis=1)
            ok = fbest < f
            chosen = jnp.take_along_axis(cand, best[:, None, None], axis=1)[:, 0]
            theta = jnp.where(ok[:, None], chosen, theta)
            f = jnp.where(ok, fbest, f)
            lam = jnp.where(ok, lam * facs[best] * _DOWN, lam * facs[-1] * _UP)
            return theta, f, jnp.clip(lam, 1e-12, 1e12)

        theta, f, _ = jax.lax.fori_loop(0, iters, body, (theta0, f0, lam0))
        return theta, f

    def run(theta0, weights, features, offsets, target, delta, iters):
        blocks = theta0.shape[0] // _CHUNK
        theta_b = theta0.reshape(blocks, _CHUNK, n_params)
        weights_b = weights.reshape(blocks, _CHUNK, weights.shape[-1])
        theta, f = jax.lax.map(
            lambda xs: one_block(xs[0], xs[1], features, offsets, target, delta, iters),
            (theta_b, weights_b),
        )
        return theta.reshape(-1, n_params), f.reshape(-1)

    return jax.jit(run)


def batched_lm(
    problem: LseProblem,
    starts: np.ndarray,
    *,
    iters: int,
    lane_weights: np.ndarray | None = None,
    dtype: Any = np.float64,
) -> np.ndarray:
    """Runs `iters` damped-Newton iterations from every start at once; returns the end points.

    Args:
      problem: the fit (its `weights` are used unless `lane_weights` is given).
      starts: [S, n] initial parameters.
      iters: fixed iteration count (no per-lane stopping: lanes never wait for each other).
      lane_weights: optional [S, P] per-start point weights, so that many bootstrap resamples
        run in one batch with one compilation.
      dtype: float64 by default; float32 halves the time for a coarse screen.

    Returns:
      [S, n] float64 end points (a start whose objective was not finite stays where it began).
    """
    import jax
    import jax.numpy as jnp

    starts = np.asarray(starts, np.float64)
    s = starts.shape[0]
    padded = -(-s // _CHUNK) * _CHUNK
    theta0 = np.concatenate([starts, np.repeat(starts[:1], padded - s, axis=0)])
    if lane_weights is None:
        lane_weights = np.broadcast_to(problem.weights, (s, problem.weights.shape[0]))
    w = np.concatenate([lane_weights, np.repeat(lane_weights[:1], padded - s, axis=0)])
    run = _compiled_lm(problem.terms, problem.n_params)
    with jax.enable_x64(True):
        theta, _ = run(
            jnp.asarray(theta0, dtype),
            jnp.asarray(w, dtype),
            jnp.asarray(problem.features, dtype),
            jnp.asarray(problem.offsets, dtype),
            jnp.asarray(problem.target, dtype),
            jnp.asarray(problem.delta, dtype),
            jnp.asarray(iters, jnp.int32),
        )
        theta = np.asarray(theta, np.float64)[:s]
    return theta


def objectives(problem: LseProblem, theta: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Float64 objectives of many parameter vectors (non-finite → inf), evaluated in numpy."""
    theta = np.atleast_2d(np.asarray(theta, np.float64))
    w = problem.weights if weights is None else weights
    out = np.empty(theta.shape[0])
    step = 512
    with np.errstate(all="ignore"):
        for i in range(0, theta.shape[0], step):
            ww = w if w.ndim == 1 else w[i : i + step]
            out[i : i + step] = lse_objective(
                np, problem.terms, problem.n_params, theta[i : i + step], problem.features,
                problem.offsets, problem.target, ww, problem.delta, derivatives=False,
            )
    return np.where(np.isfinite(out), out, np.inf)


def derivatives(
    problem: LseProblem, theta: np.ndarray, weights: np.ndarray | None = None
) -> tuple[float, np.ndarray, np.ndarray]:
    """Float64 objective, gradient and Hessian at one parameter vector."""
    w = problem.weights if weights is None else weights
    with np.errstate(all="ignore"):
        f, g, h = lse_objective(
            np, problem.terms, problem.n_params, np.asarray(theta, np.float64)[None],
            problem.features, problem.offsets, problem.target, w, problem.delta, derivatives=True,
        )
    return float(f[0]), g[0], h[0]


def polish(
    problem: LseProblem, theta0: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, float, np.ndarray, bool, str]:
    """Tight float64 polish of one start with scipy's exact-Hessian trust-region method.

    The Huber objective is only piecewise twice differentiable, so a final Newton refinement on the
    settled active set follows when it lowers the objective.

    Returns:
      (theta, objective, gradient, stopped_on_gradient, message).
    """

    def fun(t):
        f, g, _ = derivatives(problem, t, weights)
        return f, g

    def hess(t):
        return derivatives(problem, t, weights)[2]

    scale = problem.delta * float(np.sum(problem.weights if weights is None else weights))
    gtol = 1e-12 * max(scale, 1e-300)
    res = scipy.optimize.minimize(
        fun, np.asarray(theta0, np.float64), jac=True, hess=hess, method="trust-exact",
        options={"gtol": gtol, "maxiter": 400},
    )
    theta, f = res.x, float(res.fun)
    for _ in range(8):
        f_cur, g, h = derivatives(problem, theta, weights)
        try:
            step = np.linalg.solve(h, -g)
        except np.linalg.LinAlgError:
            break
        cand = theta + step
        f_new = derivatives(problem, cand, weights)[0]
        if not (np.isfinite(f_new) and f_new <= f_cur):
            break
        theta, f = cand, f_new
    f, g, _ = derivatives(problem, theta, weights)
    ok = bool(res.success) or bool(np.max(np.abs(g)) <= gtol)
    return theta, f, g, ok, str(res.message)


def multistart(
    problem: LseProblem,
    starts: np.ndarray,
    *,
    iters: int = 30,
    n_polish: int = 4,
    basin_rtol: float = 1e-6,
    grad_rtol: float = 1e-7,
    dtype: Any = np.float64,
) -> MultiStartResult:
    """Fits from every start in one batch, then polishes the best few distinct end points.

    Args:
      problem: the fit.
      starts: [S, n] grid of initial parameters.
      iters: batched LM iterations (fixed for all lanes).
      n_polish: how many of the best distinct end points get the float64 polish (guards against a
        lane that looks best but sits on a ridge).
      basin_rtol: a start "reached the best basin" when its end objective is within this relative
        tolerance of the polished best (plus a floor for noise-free data, whose best objective is ~0).
      grad_rtol: `converged` requires ‖∇f‖∞ ≤ grad_rtol · δ·Σw after the polish.
      dtype: dtype of the batched stage (the polish is always float64).
    """
    starts = np.asarray(starts, np.float64)
    f_start = objectives(problem, starts)
    finite = np.isfinite(f_start) & np.all(np.isfinite(starts), axis=1)
    finals = np.full_like(starts, np.nan)
    f_final = np.full(starts.shape[0], np.inf)
    if np.any(finite):
        finals[finite] = batched_lm(problem, starts[finite], iters=iters, dtype=dtype)
        f_final[finite] = objectives(problem, finals[finite])
    scale = problem.delta * float(np.sum(problem.weights))
    if not np.any(np.isfinite(f_final)):
        nan = np.full(problem.n_params, np.nan)
        return MultiStartResult(
            nan, math.inf, math.inf, scale, False, starts.shape[0], int(finite.sum()), 0, finals,
            f_final, "no start has a finite objective",
        )
    best_theta, best_f, best_g, best_ok, best_msg = None, math.inf, None, False, ""
    for idx in _distinct_best(finals, f_final, n_polish):
        theta, f, g, ok, msg = polish(problem, finals[idx])
        if f < best_f:
            best_theta, best_f, best_g, best_ok, best_msg = theta, f, g, ok, msg
    grad_norm = float(np.max(np.abs(best_g)))
    converged = bool(best_ok and np.isfinite(best_f) and grad_norm <= grad_rtol * scale)
    floor = 1e-9 * 0.5 * problem.delta**2 * float(np.sum(problem.weights))
    n_at_best = int(np.sum(f_final <= best_f + basin_rtol * abs(best_f) + floor))
    return MultiStartResult(
        best_theta, best_f, grad_norm, scale, converged, starts.shape[0], int(finite.sum()),
        n_at_best, finals, f_final, best_msg,
    )


def _distinct_best(finals: np.ndarray, f: np.ndarray, k: int) -> list[int]:
    """Indices of up to k lowest-objective end points that differ from each other."""
    order = np.argsort(f)
    chosen: list[int] = []
    for i in order:
        if not np.isfinite(f[i]):
            break
        if all(np.max(np.abs(finals[i] - finals[j])) > 1e-6 for j in chosen):
            chosen.append(int(i))
        if len(chosen) >= k:
            break
    return chosen


def standardise(problem: LseProblem) -> tuple[LseProblem, np.ndarray]:
    """Re-expresses a problem in centred, unit-scale coordinates φ = R·θ.

    A slope feature such as −log N sits around −20 with a spread of ~1.5, so its parameter is
    almost collinear with the component's intercept; centring the feature (and moving its mean
    into the intercept) and scaling it to unit spread makes the damped-Newton steps and the
    float32 screen well conditioned. Newton's method itself is affine invariant, so the optimum
    is unchanged: θ = R⁻¹·φ.

    Returns:
      (problem in φ coordinates, R).
    """
    n = problem.n_params
    feats = problem.features.copy()
    r = np.eye(n)
    uses = np.zeros(n, int)
    for comp in problem.terms:
        for j, _ in comp:
            uses[j] += 1
    for comp in problem.terms:
        intercept = [
            j for j, col in comp if np.all(problem.features[:, col] == 1.0) and uses[j] == 1
        ]
        for j, col in comp:
            x = problem.features[:, col]
            if uses[j] != 1 or (intercept and j == intercept[0]):
                continue
            mean, sd = float(np.mean(x)), float(np.std(x))
            if not (np.isfinite(sd) and sd > 0):
                continue
            if intercept:
                feats[:, col] = (x - mean) / sd
                r[intercept[0], j] += mean
            else:
                feats[:, col] = x / sd
            r[j, j] = sd
    return dataclasses.replace(problem, features=feats), r


def product_grid(axes: Sequence[Sequence[float]]) -> np.ndarray:
    """Cartesian product of per-parameter start values, as [S, n] (first axis varies slowest)."""
    mesh = np.meshgrid(*[np.asarray(a, np.float64) for a in axes], indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)
