"""`xlscale tokenizer`: train a SentencePiece vocabulary, extend one for a new language, and grow
a checkpoint to an extended vocabulary.

    xlscale tokenizer train --langs en zh --vocab-size 36152 --out PREFIX [--data-dir DIR]
    xlscale tokenizer extend --base M.model --lang zh --pieces N --out PREFIX [--corpora D]
    xlscale tokenizer grow-checkpoint --run SRC [--step S] --vocab NEW.model --out DST

`train` writes `PREFIX.model` and `PREFIX.json` (settings, sample, tokens per character per
language) and prints the tokens per character. `--data-dir` is the data root (`$XLSCALE_DATA` by
default); the corpora are read from its `corpora/` (`--corpora` names a corpora directory
directly). Without `--out` the vocabulary goes to `<data root>/vocab/spm_<langs>_<size>`.

`extend` appends up to N pieces of a model trained on `--lang` to `--base`, keeping every old id
(`pipelines.vocab_extend`). `grow-checkpoint` writes DST, a directory `INIT_CHECKPOINT` accepts,
with SRC's parameters grown to the new vocabulary (`convert.grown_init`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def _weights(text: str | None, langs: list[str]) -> dict[str, float] | None:
    if not text:
        return None
    pairs = dict(item.split("=", 1) for item in text.split(","))
    unknown = sorted(set(pairs) - set(langs))
    if unknown:
        raise SystemExit(f"--lang-weights names languages not in --langs: {unknown}")
    return {lang: float(pairs.get(lang, 0.0)) for lang in langs}


def _corpora(args: argparse.Namespace):
    from pathlib import Path

    from pipelines.corpora import paths

    if getattr(args, "corpora", None):  # a corpora directory, or a data root holding one
        given = Path(args.corpora)
        return paths.corpora_dir(given) if paths.corpora_dir(given).is_dir() else given
    return paths.corpora_dir(Path(args.data_dir) if args.data_dir else paths.data_root())


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    from pipelines import vocab

    parser.add_argument("--langs", nargs="+", required=True, help="languages, e.g. en zh")
    parser.add_argument("--vocab-size", type=int, required=True, help="number of pieces")
    parser.add_argument("--out", default=None, help="output prefix (PREFIX.model, PREFIX.json)")
    parser.add_argument("--data-dir", default=None, help="data root (default $XLSCALE_DATA)")
    parser.add_argument("--model-type", choices=vocab.MODEL_TYPES, default="unigram")
    parser.add_argument("--lang-weights", default=None, help="character shares, e.g. en=0.5,zh=0.5")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--character-coverage", type=float, default=None)
    parser.add_argument("--max-sentences", type=int, default=vocab.DEFAULT_MAX_SENTENCES)


def _extend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", required=True, help="the source tokenizer's .model")
    parser.add_argument("--lang", required=True, help="the new language, e.g. zh")
    parser.add_argument("--pieces", type=int, required=True, help="most pieces to add")
    parser.add_argument("--out", required=True, help="output prefix (PREFIX.model, PREFIX.json)")
    parser.add_argument("--corpora", default=None, help="corpora directory (default: data root's)")
    parser.add_argument("--data-dir", default=None, help="data root (default $XLSCALE_DATA)")
    parser.add_argument("--check-langs", nargs="*", default=["en"], help="old languages to measure")
    parser.add_argument("--seed", type=int, default=0)


def _grow_arguments(parser: argparse.ArgumentParser) -> None:
    from llama_jax import embedding_growth as vocab_growth

    parser.add_argument("--run", required=True, help="source MODEL_DIR (or checkpoints dir)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default latest)")
    parser.add_argument("--vocab", required=True, help="the extended .model")
    parser.add_argument("--out", required=True, help="directory to write (for INIT_CHECKPOINT)")
    parser.add_argument("--vocab-size", type=int, default=None, help="rows of the grown tables")
    parser.add_argument("--init", choices=sorted(vocab_growth.INIT_METHODS), default="subword_mean")
    parser.add_argument("--old-vocab", default=None, help="the run's tokenizer (default: its own)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `tokenizer` subcommand's actions and their arguments."""
    actions = parser.add_subparsers(dest="action", required=True)
    for name, adder, help_text in (
        ("train", _train_arguments, "train a vocabulary on the local corpora"),
        ("extend", _extend_arguments, "add a new language's pieces to a vocabulary"),
        ("grow-checkpoint", _grow_arguments, "grow a run's embeddings to an extended vocabulary"),
    ):
        adder(actions.add_parser(name, help=help_text, description=help_text))


def _train(args: argparse.Namespace) -> int:
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
    measured = info["measurements"]
    return _report(
        f"wrote {model} and {model.with_suffix('.json')}",
        "lang  tokens/char  byte-fallback  sample-lines",
        (
            f"{lang:<5} {measured[lang]['tokens_per_char']:>11.4f}  "
            f"{measured[lang]['byte_fallback_fraction']:>13.4f}"
            f"  {info['sample'][lang]['lines']:>12}"
            for lang in args.langs
        ),
    )


def _extend(args: argparse.Namespace) -> int:
    from pipelines import vocab_extend

    model = vocab_extend.extend_vocab(
        base_model=args.base,
        corpora_dir=_corpora(args),
        lang=args.lang,
        pieces=args.pieces,
        out_prefix=args.out,
        check_langs=args.check_langs,
        seed=args.seed,
    )
    info = vocab_extend.read_extension_info(model)
    return _report(
        f"wrote {model}: {info['base_size']} -> {info['new_size']} pieces",
        "lang  tokens/char before  after  lines changed",
        (
            f"{lang:<5} {m['tokens_per_char_before']:>18.4f} {m['tokens_per_char_after']:>6.4f}"
            f"  {m['lines_encoded_differently']}/{m['lines']}"
            for lang, m in info["measurements"].items()
        ),
    )


def _report(wrote: str, header: str, rows: Iterable[str]) -> int:
    """Prints what an action wrote and its per-language table; the action's exit status."""
    print(wrote)
    print(header)
    for row in rows:
        print(row)
    return 0


def _grow(args: argparse.Namespace) -> int:
    from convert import grown_init as vocab_growth

    source = args.run if args.step is None else f"{args.run}@{args.step}"
    record = vocab_growth.grow_checkpoint(
        source=source,
        vocab_path=args.vocab,
        out_dir=args.out,
        vocab_size=args.vocab_size,
        method=args.init,
        old_vocab_path=args.old_vocab,
    )
    print(
        f"wrote {args.out} (step {record['source_step']}): vocabulary {record['base_size']} -> "
        f"{record['new_size']} pieces, tables {record['old_vocab_rows']} -> "
        f"{record['vocab_size']} rows; train with INIT_CHECKPOINT={args.out!r}, "
        f"VOCAB_PATH={args.vocab!r} and vocab_size {record['vocab_size']}"
    )
    return 0


# action -> what runs it.
ACTIONS = {"train": _train, "extend": _extend, "grow-checkpoint": _grow}


def run(args: argparse.Namespace) -> int:
    """Runs the chosen action."""
    return ACTIONS[args.action](args)
