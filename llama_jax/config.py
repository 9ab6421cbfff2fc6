"""The frozen configuration of a LLaMA2 decoder."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from modeling.attention import check_kernel_name
from modeling.remat import REMAT_POLICIES

_DTYPES = ("float32", "bfloat16", "float16", "float64")

# Target backends on which projections that share an input run as one matmul over weights
# stacked on a new, unsharded axis (q/k/v; w1/w3). Fewer, larger dots are faster on CPU; on TPU
# and GPU the stacking copies the weights every step, and slicing the stacked result and
# broadcasting its gradient move more bytes than the separate dots cost (XLA's TPU estimate).
# The parameters stay separate either way, so checkpoints do not depend on it.
STACKED_PROJECTION_BACKENDS = frozenset({"cpu"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Shape and numerics of a LLaMA2 decoder-only Transformer (Touvron et al. 2023).

    Attributes:
      vocab_size: size of the (untied) input embedding and output projection; 36,152 is the
        CPT paper's bilingual SentencePiece vocabulary.
      d_model: hidden size ("Hidden Layer Size" in the CPT paper's Table 4).
      d_ff: SwiGLU inner size ("Intermediate Layer").
      num_heads: query heads ("Attention Head Count").
      num_kv_heads: key/value heads; None means `num_heads` (plain multi-head attention), fewer
        gives grouped-query attention. Must divide `num_heads`.
      num_layers: decoder blocks ("Number of Layers").
      head_dim: per-head size; None means `d_model // num_heads`, which must then divide evenly.
      max_len: context length the model is trained at (2048 in the paper). RoPE has no learned
        positions, so this bounds nothing inside the module; tables and recipes use it.
      rope_theta: RoPE base (10,000).
      norm_eps: RMSNorm epsilon (1e-5).
      dtype: activation/compute dtype name ("float32" or "bfloat16"); softmax, norms and logits
        are always computed in float32.
      param_dtype: dtype name the parameters are stored in.
      remat_policy: a key of `REMAT_POLICIES`, applied per decoder block in training.
      scan_layers: stack the blocks' parameters along a leading `layers` axis and run them with
        `nn.scan` (faster compiles for deep models) instead of a Python loop.
      attention_kernel: a name from `modeling.attention.kernel_names()`: "auto" (cudnn on GPU,
        splash on TPU, xla elsewhere), "xla", "cudnn" or "splash"; a kernel that cannot take a
        call falls back to "xla" and logs why.
    """

    vocab_size: int = 36152
    d_model: int
    d_ff: int
    num_heads: int
    num_kv_heads: int | None = None
    num_layers: int
    head_dim: int | None = None
    max_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat_policy: str = "none"
    scan_layers: bool = False
    attention_kernel: str = "auto"

    def __post_init__(self):
        for field in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "max_len"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_kv_heads={self.kv_heads} must divide num_heads={self.num_heads}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "set head_dim explicitly"
            )
        if self.head_size % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {self.head_size}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"unknown remat_policy {self.remat_policy!r}; valid: {', '.join(REMAT_POLICIES)}"
            )
        check_kernel_name(self.attention_kernel, field="attention_kernel")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(f"{field} must be one of {_DTYPES}, got {getattr(self, field)!r}")

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads after resolving the None default."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_size(self) -> int:
        """Per-head size after resolving the None default."""
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def compute_dtype(self) -> jnp.dtype:
        """`dtype` as a numpy dtype object."""
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self) -> jnp.dtype:
        """`param_dtype` as a numpy dtype object."""
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> LlamaConfig:
        """Returns a copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)
