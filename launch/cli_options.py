"""Command-line options that launch's entry points and the xlscale CLI declare alike.

`add_manifest_arguments` is how every command that expands a sweep manifest names it (the
manifest, its `--var NAME=VALUE` fillings and `--runs-dir`), and `repeatable` is the one shape of a
list option given once per value (`--only GLOB`, `--sbatch-line OPTION`, ...).
"""

from __future__ import annotations

import argparse


def repeatable(parser, flag: str, *, metavar: str, help: str | None = None) -> None:
    """Adds `flag`, given once per value and collected into a list (empty when not given)."""
    parser.add_argument(flag, action="append", default=[], metavar=metavar, help=help)


def add_manifest_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the positional `manifest`, `--var NAME=VALUE` (repeatable) and `--runs-dir`: what
    `manifest_variables` and `launch.sweep.load_manifest` read."""
    parser.add_argument("manifest", help="manifest path or shipped name (e.g. cpt_paper)")
    repeatable(parser, "--var", metavar="NAME=VALUE", help="fill a manifest variable (repeatable)")
    parser.add_argument("--runs-dir", help="root of the run directories (default: manifest's)")


def manifest_variables(args: argparse.Namespace) -> dict[str, str]:
    """The `--var NAME=VALUE` fillings as a mapping (`launch.sweep.load_manifest`'s `variables`)."""
    return dict(v.split("=", 1) for v in args.var)
