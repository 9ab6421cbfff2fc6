"""Exact parameter counts and training FLOPs per token of a LLaMA2 config.

Conventions (used everywhere in xlscale, and in `run.json` / `metrics.jsonl`):

- **Embedding parameters** are the input token embedding (`vocab x d_model`) *and* the untied
  output projection (`d_model x vocab`).
- **Non-embedding parameters N** are all the others: attention projections, MLP weights and
  every RMSNorm scale (per block and final). This is Kaplan et al.'s (2020) convention; it
  excludes the output projection even though that is a matmul, because it is tied to the vocab.
- **FLOPs per token** for training (forward + backward) are `6 N` (Kaplan; the default compute
  measure C = 6·N·D) and, with attention, `6 N + 6 · n_layers · seq_len · (n_heads · head_dim)`:
  PaLM's (Chowdhery et al. 2022, appendix B) `6N + 12·L·H·Q·T` with the attention term halved
  because causal attention needs only the lower triangle of the `T x T` score matrix.

The counts are computed from the config alone and are tested equal to the initialised tree.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from llama_jax.config import LlamaConfig


@dataclasses.dataclass(frozen=True)
class ParamCounts:
    """Parameter counts: `total = non_embedding + embedding` (see module docstring)."""

    total: int
    non_embedding: int
    embedding: int


@dataclasses.dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token: `six_n = 6·N`, `with_attention` adds causal attention."""

    six_n: int
    with_attention: int


def layer_params(config: LlamaConfig) -> int:
    """Parameters of one decoder block: q/k/v/out projections, SwiGLU weights, two norm scales."""
    d = config.d_model
    q_dim = config.num_heads * config.head_size
    kv_dim = config.kv_heads * config.head_size
    attention = d * q_dim + 2 * d * kv_dim + q_dim * d
    mlp = 3 * d * config.d_ff
    return attention + mlp + 2 * d


def param_counts(config: LlamaConfig) -> ParamCounts:
    """Exact counts of total, non-embedding and embedding parameters of `config`.

    Non-embedding excludes the input embedding and the untied output projection (Kaplan).
    """
    non_embedding = config.num_layers * layer_params(config) + config.d_model
    embedding = 2 * config.vocab_size * config.d_model
    return ParamCounts(
        total=non_embedding + embedding, non_embedding=non_embedding, embedding=embedding
    )


def attention_flops_per_token(config: LlamaConfig, *, seq_len: int) -> int:
    """Causal attention FLOPs per token for training: `6 · n_layers · seq_len · n_heads · head_dim`.

    Per layer and token, scores and the weighted sum are `2·2·T·H·Q` forward FLOPs for full
    attention; causal masking halves that, and the backward pass doubles the forward.
    """
    return 6 * config.num_layers * seq_len * config.num_heads * config.head_size


def flops_per_token(config: LlamaConfig, *, seq_len: int) -> FlopsPerToken:
    """Training FLOPs per token as `6·N` and with PaLM's causal attention term (module docstring)."""
    six_n = 6 * param_counts(config).non_embedding
    return FlopsPerToken(
        six_n=six_n, with_attention=six_n + attention_flops_per_token(config, seq_len=seq_len)
    )


def matmul_flops_per_token(config: LlamaConfig, *, seq_len: int) -> int:
    """All matmul FLOPs a training step needs per token: `with_attention` plus the output
    projection (`6 · d_model · vocab`).

    This is the "model FLOPs" of MFU-style utilisation figures (the input embedding is a gather,
    not a matmul); scaling-law fits use `flops_per_token` instead.
    """
    output_projection = 6 * config.d_model * config.vocab_size
    return flops_per_token(config, seq_len=seq_len).with_attention + output_projection


def count_tree(tree: Any) -> int:
    """Number of scalars in a pytree of arrays or `jax.ShapeDtypeStruct`s."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree))


def embedding_paths() -> tuple[tuple[str, str], ...]:
    """The (module, parameter) paths in `Llama`'s tree that count as embedding parameters."""
    return (("token_embedder", "embedding"), ("lm_head", "kernel"))
