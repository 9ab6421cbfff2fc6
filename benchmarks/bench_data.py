"""The data the pipeline benchmarks (`data_pipeline.py`, `pipeline.py`) read: their shared
command-line arguments, the corpora (Debian corpora under the data root, else the UDHR fixture)
and a vocabulary (trained unless `--vocab` names one) with the tasks and mixtures registered.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser, *, vocab_size_help: str) -> None:
    """`--data-dir`, `--fixture`, `--vocab`, `--vocab-size` (default 2048)."""
    parser.add_argument("--data-dir", default=None, help="data root (default $XLSCALE_DATA)")
    parser.add_argument("--fixture", action="store_true", help="use the UDHR fixture")
    parser.add_argument("--vocab", default=None, help="a .model to use instead of training one")
    parser.add_argument("--vocab-size", type=int, default=2048, help=vocab_size_help)


def corpora(args: argparse.Namespace, tmp: Path, langs: Sequence[str]) -> tuple[Path, str]:
    """The corpora directory and where it is: the data root's when it holds training text for
    every language of `langs` (and `--fixture` is not given), else the fixture written to `tmp`."""
    from pipelines.corpora import fixture, paths

    if not args.fixture:
        root = Path(args.data_dir) if args.data_dir else paths.data_root()
        found = paths.corpora_dir(root)
        if all(paths.mono_file(found, lang, "train").exists() for lang in langs):
            return found, f"Debian corpora at {found}"
    return fixture.write_fixture_corpora(tmp), "the UDHR fixture"


def register(
    args: argparse.Namespace, corpora_dir: Path, tmp: Path, *, langs: Sequence[str], extra_ids: int
) -> tuple[Path, Any, float | None]:
    """Registers the tasks of `langs` and the mixtures over a vocabulary: `--vocab`, or one
    trained on `corpora_dir` into `tmp`. Returns the vocabulary's path, the seqio vocabulary
    and the seconds training it took (None: `--vocab` given)."""
    from pipelines import mixtures, tasks, vocab

    model, took = (Path(args.vocab), None) if args.vocab else (None, None)
    if model is None:
        t = time.perf_counter()
        model = vocab.train_vocab(
            corpora_dir=corpora_dir,
            langs=tuple(langs),
            out_prefix=tmp / "bench",
            vocab_size=args.vocab_size,
            max_sentences=20_000,
        )
        took = time.perf_counter() - t
    vocabulary = vocab.load_vocab(model, extra_ids=extra_ids)
    tasks.register_tasks(
        vocabulary=vocabulary, corpora_dir=corpora_dir, langs=list(langs), pairs=[]
    )
    mixtures.register_mixtures()
    return model, vocabulary, took
