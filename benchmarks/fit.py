"""Benchmark: the 4,500-start Chinchilla fit against a plain scipy L-BFGS-B loop over the same starts.

Data as the issue specifies: 200 points, N log-uniform in 7e7–1.6e10, D in 5e9–5e11, lognormal
noise σ = 0.005 around E 1.55, A 420, B 719.5, α 0.40, β 0.30. Both sides minimise the same summed
Huber objective (δ = 1e-3) in the same variables (a, b, e, α, β) from the same Hoffmann grid; the
baseline uses analytic gradients in numpy. Reports wall and CPU seconds (the machine may be shared:
the load average is printed), the speed-up, and whether both reach the same optimum (objective
within 1e-6 relative, exponents within 1e-3). BLAS runs single-threaded (the baseline's fastest
setting on this 2-core machine).

    .venv/bin/python benchmarks/fit.py [--json out.json] [--skip-scipy]
"""

from __future__ import annotations

import os

# The baseline's best configuration: single-threaded BLAS (threaded OpenBLAS on 5-element vectors
# only adds contention). Set before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _scipy_loop(N, D, L, starts, delta):
    """The reference: one scipy L-BFGS-B run per start, analytic gradient, summed Huber."""
    import scipy.optimize

    x, y, t = np.log(N), np.log(D), np.log(L)

    def fun(theta):
        a, b, e, al, be = theta
        u0, u1 = a - al * x, b - be * y
        m = np.maximum(np.maximum(u0, u1), e)
        e0, e1, e2 = np.exp(u0 - m), np.exp(u1 - m), np.exp(e - m)
        s = e0 + e1 + e2
        r = m + np.log(s) - t
        ar = np.abs(r)
        f = np.sum(np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta)))
        psi = np.clip(r, -delta, delta) / s
        g = np.array(
            [
                np.sum(psi * e0),
                np.sum(psi * e1),
                np.sum(psi * e2),
                -np.sum(psi * e0 * x),
                -np.sum(psi * e1 * y),
            ]
        )
        return f, g

    out = []
    with np.errstate(all="ignore"):
        for theta in starts:
            if not np.isfinite(fun(theta)[0]):
                out.append((np.inf, theta))
                continue
            r = scipy.optimize.minimize(fun, theta, jac=True, method="L-BFGS-B")
            out.append((float(r.fun) if np.isfinite(r.fun) else np.inf, r.x))
    return out


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints (and optionally writes) its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--skip-scipy", action="store_true", help="time only the batched fit")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    load0 = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    import jax  # noqa: F401  (imported here so that its import time is reported apart)

    from fitting.laws import formulas as laws
    from fitting.laws import optim, synthetic
    from fitting.laws import robust_fit as fit

    import_s = time.perf_counter() - t0
    N, D, L = synthetic.chinchilla_points(200, seed=args.seed)
    spec = laws.fit_spec("chinchilla")
    starts = optim.product_grid([spec.grid[k] for k in spec.names])

    t0, c0 = time.perf_counter(), time.process_time()
    cold = fit.fit_chinchilla(N, D, L)
    cold_s, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    fit.fit_chinchilla(N, D, L)
    warm_s, warm_cpu = time.perf_counter() - t0, time.process_time() - c0
    figures = {
        "n_points": len(N),
        "n_starts": len(starts),
        "cpu_count": os.cpu_count(),
        "import_jax_and_fitting_s": import_s,
        "batched_cold_s": cold_s,
        "batched_cold_cpu_s": cold_cpu,
        "batched_warm_s": warm_s,
        "batched_warm_cpu_s": warm_cpu,
        "batched_objective": cold.objective,
        "batched_params": cold.params,
        "batched_converged": cold.converged,
        "batched_grad_norm": cold.grad_norm,
        "batched_n_at_best": cold.n_at_best,
    }
    if not args.skip_scipy:
        t0, c0 = time.perf_counter(), time.process_time()
        ref = _scipy_loop(N, D, L, starts, 1e-3)
        figures["scipy_s"] = time.perf_counter() - t0
        figures["scipy_cpu_s"] = time.process_time() - c0
        f = np.array([r[0] for r in ref])
        best = int(np.argmin(f))
        a, b, e, al, be = ref[best][1]
        figures["scipy_objective"] = float(f[best])
        figures["scipy_params"] = {
            "E": float(np.exp(e)),
            "A": float(np.exp(a)),
            "B": float(np.exp(b)),
            "alpha": float(al),
            "beta": float(be),
        }
        figures["scipy_n_at_best"] = int(np.sum(f <= f[best] * (1 + 1e-6)))
        rel = abs(cold.objective - f[best]) / abs(f[best])
        d_exp = max(abs(cold.params["alpha"] - al), abs(cold.params["beta"] - be))
        figures["objective_rel_diff"] = rel
        figures["exponent_abs_diff"] = d_exp
        figures["same_optimum"] = bool(rel <= 1e-6 and d_exp <= 1e-3)
        figures["speedup_cold"] = figures["scipy_s"] / cold_s
        figures["speedup_warm"] = figures["scipy_s"] / warm_s
    figures["load_average_before"] = load0
    figures["load_average_after"] = os.getloadavg()

    print(
        f"Chinchilla fit, {len(N)} points, {len(starts)} starts ({os.cpu_count()} CPUs, "
        f"load average {load0[0]:.1f} → {figures['load_average_after'][0]:.1f})"
    )
    print(f"  import jax + fitting          {import_s:7.2f} s")
    print(f"  batched, incl. compilation    {cold_s:7.2f} s  (CPU {cold_cpu:.2f} s)")
    print(f"  batched, compiled             {warm_s:7.2f} s  (CPU {warm_cpu:.2f} s)")
    print(
        f"  batched optimum {cold.objective!r}, converged={cold.converged}, "
        f"{cold.n_at_best} starts at the best basin"
    )
    if not args.skip_scipy:
        print(
            f"  scipy L-BFGS-B loop           {figures['scipy_s']:7.2f} s  "
            f"(CPU {figures['scipy_cpu_s']:.2f} s)"
        )
        print(
            f"  scipy optimum  {figures['scipy_objective']!r}, "
            f"{figures['scipy_n_at_best']} starts within 1e-6"
        )
        print(
            f"  speed-up {figures['speedup_cold']:.1f}× incl. compilation, "
            f"{figures['speedup_warm']:.1f}× compiled; objective rel. diff "
            f"{figures['objective_rel_diff']:.2e}, exponent diff {figures['exponent_abs_diff']:.2e}"
            f" → same optimum: {figures['same_optimum']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0 if figures.get("same_optimum", True) else 1


if __name__ == "__main__":
    sys.exit(main())
