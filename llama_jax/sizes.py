"""The model sizes: all 42 rows of the CPT paper's Table 4, plus tiny sizes for tests and CPU demos.

Paper sizes are named `llama2_<nominal>m` after the paper's "Parameter Size (M)" column and keep
its hidden size, intermediate size, head count and layer count exactly. The nominal size is the
paper's label; our exact counts (`llama_jax.counting`) differ from it and are shown beside it by
`xlscale sizes` rather than fudged to match.

One row needs a choice the table does not make: `llama2_4016m` has d_model 2688 and 22 heads,
which do not divide. We keep 22 heads and set `head_dim = 128`, the head size of every other row
with d_model >= 1280, so its attention width is 22·128 = 2816 (projections map 2688 -> 2816 ->
2688).

`'hf:<dir>'` names an imported shape: the fields of `<dir>/config.json` (`llama_jax.hf_config`),
with exact parameter counts computed like any other size's.

The paper's training recipe per size (§2.1): context 2048, tokens = 20 x parameters, batch tokens
by size band (2^20 for <= 1B, 2^21 for 1B-2.5B, 2^22 above), see `paper_recipe`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from llama_jax import hf_config
from llama_jax.config import LlamaConfig
from llama_jax.counting import flops_per_token, param_counts


@dataclasses.dataclass(frozen=True)
class SizeRow:
    """One size: shape fields of `LlamaConfig` plus the paper's nominal size (None if not a paper
    size)."""

    d_model: int
    d_ff: int
    num_heads: int
    num_layers: int
    nominal_m: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None


# Table 4 of Zheng et al. 2024, verbatim: (nominal M, hidden, intermediate, heads, layers).
_TABLE4: tuple[tuple[int, int, int, int, int], ...] = (
    (49, 512, 3072, 8, 8),
    (66, 576, 3584, 9, 9),
    (86, 640, 3584, 10, 10),
    (105, 640, 3584, 10, 13),
    (125, 640, 3584, 10, 16),
    (137, 768, 4608, 12, 12),
    (166, 768, 4608, 12, 15),
    (194, 768, 4608, 12, 18),
    (208, 896, 5120, 14, 14),
    (234, 896, 5120, 14, 16),
    (259, 896, 5120, 14, 18),
    (301, 1024, 5632, 16, 16),
    (334, 1024, 5632, 16, 18),
    (368, 1024, 5632, 16, 20),
    (512, 1280, 7168, 10, 18),
    (591, 1280, 7168, 10, 21),
    (616, 1408, 7680, 11, 18),
    (670, 1280, 7168, 10, 24),
    (711, 1408, 7680, 11, 21),
    (766, 1536, 8704, 12, 19),
    (806, 1408, 7680, 11, 24),
    (879, 1536, 8704, 12, 22),
    (992, 1536, 8704, 12, 25),
    (1085, 1792, 9728, 14, 20),
    (1239, 1792, 9728, 14, 23),
    (1393, 1792, 9728, 14, 26),
    (1542, 2048, 11264, 16, 22),
    (1736, 2176, 11776, 17, 22),
    (1743, 2048, 11264, 16, 25),
    (1944, 2048, 11264, 16, 28),
    (1963, 2176, 11776, 17, 25),
    (2112, 2304, 12800, 18, 24),
    (2191, 2176, 11776, 17, 28),
    (2452, 2304, 12800, 18, 28),
    (2791, 2304, 12800, 18, 32),
    (2808, 2560, 13824, 20, 26),
    (3227, 2560, 13824, 20, 30),
    (3647, 2560, 13824, 20, 34),
    (4016, 2688, 14848, 22, 34),
    (4248, 2688, 14848, 21, 36),
    (4657, 2816, 15360, 22, 36),
    (5534, 3072, 16896, 24, 36),
)

# Head size for rows whose d_model is not divisible by the head count (see module docstring).
_HEAD_DIM_OVERRIDES: dict[int, int] = {4016: 128}


def _paper_sizes() -> dict[str, SizeRow]:
    return {
        f"llama2_{m}m": SizeRow(
            d_model=d,
            d_ff=ff,
            num_heads=h,
            num_layers=layers,
            nominal_m=m,
            head_dim=_HEAD_DIM_OVERRIDES.get(m),
        )
        for m, d, ff, h, layers in _TABLE4
    }


# Small sizes: `llama2_tiny` for unit tests (GQA, distinct dims), and CPU demo sizes spanning
# ~32x in non-embedding parameters (d_ff = 4·d_model; head size 32, or 64 from d_model 128 as in
# Table 4's small rows).
_SMALL_SIZES: dict[str, SizeRow] = {
    "llama2_tiny": SizeRow(d_model=32, d_ff=88, num_heads=4, num_layers=2, num_kv_heads=2),
    "llama2_cpu_d64": SizeRow(d_model=64, d_ff=256, num_heads=2, num_layers=2),
    "llama2_cpu_d96": SizeRow(d_model=96, d_ff=384, num_heads=3, num_layers=3),
    "llama2_cpu_d128": SizeRow(d_model=128, d_ff=512, num_heads=2, num_layers=4),
    "llama2_cpu_d192": SizeRow(d_model=192, d_ff=768, num_heads=3, num_layers=4),
    "llama2_cpu_d256": SizeRow(d_model=256, d_ff=1024, num_heads=4, num_layers=4),
}

SIZES: dict[str, SizeRow] = {**_paper_sizes(), **_SMALL_SIZES}

PAPER_SEQ_LEN = 2048
PAPER_TOKENS_PER_PARAM = 20


def _row(name: str) -> SizeRow:
    try:
        return SIZES[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; valid names: {', '.join(SIZES)}") from None


def _nominal_m(name: str) -> int | None:
    """The paper's nominal size in millions (None for small and imported sizes)."""
    return None if hf_config.is_hf_size(name) else _row(name).nominal_m


def get_config(name: str, **overrides: Any) -> LlamaConfig:
    """Returns the `LlamaConfig` of size `name`, with any `LlamaConfig` field overridden.

    `name` is a key of `SIZES`, or `'hf:<dir>'`: an imported shape, read from `<dir>/config.json`
    (`llama_jax.hf_config`; vocabulary, GQA, RoPE base and norm epsilon included).

    Raises:
      ValueError: `name` is not in `SIZES` (the message lists the valid names).
      FileNotFoundError: an imported size's directory has no `config.json`.
    """
    if hf_config.is_hf_size(name):
        return LlamaConfig(**{**hf_config.size_fields(name), **overrides})
    row = _row(name)
    fields = {
        "d_model": row.d_model,
        "d_ff": row.d_ff,
        "num_heads": row.num_heads,
        "num_kv_heads": row.num_kv_heads,
        "num_layers": row.num_layers,
        "head_dim": row.head_dim,
    }
    fields.update(overrides)
    return LlamaConfig(**fields)


def paper_batch_tokens(params: float) -> int:
    """The paper's batch size in tokens for a model of `params` parameters (its Table 1 bands).

    1M tokens for 50M-1B, 2M for 1B-2.5B, 4M for 2.7B-5.5B; "M" is 2^20 so that a batch is a whole
    number of 2048-token sequences (512, 1024, 2048). Sizes below 50M use the smallest band.
    """
    if params <= 1.0e9:
        return 2**20
    if params <= 2.5e9:
        return 2**21
    return 2**22


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Training length of one size under the paper's recipe.

    `params` is the count the recipe is based on (the paper's nominal size for Table 4 rows with
    `basis="paper"`, else our non-embedding count).
    """

    params: int
    tokens: int
    batch_tokens: int
    batch_size: int
    train_steps: int


def paper_recipe(
    name: str,
    *,
    seq_len: int = PAPER_SEQ_LEN,
    tokens_per_param: float = PAPER_TOKENS_PER_PARAM,
    basis: str = "paper",
) -> Recipe:
    """Tokens (`tokens_per_param` x params), batch and steps for size `name` at `seq_len`.

    Args:
      name: a key of `SIZES`.
      seq_len: context length; the paper's is 2048.
      tokens_per_param: 20 in the paper.
      basis: "paper" counts parameters as the paper's nominal size (what the paper trained on;
        sizes without one fall back to ours), "ours" as our exact non-embedding count.
    """
    if basis not in ("paper", "ours"):
        raise ValueError(f"basis must be 'paper' or 'ours', got {basis!r}")
    nominal_m = _nominal_m(name)
    if basis == "paper" and nominal_m is not None:
        params = nominal_m * 10**6
    else:
        params = param_counts(get_config(name)).non_embedding
    batch_tokens = paper_batch_tokens(params)
    batch_size = max(1, batch_tokens // seq_len)
    tokens = round(tokens_per_param * params)
    return Recipe(
        params=params,
        tokens=tokens,
        batch_tokens=batch_size * seq_len,
        batch_size=batch_size,
        train_steps=math.ceil(tokens / (batch_size * seq_len)),
    )


def describe(name: str, *, seq_len: int = PAPER_SEQ_LEN, basis: str = "paper") -> dict[str, Any]:
    """One row of `xlscale sizes`: shapes, paper nominal vs our counts, FLOPs and recipe.

    Counts follow `llama_jax.counting` (non-embedding excludes the input embedding and the untied
    output projection); FLOPs per token are at `seq_len`.
    """
    nominal_m = _nominal_m(name)
    config = get_config(name)
    counts = param_counts(config)
    flops = flops_per_token(config, seq_len=seq_len)
    recipe = paper_recipe(name, seq_len=seq_len, basis=basis)
    return {
        "name": name,
        "paper_m": nominal_m,
        "d_model": config.d_model,
        "d_ff": config.d_ff,
        "num_heads": config.num_heads,
        "num_kv_heads": config.kv_heads,
        "head_dim": config.head_size,
        "num_layers": config.num_layers,
        "params_non_embedding": counts.non_embedding,
        "params_total": counts.total,
        "ratio_to_paper": (None if nominal_m is None else counts.non_embedding / (nominal_m * 1e6)),
        "flops_per_token": flops.six_n,
        "flops_per_token_attn": flops.with_attention,
        "recipe_params": recipe.params,
        "tokens": recipe.tokens,
        "batch_tokens": recipe.batch_tokens,
        "batch_size": recipe.batch_size,
        "train_steps": recipe.train_steps,
    }
