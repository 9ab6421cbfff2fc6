"""`xlscale demo [--profile full|smoke] [--out DIR]`: the main job (see `launch.demo`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `xlscale demo`."""
    from launch.demo import PROFILES

    parser.add_argument(
        "--profile",
        default="full",
        choices=sorted(PROFILES),
        help="; ".join(f"{k}: {v.description}" for k, v in sorted(PROFILES.items())),
    )
    parser.add_argument("--study", default="cpt", choices=["cpt"], help="which study to run")
    parser.add_argument("--out", default=None, help="output directory (default demo_out[/smoke])")
    parser.add_argument("--data-dir", default=None, help="data root (default $XLSCALE_DATA)")


def run(args: argparse.Namespace) -> int:
    """Runs the demo study and prints where the report is."""
    from launch.demo import run_demo

    out = args.out or ("demo_out" if args.profile == "full" else "demo_out/smoke")
    run_demo(profile=args.profile, out_dir=out, data_dir=args.data_dir)
    return 0
