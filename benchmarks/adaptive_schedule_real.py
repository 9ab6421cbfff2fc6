"""Benchmark: on the demo's real CPU runs, does an adaptive sweep refitting the schedule-aware law
(`xlscale sweep run --adaptive --adaptive-law lr_area`) predict the largest size's runs, still
pending, from the three smaller sizes' finished runs?

Needs the demo study trained (`xlscale demo`; for other seeds, its source/scratch/CPT runs again
with `seeds = [...]` in a copy of `launch/manifests/demo.toml`, in the same runs directory) and a
pilot fit of the law (`xlscale fit RUNS --law lr_area`, its fits.json) for the sweep's λ and
reference scales. Per seed it builds the sweep's study as `--adaptive-law lr_area` does
(`launch.sweep_design.STUDIES`), refits it on the finished runs of every size but the largest
(`launch.adaptive_fit.refit`, every evaluation a point), prices and predicts each pending
largest run (`launch.adaptive_fit.assess`), and prints the prediction against the final loss that
run logged, PASS where the error is within `--band` (default 1.24%: the README's 2σ_run, the
run-to-run noise of seeds 0 and 1), and its 95% interval (`--bootstrap` simulated refits per
block, moved and widened as the sweep does; '!' where it misses the logged loss): a run whose
half-width is under the sweep's `--tolerance` would be skipped.

    python benchmarks/adaptive_schedule_real.py --runs-dir demo_out/runs \
        --prior fit_lr_area/fits.json --seeds 0,1,2

The pilot's λ matters (README, "Measured"); a pilot fitted on the same seeds' runs, the largest
included, lends them its λ and scales (not its parameters: the refit starts from fixed points).
"""

from __future__ import annotations

import argparse
import re

from fitting.readers import run_dirs
from launch import adaptive_fit, sweep, sweep_design


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-dir", required=True, help="the demo's runs directory")
    p.add_argument("--prior", required=True, help="fits.json of `xlscale fit RUNS --law lr_area`")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    p.add_argument("--band", type=float, default=0.0124, help="pass band (default 0.0124)")
    p.add_argument(
        "--bootstrap", type=int, default=50, help="simulated refits per block (default 50)"
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Prints, per seed and block, the pending largest run's prediction against its log."""
    args = _parse(argv)
    runs = sweep.expand(sweep.load_manifest("demo"))
    study = sweep_design.STUDIES["lr_area"](runs, args.prior, hardware=None, mfu=0.5)
    sizes = sorted(
        {r.size for r in runs},
        key=lambda s: next(r.counts.params_non_embedding for r in runs if r.size == s),
    )
    largest = sizes[-1]
    pending = [c for c in study.candidates if c.points and f"_{largest}_" in c.key + "_"]
    data = {r.run_id: r for r in run_dirs.read_runs(args.runs_dir)}
    print(f"# prior {study.prior}; largest size {largest}; band {args.band:.2%}")
    print(
        f"{'seed':>4}  {'block':8}  {'run':44}  {'predicted':>9}  {'logged':>7}  {'error':>7}  "
        f"{'95% interval':>17}  {'±':>6}  verdict"
    )
    worst, held, intervals = {}, 0, 0
    for seed in (int(s) for s in args.seeds.split(",")):
        mine = {
            k: v for k, v in data.items() if f"_s{seed}-" in k and not k.startswith("cpt_replay")
        }
        seen = {k: v for k, v in mine.items() if largest not in k}
        obs = adaptive_fit.Observation({k: "done" for k in seen}, {}, seen, digest=f"s{seed}")
        state = adaptive_fit.refit(
            study.model, obs, run_blocks={}, basis="exact", bootstrap=args.bootstrap, seed=0,
            chip_hours=0.0, scales=study.scales,
        )  # fmt: skip
        for cand in pending:
            block = cand.points[0].block
            slug = re.sub(r"_s0-[0-9a-f]+$", f"_s{seed}-", cand.key)
            found = [k for k in mine if k.startswith(slug)]
            if not found or block not in state.fits:
                why = state.why_not.get(block, "")
                print(f"{seed:>4}  {block:8}  {slug:44}  (no run or no fit: {why})")
                continue
            run = mine[found[0]]
            key = f"eval/lm_{run.target_lang}/loss"
            logged = next(r[key] for r in reversed(run.records) if key in r)
            stub = type(
                "PendingRun", (), {"run_id": cand.key, "steps": max(r.steps for r in runs)}
            )()
            waiting = adaptive_fit.Observation({cand.key: "pending"}, {}, {}, digest="pending")
            (assessed,) = adaptive_fit.assess(
                study.model, {cand.key: cand}, [stub], waiting, state
            ).values()
            error = assessed.predicted / logged - 1
            worst[seed] = max(worst.get(seed, 0.0), abs(error))
            verdict = "PASS" if abs(error) <= args.band else "FAIL"
            span = half = "-"
            if assessed.interval is not None:
                lo, hi = assessed.interval
                inside = lo <= logged <= hi
                held, intervals = held + inside, intervals + 1
                span = f"[{lo:.3f}, {hi:.3f}]" + ("" if inside else "!")
                half = f"{assessed.half_width:.2%}"
            print(
                f"{seed:>4}  {block:8}  {found[0]:44}  {assessed.predicted:9.4f}  {logged:7.4f}  "
                f"{error:+7.2%}  {span:>17}  {half:>6}  {verdict}"
            )
    for seed, w in worst.items():
        print(f"# seed {seed}: worst {w:.2%}: {'PASS' if w <= args.band else 'FAIL'}")
    if intervals:
        print(f"# the 95% interval held the logged loss in {held} of {intervals} ('!': missed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
