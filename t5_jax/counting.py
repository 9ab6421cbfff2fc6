"""Exact parameter counts and training FLOPs of a T5 configuration, computed from its shape.

`param_counts(config).total` equals the size of the tree `Transformer(config).init` builds
(a test checks it with `jax.eval_shape`, so the large sizes cost no memory). "Embedding"
parameters are the token embedding and, when untied, the output projection `logits_dense`;
the relative-position tables are non-embedding.
"""

from __future__ import annotations

import dataclasses

from t5_jax.config import T5Config


@dataclasses.dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a T5 model.

    Attributes:
      encoder: encoder stack without embeddings (layers, relative positions, final norm).
      decoder: decoder stack without embeddings.
      embedding: token embedding plus the untied output projection.
    """

    encoder: int
    decoder: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        """`encoder + decoder`, the N of scaling laws."""
        return self.encoder + self.decoder

    @property
    def total(self) -> int:
        """Every parameter: `non_embedding + embedding`."""
        return self.non_embedding + self.embedding


@dataclasses.dataclass(frozen=True)
class FlopsPerExample:
    """Training FLOPs (forward + backward) for one (inputs, targets) example.

    Attributes:
      six_n: `6 * (encoder * inputs_length + decoder * targets_length)`, the C = 6ND convention
        applied to each stack with the tokens that pass through it.
      with_attention: `six_n` plus the attention score and mixing matmuls (self-attention in
        both stacks, cross-attention) and the output projection, all as computed (unmasked).
    """

    six_n: int
    with_attention: int


def _attention(cfg: T5Config) -> int:
    return 4 * cfg.d_model * cfg.num_heads * cfg.head_dim


def _mlp(cfg: T5Config) -> int:
    return len(cfg.mlp_activations) * cfg.d_model * cfg.d_ff + cfg.d_ff * cfg.d_model


def param_counts(config: T5Config) -> ParamCounts:
    """Exact parameter counts of `Transformer(config)`."""
    d = config.d_model
    relpos = config.num_heads * config.relpos_num_buckets
    encoder_layer = 2 * d + _attention(config) + _mlp(config)
    decoder_layer = 3 * d + 2 * _attention(config) + _mlp(config)
    encoder = config.num_encoder_layers * encoder_layer + relpos + d
    decoder = config.num_decoder_layers * decoder_layer + relpos + d
    embedding = config.vocab_size * d * (1 if config.logits_via_embedding else 2)
    return ParamCounts(encoder=encoder, decoder=decoder, embedding=embedding)


def flops_per_example(
    config: T5Config, *, inputs_length: int, targets_length: int
) -> FlopsPerExample:
    """Training FLOPs of one example with `inputs_length` encoder and `targets_length` decoder
    tokens (packed lengths: attention is computed over the whole packed row)."""
    counts = param_counts(config)
    li, lt = inputs_length, targets_length
    six_n = 6 * (counts.encoder * li + counts.decoder * lt)
    hd = config.num_heads * config.head_dim
    # Scores (q k^T) and mixing (w v): 2 matmuls x 2 FLOPs per MAC x 3 (forward + backward).
    attn = (
        12
        * hd
        * (config.num_encoder_layers * li * li + config.num_decoder_layers * (lt * lt + lt * li))
    )
    logits = 6 * config.d_model * config.vocab_size * lt
    return FlopsPerExample(six_n=six_n, with_attention=six_n + attn + logits)
