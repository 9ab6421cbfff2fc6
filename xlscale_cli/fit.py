"""`xlscale fit`: fit the papers' laws to a directory of runs (fits.json, report.md, plots)."""

from __future__ import annotations

import argparse
import sys

from rundir import exits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `xlscale fit`."""
    parser.add_argument("--runs", required=True, help="directory of run directories")
    parser.add_argument(
        "--law",
        default="all",
        choices=(
            "chinchilla",
            "cpt",
            "compute",
            "transfer",
            "replay",
            "bleu",
            "ce",
            "zeroshot",
            "lr_area",
            "all",
        ),
        help="which law to fit (default: all that the runs support; lr_area, the "
        "schedule-aware law of fitting.laws.lr_area, only by name)",
    )
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--bootstrap", type=int, default=100, help="resamples of whole runs (0: none)"
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument(
        "--n-basis",
        default="exact",
        choices=("exact", "nominal"),
        help="N of the upstream fits: exact non-embedding counts (default) or the paper's "
        "nominal sizes (CPT paper Table 4, the basis of its Table 2 and eqs. 8-9)",
    )
    parser.add_argument(
        "--points-per-run",
        type=int,
        default=None,
        help="fit points: at most this many evaluations per run, evenly "
        "spaced, the last always kept (default: every evaluation; 1: final losses only)",
    )
    parser.add_argument(
        "--points-min-fraction",
        type=float,
        default=0.0,
        help="fit points: only evaluations at or after this fraction of each run's tokens",
    )
    parser.add_argument(
        "--points-min-tokens",
        type=float,
        default=0.0,
        help="fit points: only evaluations after more than this many tokens (default 0)",
    )
    parser.add_argument(
        "--lr-decay",
        type=_decay,
        default=None,
        metavar="{auto,λ}",
        help="lr_area: the annealing momentum λ of the learning-rate areas, 0 <= λ < 1 (Tissue "
        "et al.'s is 0.999), or auto (default): the λ under which the runs' first three "
        "quarters best forecast their last quarter",
    )
    parser.add_argument(
        "--zeroshot-size",
        type=float,
        default=None,
        help="zero-shot figures: compare models of the size (non-embedding N) closest to this "
        "(default: per language, the size closest to the paper's 1.4B that every compared model "
        "has; Fig. 3 is also drawn at every size present)",
    )


def _decay(text: str) -> float | None:
    """`--lr-decay`'s value: None for auto, else a λ in [0, 1)."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: auto, or a number 0 <= λ < 1")
    return value


def run(args: argparse.Namespace) -> int:
    """Runs the fits; exits 1 on bad input (the message names the run or point, in at most three
    lines, and no `--out` is left behind), 2 on a bad fit-point rule, 3 if a fit did not converge
    (the outputs are still written and say so). Runs skipped and records left out are warnings
    (also in fits.json's `input_warnings` and report.md)."""
    from fitting.checks import FitInputError
    from fitting.readers.points import PointRule
    from fitting.reports.fit_all import fit_runs

    try:
        rule = PointRule(
            min_tokens=args.points_min_tokens,
            min_fraction=args.points_min_fraction,
            per_run=args.points_per_run,
        )
    except ValueError as e:
        print(f"xlscale fit: {e}", file=sys.stderr)
        return 2
    try:
        result = fit_runs(
            args.runs,
            args.out,
            law=args.law,
            bootstrap=args.bootstrap,
            seed=args.seed,
            n_basis=args.n_basis,
            point_rule=rule,
            zeroshot_size=args.zeroshot_size,
            lr_decay=args.lr_decay,
        )
    except FitInputError as e:
        print(exits.brief(f"xlscale fit: {e}"), file=sys.stderr)
        return 1
    for warning in result.get("input_warnings", ()):
        print(f"xlscale fit: WARNING {warning}", file=sys.stderr)
    for warning in result["warnings"]:
        print(f"xlscale fit: WARNING {warning}", file=sys.stderr)
    for step, why in result["skipped"].items():
        print(f"xlscale fit: skipped {step}: {why}")
    print(
        f"xlscale fit: wrote {args.out}/fits.json, report.md and {len(result['plots'])} plots "
        f"(N basis: {result['n_basis']})"
    )
    return 0 if result["converged"] else 3
