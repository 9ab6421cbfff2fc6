"""Model-agnostic autoregressive decoding: batched greedy search and beam search.

Both run as one `lax.while_loop`, so a caller jits them whole (see `t5_jax.predict`). A model
plugs in through a callback, as in T5X:

    tokens_to_logits(state: DecodingState) -> (logits [n, vocab], new_cache)

which reads `state.cur_token` ([n, 1], the token at position `state.cur_index`) and the model's
`state.cache` pytree (e.g. Flax's `cache` collection) and returns next-token logits and the
updated cache. `n` is the batch (greedy) or batch x beams, flattened batch-major. Any per-example
context the callback closes over (an encoder output) must be expanded the same way; see
`flat_batch_beam_expand`. Cache leaves with more than `cache_offset` dimensions carry the batch
on axis `cache_offset` (0, or 1 for layer-scanned caches); smaller leaves (scalar cache indices)
are shared by the whole batch and left alone.

Semantics follow T5X's `decoding.py`: the sequence buffer starts with a dummy 0 token (the
decoder start / BOS) which is fed first and dropped from the output; decoding stops at `eos_id`
(kept in the output, padding 0 after it) or at `max_decode_len`; non-zero `inputs` tokens are a
prompt that is forced (teacher-forced one step at a time). Beam search keeps `2k` candidates a
step so that `k` live beams survive even if `k` candidates end together, ranks finished beams by
`log p / ((5 + length) / 6) ** alpha` (length counts the EOS), stops once no live beam can beat
the worst of `k` finished ones, and returns beams sorted by increasing score (best last).
Consequently beam search of width 1 with `alpha=0` is greedy search except that it keeps a
hypothesis ended by a second-ranked EOS when that scores better than greedy's continuation.
Decoding starts at position 0 for every row: prompts are forced step by step, not prefilled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
from jax import lax

PyTree = Any
# Large finite negative log-probability (as T5X): -inf would turn into NaN in the sums below.
NEG_INF = -1.0e7


@flax.struct.dataclass
class DecodingState:
    """What a `tokens_to_logits` callback sees at one step.

    Attributes:
      cur_index: int32 scalar, the position of `cur_token` in the sequence (0 = start token).
      sequences: [n, max_decode_len + 1] int32 prefixes so far (column 0 is the start token,
        later columns 0 until written).
      cur_token: [n, 1] int32 token to feed now.
      cache: the model's cache pytree, batch-flattened.
    """

    cur_index: jax.Array
    sequences: jax.Array
    cur_token: jax.Array
    cache: PyTree


TokensToLogits = Callable[[DecodingState], tuple[jax.Array, PyTree]]


def brevity_penalty(alpha: float, length) -> jax.Array:
    """T5X / GNMT length normalisation `((5 + length) / 6) ** alpha` (T5X's name; a length penalty,
    unrelated to BLEU's brevity penalty)."""
    return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, alpha)


def flat_batch_beam_expand(x: jax.Array, beam_size: int, offset: int = 0) -> jax.Array:
    """Repeats each batch row `beam_size` times in place: [b, ...] -> [b * beam_size, ...]
    (row order b0, b0, ..., b1, b1, ...), matching the flattened beams' order."""
    return jnp.repeat(x, beam_size, axis=offset)


def _map_batched(fn, cache: PyTree, offset: int) -> PyTree:
    """Applies `fn` to the cache leaves that carry a batch axis (ndim > offset)."""
    return jax.tree.map(lambda x: fn(x) if jnp.ndim(x) > offset else x, cache)


def _prompt(
    inputs: jax.Array, max_decode_len: int | None, start_id: int = 0
) -> tuple[jax.Array, int]:
    """The prompt behind a start-token column (`start_id`), 0-padded on the right:
    [b, max_decode_len + 1], and the length."""
    inputs = jnp.asarray(inputs, jnp.int32)
    length = inputs.shape[1] if max_decode_len is None else max_decode_len
    if inputs.shape[1] > length:
        raise ValueError(f"inputs have {inputs.shape[1]} positions, max_decode_len is {length}")
    padded = jnp.pad(inputs, ((0, 0), (0, length - inputs.shape[1])))
    start = jnp.full((inputs.shape[0], 1), start_id, jnp.int32)
    return jnp.concatenate([start, padded], axis=1), length


def greedy_decode(
    inputs: jax.Array,
    cache: PyTree,
    tokens_to_logits: TokensToLogits,
    *,
    eos_id: int,
    max_decode_len: int | None = None,
    start_id: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Arg-max decoding of a batch until every row has produced `eos_id` or is full.

    Args:
      inputs: [b, l] int32 prompt tokens to force (all zeros: no prompt).
      cache: the model's initialised cache, batch size b.
      tokens_to_logits: the model's one-step callback.
      eos_id: end-of-sequence id.
      max_decode_len: output length (default `l`).
      start_id: the token in front of the prompt (`pipelines.vocab.start_id`: 0, or a
        published LLaMA's `<s>`).

    Returns:
      sequences [b, max_decode_len] (0 after EOS) and the sum of the log-probabilities of the
      generated (non-prompt) tokens [b], float32.
    """
    padded, length = _prompt(inputs, max_decode_len, start_id)
    batch = padded.shape[0]

    def cond(carry):
        i, _, _, ended, _ = carry
        return (i < length) & ~jnp.all(ended)

    def body(carry):
        i, seqs, cache, ended, log_prob = carry
        token = lax.dynamic_slice_in_dim(seqs, i, 1, axis=1)
        state = DecodingState(cur_index=i, sequences=seqs, cur_token=token, cache=cache)
        logits, cache = tokens_to_logits(state)
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
        best = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
        forced = lax.dynamic_index_in_dim(padded, i + 1, axis=1, keepdims=False)
        free = forced == 0
        token = jnp.where(free, best, forced)
        step_lp = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
        log_prob = log_prob + jnp.where(free & ~ended, step_lp, 0.0)
        token = jnp.where(ended, 0, token)
        seqs = lax.dynamic_update_slice_in_dim(seqs, token[:, None], i + 1, axis=1)
        ended = ended | (free & (token == eos_id))
        return i + 1, seqs, cache, ended, log_prob

    init = (
        jnp.array(0, jnp.int32),
        padded,
        cache,
        jnp.zeros((batch,), bool),
        jnp.zeros((batch,), jnp.float32),
    )
    _, seqs, _, _, log_prob = lax.while_loop(cond, body, init)
    return seqs[:, 1 : length + 1], log_prob


@flax.struct.dataclass
class _BeamState:
    cur_index: jax.Array  # scalar int32
    live_logprobs: jax.Array  # [b, k]
    finished_scores: jax.Array  # [b, k]
    live_seqs: jax.Array  # [b, k, L + 1]
    finished_seqs: jax.Array  # [b, k, L + 1]
    finished_flags: jax.Array  # [b, k] bool
    cache: PyTree  # leaves [b, k, ...] (after `offset` leading axes)


def _gather_beams(x: jax.Array, indices: jax.Array, offset: int = 0) -> jax.Array:
    """x [.., b, k_old, ...] (batch at axis `offset`), indices [b, k_new] -> [.., b, k_new, ...]."""

    def gather(y):
        idx = indices.reshape(indices.shape + (1,) * (y.ndim - 2))
        return jnp.take_along_axis(y, idx, axis=1)

    for _ in range(offset):
        gather = jax.vmap(gather)
    return gather(x)


def beam_search(
    inputs: jax.Array,
    cache: PyTree,
    tokens_to_logits: TokensToLogits,
    *,
    eos_id: int,
    num_decodes: int = 4,
    alpha: float = 0.6,
    max_decode_len: int | None = None,
    cache_offset: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Beam search with T5X semantics (see the module docstring).

    Args:
      inputs: [b, l] int32 prompt tokens to force (all zeros: no prompt).
      cache: the model's initialised cache for batch size b (expanded to beams here).
      tokens_to_logits: the model's one-step callback; it sees batch b * num_decodes.
      eos_id: end-of-sequence id.
      num_decodes: beam size k.
      alpha: length-penalty exponent (0: rank by raw log-probability).
      max_decode_len: output length (default `l`).
      cache_offset: axis of the batch in the cache leaves (1 for layer-scanned caches).

    Returns:
      sequences [b, k, max_decode_len] and scores [b, k] (length-normalised log-probabilities),
      sorted by increasing score. A row where no beam reached EOS returns its live beams with
      their raw log-probabilities instead.
    """
    padded, length = _prompt(inputs, max_decode_len)
    batch, k = padded.shape[0], num_decodes
    # Column 0 holds the start token, columns 1..length the output.
    max_len = length + 1

    def expand(x):  # [.., b, ...] -> [.., b, k, ...]
        return jnp.repeat(jnp.expand_dims(x, cache_offset + 1), k, axis=cache_offset + 1)

    def flatten(x):  # [.., b, k, ...] -> [.., b * k, ...]
        shape = x.shape[:cache_offset] + (batch * k,) + x.shape[cache_offset + 2 :]
        return x.reshape(shape)

    def unflatten(x):
        shape = x.shape[:cache_offset] + (batch, k) + x.shape[cache_offset + 1 :]
        return x.reshape(shape)

    init = _BeamState(
        cur_index=jnp.array(0, jnp.int32),
        live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1)), (batch, 1)),
        finished_scores=jnp.full((batch, k), NEG_INF),
        live_seqs=jnp.zeros((batch, k, max_len), jnp.int32),
        finished_seqs=jnp.zeros((batch, k, max_len), jnp.int32),
        finished_flags=jnp.zeros((batch, k), bool),
        cache=_map_batched(expand, cache, cache_offset),
    )
    min_penalty = brevity_penalty(alpha, max_len)

    def cond(state: _BeamState):
        not_at_end = state.cur_index < max_len - 1
        best_live = jnp.max(state.live_logprobs, axis=1, keepdims=True) / min_penalty
        worst_finished = jnp.min(state.finished_scores, axis=1, keepdims=True)
        worst_finished = jnp.where(state.finished_flags, worst_finished, NEG_INF)
        return not_at_end & ~jnp.all(worst_finished > best_live)

    def body(state: _BeamState):
        i = state.cur_index
        token = lax.dynamic_slice_in_dim(state.live_seqs, i, 1, axis=2).reshape(batch * k, 1)
        decoding_state = DecodingState(
            cur_index=i,
            sequences=state.live_seqs.reshape(batch * k, max_len),
            cur_token=token,
            cache=_map_batched(flatten, state.cache, cache_offset),
        )
        flat_logits, new_cache = tokens_to_logits(decoding_state)
        new_cache = _map_batched(unflatten, new_cache, cache_offset)
        log_probs = jax.nn.log_softmax(flat_logits.astype(jnp.float32)).reshape(batch, k, -1)
        vocab = log_probs.shape[-1]
        log_probs = log_probs + state.live_logprobs[:, :, None]
        # 2k best continuations over all beams and tokens.
        topk_lp, topk_idx = lax.top_k(log_probs.reshape(batch, k * vocab), 2 * k)
        topk_beam, topk_ids = topk_idx // vocab, topk_idx % vocab
        # Inside a prompt: force the prompt token and keep a single beam (the only live one,
        # which holds the first candidate) alive.
        forced = lax.dynamic_index_in_dim(padded, i + 1, axis=1)  # [b, 1]
        in_prompt = forced != 0
        prompt_lp = jnp.concatenate(
            [jnp.zeros((batch, 1)), jnp.full((batch, 2 * k - 1), NEG_INF)], axis=1
        )
        topk_lp = jnp.where(in_prompt, prompt_lp, topk_lp)
        topk_ids = jnp.where(in_prompt, forced, topk_ids)
        topk_seqs = _gather_beams(state.live_seqs, topk_beam)
        topk_seqs = lax.dynamic_update_slice_in_dim(topk_seqs, topk_ids[:, :, None], i + 1, axis=2)
        newly_finished = (topk_ids == eos_id) & ~in_prompt

        # Live: the k best that did not just end.
        live_lp = topk_lp + newly_finished * NEG_INF
        _, keep = lax.top_k(live_lp, k)
        keep = jnp.flip(keep, axis=1)
        live_seqs = _gather_beams(topk_seqs, keep)
        live_logprobs = jnp.take_along_axis(live_lp, keep, axis=1)
        parent = jnp.take_along_axis(topk_beam, keep, axis=1)
        cache = _map_batched(
            lambda x: _gather_beams(x, parent, cache_offset), new_cache, cache_offset
        )

        # Finished: merge the just-ended with the old finished set, keep the k best.
        scores = topk_lp / brevity_penalty(alpha, i + 1) + (~newly_finished) * NEG_INF
        all_seqs = jnp.concatenate([state.finished_seqs, topk_seqs], axis=1)
        all_scores = jnp.concatenate([state.finished_scores, scores], axis=1)
        all_flags = jnp.concatenate([state.finished_flags, newly_finished], axis=1)
        _, best = lax.top_k(all_scores, k)
        best = jnp.flip(best, axis=1)
        return _BeamState(
            cur_index=i + 1,
            live_logprobs=live_logprobs,
            finished_scores=jnp.take_along_axis(all_scores, best, axis=1),
            live_seqs=live_seqs,
            finished_seqs=_gather_beams(all_seqs, best),
            finished_flags=jnp.take_along_axis(all_flags, best, axis=1),
            cache=cache,
        )

    final = lax.while_loop(cond, body, init)
    any_finished = jnp.any(final.finished_flags, axis=1)
    seqs = jnp.where(any_finished[:, None, None], final.finished_seqs, final.live_seqs)
    scores = jnp.where(any_finished[:, None], final.finished_scores, final.live_logprobs)
    return seqs[:, :, 1 : length + 1], scores
