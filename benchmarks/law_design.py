"""Benchmark: does a designed quarter of a paper study recover what the full study finds?

For each synthetic study from the project's paper-law generator (its noise included):

- CPT (Chinchilla laws for source and from-scratch runs, the CPT law): the 42 sizes of
  `cpt_paper`, 20×N tokens, the trainer's log evaluation schedule plus periodic points, a run's
  cost 6·N·D; the two largest sizes held out of every design.
- MT (BLEU log-law and cross-entropy power law per series): `mt_paper`'s series for the tasks
  asked for (default en-de: T5-3B and T5-770M, every mixture and Df), the truth of
  `studies.paper_truth.mt_truth`, pretraining runs cut into segments that the finetunes need
  (pretraining is a required parent), the largest checkpoint of each series held out.

it designs a subset for 25% of the full study's chip-hours (`fitting.design.choose`), draws one
realisation of every run, fits the FULL study with its bootstrap (95% intervals, whole runs
resampled) and the designed subset, and prints per parameter the interval, the designed value and
whether it is inside, the held-out runs' final-value errors, the same for random subsets of equal
cost (mean over seeds), and PASS/FAIL per target (compute ≤ 25%, every parameter inside, held-out
error ≤ 2%). For MT it also prints the project's own convention (laws fitted on each series' four
smallest checkpoints, `fitting.design.simulate_mt`) and the finetuning recipe's bound.

    .venv/bin/python benchmarks/law_design.py [--plot DIR] [--seeds 0,1,2] [--quick]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # 2 shared cores: one BLAS thread per process

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fitting.design import choose, simulate, simulate_mt  # noqa: E402
from fitting.design.snapshots import Snapshot  # noqa: E402

MT_MANIFEST = ROOT / "launch" / "manifests" / "mt_paper.toml"
FRACTION = 0.25
RECIPE_STEPS = {"paper_300": 300, "raffel_2^18": 2**18}


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def mt_study(tasks, *, recipe: str, n_fit: int | None, sigma: float) -> simulate.SimStudy:
    """`mt_paper`'s finetuning series of `tasks` with the paper-law truth (see the docstring)."""
    from modeling import family
    from studies import paper_truth

    manifest = tomllib.loads(MT_MANIFEST.read_text())
    t5 = family.get("t5")
    pretrain_steps = manifest["strategies"]["pretrain"]["budget"]["steps"]
    short = {  # [[override]]s of the pretraining steps (ro-mC4: 510k)
        o["where"]["mixture"]: o["budget"]["steps"]
        for o in manifest.get("override", [])
        if o["where"].get("strategy") == "pretrain" and "budget" in o
    }
    series, pretrained = [], {}
    for grid in manifest["grid"]:
        if "finetune" not in grid["strategies"] or not set(grid.get("tasks", ())) & set(tasks):
            continue
        for size in grid["sizes"]:
            total, _ = t5.param_counts(t5.get_config(size))
            for mixture in grid["mixtures"]:
                name = f"{size}/{mixture}"
                steps = short.get(mixture, pretrain_steps)
                pretrained[name] = simulate_mt.Pretrained(float(total), steps)
                for task in set(grid["tasks"]) & set(tasks):
                    for df in grid["finetune_tokens"]:
                        laws = {
                            m: dict(paper_truth.mt_truth(size, mixture, task, df, m).params)
                            for m in ("bleu", "loss")
                        }
                        key = f"{size}/{mixture}/{task}/{df}"
                        series.append(simulate_mt.Series(key, name, laws["bleu"], laws["loss"]))
    return simulate_mt.mt_study(
        series,
        pretrained,
        init_steps=manifest["axes"]["init_steps"],
        finetune_steps=RECIPE_STEPS[recipe],
        n_fit=n_fit,
        bleu_sigma=sigma,
        ce_sigma=sigma,
    )


def _design_and_check(args, study, bootstrap):
    """The design for 25% of the study, one realisation, the full fit with its bootstrap, the
    design's check and those of random subsets of equal cost."""
    budget = FRACTION * study.full_cost
    design = choose.choose(
        study.model,
        study.candidates,
        budget,
        targets=study.targets,
        criterion=args.criterion,
        exclude=study.held_out,
    )
    values = simulate.draw(study, args.seed)
    everything = [c.key for c in study.candidates]
    full = simulate.fit(study, values, everything, bootstrap=bootstrap, seed=args.seed)
    check = simulate.check(study, design.keys, values=values, full=full)
    randoms = []
    for s in range(args.seed + 1, args.seed + 1 + args.random):
        r = choose.random_design(
            study.model, study.candidates, budget, seed=s, exclude=study.held_out
        )
        randoms.append(simulate.check(study, r.keys, values=values, full=full))
    return design, values, full, check, randoms


def _summary(label: str, checks) -> str:
    inside = np.mean([c.n_inside for c in checks])
    err = np.mean([c.max_error for c in checks])
    frac = np.mean([c.fraction for c in checks])
    n = len(checks[0].params)
    shown = f"{err:7.2%}" if math.isfinite(err) else "unfit (a series or law lacks points)"
    return (
        f"  {label:<28s} compute {frac:6.1%}  params inside {inside:5.1f}/{n}  "
        f"max held-out error {shown}"
    )


def _targets_lines(check) -> list[str]:
    return [
        f"  compute ≤ 25% of the full study ........ {check.fraction:6.1%}  "
        f"{_verdict(check.fraction <= FRACTION + 1e-9)}",
        f"  every parameter in the full 95% CI ..... {check.n_inside}/{len(check.params)}  "
        f"{_verdict(check.params_pass)}",
        f"  held-out final value within 2% ......... max {check.max_error:.2%}  "
        f"{_verdict(check.held_out_pass)}",
    ]


def _passes(check) -> bool:
    return check.fraction <= FRACTION + 1e-9 and check.params_pass and check.held_out_pass


def run_cpt(args) -> tuple[list[str], bool, int]:
    """The CPT study (see the module docstring): the printed lines, whether the design met
    every target, and how many random subsets did."""
    t0 = time.time()
    study = simulate.cpt_study(simulate.paper_sizes(), run_sigma=args.run_sigma)
    design, values, full, check, randoms = _design_and_check(args, study, args.bootstrap)
    lines = [
        f"== CPT study (Chinchilla: source, scratch; CPT law) — {len(study.candidates)} runs, "
        f"{study.full_cost:.4g} chip-hours, criterion {args.criterion!r}, "
        f"{args.bootstrap} bootstrap resamples, seed {args.seed}"
        + (f", run offset tau {args.run_sigma:g}" if args.run_sigma else ""),
        f"  design: {len(design.keys)} runs, {design.cost:.4g} chip-hours "
        f"({design.fraction:.1%}); held out: {', '.join(study.held_out)}",
        f"  {'parameter':<14s} {'full':>10s} {'95% CI lo':>10s} {'95% CI hi':>10s} "
        f"{'design':>10s}  inside   {'random inside':>13s}",
    ]
    for i, p in enumerate(check.params):
        r_in = sum(r.params[i].inside for r in randoms)
        lines.append(
            f"  {p.name:<14s} {p.full:10.5g} {p.lo:10.5g} {p.hi:10.5g} {p.design:10.5g}  "
            f"{'yes' if p.inside else 'NO ':<6s}   {r_in:>5d}/{len(randoms)}"
        )
    lines.append("  held-out final loss (observed, designed fit's prediction, error):")
    for h in check.held_out:
        lines.append(f"    {h.key:<20s} {h.observed:8.4f} {h.predicted:8.4f} {h.error:7.2%}")
    lines += [
        _summary(f"design ({args.criterion})", [check]),
        _summary(f"random x{len(randoms)} (mean)", randoms),
        "  targets:",
        *_targets_lines(check),
        f"  ({time.time() - t0:.0f} s)",
    ]
    if args.plot:
        lines.append(_plot(args, "cpt", study, values, full, design.keys, check))
    return lines, _passes(check), sum(map(_passes, randoms))


def run_mt(args) -> tuple[list[str], bool, int]:
    """The MT study (see the module docstring), returned as `run_cpt` does."""
    t0 = time.time()
    study = mt_study(args.mt_tasks, recipe=args.recipe, n_fit=None, sigma=args.mt_sigma)
    design, values, full, check, randoms = _design_and_check(args, study, args.mt_bootstrap)
    pre = sum(c.cost for c in study.candidates if not c.points) / study.full_cost
    n_series = len(study.held_out)
    lines = [
        f"== MT study (BLEU log-law, cross-entropy power law per series) — tasks "
        f"{','.join(args.mt_tasks)}, recipe {args.recipe}: {n_series} series, "
        f"{len(study.candidates)} runs and pretraining segments, {study.full_cost:.4g} chip-hours "
        f"(pretraining {pre:.1%}), criterion {args.criterion!r}, {args.mt_bootstrap} bootstrap "
        f"resamples, noise σ {args.mt_sigma:g}, seed {args.seed}",
        "  every point fitted (n_fit = all), full sweep: 8 checkpoints per series; design: "
        f"{sum(k.startswith('finetune') for k in design.keys)} finetunes, "
        f"{design.cost:.4g} chip-hours ({design.fraction:.1%})",
        f"  {'series':<40s} {'BLEU in':>7s} {'CE in':>5s} {'BLEU err':>8s} {'CE err':>7s}",
    ]
    errors = {(h.key, h.block.split("/")[0]): h.error for h in check.held_out}
    for held in study.held_out:
        series = held.split("/", 1)[1].rsplit("@", 1)[0]
        b_in = sum(p.inside for p in check.params if p.name.startswith(f"bleu/{series}."))
        c_in = sum(p.inside for p in check.params if p.name.startswith(f"ce/{series}."))
        lines.append(
            f"  {series:<40s} {b_in:>5d}/3 {c_in:>3d}/3 {errors[(held, 'bleu')]:8.2%} "
            f"{errors[(held, 'ce')]:7.2%}"
        )
    outside = [p.name for p in check.params if not p.inside]
    lines += [
        f"  parameters outside the full CI: {len(outside)} "
        f"({', '.join(sorted({n.rsplit('.', 1)[1] for n in outside})) or 'none'})",
        _summary(f"design ({args.criterion})", [check]),
        _summary(f"random x{len(randoms)} (mean)", randoms),
        "  targets:",
        *_targets_lines(check),
    ]
    depth = {}
    for k in design.keys:
        if k.startswith("pretrain/"):
            name, step = k[len("pretrain/") :].rsplit("@", 1)
            depth[name] = max(depth.get(name, 0), int(step))
    lines.append(
        "  why: pretraining is {:.1%} of the compute, so 25% of it trains each model only so far "
        "(design: {}); each series is then fitted on a quarter of the full sweep's Dp range, "
        "whose 8-checkpoint intervals are narrower than that extrapolation".format(
            pre, ", ".join(f"{n} to {s // 1000}k" for n, s in sorted(depth.items()))
        )
    )
    lines += _mt_convention(args, study, values)
    lines.append(f"  ({time.time() - t0:.0f} s)")
    if args.plot:
        lines.append(_plot(args, "mt", study, values, full, design.keys, check))
    return lines, _passes(check), sum(map(_passes, randoms))


def _mt_convention(args, study_all, values) -> list[str]:
    """The project's convention (fit the 4 smallest checkpoints, score the rest), and what the
    other finetuning recipe costs."""
    study = mt_study(args.mt_tasks, recipe=args.recipe, n_fit=4, sigma=args.mt_sigma)
    keys = simulate_mt.first_checkpoints(study, 4)
    everything = [c.key for c in study.candidates]
    full = simulate.fit(study, values, everything)
    check = simulate.check(study, keys, values=values, full=full)
    same = all(p.design == p.full for p in check.params)
    other = "raffel_2^18" if args.recipe == "paper_300" else "paper_300"
    alt = mt_study(args.mt_tasks, recipe=other, n_fit=4, sigma=args.mt_sigma)
    alt_keys = simulate_mt.first_checkpoints(alt, 4)
    alt_frac = sum(alt.candidate(k).cost for k in alt_keys) / alt.full_cost
    alt_min = sum(alt.candidate(k).cost for k in simulate_mt.first_checkpoints(alt, 3))
    return [
        "  project convention (each series fitted on its 4 smallest checkpoints, the rest held "
        "out; `fitting.laws.downstream_laws`):",
        f"    design = those 4 checkpoints + pretraining to step "
        f"{max(int(k.rsplit('@', 1)[1]) for k in keys)}: {check.fraction:.1%} of the compute; "
        f"parameters identical to the full sweep's: {same}",
        f"    held-out largest checkpoint predicted: max error {check.max_error:.2%}  "
        f"{_verdict(check.held_out_pass and check.fraction <= FRACTION and same)}",
        f"    with recipe {other}: the 4 smallest checkpoints cost {alt_frac:.1%} of that study "
        f"(3, the fewest a 3-parameter law needs: {alt_min / alt.full_cost:.1%}) — finetunes "
        "dominate its compute, so no design that fits every series can reach 25%",
    ]


def _snapshots(study, values, order, fractions, bootstrap, seed) -> list[Snapshot]:
    """Refits on prefixes of `order` at the given fractions of its compute."""
    by_key = {c.key: c for c in study.candidates}
    total = sum(by_key[k].cost for k in order)
    out = []
    for f in fractions:
        spent, prefix = 0.0, []
        for k in order:
            if spent + by_key[k].cost > f * total + 1e-9:
                break
            prefix.append(k)
            spent += by_key[k].cost
        fit = simulate.fit(study, values, prefix, bootstrap=bootstrap, seed=seed)
        params = {k: v for k, v in fit.params.items() if math.isfinite(v)}
        ci = {k: v for k, v in fit.ci.items() if k in params}
        if params:
            out.append(Snapshot(fit.chip_hours, params, ci))
    return out


def _plot(args, name, study, values, full, design_keys, check) -> str:
    """Snapshots of the full sweep (its runs as they would finish: small models, early
    checkpoints first) and of the design (in its order), their JSON lines, the report section
    and the figure."""
    from fitting.reports import design_report

    out = Path(args.plot)
    out.mkdir(parents=True, exist_ok=True)

    def when(c):  # a sweep in time: small models (CPT), early checkpoints (MT) first
        last = max((p.inputs[-1] for p in c.points), default=math.inf)
        return (last, c.cost, c.key)

    in_time = [c.key for c in sorted(study.candidates, key=when) if c.key not in study.held_out]
    order = []
    for k in in_time:
        order += choose.closure(k, {c.key: c for c in study.candidates}, set(order))
    b = min(args.bootstrap, 30) if name == "cpt" else min(args.mt_bootstrap, 10)
    sweeps = {
        "full": [
            *_snapshots(study, values, order, (0.1, 0.25, 0.5), b, args.seed),
            Snapshot(full.chip_hours, full.params, full.ci),
        ],
        "designed": _snapshots(study, values, list(design_keys), (0.5, 0.75, 1.0), b, args.seed),
    }
    for sweep, snaps in sweeps.items():
        text = "".join(s.to_json() + "\n" for s in snaps)
        (out / f"{name}_{sweep}.jsonl").write_text(text)
    params = list(study.model.names) if name == "cpt" else list(study.model.names)[:6]
    png = design_report.plot(sweeps, out / f"{name}_design.png", params=params, title=name)
    md = design_report.section(
        sweeps, title=f"{name.upper()}: designed against full", params=params, plot_path=png.name
    )
    (out / f"{name}_design.md").write_text(md)
    return f"  plot: {png}"


STUDIES = {"cpt": run_cpt, "mt": run_mt}


def main(argv=None) -> int:
    """Runs the studies and prints the tables (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--studies", default="cpt,mt", help=f"of {', '.join(STUDIES)}")
    p.add_argument(
        "--seeds",
        default="0",
        type=lambda s: [int(x) for x in s.split(",")],
        help="realisations drawn, e.g. 0,1,2 (a summary line counts those that pass)",
    )
    p.add_argument("--bootstrap", type=int, default=100, help="CPT bootstrap resamples")
    p.add_argument("--mt-bootstrap", type=int, default=20, help="MT bootstrap resamples")
    p.add_argument("--random", type=int, default=3, help="random subsets of equal cost")
    p.add_argument("--criterion", default="d_optimal", choices=list(choose.CRITERIA))
    p.add_argument(
        "--mt-sigma",
        type=float,
        default=None,
        help="MT noise (σ of log BLEU and log CE); default: the paper study's (paper_truth.Truth)",
    )
    p.add_argument(
        "--run-sigma",
        type=float,
        default=0.0,
        help="CPT: a run's own offset of its log loss (tau), shared by its evaluations, drawn "
        "by the generator and known to the design (default 0: independent evaluations)",
    )
    p.add_argument("--mt-tasks", default="mt_en_de", type=lambda s: s.split(","))
    p.add_argument("--recipe", default="paper_300", choices=list(RECIPE_STEPS))
    p.add_argument("--plot", default=None, help="write snapshots, report section and figures")
    p.add_argument("--quick", action="store_true", help="fewer resamples and random subsets")
    args = p.parse_args(argv)
    if args.mt_sigma is None:
        from studies import paper_truth

        args.mt_sigma = paper_truth.Truth().mt_sigma
    if args.quick:
        args.bootstrap, args.mt_bootstrap, args.random = 30, 10, 1
    names = args.studies.split(",")
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        p.error(f"--studies {unknown}: allowed {', '.join(STUDIES)}")
    t0 = time.time()
    for n in names:
        passed, random_passed = 0, 0
        for seed in args.seeds:
            args.seed = seed
            lines, ok, n_random = STUDIES[n](args)
            print("\n".join(lines), flush=True)
            passed, random_passed = passed + ok, random_passed + n_random
        if len(args.seeds) > 1:
            print(
                f"== {n.upper()}: the design met every target in {passed}/{len(args.seeds)} "
                f"realisations; random subsets of equal cost in {random_passed}/"
                f"{len(args.seeds) * args.random}"
            )
    print(f"total {time.time() - t0:.0f} s (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
