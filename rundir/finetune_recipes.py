"""Finetuning recipes by name: how many steps the MT paper's finetunes train, and why.

The MT paper (Isik et al. 2024) says, in §4 [q:mt.s4_finetune]: "During finetuning, again following
Raffel et al. (2020), we use a batch size of 128 and a sequence length of 512 for 300 steps." That
is the recipe 'paper_300'. It names no other length. We also run 'raffel_2^18', Raffel et al.'s
(2020) 2^18 finetuning steps, as a reading of ours, for three reasons the paper does not
give: its Df sizes reach 3B (en-de) and 21B (en-fr) tokens [q:mt.s4_wmt_sizes], 5.9M and 41M
pairs as we count them (512 tokens a pair, trainer/paper_units.py), which 300 × 128 = 38,400
pairs cannot reach, so trained literally the large-Df runs see no more data than the
small ones and a Df effect cannot appear; the Raffel et al. it cites finetune for 2^18 steps; and
its own timings fit 2^18 steps, not 300 [q:mt.appA_timing]: pretraining 1M steps of 256 × (512 +
114) tokens takes 15-20 hours, so 2^18 finetuning steps of 128 × (512 + 512) tokens take 3.2-4.3
hours by tokens processed, near its 5-7 hours per finetune, where 300 steps take under a minute.
The timings name no chip generation (an "8x8 TPU"), and none is assumed here.

Both are recipes, chosen by name (`FINETUNE_RECIPE`), recorded in run.json (`finetune_recipe`)
and T5X's config.gin, so a report can say which one its runs used. A sweep manifest may make it a
grid axis (`gin_axes = {FINETUNE_RECIPE = [...]}`: each run trains its recipe's steps;
mt_paper.toml runs both), and its finetunes evaluate at several steps so that a learning rate is
chosen at each run's best validation step, not at the end of thousands of repeats of a small set
(`launch.best_checkpoint`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class FinetuneRecipe:
    """One finetuning length.

    Attributes:
      steps: training steps (at the run's batch size; the MT paper's is 128).
      source: where the number comes from.
    """

    steps: int
    source: str


RECIPES: Mapping[str, FinetuneRecipe] = {
    "paper_300": FinetuneRecipe(
        steps=300, source="MT paper §4 [q:mt.s4_finetune]: 300 steps at batch 128"
    ),
    "raffel_2^18": FinetuneRecipe(
        steps=2**18,
        source="ours: Raffel et al. 2020's 2^18 finetuning steps (the MT paper names no "
        "such length; its Df sizes and App. A timings [q:mt.appA_timing] fit it)",
    ),
}


def recipe(name: str) -> FinetuneRecipe:
    """The recipe called `name`.

    Raises:
      ValueError: no such recipe, naming `FINETUNE_RECIPE` and the allowed names.
    """
    if name not in RECIPES:
        raise ValueError(f"FINETUNE_RECIPE = {name!r}: allowed: {', '.join(map(repr, RECIPES))}")
    return RECIPES[name]


def recipe_steps(*, recipe_name: str) -> int:
    """The steps of the recipe called `recipe_name` (gin: FINETUNE_DEFAULT_STEPS)."""
    return recipe(recipe_name).steps


def epochs(*, recipe_name: str, batch_size: int, pairs: int) -> float:
    """Passes over a fixed finetuning set of `pairs` pairs that the recipe makes at
    `batch_size`: above 1, the pairs repeat (a small Df under 2^18 steps repeats thousands of
    times); below 1, part of the set is never seen (any large Df under 300 steps)."""
    return recipe(recipe_name).steps * batch_size / pairs
