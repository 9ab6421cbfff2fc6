"""`xlscale sweep plan|run|status|select MANIFEST`: plan, launch, summarise a sweep manifest,
and make its `[[select]]` choices (selection.json; `xlscale sweep run` makes them itself).

    xlscale sweep plan cpt_paper                       # runs, N, tokens, FLOPs, steps, est. time
    xlscale sweep run demo --var DATA_DIR=... --var VOCAB_PATH=... --launcher local
    xlscale sweep run cpt_paper --launcher tpu_vm --tpu my-v4 --zone us-central2-b --dry-run
    xlscale sweep status demo --runs-dir demo_out/runs
    xlscale sweep select mt_paper --var DATA_DIR=... --var VOCAB_PATH=...   # writes selection.json
    xlscale sweep run mt_paper --runner t5x --t5x-dir ~/t5x --launcher xmanager --dry-run

MANIFEST is a path or the name of a manifest shipped in `launch/manifests/`.
"""

from __future__ import annotations

import argparse
import json
import sys

from launch import cli_options, estimate, launchers, run_selection, t5x_runner, zeroshot_stage
from launch import status as run_states
from launch.adaptive_loop import SteeringError
from launch.runs import RUNNERS
from launch.sweep import expand, load_manifest, select
from xlscale_cli import sweep_adaptive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `plan`, `run`, `status` and `select` actions and their options."""
    actions = parser.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    cli_options.add_manifest_arguments(common)
    cli_options.repeatable(
        common,
        "--only",
        metavar="GLOB",
        help="only runs whose id matches (plus their dependencies)",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument(
        "--runner",
        choices=sorted(RUNNERS),
        help="what runs each job: xlscale's trainer, or real T5X's t5x.train (default: the "
        "manifest's [sweep] runner, else xlscale)",
    )
    common.add_argument(
        "--t5x-dir", help="T5X's source checkout, for --runner t5x (default: $T5X_DIR)"
    )
    common.add_argument(
        "--repo-dir",
        help="the xlscale checkout where the T5X jobs run, for --runner t5x "
        "(<repo>/t5x_configs; default: this checkout)",
    )

    plan = actions.add_parser("plan", parents=[common], help="list the runs with cost estimates")
    plan.add_argument(
        "--step-time",
        type=float,
        metavar="SECONDS",
        help="seconds per step of the smallest run (instead of measuring one)",
    )
    plan.add_argument("--no-measure", action="store_true", help="no time estimates")
    plan.add_argument(
        "--hardware",
        metavar="SLICE",
        help="estimate on the hardware you book instead of this machine: a TPU slice "
        "(v5p-128, v5e-16, v4-8, v6e-256) or GPUs (8xH100, 64xA100); prints chip-hours and "
        "per run the remat policy and microbatches that fit one chip (default: the manifest's "
        "[sweep] hardware)",
    )
    plan.add_argument(
        "--mfu",
        type=float,
        default=0.5,
        help="model FLOPs utilisation assumed with --hardware (default 0.5)",
    )

    run = actions.add_parser("run", parents=[common], help="launch the runs in dependency order")
    run.add_argument(
        "--hardware",
        metavar="SLICE",
        help="give every run the remat policy and NUM_MICROBATCHES that fit one chip of this "
        "slice (e.g. v5p-128, 8xH100; default: the manifest's [sweep] hardware, else as set)",
    )
    run.add_argument("--launcher", choices=sorted(launchers.LAUNCHERS), default="local")
    run.add_argument("--dry-run", action="store_true", help="print what would run; start nothing")
    run.add_argument("--retries", type=int, default=0, help="restarts of a failed run")
    for name in sorted(launchers.LAUNCHERS):
        group = run.add_argument_group(f"{name} launcher")
        launchers.get_launcher(name).add_arguments(group)
    sweep_adaptive.add_run_arguments(run)
    sweep_adaptive.add_actions(actions, common)

    status = actions.add_parser("status", parents=[common], help="summarise the runs' progress")
    status.add_argument(
        "--stale",
        type=float,
        default=900.0,
        help="seconds without new metrics before a run counts as stopped",
    )
    status.add_argument(
        "--report",
        metavar="DIR",
        help="also write an adaptive sweep's report section and plot (its fits' estimates and "
        "95%% intervals against chip-hours spent) to DIR/adaptive.md and DIR/adaptive.png",
    )
    status.add_argument(
        "--scheduler",
        choices=["auto", "slurm", "none"],
        default="auto",
        help="join each run's SLURM job (id, state, reason, requeues) from squeue; auto: where "
        "squeue and a slurm.conf are installed",
    )
    _add_design_parser(actions, common)
    choose = actions.add_parser(
        "select",
        parents=[common],
        help="choose the best run of each [[select]] group; write <runs_dir>/selection.json",
    )
    choose.add_argument(
        "--stale",
        type=float,
        default=900.0,
        help="seconds without new metrics before a run counts as stopped",
    )


def _manifest(args):
    paths = t5x_runner.T5xPaths.resolve(t5x_dir=args.t5x_dir, repo_dir=args.repo_dir)
    return load_manifest(
        args.manifest,
        variables=cli_options.manifest_variables(args),
        runs_dir=args.runs_dir,
        runner=args.runner,
        t5x_paths=paths,
    )


def _only(args, manifest):
    def narrow(runs):
        if not args.only:
            return runs
        runs = select(runs, args.only)
        if not runs:
            raise ValueError(f"no run id of {manifest.name} matches {args.only}")
        return runs

    return narrow


def _runs(args):
    manifest = _manifest(args)
    runs = expand(manifest, selection=run_selection.read(manifest.runs_dir))
    return manifest, _only(args, manifest)(runs)


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "?" if value is None else format(value, spec)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, ["-" * w for w in widths], *rows]
    ]
    return "\n".join(lines)


def plan(args) -> int:
    """Prints one row per run: id, strategy, N, tokens, FLOPs, steps, batch, estimated time."""
    manifest, runs = _runs(args)
    hardware = None
    if args.hardware or manifest.hardware:
        if args.step_time:
            raise ValueError("--hardware and --step-time both set; allowed: one of them")
        hardware = estimate.parse_hardware(args.hardware or manifest.hardware)
        throughput, why = estimate.hardware_throughput(hardware, mfu=args.mfu), ""
    else:
        throughput, why = estimate.throughput_for(
            runs, step_time=args.step_time, measure_step=not args.no_measure
        )
    if throughput is None:
        print(f"# no time estimates: {why}", file=sys.stderr)
    rows = estimate.plan_rows(runs, throughput)
    chips = hardware.chips if hardware else None
    for row in rows:  # chip-hours: what a booking costs (only for booked hardware)
        seconds = row["estimated_s"]
        row["chip_hours"] = None if chips is None or seconds is None else chips * seconds / 3600
    if hardware:
        for row, r in zip(rows, runs, strict=True):
            row.update(_memory_columns(estimate.memory_plan(r, hardware)))
    if args.json:
        print(json.dumps({"manifest": manifest.name, "runs": rows}, indent=1))
        return 0
    print(f"# {manifest.name}: {len(runs)} runs — {manifest.description}".rstrip(" —"))
    if throughput:
        print(f"# time estimates: {throughput.flops_per_s:.3g} FLOP/s, {throughput.source}")
    header = ["run id", "N", "tokens", "FLOPs (6ND)", "steps", "batch", "est. time"]
    header += ["chip-hours", "remat", "micro", "GiB/chip", "fits"] if hardware else []
    table = [
        [
            row["run_id"],
            _fmt(row["params_non_embedding"]),
            _fmt(row["tokens"]),
            _fmt(row["flops"]),
            str(row["steps"]),
            str(row["batch_size"]),
            run_states.format_seconds(row["estimated_s"]) if throughput else "-",
        ]
        + (
            [
                _fmt(row["chip_hours"], ",.0f"),
                row["remat_policy"] or "?",
                _fmt(row["num_microbatches"], "d"),
                _fmt(row["gib_per_chip"], ".1f"),
                {True: "yes", False: "NO", None: "?"}[row["fits"]],
            ]
            if hardware
            else []
        )
        for row in rows
    ]
    print(_table(header, table))
    if hardware:
        chip = estimate.chip_of(hardware)
        print(
            f"# memory: per run the cheapest remat policy, then the fewest microbatches, whose "
            f"estimate fits one {chip.name} ({chip.usable / 2**30:.1f} GiB usable of "
            f"{chip.memory / 2**30:.1f} GiB), FSDP over {hardware.chips} chips; `sweep run "
            f"--hardware {hardware.name}` (or [sweep] hardware) sets them as "
            "MODEL_OVERRIDES['remat_policy'] and NUM_MICROBATCHES"
        )
    for line in _plan_notes(manifest, runs, rows):
        print(line)
    flops = [r.flops for r in runs]
    total_s = [row["estimated_s"] for row in rows]
    total_flops = "?" if None in flops else f"{sum(flops):.3g}"
    total_time = run_states.format_seconds(None if None in total_s else sum(total_s))
    where = f"on {hardware.name}, one run after another" if hardware else "on this machine"
    total = f"# total: {sum(r.tokens for r in runs):.3g} tokens, {total_flops} FLOPs (6ND)"
    if throughput:
        total += f", about {total_time} {where}"
    if hardware and None not in total_s:
        total += f", {hardware.chips * sum(total_s) / 3600:,.0f} chip-hours"
    print(total)
    return 0


def _memory_columns(plan) -> dict:
    """A run's memory-plan fields for the plan table and JSON (None where unknown)."""
    if plan is None:
        return {"remat_policy": None, "num_microbatches": None, "gib_per_chip": None, "fits": None}
    return {
        "remat_policy": plan.remat_policy,
        "num_microbatches": plan.num_microbatches,
        "gib_per_chip": plan.estimate.total / 2**30,
        "fits": plan.fits,
    }


def _planned(args, manifest, runs):
    """`runs` with the memory plan of `--hardware` (or the manifest's) applied, each run's
    policy printed; unchanged without one."""
    name = getattr(args, "hardware", None) or manifest.hardware
    if not name:
        return runs
    hardware = estimate.parse_hardware(name)
    planned = []
    for r in runs:
        plan = estimate.memory_plan(r, hardware)
        if plan is None:
            planned.append(r)
            continue
        if not plan.fits:
            print(
                f"# {r.run_id}: no remat policy or microbatch count fits one chip of {name} "
                f"(est. {plan.estimate.total / 2**30:.1f} GiB with 'full'); use more chips",
                file=sys.stderr,
            )
        planned.append(estimate.with_memory_plan(r, plan))
    return planned


def _plan_notes(manifest, runs, rows) -> list[str]:
    """Comment lines under the plan: model vocabularies, gin-axis grids, [[select]] stages."""
    vocab: dict[int | None, set[str]] = {}
    for row in rows:
        vocab.setdefault(row["vocab_size"], set()).add(row["size"])
    lines = [f"# vocab_size {v}: {', '.join(sorted(s))}" for v, s in sorted(vocab.items(), key=str)]
    grids: dict[tuple, list[int]] = {}
    for i, grid in enumerate(manifest.grids):
        for macro, values in grid.get("gin_axes", {}).items():
            grids.setdefault((macro, tuple(values), tuple(grid["strategies"])), []).append(i)
    for (macro, values, strategies), where in grids.items():
        lines.append(
            f"# grid over {macro} = {list(values)} ({', '.join(strategies)}; "
            f"grid {', '.join(map(str, where))})"
        )
    for spec in manifest.selects:
        waiting = sum(
            r.waits_for_selection and r.selected_from.startswith(f"{spec.name}:") for r in runs
        )
        lines.append(
            f"# [[select]] {spec.name}: {spec.rule} {spec.metric} over {list(spec.over)} "
            f"of {spec.strategy} runs"
            + (f"; {waiting} runs wait for its choices" if waiting else "")
        )
    staged = [r for r in runs if r.zeroshot is not None]
    if staged:  # [zeroshot]: what `sweep run` scores after each run's training
        tasks = sorted({t for r in staged for t in r.zeroshot.tasks})
        lines.append(
            f"# [zeroshot]: {len(staged)} runs scored after training on {len(tasks)} task(s) "
            f"({', '.join(tasks)}), limit {staged[0].zeroshot.limit or 'none'} "
            "(`python -m evals.score_run`)"
        )
    return lines


def _candidate_values(candidates, over) -> str:
    """`0.001=3.2 0.003=2.9 ...`: each candidate's grid value(s) and metric value."""
    return " ".join(
        f"{'/'.join(str(c['coords'][o]) for o in over)}={_fmt(c['value'], '.4g')}"
        for c in candidates
    )


def choose(args) -> int:
    """Decides the [[select]] groups whose candidates have finished; writes selection.json."""
    manifest = _manifest(args)
    runs = expand(manifest, selection=run_selection.read(manifest.runs_dir))
    if not manifest.selects:
        raise ValueError(f"{manifest.path} has no [[select]] tables; nothing to choose")
    document = run_selection.decide(manifest, runs, stale_s=args.stale)
    path = run_selection.write(manifest.runs_dir, document)
    if args.json:
        print(json.dumps(document, indent=1, default=str))
        return 0
    print(f"# {manifest.name}: wrote {path}")
    for name, stage in document["selections"].items():
        print(f"# [[select]] {name}: {stage['rule']} {stage['metric']} over {stage['over']}")
        rows = [
            [group, decided["chosen"], _candidate_values(decided["candidates"], stage["over"])]
            for group, decided in sorted(stage["groups"].items())
        ]
        rows += [
            [group, "(pending)", f"{len(ids)} runs not finished"]
            for group, ids in stage["pending"].items()
        ]
        rows += [[group, "(none)", why] for group, why in stage["failed"].items()]
        print(_table(["group", "chosen", "candidates"], rows))
    return 0


def _add_design_parser(actions, common) -> None:
    """The `design` action's options."""
    p = actions.add_parser(
        "design",
        parents=[common],
        help="choose the manifest's runs for a compute budget; write a manifest that runs them",
    )
    p.add_argument("--budget", type=float, required=True, metavar="CHIP_HOURS")
    p.add_argument(
        "--hardware",
        metavar="SLICE",
        help="what the budget buys: a TPU slice (v5p-8, v5p-128, ...) or GPUs (8xH100, ...) "
        "(default: the manifest's [sweep] hardware)",
    )
    p.add_argument("--mfu", type=float, default=0.5, help="MFU assumed (default 0.5)")
    p.add_argument(
        "--criterion",
        default="d_optimal",
        help="d_optimal (default: in benchmarks/law_design.py's simulated paper studies the "
        "one that kept every parameter inside the full sweep's intervals): log det of the "
        "Fisher information; targets: the summed squared widths of what the study reports "
        "(parameters, compute-optimal N, held-out loss); matched: each reported quantity's "
        "variance against the full manifest's",
    )
    p.add_argument("--prior", metavar="FITS_JSON", help="a pilot fit (default: the paper's values)")
    p.add_argument("--law", default="paper", metavar="LAW", help=sweep_adaptive.LAW_HELP)
    p.add_argument(
        "--run-sigma",
        type=float,
        default=0.0,
        metavar="TAU",
        help="a run's own offset of the log metric, shared by its evaluations (its seed moves "
        "the whole curve; e.g. the sigma_run of two seeds, or fits.jsonl's noise of an adaptive "
        "sweep): the design then counts a run's checkpoints as one run's (default 0: every "
        "evaluation independent)",
    )
    cli_options.repeatable(p, "--keep", metavar="RUN_ID", help="a run the design must hold")
    p.add_argument("--out", help="the designed manifest (default: ./<name>_design.toml)")


def design(args) -> int:
    """Chooses runs for `--budget` chip-hours (`launch.sweep_design`), prints them and the
    predicted interval half-widths against the full manifest's, writes the designed manifest."""
    import dataclasses
    from pathlib import Path

    from launch import sweep_design

    manifest = _manifest(args)
    source = Path(manifest.path).read_text()
    if manifest.design_runs is not None:  # design again, from the full grid it was made from
        source = sweep_design.original_text(source, where=manifest.path)
        manifest = dataclasses.replace(manifest, design_runs=None)
    runs = expand(manifest, selection=run_selection.read(manifest.runs_dir))
    runs = _only(args, manifest)(runs)
    hardware = args.hardware or manifest.hardware
    if hardware is None:
        raise ValueError("--hardware is required (or [sweep] hardware): e.g. 8xH100, v5p-8")
    d = sweep_design.design_sweep(
        runs,
        budget=args.budget,
        hardware=hardware,
        mfu=args.mfu,
        criterion=args.criterion,
        prior_path=args.prior,
        keep=args.keep,
        run_sigma=args.run_sigma,
        law=args.law,
    )
    command = f"xlscale sweep design {args.manifest} --budget {args.budget:g} --hardware {hardware}"
    command += f" --mfu {args.mfu:g}" if args.mfu != 0.5 else ""
    command += f" --criterion {args.criterion}" + (f" --prior {args.prior}" if args.prior else "")
    command += f" --run-sigma {args.run_sigma:g}" if args.run_sigma else ""
    command += f" --law {args.law}" if args.law != "paper" else ""
    out = Path(args.out or f"{manifest.name}_design.toml")
    text = sweep_design.manifest_text(d, source, source=Path(manifest.path).name, command=command)
    out.write_text(text)
    if args.json:
        print(json.dumps({**d.result.to_dict(), "manifest": str(out)}, indent=2))
        return 0
    print(_table(sweep_design.RUN_HEADER, sweep_design.run_rows(d)))
    print(f"# {sweep_design.summary(d)}")
    print(_table(sweep_design.WIDTH_HEADER, sweep_design.width_rows(d)))
    print(f"# wrote {out}: `xlscale sweep plan {out}` lists these runs")
    return 0


def run(args) -> int:
    """Dispatches to the action; `run` itself launches the sweep."""
    actions = {"plan": plan, "run": launch, "status": status, "select": choose, "design": design}
    actions["adaptive"] = lambda args: sweep_adaptive.replay(args, _manifest(args))
    try:
        return actions[args.action](args)
    except (ValueError, FileNotFoundError, SteeringError) as e:
        print(f"xlscale sweep: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xlscale sweep: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def launch(args) -> int:
    """Runs (or dry-runs) the manifest's runs with the chosen launcher, stage by stage around
    its [[select]]s (`launch.run_selection.launch_in_stages`)."""
    manifest, runs = _runs(args)
    args.manifest_name = manifest.name
    launcher = launchers.get_launcher(args.launcher).from_args(args)
    missing = manifest.missing_variables()
    if missing and not args.dry_run:
        raise ValueError(f"manifest variables without a value: {missing}; pass --var NAME=VALUE")
    progress = run_states.Progress(runs)
    progress.note(
        f"{manifest.name}: {len(runs)} runs with the {args.launcher} launcher"
        + (" (dry run)" if args.dry_run else "")
    )
    narrow = _only(args, manifest)
    reports, waiting = sweep_adaptive.steered(
        args,
        manifest,
        runs,
        lambda: run_selection.launch_in_stages(
            manifest,
            launcher,
            only=lambda runs: _planned(args, manifest, narrow(runs)),
            dry_run=args.dry_run,
            progress_factory=run_states.Progress,
            note=progress.note,
        ),
        launcher=launcher,
    )
    done = {i for r in reports for i in r.completed}
    ids = {
        key: {i for r in reports for i in getattr(r, key)} - (done if key == "skipped" else set())
        for key in ("skipped", "submitted", "failed", "blocked", "stopped")
    }
    progress.note(
        f"completed {len(done)}, already done {len(ids['skipped'])}, "
        f"submitted {len(ids['submitted'])}, failed {len(ids['failed'])}, "
        f"blocked {len(ids['blocked'])}"
        + (f", stopped on request {len(ids['stopped'])}" if ids["stopped"] else "")
        + (f", waiting for a [[select]] {len(waiting)}" if waiting else "")
    )
    scored, unscored = (
        {i for r in reports for i in getattr(r, k)} for k in ("scored", "score_failed")
    )
    if scored or unscored:
        progress.note(f"zero-shot: scored {len(scored)}, scoring failed {len(unscored)}")
    return 0 if all(r.ok for r in reports) else 1


def status(args) -> int:
    """Prints each run's state, last step and losses, then the counts per state."""
    manifest, runs = _runs(args)
    states = [run_states.run_status(r, stale_s=args.stale) for r in runs]
    jobs = _scheduler_jobs(args, runs)
    if args.json:
        rows = [s.__dict__ | {"evals": dict(s.evals)} for s in states]
        if jobs is not None:
            rows = [row | {"slurm": _job_json(jobs.get(row["run_id"]))} for row in rows]
        print(json.dumps(rows, indent=1))
        return 0
    header = ["run id", "state", "step", "train loss", "eval losses"]
    header += ["slurm job"] if jobs is not None else []
    rows = [
        [
            s.run_id,
            s.state,
            f"{'-' if s.step is None else s.step}/{r.steps}",
            _fmt(s.loss, ".4f"),
            " ".join(f"{t}={v:.4f}" for t, v in s.evals),
        ]
        + ([jobs[s.run_id].describe() if s.run_id in jobs else "-"] if jobs is not None else [])
        for s, r in zip(states, runs, strict=True)
    ]
    print(f"# {manifest.name}: {len(runs)} runs under {manifest.runs_dir}")
    print(_table(header, rows))
    counts = run_states.count_states(states)
    print("# " + ", ".join(f"{k} {n}" for k, n in counts.items()) + f" (of {len(runs)})")
    staged = [r for r in runs if r.zeroshot is not None]
    if staged:  # the zero-shot stage (`launch.zeroshot_stage`): completed runs scored or not
        done = [r for r in staged if run_states.is_completed(r)]
        unscored = sum(zeroshot_stage.needs_scoring(r) for r in done)
        print(
            f"# zero-shot: scored {len(done) - unscored}, completed but unscored {unscored} "
            f"(of {len(staged)} runs with the stage; `sweep run` scores them)"
        )
    for line in _scheduler_notes(jobs):
        print(line)
    waiting = sum(r.waits_for_selection for r in runs)
    if manifest.selects:
        document = run_selection.read(manifest.runs_dir) or {}
        for spec in manifest.selects:
            groups = (document.get("selections") or {}).get(spec.name, {}).get("groups") or {}
            print(f"# [[select]] {spec.name}: {len(groups)} groups chosen (selection.json)")
    if waiting:
        print(f"# {waiting} pending runs wait for a [[select]] choice")
    for line in sweep_adaptive.status_lines(manifest, runs):
        print(line)
    if args.report:
        print(sweep_adaptive.write_report(manifest, args.report))
    return 0


def _scheduler_jobs(args, runs):
    """Run id -> its SLURM job (`launch.slurm.scheduler_jobs`), or None when not asked or, for
    `--scheduler auto`, where no SLURM is reachable."""
    if args.scheduler == "none":
        return None
    from launch import slurm

    if args.scheduler == "auto" and not slurm.slurm_configured():
        return None
    jobs = slurm.scheduler_jobs([r.run_id for r in runs])
    if jobs is None and args.scheduler == "slurm":
        raise ValueError("--scheduler slurm: squeue is not installed or reaches no controller")
    return jobs


def _job_json(job):
    return None if job is None else job.__dict__ | {"stuck": job.stuck}


def _scheduler_notes(jobs) -> list[str]:
    """`# slurm: PENDING 2 (Dependency 1, PartitionConfig 1), RUNNING 1` and one line per reason
    a job will wait for forever, with what to do."""
    if not jobs:
        return [] if jobs is None else ["# slurm: no job of these runs in the queue"]
    by_state: dict[str, dict[str, int]] = {}
    for job in jobs.values():
        reasons = by_state.setdefault(job.state, {})
        if job.reason and job.reason != "None":
            reasons[job.reason] = reasons.get(job.reason, 0) + 1
    parts = []
    for state, reasons in sorted(by_state.items()):
        n = sum(j.state == state for j in jobs.values())
        detail = ", ".join(f"{r} {k}" for r, k in sorted(reasons.items()))
        parts.append(f"{state} {n}" + (f" ({detail})" if detail else ""))
    lines = ["# slurm: " + ", ".join(parts)]
    stuck: dict[tuple[str, str], list[str]] = {}
    for job in jobs.values():
        if job.stuck:
            stuck.setdefault((job.reason, job.stuck), []).append(job.job_id)
    for (reason, hint), ids in sorted(stuck.items()):
        lines.append(f"# {len(ids)} job(s) will never start ({reason}: {', '.join(ids)}): {hint}")
    return lines
