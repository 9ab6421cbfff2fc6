"""`xlscale zeroshot`: score a run's checkpoint on zero-shot multiple-choice benchmarks through
lm-evaluation-harness (the `xlscale` lm-eval model, `evals.harness`)."""

from __future__ import annotations

import argparse
import sys


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `xlscale zeroshot`."""
    parser.add_argument("--model-dir", required=True, help="the run's MODEL_DIR")
    parser.add_argument("--step", type=int, default=None, help="kept step (default: latest)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--tasks", type=_csv, default=[], help="lm-eval task names, comma-separated")
    which.add_argument(
        "--paper",
        action="store_true",
        help="the CPT paper's benchmarks for the run's languages (XNLI, XWinograd, HellaSwag, "
        "XStoryCloze, XCOPA, PIQA as lm-eval names; needs those datasets at hand)",
    )
    parser.add_argument(
        "--local",
        default=None,
        help="directory of local task YAML (default: <data root>/zeroshot_tasks, written by "
        "`xlscale data build`); used when neither --tasks nor --paper is given",
    )
    parser.add_argument(
        "--langs", type=_csv, default=[], help="languages (default: the run's, from run.json)"
    )
    parser.add_argument(
        "--vocab-path",
        default=None,
        help="the run's SentencePiece model (default: the path recorded in run.json)",
    )
    parser.add_argument("--limit", type=int, default=None, help="at most this many items per task")
    parser.add_argument("--batch-size", type=int, default=16, help="requests scored together")
    parser.add_argument(
        "--no-bucket",
        action="store_true",
        help="pad every batch to the model's max length (slower; for comparison)",
    )


def run(args: argparse.Namespace) -> int:
    """Scores the checkpoint and writes MODEL_DIR/zeroshot/<step>.json; exits 2 on bad input."""
    from evals import job

    try:
        job.resolve_step(args.model_dir, args.step)  # a bad --step fails before anything loads
        choice = job.choose_tasks(
            args.model_dir,
            tasks=args.tasks,
            paper=args.paper,
            local_dir=args.local,
            langs=args.langs,
        )
        job.run_zeroshot(
            args.model_dir,
            choice,
            step=args.step,
            limit=args.limit,
            batch_size=args.batch_size,
            bucket=not args.no_bucket,
            vocab_path=args.vocab_path,
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"xlscale zeroshot: {err}", file=sys.stderr)
        return 2
    return 0
