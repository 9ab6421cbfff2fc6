"""`xlscale train|eval|infer ...`: forwards the remaining arguments to the gin entry points
(`trainer.train`, `trainer.eval`, `trainer.infer`), e.g.

    xlscale train --gin_file=experiments/cpt.gin --gin.MODEL_DIR="'/runs/x'" ...
"""

from __future__ import annotations

import argparse
import importlib

# subcommand -> module whose `main(argv) -> int` runs it.
ENTRY_POINTS: dict[str, str] = {
    "train": "trainer.train",
    "eval": "trainer.eval",
    "infer": "trainer.infer",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Everything after the subcommand goes to the entry point unchanged."""
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="--gin_file=F [--gin.KEY=VALUE ...]")
    # argparse treats a leading `--gin_file=...` as an unknown option even before REMAINDER;
    # with no prefix characters every argument is positional, so all of them reach `rest`
    # (`-h` included: the entry point's own parser answers it).
    parser.prefix_chars = "\0"


def run(args: argparse.Namespace) -> int:
    """Runs the entry point of `args.command` with `args.rest`."""
    module = importlib.import_module(ENTRY_POINTS[args.command])
    return int(module.main(list(args.rest)) or 0)
