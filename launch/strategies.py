"""The sweep's registries: training strategies, manifest axes, and model families.

A strategy names the experiment gin file a run uses, the coordinates it expands over (each set
through its gin macro) and the strategy whose checkpoint initialises it. A family says where its
size table and parameter/FLOP counting live (imported only when a sweep needs counts).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Strategy:
    """How one kind of run is trained.

    Attributes:
      name: the `run.json` strategy name.
      gin_file: the experiment gin file (relative to the gin search path).
      family: model family the strategy trains.
      axes: coordinates (besides size and seed) the strategy expands over, each set by its macro.
      parent: strategy whose checkpoint initialises this one (`INIT_CHECKPOINT`), if any.
      macros: fixed gin macros, for strategies that share a gin file (e.g. `STRATEGY`).
    """

    name: str
    gin_file: str
    family: str
    axes: tuple[str, ...] = ()
    parent: str | None = None
    macros: tuple[tuple[str, Any], ...] = ()


# Name -> strategy. A manifest may point a strategy at another gin file ([strategies.X] gin_file).
STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("source", "experiments/cpt_source_en.gin", "llama2"),
        Strategy("scratch", "experiments/cpt_scratch.gin", "llama2", ("target_lang",)),
        Strategy("cpt", "experiments/cpt.gin", "llama2", ("target_lang",), parent="source"),
        Strategy(
            "cpt_replay",
            "experiments/cpt_replay.gin",
            "llama2",
            ("target_lang", "replay_ratio"),
            parent="source",
        ),
        Strategy("pretrain", "experiments/mt_pretrain.gin", "t5", ("mixture",)),
        Strategy(
            "finetune",
            "experiments/mt_finetune.gin",
            "t5",
            ("mixture", "init_step", "task", "finetune_tokens"),
            parent="pretrain",
            macros=(("STRATEGY", "finetune"),),
        ),
        Strategy(
            "finetune_scratch",
            "experiments/mt_finetune.gin",
            "t5",
            ("task", "finetune_tokens"),
            macros=(("STRATEGY", "finetune_scratch"),),
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


# Macros the sweep computes itself; a manifest sets them through [budget] or the axes instead.
@dataclasses.dataclass(frozen=True)
class Counts:
    """Sizes and per-token training FLOPs of one model shape, from its family's counting module."""

    params_non_embedding: int
    params_total: int
    flops_per_token: float  # 6·N, N non-embedding
    flops_per_token_attn: float
    cost_per_token: float  # what a step actually computes: attention and output projection too


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family: where its size table and counting live, and its feature lengths."""

    name: str
    sizes_module: str
    counting_module: str
    feature_keys: tuple[str, ...]

    def config(self, size: str, shape: Mapping[str, Any]):
        """The model config of a table size with `shape` fields replaced (imports lazily)."""
        return importlib.import_module(self.sizes_module).get_config(size, **dict(shape))

    def nominal_params(self, size: str) -> float | None:
        """The paper's nominal parameter count of a table size (`SizeRow.nominal_m`), if any."""
        try:
            row = importlib.import_module(self.sizes_module).SIZES.get(size)
        except ImportError:
            return None
        nominal = getattr(row, "nominal_m", None)
        return None if nominal is None else nominal * 1e6

    def counts(self, size: str, shape: Mapping[str, Any], *, seq_len: int) -> Counts | None:
        """Parameter and FLOP counts; None when the family's packages are not importable."""
        try:
            counting = importlib.import_module(self.counting_module)
            config = self.config(size, shape)
        except ImportError:
            return None
        params = counting.param_counts(config)
        if hasattr(counting, "flops_per_token"):
            fpt = counting.flops_per_token(config, seq_len=seq_len)
            six_n, attn = float(fpt.six_n), float(fpt.with_attention)
            output = 6.0 * config.d_model * config.vocab_size
            cost = attn + output
        else:  # encoder-decoder: FLOPs per example, inputs and targets both `seq_len` long
            fpe = counting.flops_per_example(config, inputs_length=seq_len, targets_length=seq_len)
            six_n, attn = fpe.six_n / seq_len, fpe.with_attention / seq_len
            cost = attn
        return Counts(params.non_embedding, params.total, six_n, attn, cost)


FAMILIES: dict[str, Family] = {
    "llama2": Family("llama2", "llama_jax.sizes", "llama_jax.counting", ("targets",)),
    "t5": Family("t5", "t5_jax.sizes", "t5_jax.counting", ("inputs", "targets")),
}
