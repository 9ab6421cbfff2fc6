"""`xlscale sweep plan|run|status MANIFEST`: plan, launch and summarise a sweep manifest.

    xlscale sweep plan cpt_paper                       # runs, N, tokens, FLOPs, steps, est. time
    xlscale sweep run demo --var DATA_DIR=... --var VOCAB_PATH=... --launcher local
    xlscale sweep run cpt_paper --launcher tpu_vm --tpu my-v4 --zone us-central2-b --dry-run
    xlscale sweep status demo --runs-dir demo_out/runs

MANIFEST is a path or the name of a manifest shipped in `launch/manifests/`.
"""

from __future__ import annotations

import argparse
import json
import sys

from launch import estimate, launchers
from launch import status as run_states
from launch.sweep import expand, load_manifest, select


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `plan`, `run` and `status` actions and their options."""
    actions = parser.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("manifest", help="manifest path or shipped name (e.g. cpt_paper)")
    common.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="fill a manifest variable (repeatable)",
    )
    common.add_argument("--runs-dir", help="root of the run directories (default: manifest's)")
    common.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="only runs whose id matches (plus their dependencies)",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")

    plan = actions.add_parser("plan", parents=[common], help="list the runs with cost estimates")
    plan.add_argument(
        "--step-time",
        type=float,
        metavar="SECONDS",
        help="seconds per step of the smallest run (instead of measuring one)",
    )
    plan.add_argument("--no-measure", action="store_true", help="no time estimates")

    run = actions.add_parser("run", parents=[common], help="launch the runs in dependency order")
    run.add_argument("--launcher", choices=sorted(launchers.LAUNCHERS), default="local")
    run.add_argument("--dry-run", action="store_true", help="print what would run; start nothing")
    run.add_argument("--retries", type=int, default=0, help="restarts of a failed run")
    for name in sorted(launchers.LAUNCHERS):
        group = run.add_argument_group(f"{name} launcher")
        launchers.get_launcher(name).add_arguments(group)

    status = actions.add_parser("status", parents=[common], help="summarise the runs' progress")
    status.add_argument(
        "--stale",
        type=float,
        default=900.0,
        help="seconds without new metrics before a run counts as stopped",
    )


def _runs(args):
    variables = dict(v.split("=", 1) for v in args.var)
    manifest = load_manifest(args.manifest, variables=variables, runs_dir=args.runs_dir)
    runs = expand(manifest)
    if args.only:
        runs = select(runs, args.only)
        if not runs:
            raise ValueError(f"no run id of {manifest.name} matches {args.only}")
    return manifest, runs


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
    throughput, why = estimate.throughput_for(
        runs, step_time=args.step_time, measure_step=not args.no_measure
    )
    if throughput is None:
        print(f"# no time estimates: {why}", file=sys.stderr)
    rows = estimate.plan_rows(runs, throughput)
    if args.json:
        print(json.dumps({"manifest": manifest.name, "runs": rows}, indent=1))
        return 0
    print(f"# {manifest.name}: {len(runs)} runs — {manifest.description}".rstrip(" —"))
    if throughput:
        print(f"# time estimates: {throughput.flops_per_s:.3g} FLOP/s, {throughput.source}")
    header = ["run id", "N", "tokens", "FLOPs (6ND)", "steps", "batch", "est. time"]
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
        for row in rows
    ]
    print(_table(header, table))
    flops = [r.flops for r in runs]
    total_s = [row["estimated_s"] for row in rows]
    total_flops = "?" if None in flops else f"{sum(flops):.3g}"
    total_time = run_states.format_seconds(None if None in total_s else sum(total_s))
    print(
        f"# total: {sum(r.tokens for r in runs):.3g} tokens, {total_flops} FLOPs (6ND)"
        + (f", about {total_time} on this machine" if throughput else "")
    )
    return 0


def run(args) -> int:
    """Dispatches to the action; `run` itself launches the sweep."""
    actions = {"plan": plan, "run": launch, "status": status}
    try:
        return actions[args.action](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"xlscale sweep: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xlscale sweep: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


def launch(args) -> int:
    """Runs (or dry-runs) the manifest's runs with the chosen launcher."""
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
    report = launcher.launch(runs, dry_run=args.dry_run, progress=progress)
    progress.note(
        f"completed {len(report.completed)}, already done {len(report.skipped)}, "
        f"submitted {len(report.submitted)}, failed {len(report.failed)}, "
        f"blocked {len(report.blocked)}"
    )
    return 0 if report.ok else 1


def status(args) -> int:
    """Prints each run's state, last step and losses, then the counts per state."""
    manifest, runs = _runs(args)
    states = [run_states.run_status(r, stale_s=args.stale) for r in runs]
    if args.json:
        print(json.dumps([s.__dict__ | {"evals": dict(s.evals)} for s in states], indent=1))
        return 0
    header = ["run id", "state", "step", "train loss", "eval losses"]
    rows = [
        [
            s.run_id,
            s.state,
            f"{'-' if s.step is None else s.step}/{r.steps}",
            _fmt(s.loss, ".4f"),
            " ".join(f"{t}={v:.4f}" for t, v in s.evals),
        ]
        for s, r in zip(states, runs, strict=True)
    ]
    print(f"# {manifest.name}: {len(runs)} runs under {manifest.runs_dir}")
    print(_table(header, rows))
    counts = run_states.count_states(states)
    print("# " + ", ".join(f"{k} {n}" for k, n in counts.items()) + f" (of {len(runs)})")
    return 0
