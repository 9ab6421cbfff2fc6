"""Decoding a T5 `Transformer` with `modeling.decoding`: cache set-up, the one-step callback,
and a jitted `predict_batch` (greedy or beam search) over encoder inputs.

This is the glue T5X keeps in `EncoderDecoderModel.predict_batch_with_aux`: encode once, expand
the encoder output to the beams, and step the decoder one token at a time through the cache.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from modeling import decoding
from t5_jax.model import Transformer

DECODE_METHODS = ("greedy", "beam")


def init_cache(
    module: Transformer, params, *, batch_size: int, inputs_length: int, max_decode_length: int
):
    """Zero decode caches for `batch_size` rows (no compute: shapes come from `eval_shape`)."""

    def make(p):
        enc = jnp.ones((batch_size, inputs_length), jnp.int32)
        dec = jnp.ones((batch_size, max_decode_length), jnp.int32)
        _, variables = module.apply({"params": p}, enc, dec, dec, decode=True, mutable=["cache"])
        return variables["cache"]

    shapes = jax.eval_shape(make, params)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def make_tokens_to_logits(module: Transformer, params, encoded, encoder_input_tokens):
    """The `tokens_to_logits(DecodingState)` callback of `modeling.decoding` for T5.

    `encoded` [n, le, d] and `encoder_input_tokens` [n, le] must already have one row per
    decoded sequence (beams expanded with `decoding.flat_batch_beam_expand`).
    """

    def tokens_to_logits(state: decoding.DecodingState):
        logits, variables = module.apply(
            {"params": params, "cache": state.cache},
            encoded,
            encoder_input_tokens,
            state.cur_token,
            state.cur_token,
            decode=True,
            mutable=["cache"],
            method=Transformer.decode,
        )
        return logits[:, 0], variables["cache"]

    return tokens_to_logits


@functools.partial(
    jax.jit, static_argnames=("module", "max_decode_length", "method", "num_decodes", "eos_id")
)
def _decode(
    module, params, encoder_input_tokens, alpha, *, max_decode_length, method, num_decodes, eos_id
):
    batch, inputs_length = encoder_input_tokens.shape
    encoded = module.apply({"params": params}, encoder_input_tokens, method=Transformer.encode)
    prompts = jnp.zeros((batch, max_decode_length), jnp.int32)
    cache = init_cache(
        module,
        params,
        batch_size=batch,
        inputs_length=inputs_length,
        max_decode_length=max_decode_length,
    )
    if method == "greedy":
        step = make_tokens_to_logits(module, params, encoded, encoder_input_tokens)
        return decoding.greedy_decode(prompts, cache, step, eos_id=eos_id)
    step = make_tokens_to_logits(
        module,
        params,
        decoding.flat_batch_beam_expand(encoded, num_decodes),
        decoding.flat_batch_beam_expand(encoder_input_tokens, num_decodes),
    )
    return decoding.beam_search(
        prompts, cache, step, eos_id=eos_id, num_decodes=num_decodes, alpha=alpha
    )


def predict_batch(
    module: Transformer,
    params,
    encoder_input_tokens: jax.Array,
    *,
    max_decode_length: int,
    method: str = "beam",
    num_decodes: int = 4,
    alpha: float = 0.6,
    eos_id: int = 1,
    return_all_decodes: bool = False,
):
    """Decodes a batch of encoder inputs [b, le] (0 = padding) with one jitted program.

    The program is compiled once per (module, input shape, method, beam size, length, EOS);
    `alpha` and the parameters are runtime values.

    Args:
      module: the `Transformer` (hashable; a new config compiles anew).
      params: its parameters.
      encoder_input_tokens: int32 [b, le].
      max_decode_length: output length.
      method: "greedy" or "beam".
      num_decodes: beam size (beam search only).
      alpha: length-penalty exponent (beam search only).
      eos_id: end-of-sequence id (T5: 1).
      return_all_decodes: beam search only; return all beams (sorted by increasing score).

    Returns:
      tokens [b, max_decode_length] (or [b, k, max_decode_length]) ending in EOS then 0s, and
      scores [b] (or [b, k]): summed log-probabilities for greedy, length-normalised for beam.
    """
    if method not in DECODE_METHODS:
        raise ValueError(f"method must be one of {DECODE_METHODS}, got {method!r}")
    seqs, scores = _decode(
        module,
        params,
        jnp.asarray(encoder_input_tokens, jnp.int32),
        jnp.asarray(alpha, jnp.float32),
        max_decode_length=max_decode_length,
        method=method,
        num_decodes=num_decodes if method == "beam" else 1,
        eos_id=eos_id,
    )
    if method == "greedy" or return_all_decodes:
        return seqs, scores
    return seqs[:, -1], scores[:, -1]
