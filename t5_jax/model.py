"""The T5 encoder–decoder `Transformer` (T5.1.1 and original T5), with T5X's module contract.

`Transformer(config)` has `encode`, `decode` and `__call__` with T5X's `EncoderDecoder`
arguments, parameter names (`token_embedder`, `encoder/layers_0/attention/query`,
`encoder/relpos_bias`, `encoder_norm`, `decoder/logits_dense`, ...) and a `cache` collection for
decoding, so that it runs inside T5X's `EncoderDecoderModel` as well as in `trainer/`.

Decoding follows T5X: first a `decode=True` call on full-length dummy inputs with
`mutable=["cache"]` creates zero caches (its logits are valid causal logits, but nothing is
prefilled); then each `decode(encoded, encoder_input_tokens, token[:, None], token[:, None],
decode=True, mutable=["cache"])` step feeds one decoder token and returns the next-token logits.
Cross-attention keys/values are projected from `encoded` on the first step and cached.

Packed sequences and padding: no mask is materialised. Each attention gets segment ids (0 for
padding, the packed-example id or 1 elsewhere) and a causal flag, and the seam
`modeling.attention.attend` keeps segments apart; the relative-position bias is computed once per
stack. As in T5X, relative positions come from the array index, which equals the in-segment
distance wherever attention is allowed, so `*_positions` are accepted for the contract and not
needed.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from modeling.axes import ACT_EMBED, ACT_VOCAB, EMBED, VOCAB
from modeling.remat import REMAT_POLICIES
from t5_jax import layers
from t5_jax.config import T5Config


def _dtypes(cfg: T5Config) -> dict[str, jnp.dtype]:
    """Every layer computes in the activation dtype and keeps its parameters in the weight
    dtype (the output projection alone computes in float32)."""
    return dict(dtype=cfg.activation_dtype, param_dtype=cfg.weight_dtype)


def _dropout(cfg: T5Config, x: jax.Array, deterministic: bool, broadcast: bool = True):
    dims = (-2,) if broadcast else ()
    return nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=dims)(x, deterministic=deterministic)


def _norm(cfg: T5Config, name: str) -> layers.LayerNorm:
    return layers.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        **_dtypes(cfg),
        name=name,
    )


def _attention(cfg: T5Config, name: str, cross: bool = False):
    return layers.MultiHeadDotProductAttention(
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        out_features=cfg.d_model,
        cross=cross,
        dropout_rate=cfg.dropout_rate,
        kernel=cfg.attention_kernel,
        float32_logits=cfg.float32_attention_logits,
        **_dtypes(cfg),
        name=name,
    )


def _mlp(cfg: T5Config) -> layers.MlpBlock:
    return layers.MlpBlock(
        intermediate_dim=cfg.d_ff,
        activations=cfg.mlp_activations,
        intermediate_dropout_rate=cfg.dropout_rate,
        **_dtypes(cfg),
        name="mlp",
    )


def _maybe_remat(cfg: T5Config, layer_cls, static_argnums: tuple[int, ...]):
    if cfg.remat_policy == "none":
        return layer_cls
    return nn.remat(
        layer_cls, policy=REMAT_POLICIES[cfg.remat_policy], static_argnums=static_argnums
    )


class EncoderLayer(nn.Module):
    """Pre-norm encoder block: self-attention, then MLP, each with dropout and a residual."""

    config: T5Config

    @nn.compact
    def __call__(self, inputs, segment_ids, bias, deterministic: bool = True):
        """[b, l, d] -> [b, l, d]; `segment_ids` [b, l] (0 = padding) keep examples apart."""
        cfg = self.config
        x = _norm(cfg, "pre_attention_layer_norm")(inputs)
        x = _attention(cfg, "attention")(
            x, x, bias, q_segment_ids=segment_ids, deterministic=deterministic
        )
        x = _dropout(cfg, x, deterministic) + inputs
        y = _norm(cfg, "pre_mlp_layer_norm")(x)
        y = _mlp(cfg)(y, deterministic=deterministic)
        y = _dropout(cfg, y, deterministic) + x
        return nn.with_logical_constraint(y, ACT_EMBED)


class DecoderLayer(nn.Module):
    """Pre-norm decoder block: causal self-attention, cross-attention to the encoder, MLP."""

    config: T5Config
    relative_embedding: nn.Module | None = None

    @nn.compact
    def __call__(
        self,
        inputs,
        encoded,
        segments,
        cross_segments,
        bias,
        deterministic: bool = True,
        decode: bool = False,
    ):
        """[b, l, d] (and encoder output [b, le, d]) -> [b, l, d].

        `segments` [b, l] are the decoder's own segment ids (or None); `cross_segments` the
        (decoder [b, l], encoder [b, le]) pair for cross-attention.
        """
        cfg = self.config
        x = _norm(cfg, "pre_self_attention_layer_norm")(inputs)
        x = _attention(cfg, "self_attention")(
            x,
            x,
            bias,
            causal=True,
            q_segment_ids=segments,
            relpos=self.relative_embedding,
            decode=decode,
            deterministic=deterministic,
        )
        x = _dropout(cfg, x, deterministic) + inputs
        y = _norm(cfg, "pre_cross_attention_layer_norm")(x)
        y = _attention(cfg, "encoder_decoder_attention", cross=True)(
            y,
            encoded,
            q_segment_ids=cross_segments[0],
            kv_segment_ids=cross_segments[1],
            decode=decode,
            deterministic=deterministic,
        )
        y = _dropout(cfg, y, deterministic) + x
        z = _norm(cfg, "pre_mlp_layer_norm")(y)
        z = _mlp(cfg)(z, deterministic=deterministic)
        z = _dropout(cfg, z, deterministic) + y
        return nn.with_logical_constraint(z, ACT_EMBED)


def _relpos(cfg: T5Config) -> layers.RelativePositionBiases:
    return layers.RelativePositionBiases(
        num_buckets=cfg.relpos_num_buckets,
        max_distance=cfg.relpos_max_distance,
        num_heads=cfg.num_heads,
        **_dtypes(cfg),
        name="relpos_bias",
    )


class Encoder(nn.Module):
    """Embedding, a stack of encoder layers sharing one relative-position table, final norm."""

    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(self, tokens, segment_ids, deterministic: bool = True):
        """Tokens [b, l] and segment ids [b, l] (0 = padding) -> encodings [b, l, d]."""
        cfg = self.config
        length = tokens.shape[1]
        bias = _relpos(cfg).full(length, length, bidirectional=True)
        x = self.shared_embedding(tokens)
        x = _dropout(cfg, x, deterministic).astype(cfg.activation_dtype)
        layer_cls = _maybe_remat(cfg, EncoderLayer, static_argnums=(4,))
        for i in range(cfg.num_encoder_layers):
            x = layer_cls(config=cfg, name=f"layers_{i}")(x, segment_ids, bias, deterministic)
        x = _norm(cfg, "encoder_norm")(x)
        return _dropout(cfg, x, deterministic, broadcast=False)


class Decoder(nn.Module):
    """Embedding, decoder layers (shared causal relative positions), final norm, logits."""

    config: T5Config
    shared_embedding: nn.Module

    @nn.compact
    def __call__(
        self,
        encoded,
        tokens,
        segments,
        cross_segments,
        deterministic: bool = True,
        decode: bool = False,
    ):
        """Decoder input tokens [b, l] -> float32 logits [b, l, vocab]; segment ids as in
        `DecoderLayer`."""
        cfg = self.config
        length = tokens.shape[1]
        relpos = _relpos(cfg)
        # A one-token decode step replaces this with its own row (from its cache index).
        bias = relpos.full(length, length, bidirectional=False)
        y = self.shared_embedding(tokens)
        y = _dropout(cfg, y, deterministic).astype(cfg.activation_dtype)
        layer_cls = DecoderLayer if decode else _maybe_remat(cfg, DecoderLayer, (6, 7))
        for i in range(cfg.num_decoder_layers):
            y = layer_cls(config=cfg, relative_embedding=relpos, name=f"layers_{i}")(
                y, encoded, segments, cross_segments, bias, deterministic, decode
            )
        y = _norm(cfg, "decoder_norm")(y)
        y = _dropout(cfg, y, deterministic)
        if cfg.logits_via_embedding:
            logits = self.shared_embedding.attend(y) / jnp.sqrt(cfg.d_model)
        else:
            logits = layers.Dense(
                cfg.vocab_size,
                kernel_axes=(EMBED, VOCAB),
                dtype=jnp.float32,
                param_dtype=cfg.weight_dtype,
                name="logits_dense",
            )(y)
        return nn.with_logical_constraint(logits, ACT_VOCAB)


class Transformer(nn.Module):
    """T5 encoder–decoder with T5X's `encode` / `decode` / `__call__` contract."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = layers.Embed(
            num_embeddings=cfg.vocab_size,
            features=cfg.d_model,
            **_dtypes(cfg),
        )
        self.encoder = Encoder(config=cfg, shared_embedding=self.token_embedder)
        self.decoder = Decoder(config=cfg, shared_embedding=self.token_embedder)

    def encode(
        self,
        encoder_input_tokens,
        encoder_segment_ids=None,
        encoder_positions=None,
        *,
        enable_dropout: bool = False,
    ):
        """Encodes int tokens [b, l] (0 = padding) -> [b, l, d_model].

        Args:
          encoder_input_tokens: input ids, 0 marks padding.
          encoder_segment_ids: packed-example ids; attention stays within a segment.
          encoder_positions: accepted for T5X's contract; relative positions need no positions.
          enable_dropout: apply dropout (needs a `dropout` rng).
        """
        del encoder_positions
        segments = layers.attention_segments(encoder_input_tokens > 0, encoder_segment_ids)
        return self.encoder(encoder_input_tokens, segments, deterministic=not enable_dropout)

    def decode(
        self,
        encoded,
        encoder_input_tokens,
        decoder_input_tokens,
        decoder_target_tokens=None,
        *,
        encoder_segment_ids=None,
        decoder_segment_ids=None,
        decoder_positions=None,
        enable_dropout: bool = False,
        decode: bool = False,
        max_decode_length: int | None = None,
    ):
        """Decodes against `encoded` -> float32 logits [b, l, vocab].

        Args:
          encoded: encoder output [b, le, d].
          encoder_input_tokens: [b, le], only for the padding mask.
          decoder_input_tokens: [b, l], targets shifted right (0 starts each sequence).
          decoder_target_tokens: [b, l]; 0 marks padding. None: every position is valid.
          encoder_segment_ids, decoder_segment_ids: packing ids (training only).
          decoder_positions: accepted for T5X's contract, unused.
          enable_dropout: apply dropout.
          decode: use the `cache` collection (one token per call once it exists).
          max_decode_length: accepted for T5X's contract; the cache knows its length.
        """
        del decoder_positions, max_decode_length
        enc_valid = encoder_input_tokens > 0
        if decode:
            if encoder_segment_ids is not None or decoder_segment_ids is not None:
                raise ValueError("packed (segmented) inputs cannot be decoded with a cache")
            segments = None  # causal only
            dec_valid = jnp.ones_like(decoder_input_tokens, dtype=bool)
        else:
            if encoder_segment_ids is not None and decoder_segment_ids is None:
                raise ValueError("encoder_segment_ids need decoder_segment_ids")
            if decoder_target_tokens is None:
                dec_valid = jnp.ones_like(decoder_input_tokens, dtype=bool)
            else:
                dec_valid = decoder_target_tokens > 0
            segments = layers.attention_segments(dec_valid, decoder_segment_ids)
        # Cross-attention matches packed examples only when the encoder side is packed too.
        cross_ids = None if encoder_segment_ids is None else decoder_segment_ids
        cross_segments = (
            layers.attention_segments(dec_valid, cross_ids),
            layers.attention_segments(enc_valid, encoder_segment_ids),
        )
        return self.decoder(
            encoded,
            decoder_input_tokens,
            segments,
            cross_segments,
            deterministic=not enable_dropout,
            decode=decode,
        )

    def __call__(
        self,
        encoder_input_tokens,
        decoder_input_tokens,
        decoder_target_tokens=None,
        *,
        encoder_segment_ids=None,
        decoder_segment_ids=None,
        encoder_positions=None,
        decoder_positions=None,
        enable_dropout: bool = False,
        decode: bool = False,
        max_decode_length: int | None = None,
    ):
        """Encodes, then decodes teacher-forced: float32 logits [b, l_dec, vocab].

        `decoder_input_tokens` is `decoder_target_tokens` shifted right, with 0 opening each
        (packed) sequence. See `encode` and `decode` for the arguments.
        """
        encoded = self.encode(
            encoder_input_tokens,
            encoder_segment_ids,
            encoder_positions,
            enable_dropout=enable_dropout,
        )
        return self.decode(
            encoded,
            encoder_input_tokens,
            decoder_input_tokens,
            decoder_target_tokens,
            encoder_segment_ids=encoder_segment_ids,
            decoder_segment_ids=decoder_segment_ids,
            decoder_positions=decoder_positions,
            enable_dropout=enable_dropout,
            decode=decode,
            max_decode_length=max_decode_length,
        )
