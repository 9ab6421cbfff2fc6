"""`xlscale tokenizer train`: train a SentencePiece vocabulary on the local corpora.

    xlscale tokenizer train --langs en zh --vocab-size 36152 --out PREFIX [--data-dir DIR]

Writes `PREFIX.model` and `PREFIX.json` (settings, sample, tokens per character per language)
and prints the tokens per character. `--data-dir` is the data root (`$XLSCALE_DATA` by default);
the corpora are read from its `corpora/`. Without `--out` the vocabulary goes to
`<data root>/vocab/spm_<langs>_<size>`.
"""

from __future__ import annotations

import argparse


def _weights(text: str | None, langs: list[str]) -> dict[str, float] | None:
    if not text:
        return None
    pairs = dict(item.split("=", 1) for item in text.split(","))
    unknown = sorted(set(pairs) - set(langs))
    if unknown:
        raise SystemExit(f"--lang-weights names languages not in --langs: {unknown}")
    return {lang: float(pairs.get(lang, 0.0)) for lang in langs}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `tokenizer` subcommand's arguments."""
    from pipelines import vocab

    parser.add_argument("action", choices=["train"], help="what to do")
    parser.add_argument("--langs", nargs="+", required=True, help="languages, e.g. en zh")
    parser.add_argument("--vocab-size", type=int, required=True, help="number of pieces")
    parser.add_argument("--out", default=None, help="output prefix (PREFIX.model, PREFIX.json)")
    parser.add_argument("--data-dir", default=None, help="data root (default $XLSCALE_DATA)")
    parser.add_argument("--model-type", choices=vocab.MODEL_TYPES, default="unigram")
    parser.add_argument("--lang-weights", default=None, help="character shares, e.g. en=0.5,zh=0.5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--character-coverage", type=float, default=None)
    parser.add_argument("--max-sentences", type=int, default=vocab.DEFAULT_MAX_SENTENCES)


def run(args: argparse.Namespace) -> int:
    """Trains the vocabulary and prints where it went and its tokens per character."""
    from pathlib import Path

    from pipelines import vocab
    from pipelines.corpora import paths

    root = Path(args.data_dir) if args.data_dir else paths.data_root()
    out = args.out or str(root / "vocab" / f"spm_{'_'.join(args.langs)}_{args.vocab_size}")
    model = vocab.train_vocab(
        corpora_dir=paths.corpora_dir(root),
        langs=args.langs,
        out_prefix=out,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        lang_weights=_weights(args.lang_weights, args.langs),
        seed=args.seed,
        character_coverage=args.character_coverage,
        max_sentences=args.max_sentences,
    )
    info = vocab.read_vocab_info(model)
    print(f"wrote {model} and {model.with_suffix('.json')}")
    print("lang  tokens/char  byte-fallback  sample-lines")
    for lang in args.langs:
        m = info["measurements"][lang]
        print(
            f"{lang:<5} {m['tokens_per_char']:>11.4f}  {m['byte_fallback_fraction']:>13.4f}"
            f"  {info['sample'][lang]['lines']:>12}"
        )
    return 0
