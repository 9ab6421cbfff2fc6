"""`xlscale fit`: fit the papers' laws to a directory of runs (fits.json, report.md, plots)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `xlscale fit`."""
    parser.add_argument("--runs", required=True, help="directory of run directories")
    parser.add_argument(
        "--law",
        default="all",
        choices=("chinchilla", "cpt", "compute", "transfer", "replay", "bleu", "ce", "all"),
        help="which law to fit (default: all that the runs support)",
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


def run(args: argparse.Namespace) -> int:
    """Runs the fits; exits 1 on bad input (the message names the run or point), 3 if a fit
    did not converge (the outputs are still written and say so)."""
    from fitting.checks import FitInputError
    from fitting.pipeline import fit_runs

    try:
        result = fit_runs(
            args.runs,
            args.out,
            law=args.law,
            bootstrap=args.bootstrap,
            seed=args.seed,
            n_basis=args.n_basis,
        )
    except FitInputError as e:
        print(f"xlscale fit: {e}", file=sys.stderr)
        return 1
    for warning in result["warnings"]:
        print(f"xlscale fit: WARNING {warning}", file=sys.stderr)
    for step, why in result["skipped"].items():
        print(f"xlscale fit: skipped {step}: {why}")
    print(
        f"xlscale fit: wrote {args.out}/fits.json, report.md and {len(result['plots'])} plots "
        f"(N basis: {result['n_basis']})"
    )
    return 0 if result["converged"] else 3
