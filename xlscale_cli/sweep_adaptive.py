"""The adaptive parts of `xlscale sweep`: `run --adaptive`, the adaptive lines of `status`, and
`adaptive replay`.

    xlscale sweep run demo --var ... --adaptive --min-gain 0.5 --tolerance 0.02
    xlscale sweep run demo --var ... --adaptive --adaptive-law lr_area --adaptive-prior fits.json
    xlscale sweep status demo          # + compute spent and saved, the fit, decision counts
    xlscale sweep adaptive replay demo # recompute every logged decision from its logged state

See `launch.adaptive_loop` (the loop), `launch.adaptive` (the decisions and their log).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from launch import adaptive, adaptive_loop
from rundir import names, storage

REPLAY = "replay"
# `sweep design --law`: the laws scored (an adaptive sweep refits the same, `--adaptive-law`).
LAW_HELP = (
    "the laws the design scores: paper (default: the papers' L(N, D) laws for CPT, the Dp laws "
    "for MT) or lr_area (CPT: the schedule-aware law that `xlscale fit --law lr_area` fits on "
    "every evaluation; needs --prior, that fit's fits.json)"
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The `sweep run` options of an adaptive sweep."""
    group = parser.add_argument_group("adaptive sweep (--adaptive)")
    group.add_argument(
        "--adaptive",
        action="store_true",
        help="refit the study's laws on every new evaluation and skip or stop the runs the law "
        "already knows (decisions logged in <runs_dir>/adaptive/)",
    )
    group.add_argument(
        "--min-gain",
        type=float,
        default=0.0,
        metavar="NATS_PER_CHIP_HOUR",
        help="skip or stop a run whose remaining evaluations add less information about the "
        "law's parameters per chip-hour of --hardware (per PFLOP/s-hour without one; default 0: "
        "never on information alone)",
    )
    group.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="skip or stop a run whose final value is predicted within this relative 95%% "
        "half-width (default 0.02; 0: never on prediction alone)",
    )
    group.add_argument(
        "--adaptive-poll",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds between looks at the runs' metrics (default 30)",
    )
    group.add_argument(
        "--adaptive-law",
        metavar="LAW",
        help="the laws refitted: paper (the papers' laws from their values) or lr_area (CPT: "
        "the schedule-aware law, from --adaptive-prior), as `sweep design --law` (default: the "
        "law a designed manifest was made for, else paper)",
    )
    group.add_argument(
        "--adaptive-prior",
        metavar="FITS_JSON",
        help="a pilot fit the sweep starts from, as `sweep design --prior` (lr_area: required)",
    )
    group.add_argument(
        "--adaptive-bootstrap",
        type=int,
        default=50,
        metavar="N",
        help="bootstrap resamples of each refit, for the predictions' intervals (default 50)",
    )


def add_actions(actions, common: argparse.ArgumentParser) -> None:
    """`sweep adaptive replay MANIFEST`."""
    parser = actions.add_parser("adaptive", help="an adaptive sweep's log: replay its decisions")
    what = parser.add_subparsers(dest="adaptive_action", required=True)
    what.add_parser(
        REPLAY,
        parents=[common],
        help="recompute every logged decision from its logged state; exit 1 if one differs",
    )


def steered(args, manifest, runs, stages: Callable[[], Any], *, launcher=None) -> Any:
    """`stages()` (the sweep's launch, returning (reports, waiting)), steered by an adaptive
    sweep when `--adaptive` is given; as it is otherwise. A skipped run's queued jobs are taken
    back through the launcher's `cancel_queued`, where it has a queue."""
    if not args.adaptive or args.dry_run:
        return stages()
    if args.adaptive_poll <= 0 or args.adaptive_bootstrap < 0:
        raise ValueError(
            f"--adaptive-poll {args.adaptive_poll} and --adaptive-bootstrap "
            f"{args.adaptive_bootstrap}: allowed: seconds > 0 and resamples >= 0"
        )
    law = args.adaptive_law or manifest.design_law or "paper"
    if law != "paper" and not args.adaptive_prior:
        why = "" if args.adaptive_law else f" (the law {manifest.path} was designed for)"
        raise ValueError(
            f"--adaptive-law {law}{why} needs --adaptive-prior: the pilot fit's fits.json "
            f"(`xlscale fit PILOT_RUNS_DIR --law {law}`); or give --adaptive-law paper"
        )
    sweep = adaptive_loop.AdaptiveSweep.for_runs(
        runs,
        manifest.runs_dir,
        adaptive.Policy(min_gain=args.min_gain, tolerance=args.tolerance),
        hardware=getattr(args, "hardware", None) or manifest.hardware,
        law=law,
        prior_path=args.adaptive_prior,
        bootstrap=args.adaptive_bootstrap,
    )
    # Launchers with a queue (SLURM) cancel a skipped run's waiting jobs; the others start each
    # run themselves after looking for its stop request, and an xmanager work unit that starts
    # finds it and ends before compiling.
    sweep.cancel_queued = getattr(launcher, "cancel_queued", None)
    result: list[Any] = []

    def launch() -> list:
        result.append(stages())
        return result[-1][0]

    adaptive_loop.run(sweep, launch, poll_s=args.adaptive_poll)
    return result[-1]


def status_lines(manifest, runs) -> list[str]:
    """`sweep status`'s adaptive lines (none where no adaptive sweep ran)."""
    return adaptive_loop.summary_lines(runs, manifest.runs_dir)


def write_report(manifest, out_dir: str) -> str:
    """Writes the adaptive sweep's report section and plot (`fitting.reports.design_report`:
    every refit's estimates and 95% intervals against the chip-hours spent by then) under
    `out_dir`; returns the line saying where."""
    from fitting.design.snapshots import Snapshot
    from fitting.reports import design_report

    records = adaptive.read_lines(manifest.runs_dir, names.ADAPTIVE_FITS_FILE)
    snapshots = sorted((Snapshot.from_json(r) for r in records), key=lambda s: s.chip_hours)
    snapshots = [s for s in snapshots if s.params]
    if not snapshots:
        raise ValueError(f"--report: no adaptive fits logged under {manifest.runs_dir}/adaptive")
    out = storage.as_path(out_dir)  # local or object storage, as every report
    out.mkdir(parents=True, exist_ok=True)
    sweeps = {"adaptive": snapshots}
    title = f"{manifest.name}: the adaptive sweep's fit against compute"
    plot = design_report.plot(sweeps, out / "adaptive.png", title=title)
    text = design_report.section(sweeps, title=title, plot_path=plot.name)
    storage.write_text_atomic(out / "adaptive.md", text)
    return f"# adaptive report: {out / 'adaptive.md'} and {plot}"


def replay(args, manifest) -> int:
    """Prints whether every logged decision recomputes to itself; 1 when one does not."""
    result = adaptive.replay(manifest.runs_dir)
    if not result.checked:
        raise ValueError(f"no adaptive decisions logged under {manifest.runs_dir}/adaptive")
    print(f"# {manifest.name}: {result.checked} logged decisions recomputed")
    for line, logged, got in result.mismatches:
        print(f"line {line}: logged {logged[0]} ({logged[1]}), recomputed {got[0]} ({got[1]})")
    if result.ok:
        print("# every decision reproduces from its logged state")
    return 0 if result.ok else 1
