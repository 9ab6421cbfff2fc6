"""The papers' token units, recorded beside the real token counts of a run.

A run counts real tokens: `tokens` in `metrics.jsonl` is the number of target (decoder) tokens
that carried loss. The papers count differently, and their fitted constants are in their units:

- The MT paper (Isik et al. 2024, §4) counts pretraining data Dp as steps × batch 256 × sequence
  length 512, where 512 is the span-corruption *input* length; our span-corruption targets are at
  most 114 tokens, so `tokens` is about 114/512 of its Dp. Its finetuning set size Df is training
  pairs × 512 (WMT16 en-ro: 610,320 pairs = 312.5M), whatever the pairs' real lengths.
- The CPT paper (Zheng et al. 2024) counts training tokens as batches of full 2048-token rows
  (batch sizes of 1M/2M/4M tokens, 20 tokens per parameter): steps × batch × sequence length. With
  packing, real target tokens are nearly all of those positions.

So `tokens_paper` = applied steps × batch × the paper's row length: the `inputs` length for an
encoder-decoder, the `targets` length for a decoder-only model (`paper_length`). Finetuning sets
given by the MT paper's Df (`FINETUNE_UNIT = 'paper'`) hold exactly Df / `PAIR_TOKENS` pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

PAIR_TOKENS = 512  # the MT paper counts each finetuning pair as one 512-token sequence


def paper_length(task_feature_lengths: Mapping[str, int]) -> int:
    """Tokens the papers count per row: the `inputs` length of an encoder-decoder (the MT paper's
    sequence length 512), else the `targets` length (the CPT paper's context 2048)."""
    return int(task_feature_lengths.get("inputs", task_feature_lengths["targets"]))


def tokens_paper_per_step(*, batch_size: int, task_feature_lengths: Mapping[str, int]) -> int:
    """Paper tokens of one applied step: the global batch × `paper_length`."""
    return int(batch_size) * paper_length(task_feature_lengths)


def token_units(task_feature_lengths: Mapping[str, int]) -> dict[str, str]:
    """`run.json`'s `token_units`: what each token count of the run's records means."""
    if "inputs" in task_feature_lengths:
        return {
            "tokens": "target (decoder) tokens with loss; span-corruption targets in pretraining",
            "input_tokens": "non-padding encoder input tokens",
            "tokens_paper": "applied steps x batch x inputs length: the MT paper's Dp "
            "(steps x 256 x 512)",
            "finetune_tokens_paper": f"finetuning pairs x {PAIR_TOKENS}: the MT paper's Df",
        }
    return {
        "tokens": "target tokens with loss (non-padding positions of packed rows)",
        "tokens_paper": "applied steps x batch x sequence length: the CPT paper's tokens "
        "(full 2048-token rows)",
    }


@dataclasses.dataclass(frozen=True)
class FinetuneSet:
    """A finetuning set as the data pipeline takes it.

    Attributes:
      subset_tokens: about this many real target tokens (`DataConfig.subset_tokens`), or None.
      pairs: exactly this many examples (`DataConfig.subset_examples`), or None.
      fixed_steps: whether the step count is independent of the set's size (the MT paper's 300
        steps at every Df) rather than one pass over it.
    """

    subset_tokens: int | None = None
    pairs: int | None = None
    fixed_steps: bool = False


def pairs_for(df_paper: int) -> int:
    """Pairs of a finetuning set of the MT paper's size Df (= pairs × 512), at least one."""
    return max(1, round(int(df_paper) / PAIR_TOKENS))


# FINETUNE_UNIT -> how FINETUNE_TOKENS (Df) becomes a finetuning set.
DF_UNITS: dict[str, Callable[[int], FinetuneSet]] = {
    # about Df real target tokens (a sample sized by the task's mean target length); one pass
    "target": lambda df: FinetuneSet(subset_tokens=int(df)),
    # the MT paper's Df = pairs × 512: exactly Df / 512 pairs, steps fixed (300)
    "paper": lambda df: FinetuneSet(pairs=pairs_for(df), fixed_steps=True),
}


def finetune_set(*, finetune_tokens: int | None, unit: str = "target") -> FinetuneSet:
    """The finetuning set that `FINETUNE_TOKENS` (Df) in `FINETUNE_UNIT` names (None: the whole
    split, `FinetuneSet()`).

    Raises:
      ValueError: an unknown unit or a non-positive Df (naming the macro and what is allowed).
    """
    if unit not in DF_UNITS:
        raise ValueError(f"FINETUNE_UNIT = {unit!r}: allowed: {', '.join(map(repr, DF_UNITS))}")
    if finetune_tokens is None:
        return FinetuneSet()
    if finetune_tokens <= 0:
        raise ValueError(f"FINETUNE_TOKENS = {finetune_tokens}: allowed: a positive token count")
    return DF_UNITS[unit](finetune_tokens)


def run_fields(
    *,
    batch_size: int,
    task_feature_lengths: Mapping[str, int],
    subset_examples: int | None,
    finetune_unit: str,
) -> dict[str, Any]:
    """`run.json`'s unit fields: `token_units`, `tokens_paper_per_step`, and for finetuning
    `finetune_unit`, `finetune_pairs` (the set's exact pair count, when it has one) and
    `finetune_tokens_paper` (= pairs × 512, the MT paper's Df)."""
    return {
        "token_units": token_units(task_feature_lengths),
        "tokens_paper_per_step": tokens_paper_per_step(
            batch_size=batch_size, task_feature_lengths=task_feature_lengths
        ),
        "finetune_unit": finetune_unit,
        "finetune_pairs": subset_examples,
        "finetune_tokens_paper": None
        if subset_examples is None
        else int(subset_examples) * PAIR_TOKENS,
    }
