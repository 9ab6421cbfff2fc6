"""`xlscale demo [--study cpt|mt] [--profile full|smoke] [--out DIR] [--jobs N]`: the main job (see
`studies.registry`): the CPT study (default) or the translation study."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `xlscale demo`."""
    from studies.registry import PROFILES, STUDIES

    helps = [
        f"{study} {k}: {v.description}"
        for study, profiles in PROFILES.items()
        for k, v in sorted(profiles.items())
    ]
    parser.add_argument(
        "--study",
        default="cpt",
        choices=sorted(STUDIES),
        help="cpt: the continual-pretraining study (CPT paper); mt: the translation study "
        "(MT paper: pretraining data vs downstream BLEU/CE)",
    )
    parser.add_argument(
        "--profile",
        default="full",
        choices=sorted({k for profiles in PROFILES.values() for k in profiles}),
        help="; ".join(helps),
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output directory (default demo_out[/smoke] for cpt, demo_out/mt[/smoke] for mt)",
    )
    parser.add_argument("--data-dir", default=None, help="data root (default $XLSCALE_DATA)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs trained at once in worker processes (default: 2 on a machine with 2 or more "
        "cores, or $XLSCALE_JOBS; 1 runs them one by one in this process)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the chosen demo study and prints where the report is."""
    from studies.registry import run_demo

    run_demo(
        study=args.study,
        profile=args.profile,
        out_dir=args.out,
        data_dir=args.data_dir,
        jobs=args.jobs,
    )
    return 0
