"""Where real T5X runs find xlscale's vocabulary and corpora: two environment variables.

T5X's command lines carry no vocabulary or data path for a task module, so the gin files under
`t5x/` and the task module `t5x_configs.t5x_tasks` read them from the environment:

- `XLSCALE_VOCAB_PATH`: the SentencePiece `.model` (loaded with T5's 100 sentinel ids);
- `XLSCALE_DATA_DIR`: the `corpora/` directory of the local layout (docs/interfaces.md);
- `XLSCALE_FINETUNE_PAIRS` (optional): a finetune's Df as the MT paper counts it, in pairs
  (Df / 512): the translation tasks' train split is cut to its first that many pairs, the
  fixed finetuning set of `FINETUNE_UNIT='paper'` (set by `launch.t5x_runner`).

Importing this module reads nothing; the functions raise a `RuntimeError` naming the variable
when it is unset.
"""

from __future__ import annotations

import os

VOCAB_ENV = "XLSCALE_VOCAB_PATH"
DATA_ENV = "XLSCALE_DATA_DIR"
PAIRS_ENV = "XLSCALE_FINETUNE_PAIRS"
# Sentinels for span corruption; finetuning must load the same vocabulary.
EXTRA_IDS = 100


def _required(name: str, what: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"set {name} to {what} before running T5X on xlscale's tasks")
    return value


def vocab_path() -> str:
    """The SentencePiece model named by `XLSCALE_VOCAB_PATH`."""
    return _required(VOCAB_ENV, "the SentencePiece .model file")


def data_dir() -> str:
    """The corpora directory named by `XLSCALE_DATA_DIR`."""
    return _required(DATA_ENV, "the corpora/ directory (xlscale data fixture --out DIR)")


def finetune_pairs() -> int | None:
    """The finetuning set size in pairs from `XLSCALE_FINETUNE_PAIRS`, or None when unset.

    Raises:
      RuntimeError: a value that is not a positive integer (naming the variable and value).
    """
    value = os.environ.get(PAIRS_ENV)
    if not value:
        return None
    if not value.isdigit() or int(value) <= 0:
        raise RuntimeError(f"{PAIRS_ENV}={value!r}: allowed: a positive number of pairs")
    return int(value)


def vocabulary():
    """The `seqio.SentencePieceVocabulary` at `XLSCALE_VOCAB_PATH`, with `EXTRA_IDS` sentinels
    (the model's `input_vocabulary` / `output_vocabulary` in `t5x/models/*.gin`)."""
    from pipelines import vocab

    return vocab.load_vocab(vocab_path(), extra_ids=EXTRA_IDS)
