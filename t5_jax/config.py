"""The T5 encoder–decoder's hyperparameters, as one frozen dataclass.

Field names follow `llama_jax.config.LlamaConfig` where the two families share a concept
(`d_model`, `d_ff`, `num_heads`, `head_dim`, `dtype`, `param_dtype`); the T5-specific fields keep
T5X's meaning (`mlp_activations`, `logits_via_embedding`, relative-position buckets).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from modeling.attention import check_kernel_name
from modeling.remat import REMAT_POLICIES

# Activation names usable in `T5Config.mlp_activations`; "linear" is the identity (the gate's
# second branch in T5.1.1's gated GELU).
MLP_ACTIVATIONS = ("relu", "gelu", "silu", "linear")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# Two named MLP variants, for gin files and size tables.
GATED_GELU = ("gelu", "linear")  # T5.1.1: wo(gelu(wi_0 x) * wi_1 x)
RELU = ("relu",)  # original T5: wo(relu(wi x))


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Shape and numerics of a T5 encoder–decoder.

    Attributes:
      vocab_size: rows of the shared token embedding (T5's SentencePiece 32k + 100 sentinels,
        padded to a multiple of 128 = 32128 by default).
      d_model: model (embedding) width.
      d_ff: MLP hidden width.
      num_heads: attention heads, identical in self- and cross-attention.
      head_dim: width of one head; `num_heads * head_dim` need not equal `d_model`.
      num_encoder_layers: encoder blocks.
      num_decoder_layers: decoder blocks.
      mlp_activations: one activation per input branch of the MLP, multiplied together;
        `("gelu", "linear")` is T5.1.1's gated GELU, `("relu",)` the original T5.
      logits_via_embedding: tie the output projection to the token embedding (original T5);
        otherwise a separate `logits_dense` (T5.1.1).
      dropout_rate: dropout on embeddings, sublayer outputs, attention weights and the MLP
        hidden layer, applied only when a call passes `enable_dropout=True`.
      relpos_num_buckets: relative-position buckets per direction set (T5: 32).
      relpos_max_distance: distance beyond which all positions share the last bucket (T5: 128).
      layer_norm_eps: epsilon of the RMS layer norm.
      dtype: activation dtype name ("float32", "bfloat16").
      param_dtype: parameter dtype name.
      float32_attention_logits: the `xla` attention kernel's logits leave their matmul in float32
        (False, the default: in `dtype`, as T5X's T5.1.1 network, Hugging Face's T5 and LLaMA
        compute them; float32 logits cost a `[B, H, Q, K]` float32 array per layer, 5% of a
        T5-770M step on a TPU by XLA's estimate). The softmax is float32 either way.
      remat_policy: a key of `modeling.remat.REMAT_POLICIES` (the one registry), applied per
        layer in training calls, never while decoding.
      attention_kernel: a name from `modeling.attention.kernel_names()`: "auto" (cudnn on GPU,
        splash on TPU, xla elsewhere), "xla", "cudnn" or "splash"; a kernel that cannot take a
        call (relative-position bias on splash, cached decoding, dropout) falls back to "xla".
    """

    vocab_size: int = 32128
    d_model: int = 512
    d_ff: int = 1024
    num_heads: int = 6
    head_dim: int = 64
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    mlp_activations: tuple[str, ...] = GATED_GELU
    logits_via_embedding: bool = False
    dropout_rate: float = 0.1
    relpos_num_buckets: int = 32
    relpos_max_distance: int = 128
    layer_norm_eps: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    float32_attention_logits: bool = False
    remat_policy: str = "none"
    attention_kernel: str = "auto"

    def __post_init__(self):
        # Gin and TOML hand lists over; keep the dataclass hashable.
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        for name in ("vocab_size", "d_model", "d_ff", "num_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"T5Config.{name} must be positive, got {getattr(self, name)}")
        if self.num_encoder_layers < 0 or self.num_decoder_layers < 1:
            raise ValueError("T5Config needs >= 0 encoder layers and >= 1 decoder layer")
        unknown = [a for a in self.mlp_activations if a not in MLP_ACTIVATIONS]
        if unknown or not self.mlp_activations:
            raise ValueError(
                f"mlp_activations {self.mlp_activations!r}: each must be one of {MLP_ACTIVATIONS}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"T5Config.{name} must be one of {sorted(_DTYPES)}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy must be one of {sorted(REMAT_POLICIES)}")
        check_kernel_name(self.attention_kernel, field="T5Config.attention_kernel")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError("dropout_rate must be in [0, 1)")
        if self.relpos_num_buckets < 4 or self.relpos_max_distance <= self.relpos_num_buckets // 4:
            raise ValueError("relative-position buckets need num_buckets >= 4, max_distance larger")

    @property
    def activation_dtype(self):
        """The jnp dtype of activations."""
        return _DTYPES[self.dtype]

    @property
    def weight_dtype(self):
        """The jnp dtype parameters are stored in."""
        return _DTYPES[self.param_dtype]

    @property
    def is_gated(self) -> bool:
        """Whether the MLP has more than one input branch (T5.1.1's gated activations)."""
        return len(self.mlp_activations) > 1
