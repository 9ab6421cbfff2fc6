"""The sweep's registries: training strategies, manifest axes, and model families.

A strategy (`rundir.run_record.Strategy`, the name `run.json` records) has a `StrategySpec`: the
experiment gin file its runs use, the coordinates they expand over (each set through its gin macro)
and the strategy whose checkpoint initialises them. Model families are
`modeling.family`'s registry; `counts` asks one for a shape's parameters and FLOPs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rundir.run_record import Strategy


@dataclasses.dataclass(frozen=True)
class StrategySpec:
    """How the runs of one strategy are trained.

    Attributes:
      name: the strategy (`run.json`'s name).
      gin_file: the experiment gin file (relative to the gin search path).
      family: model family the strategy trains.
      axes: coordinates (besides size and seed) the strategy expands over, each set by its macro.
      parent: strategy whose checkpoint initialises this one (`INIT_CHECKPOINT`), if any.
      macros: fixed gin macros, for strategies that share a gin file (e.g. `STRATEGY`).
    """

    name: Strategy
    gin_file: str
    family: str
    axes: tuple[str, ...] = ()
    parent: Strategy | None = None
    macros: tuple[tuple[str, Any], ...] = ()


# Strategy -> its spec. A manifest may point a strategy at another gin file ([strategies.X]
# gin_file).
STRATEGIES: dict[Strategy, StrategySpec] = {
    s.name: s
    for s in (
        StrategySpec(Strategy.SOURCE, "experiments/cpt_source_en.gin", "llama2"),
        StrategySpec(Strategy.SCRATCH, "experiments/cpt_scratch.gin", "llama2", ("target_lang",)),
        StrategySpec(
            Strategy.CPT,
            "experiments/cpt.gin",
            "llama2",
            ("target_lang",),
            parent=Strategy.SOURCE,
        ),
        StrategySpec(
            Strategy.CPT_REPLAY,
            "experiments/cpt_replay.gin",
            "llama2",
            ("target_lang", "replay_ratio"),
            parent=Strategy.SOURCE,
        ),
        StrategySpec(Strategy.PRETRAIN, "experiments/mt_pretrain.gin", "t5", ("mixture",)),
        StrategySpec(
            Strategy.FINETUNE,
            "experiments/mt_finetune.gin",
            "t5",
            ("mixture", "init_step", "task", "finetune_tokens"),
            parent=Strategy.PRETRAIN,
            macros=(("STRATEGY", Strategy.FINETUNE.value),),
        ),
        StrategySpec(
            Strategy.FINETUNE_SCRATCH,
            "experiments/mt_finetune.gin",
            "t5",
            ("task", "finetune_tokens"),
            macros=(("STRATEGY", Strategy.FINETUNE_SCRATCH.value),),
        ),
    )
}

# Manifest axis (plural) -> run coordinate (singular).
AXES: dict[str, str] = {
    "sizes": "size",
    "seeds": "seed",
    "target_langs": "target_lang",
    "replay_ratios": "replay_ratio",
    "mixtures": "mixture",
    "tasks": "task",
    "finetune_tokens": "finetune_tokens",
    "init_steps": "init_step",
}
# Coordinate -> the gin macro that carries it (init_step goes into INIT_CHECKPOINT instead).
COORD_MACROS: dict[str, str] = {
    "size": "MODEL_SIZE",
    "seed": "SEED",
    "target_lang": "TARGET_LANG",
    "replay_ratio": "REPLAY_RATIO",
    "mixture": "MIXTURE",
    "task": "TASK",
    "finetune_tokens": "FINETUNE_TOKENS",
}


@dataclasses.dataclass(frozen=True)
class Counts:
    """Sizes and per-token training FLOPs of one model shape, as its family counts them."""

    params_non_embedding: int
    params_total: int
    flops_per_token: float  # 6·N, N non-embedding
    flops_per_token_attn: float
    cost_per_token: float  # what a step actually computes: attention and output projection too


def counts(family: Any, size: str, shape: Mapping[str, Any], *, seq_len: int) -> Counts:
    """Parameter and FLOP counts of `size` with `shape` fields replaced, asked of `family` (a
    `modeling.family.ModelFamily`; an encoder-decoder's inputs are `seq_len` long too)."""
    config = family.get_config(size, **dict(shape))
    total, non_embedding = family.param_counts(config)
    six_n, attn = family.flops_per_token(config, seq_len=seq_len)
    cost = family.cost_per_token(config, seq_len=seq_len)
    return Counts(non_embedding, total, six_n, attn, cost)
