"""What gin files compute from macros, since gin cannot: task and mixture names, the paper's
batch size, and finetuning steps and sets from token budgets.

Gin files import this module (`from trainer import recipes`) and call its functions as
configurables (`MIXTURE_OR_TASK_NAME = @target/recipes.lm_task()`): task names from
`TARGET_LANG` and `REPLAY_RATIO`, `BATCH_SIZE` from the family's paper recipe, and the steps and
set of a finetuning run from `FINETUNE_TOKENS` in `FINETUNE_UNIT` (`rundir.paper_units`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from modeling import family as family_lib
from rundir import paper_units
from trainer import validation


def lm_task(*, lang: str) -> str:
    """The language-modelling task of `lang` (`lm_<lang>`)."""
    # Its name only: `pipelines.names` imports neither seqio nor TensorFlow, which a run on
    # prepared data never needs.
    from pipelines import names

    return names.lm_task_name(lang)


def lm_tasks(*, langs: Sequence[str]) -> list[str]:
    """`lm_<lang>` for each language, duplicates dropped (for `EVAL_TASKS`)."""
    return list(dict.fromkeys(lm_task(lang=lang) for lang in langs))


def replay_mixture(*, target_lang: str, source_lang: str, replay_ratio: float) -> str:
    """The CPT replay mixture `cpt_<target>_replay_<source>_<pct>`: `replay_ratio` (0-1) of the
    tokens from the source language, the rest from the target.

    Raises:
      trainer.validation.ConfigError: no such mixture in `pipelines.mixtures.RATIOS`, naming
        `REPLAY_RATIO` and its allowed values (or `TARGET_LANG`/`SOURCE_LANG` and theirs), rather
        than an unregistered mixture name later on.
    """
    from pipelines import mixture_tables as mixtures  # the tables: no seqio, no TensorFlow

    allowed = [
        p for p in range(101) if mixtures.cpt_name(target_lang, source_lang, p) in mixtures.RATIOS
    ]
    if not allowed:
        pairs = sorted(
            {tuple(name.split("_")[1:4:2]) for name in mixtures.RATIOS if "_replay_" in name}
        )
        raise validation.ConfigError(
            f"no replay mixtures for TARGET_LANG = {target_lang!r} with SOURCE_LANG = "
            f"{source_lang!r} (recipes.replay_mixture); allowed (target, source): "
            + ", ".join(f"({t!r}, {s!r})" for t, s in pairs)
        )
    pct = round(100 * replay_ratio)
    if abs(pct - 100 * replay_ratio) > 1e-6 or pct not in allowed:
        raise validation.ConfigError(
            f"REPLAY_RATIO = {replay_ratio!r} (recipes.replay_mixture.replay_ratio) names no "
            f"replay mixture of {target_lang!r} with {source_lang!r}; allowed: "
            + ", ".join(f"{p / 100:g}" for p in allowed)
        )
    return mixtures.cpt_name(target_lang, source_lang, pct)


def paper_batch_size(*, model_size: str, seq_len: int, family: str = "llama2") -> int:
    """The family's paper batch (in sequences of `seq_len`) for a size, from its
    `paper_recipe` (LLaMA2: the CPT paper's 1M, 2M or 4M tokens by parameter band, its Table 1).

    Raises:
      trainer.validation.ConfigError: unknown family or size, or a family whose paper fixes no
        batch per size (set `BATCH_SIZE` instead).
    """
    validation.check_choice(name="family", value=family, allowed=family_lib.names())
    spec = family_lib.get(family)
    validation.check_model_size(
        family=family,
        size=model_size,
        allowed=spec.sizes(),
        prefixes=family_lib.size_prefixes(spec),
    )
    recipe = spec.paper_recipe(model_size, seq_len=seq_len)
    if recipe is None:
        raise validation.ConfigError(
            f"the {family} paper fixes no batch per size; set {validation.BINDINGS['batch_size']}"
        )
    return recipe.batch_size


def finetune_steps(
    *,
    finetune_tokens: int | None,
    batch_size: int,
    task_feature_lengths: Mapping[str, int],
    default_steps: int = 300,
    unit: str = "target",
) -> int:
    """Steps of a finetuning run on a set of size `finetune_tokens` (Df, `FINETUNE_TOKENS`) in
    `unit` (`FINETUNE_UNIT`, a key of `paper_units.DF_UNITS`).

    `'target'`: one pass over about Df target tokens, `ceil(Df / (batch × targets length))`, at
    least 1 (packed rows are not completely full, so a run sees slightly fewer real tokens;
    `metrics.jsonl` counts the exact number, `tokens`). `'paper'`: `default_steps` (the MT
    paper's 300) whatever Df, so that small and large sets differ in how often their pairs
    repeat, not in training length. `default_steps` too when Df is None.

    Raises:
      ValueError: a non-positive budget (naming `FINETUNE_TOKENS`) or an unknown unit.
    """
    chosen = paper_units.finetune_set(finetune_tokens=finetune_tokens, unit=unit)
    if chosen.subset_tokens is None:
        return int(default_steps)
    per_step = int(batch_size) * int(task_feature_lengths["targets"])
    return max(1, math.ceil(chosen.subset_tokens / per_step))


def finetune_subset_tokens(*, finetune_tokens: int | None, unit: str = "target") -> int | None:
    """`DataConfig.subset_tokens` of a finetuning set of size Df in `unit`: Df for `'target'`,
    else None (gin cannot compute; `runs/finetune.gin` binds it)."""
    return paper_units.finetune_set(finetune_tokens=finetune_tokens, unit=unit).subset_tokens


def finetune_pairs(*, finetune_tokens: int | None, unit: str = "target") -> int | None:
    """`DataConfig.subset_examples` of a finetuning set of size Df in `unit`: for `'paper'` the
    MT paper's pair count `round(Df / 512)`, else None."""
    return paper_units.finetune_set(finetune_tokens=finetune_tokens, unit=unit).pairs
