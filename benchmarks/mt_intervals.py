"""Benchmark: how often do an MT series' residual-bootstrap intervals hold the truth?

The adaptive sweep stops or skips a finetune whose final value is predicted within `--tolerance`
(`launch.adaptive`); for MT series that prediction interval comes from
`fitting.laws.downstream_laws.bootstrap_series` (the checkpoints stay, the log residuals are
redrawn). This draws series from the paper-law generator's truth (`fitting.laws.synthetic`: BLEU
log-law, Table 3's first row; CE power law; the generator's 8 checkpoints, 2.6e9–1.3e11 Dp;
lognormal noise σ for BLEU and σ/5 for CE, as `write_study`), fits the first `--n-fit`
checkpoints, and prints for each law: how often the 95% interval at the next and at the last
checkpoint holds the noise-free value, the median relative half-width there, and the seconds per
bootstrap. A calibrated interval holds the truth in about 95% of the series.

    .venv/bin/python benchmarks/mt_intervals.py [--series 40] [--n-fit 5] [--resamples 50]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # 2 shared cores: one BLAS thread per process

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fitting.laws import downstream_laws, formulas, synthetic  # noqa: E402

# law -> (fitter, truth, noise relative to --sigma), as the generator writes MT series
LAWS = {
    "log_law": (downstream_laws.fit_bleu_law, synthetic.BLEU, 1.0),
    "power_law": (downstream_laws.fit_ce_law, synthetic.CE, 0.2),
}
BATCH = 512 * 256  # the generator's pretraining batch: Dp = step x batch
DP = np.geomspace(2e4, 1e6, 8).astype(int) * float(BATCH)


def coverage(law: str, *, series: int, n_fit: int, resamples: int, sigma: float) -> dict:
    """Draws `series` noisy series of `law`, fits and bootstraps each, and counts how often the
    95% interval at the next and the last checkpoint holds the truth."""
    fitter, truth, scale = LAWS[law]
    at = {"next": DP[n_fit], "last": DP[-1]}
    held = {k: 0 for k in at}
    widths = {k: [] for k in at}
    usable, seconds = 0, 0.0
    for s in range(series):
        rng = np.random.default_rng(s)
        clean = formulas.predict(law, truth, DP)
        noisy = clean * np.exp(scale * sigma * rng.standard_normal(len(DP)))
        fit = fitter(DP, noisy, n_fit=n_fit)
        t0 = time.perf_counter()
        boot = downstream_laws.bootstrap_series(fit, n=resamples, seed=s)
        seconds += time.perf_counter() - t0
        if len(boot.samples) < 10:
            continue
        usable += 1
        for k, dp in at.items():
            values = [float(formulas.predict(law, {**fit.params, **p}, dp)) for p in boot.samples]
            lo, hi = np.percentile(values, [2.5, 97.5])
            true = float(formulas.predict(law, truth, dp))
            held[k] += int(lo <= true <= hi)
            widths[k].append((hi - lo) / 2 / true)
    return {
        "usable": usable,
        "held": held,
        "width": {k: float(np.median(v)) if v else float("nan") for k, v in widths.items()},
        "seconds": seconds / max(series, 1),
    }


def main(argv=None) -> int:
    """Prints the coverage table; exits 0 (a measurement, not a gate)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--series", type=int, default=40)
    p.add_argument("--n-fit", type=int, default=5, help="checkpoints fitted (4..7)")
    p.add_argument("--resamples", type=int, default=50)
    p.add_argument("--sigma", type=float, default=0.005, help="the generator's noise (0.005)")
    args = p.parse_args(argv)
    if not 4 <= args.n_fit <= len(DP) - 1:
        p.error(f"--n-fit {args.n_fit}: allowed: 4 to {len(DP) - 1}")
    print(
        f"MT residual bootstrap: {args.series} series per law, first {args.n_fit} of {len(DP)} "
        f"checkpoints fitted, {args.resamples} resamples, sigma {args.sigma:g}"
    )
    print("law        usable  next: held  half-width   last: held  half-width   s/bootstrap")
    for law in LAWS:
        r = coverage(
            law, series=args.series, n_fit=args.n_fit, resamples=args.resamples, sigma=args.sigma
        )
        n = max(r["usable"], 1)
        print(
            f"{law:<10} {r['usable']:>6}  {r['held']['next'] / n:>10.0%}  {r['width']['next']:>10.2%}"
            f"   {r['held']['last'] / n:>10.0%}  {r['width']['last']:>10.2%}   {r['seconds']:>10.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
