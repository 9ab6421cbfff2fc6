"""Finetuning recipes by name: how many steps the MT paper's finetunes train, and why.

The MT paper (Isik et al. 2024, §4) says it finetunes for 300 steps at batch 128 (38,400 pairs),
but its Df sizes reach 5.9M (en-de) and 41M (en-fr) pairs, which 300 steps cannot reach, it
follows Raffel et al. (2020), who finetune for 2^18 steps, and it reports 5–7 hours per T5-3B
finetune on an 8x8 TPU (300 steps take minutes). Trained literally, the large-Df runs see no more
data than the small ones and the paper's Df effect cannot appear. Both readings are recipes here,
chosen by name (`FINETUNE_RECIPE`), recorded in run.json (`finetune_recipe`) and T5X's config.gin,
so a report can say which one its runs used. A sweep manifest may make it a grid axis
(`gin_axes = {FINETUNE_RECIPE = [...]}`: each run trains its recipe's steps; mt_paper.toml runs
both), and its finetunes evaluate at several steps so that a learning rate is chosen at each
run's best validation step, not at the end of thousands of repeats of a small set
(`launch.best_checkpoint`). The arithmetic is in docs/interfaces.md.
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
    "paper_300": FinetuneRecipe(steps=300, source="MT paper §4, as printed: 300 steps"),
    "raffel_2^18": FinetuneRecipe(
        steps=2**18,
        source="Raffel et al. 2020 §3.1.3 (which the MT paper says it follows): 2^18 steps",
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
