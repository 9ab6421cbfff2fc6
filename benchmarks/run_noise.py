"""Benchmark: are a sweep's predicted intervals honest when a run's evaluations share
its seed?

The paper-law generator's CPT study (`fitting.design.simulate.cpt_study`) is drawn with a per-run
offset τ (`--run-sigma`) on top of each evaluation's own noise σ (`--sigma`), as real runs are:
a seed moves its whole loss curve. For `--draws` realisations it fits every run (the project's
fits, `simulate.fit_cpt_study`), and prints:

- per parameter, the spread of the fitted values over the draws against the standard deviation
  that the design's Fisher information predicts (`fitting.design.information`, the delta method),
  once counting every evaluation as independent (τ = 0, σ² + τ² per point: what the design did
  before) and once with the run's shared offset (σ, τ); a ratio near 1 is an honest prediction,
  above 1 an overconfident one;
- σ and τ as `fitting.design.noise.run_noise` estimates them from the fits' log residuals, against
  the generator's;
- the information (log det, nats) a run's later half adds once its first half is in the fit,
  under each model (what `xlscale sweep run --adaptive` prices a running run's remaining
  evaluations at);
- with `--intervals N` (draws), the adaptive sweep's 95% interval for the final loss of the
  largest size's from-scratch run, not started or half done, as the other runs and its own
  evaluations so far fit the law (bootstrap over whole runs): how often it held the loss the run
  then logged, for the law's interval alone (before) and for the one moved by the run's own
  offset and widened by what is unknown of it (`launch.adaptive_fit.with_run_offset`).

    .venv/bin/python benchmarks/run_noise.py [--draws 40] [--sigma 0.002] [--run-sigma 0.006]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # 2 shared cores: one BLAS thread per process

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fitting.design import information, simulate  # noqa: E402
from fitting.design.noise import run_noise  # noqa: E402
from fitting.design.study import with_noise  # noqa: E402
from fitting.laws import formulas, robust_fit  # noqa: E402
from launch.adaptive_fit import with_run_offset  # noqa: E402

SIZES = (3e7, 6e7, 1.2e8, 2.5e8, 5e8, 1e9, 2e9, 4e9)


def predicted_sd(model, study) -> dict[str, float]:
    """Each study parameter's standard deviation under the model's noise (internal scale: log of
    scales, exponents as they are), from the information of every candidate run."""
    F = sum(information.candidate_information(model, study.candidates).values())
    cov = information.covariance(F)
    return {n: float(math.sqrt(max(cov[i, i], 0.0))) for i, n in enumerate(model.names)}


def internal(model, params: dict[str, float]) -> np.ndarray:
    """The fitted parameters on the information's scale (`StudyModel.to_internal`)."""
    return model.to_internal(params)


def interval_coverage(study, *, draws: int, seed: int, bootstrap: int) -> list[str]:
    """The printed lines of the interval check (see the module docstring)."""
    scratch = sorted(
        (c for c in study.candidates if c.key.startswith("scratch_")),
        key=lambda c: c.points[0].inputs[0],
    )
    target = scratch[-1]
    half = len(target.points) // 2
    inputs = np.asarray(target.points[-1].inputs)
    held = {"not started": 0, "half done": half}
    hits = {(k, m): 0 for k in held for m in ("law", "offset")}
    widths = {(k, m): [] for k in held for m in ("law", "offset")}
    done = 0
    for k in range(draws):
        values = simulate.draw(study, seed + 1000 + k)
        truth = float(values[target.key][-1])  # what the run logs at its end
        for label, seen in held.items():
            rows = [
                (p.inputs, v, c.key)
                for c in scratch
                for i, (p, v) in enumerate(zip(c.points, values[c.key], strict=True))
                if c is not target or i < seen
            ]
            x = np.asarray([r[0] for r in rows])
            y = np.asarray([r[1] for r in rows])
            runs = [r[2] for r in rows]
            fit = robust_fit.fit_chinchilla(
                x[:, 0], x[:, 1], y, runs=runs, bootstrap=bootstrap, seed=k,
                grid=simulate.SIM_GRID, series="scratch",
            )  # fmt: skip
            if not fit.converged or len(fit.samples) < 10:
                continue
            mean = float(fit.predict(*inputs))
            law = [float(formulas.predict("chinchilla", {**fit.params, **s}, *inputs))
                   for s in fit.samples]  # fmt: skip
            interval = tuple(float(v) for v in np.percentile(law, [2.5, 97.5]))
            residuals = np.log(y) - np.log(fit.predict(x[:, 0], x[:, 1]))
            mine = residuals[np.asarray(runs) == target.key]
            shown = {
                "law": (mean, interval),
                "offset": with_run_offset(mean, interval, run_noise(residuals, runs), mine),
            }
            for m, (centre, (lo, hi)) in shown.items():
                hits[label, m] += lo <= truth <= hi
                widths[label, m].append((hi - lo) / 2 / centre)
            done += label == "half done"
        if (k + 1) % 10 == 0:
            print(f"  intervals: {k + 1}/{draws} draws", flush=True)
    lines = [
        f"\n{target.key}'s final loss, {done} draws, {bootstrap} bootstrap resamples "
        "of whole runs:",
        "| run | interval | held the logged loss | median half-width |",
        "|---|---|---|---|",
    ]
    for label in held:
        for m, name in (("law", "the law's alone"), ("offset", "with the run's offset")):
            n = len(widths[label, m])
            lines.append(
                f"| {label} | {name} | {hits[label, m] / max(n, 1):.0%} "
                f"| {np.median(widths[label, m]) if n else float('nan'):.2%} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--sigma", type=float, default=0.002, help="one evaluation's log-loss noise")
    ap.add_argument("--run-sigma", type=float, default=0.006, help="a run's shared offset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--intervals", type=int, default=0, help="draws for the interval check")
    ap.add_argument("--bootstrap", type=int, default=40, help="resamples per interval fit")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    study = simulate.cpt_study(
        SIZES, held_out=1, sigma=args.sigma, run_sigma=args.run_sigma, log_points=12, periodic=6
    )
    keys = [c.key for c in study.candidates]
    points = sum(len(c.points) for c in study.candidates)
    print(
        f"CPT study: {len(SIZES)} sizes x (source, scratch, cpt), {points} evaluations; "
        f"generator sigma {args.sigma:g}, run sigma (tau) {args.run_sigma:g}; {args.draws} draws",
        flush=True,
    )
    fitted, noises = [], {b.name: [] for b in study.model.blocks}
    for k in range(args.draws):
        values = simulate.draw(study, args.seed + k)
        fit = simulate.fit_cpt_study(study, values, keys)
        if not fit.converged:
            continue
        fitted.append(internal(study.model, fit.params))
        # The fits' log residuals, grouped by run, as the adaptive refit reads them.
        for block, (x, y, runs) in simulate.block_points(study, values, keys).items():
            pred = study.model.predict(block, fit.params, x)
            est = run_noise(np.log(y) - np.log(pred), runs)
            if est is not None:
                noises[block].append((est.sigma, est.run_sigma))
        if (k + 1) % 10 == 0:
            rate = (k + 1) / (time.perf_counter() - t0)
            print(f"  {k + 1}/{args.draws} draws ({rate:.2f}/s)", flush=True)
    fitted = np.asarray(fitted)
    empirical = fitted.std(axis=0, ddof=1)
    total = math.hypot(args.sigma, args.run_sigma)
    independent = with_noise(study.model, {b.name: (total, 0.0) for b in study.model.blocks})
    shared = study.model  # σ and τ, as drawn
    sd_ind, sd_run = predicted_sd(independent, study), predicted_sd(shared, study)
    print(f"\n{len(fitted)} converged fits of the full sweep\n")
    print(
        "| parameter | spread over draws | predicted, independent | ratio "
        "| predicted, shared offset | ratio |"
    )
    print("|---|---|---|---|---|---|")
    ratios_ind, ratios_run = [], []
    for i, name in enumerate(study.model.names):
        ri, rr = empirical[i] / sd_ind[name], empirical[i] / sd_run[name]
        ratios_ind.append(ri)
        ratios_run.append(rr)
        print(
            f"| {name} | {empirical[i]:.4g} | {sd_ind[name]:.4g} | {ri:.2f} "
            f"| {sd_run[name]:.4g} | {rr:.2f} |"
        )
    print(
        f"\nmedian ratio (spread / predicted): independent {np.median(ratios_ind):.2f}, "
        f"shared offset {np.median(ratios_run):.2f}"
    )
    print("\n| block | sigma estimated (truth) | tau estimated (truth) |")
    print("|---|---|---|")
    for block, rows in noises.items():
        if rows:
            s, t = np.mean(rows, axis=0)
            print(f"| {block} | {s:.4g} ({args.sigma:g}) | {t:.4g} ({args.run_sigma:g}) |")
    # A running run's later half (the largest fitted size's scratch run): what it adds once its
    # first half is in the fit, with every other run, as each model prices it.
    cand = [c for c in study.candidates if c.key.startswith("scratch_")][-2]
    others = [c for c in study.candidates if c.key != cand.key]
    pts = information.run_points(cand.points, cand.key)
    half = len(pts) // 2
    gains = {}
    for label, model in (("independent", independent), ("shared offset", shared)):
        rest = sum(information.candidate_information(model, others).values())
        before = rest + information.fisher(model, pts[:half])
        after = rest + information.fisher(model, pts)
        gains[label] = information.log_det(after) - information.log_det(before)
    print(
        f"\n{cand.key} half done: its last {len(pts) - half} evaluations add "
        + ", ".join(f"{v:.3g} nats ({k})" for k, v in gains.items())
    )
    if args.intervals:
        lines = interval_coverage(
            study, draws=args.intervals, seed=args.seed, bootstrap=args.bootstrap
        )
        print("\n".join(lines))
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
