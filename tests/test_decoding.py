"""modeling.decoding against exhaustive search over small known distributions.

The "model" is a second-order Markov chain: next-token logits are `tables[example, prev, cur]`,
with `example` and `prev` kept in the cache pytree, so beam search must carry and reorder the
cache correctly to get the right answers. Ground truth comes from enumerating every sequence.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from modeling import decoding

EOS = 1


def markov_tokens_to_logits(tables):
    """tables [examples, vocab, vocab, vocab] -> a `tokens_to_logits` with a cache
    {"example": [n], "prev": [n], "steps": scalar}; layer-scanned caches put a leading axis of 2
    on every leaf (`offset=1`)."""

    def tokens_to_logits(state: decoding.DecodingState):
        cache = state.cache
        scanned = cache["steps"].ndim == 1
        ex, prev = (
            (cache["example"][0], cache["prev"][0])
            if scanned
            else (
                cache["example"],
                cache["prev"],
            )
        )
        cur = state.cur_token[:, 0]
        logits = tables[ex, prev, cur]
        new_prev = jnp.stack([cur, cur]) if scanned else cur
        return logits, {"example": cache["example"], "prev": new_prev, "steps": cache["steps"] + 1}

    return tokens_to_logits


def markov_cache(batch, scanned=False):
    cache = {
        "example": jnp.arange(batch, dtype=jnp.int32),
        "prev": jnp.zeros((batch,), jnp.int32),
        "steps": jnp.array(0, jnp.int32),
    }
    if scanned:
        cache = jax.tree.map(lambda x: jnp.stack([x, x]), cache)
    return cache


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def sequence_log_prob(table, seq):
    log_probs = log_softmax(table)
    prev, cur, total = 0, 0, 0.0
    for tok in seq:
        total += float(log_probs[prev, cur, tok])
        prev, cur = cur, tok
    return total


def exhaustive_finished(table, max_len, alpha):
    """Every EOS-terminated sequence of length <= max_len with its brevity-normalised score,
    best first."""
    vocab = table.shape[-1]
    log_probs = log_softmax(table)
    words = [t for t in range(vocab) if t != EOS]
    out = []
    for n in range(1, max_len + 1):
        for prefix in itertools.product(words, repeat=n - 1):
            seq = (*prefix, EOS)
            prev, cur, total = 0, 0, 0.0
            for tok in seq:
                total += log_probs[prev, cur, tok]
                prev, cur = cur, tok
            out.append((total / ((5 + n) / 6) ** alpha, seq))
    return sorted(out, reverse=True)


def _pad(seq, length):
    return list(seq) + [0] * (length - len(seq))


@functools.partial(jax.jit, static_argnames=("k", "max_len", "offset"))
def _beam(tables, prompts, *, k, alpha, max_len, offset=0):
    return decoding.beam_search(
        prompts,
        markov_cache(prompts.shape[0], scanned=offset == 1),
        markov_tokens_to_logits(tables),
        eos_id=EOS,
        num_decodes=k,
        alpha=alpha,
        max_decode_len=max_len,
        cache_offset=offset,
    )


@functools.partial(jax.jit, static_argnames=("max_len",))
def _greedy(tables, prompts, *, max_len):
    return decoding.greedy_decode(
        prompts,
        markov_cache(prompts.shape[0]),
        markov_tokens_to_logits(tables),
        eos_id=EOS,
        max_decode_len=max_len,
    )


def test_brevity_penalty():
    assert float(decoding.brevity_penalty(0.6, 1)) == pytest.approx(1.0)
    assert float(decoding.brevity_penalty(0.6, 7)) == pytest.approx(2.0**0.6)
    assert float(decoding.brevity_penalty(0.0, 30)) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0, 1], ids=["cache", "scanned_cache"])
def test_wide_beam_search_is_exhaustive_search(offset):
    """With 2k at least every candidate, beam search keeps all hypotheses: its finished set must
    be exactly the exhaustive ranking, per example (each example has its own table)."""
    vocab, max_len, k = 4, 3, 18
    tables = jnp.asarray(np.random.RandomState(0).normal(size=(2, vocab, vocab, vocab)) * 2)
    prompts = jnp.zeros((2, max_len), jnp.int32)
    seqs, scores = _beam(tables, prompts, k=k, alpha=0.6, max_len=max_len, offset=offset)
    for b in range(2):
        truth = exhaustive_finished(np.asarray(tables[b]), max_len, 0.6)  # 1 + 3 + 9 = 13
        got_scores = np.asarray(scores[b])[::-1][: len(truth)]  # best first
        np.testing.assert_allclose(got_scores, [s for s, _ in truth], rtol=1e-5)
        got_seqs = np.asarray(seqs[b])[::-1][: len(truth)]
        assert [list(s) for s in got_seqs] == [_pad(seq, max_len) for _, seq in truth]
        assert np.all(np.asarray(scores[b])[: k - len(truth)] <= decoding.NEG_INF / 2)


def _designed_table(vocab=6):
    """Greedy takes 2 (p=.55) then 4 (.35 > EOS .3) then EOS: p = .55 * .35 * .9 = .17;
    the best sequence is 3 EOS (p = .45 * .95 = .43)."""
    probs = np.full((vocab, vocab), 1e-4)
    probs[0, [2, 3]] = [0.55, 0.45]
    probs[2, [EOS, 4, 5]] = [0.3, 0.35, 0.35]
    probs[3, EOS] = 0.95
    probs[4, EOS] = probs[5, EOS] = 0.9
    probs[1, 1] = 1.0
    probs /= probs.sum(-1, keepdims=True)
    # Order 1: the same table for every `prev`.
    return jnp.asarray(np.broadcast_to(np.log(probs), (1, vocab, vocab, vocab)))


def test_beam_search_beats_greedy_and_finds_the_best_sequence():
    tables, max_len = _designed_table(), 5
    prompts = jnp.zeros((1, max_len), jnp.int32)
    greedy, greedy_lp = _greedy(tables, prompts, max_len=max_len)
    assert greedy[0].tolist() == [2, 4, EOS, 0, 0]
    assert float(greedy_lp[0]) == pytest.approx(sequence_log_prob(tables[0], [2, 4, EOS]))
    seqs, scores = _beam(tables, prompts, k=4, alpha=0.6, max_len=max_len)
    best_score, best_seq = exhaustive_finished(np.asarray(tables[0]), max_len, 0.6)[0]
    assert seqs[0, -1].tolist() == _pad(best_seq, max_len) == [3, EOS, 0, 0, 0]
    assert float(scores[0, -1]) == pytest.approx(best_score, rel=1e-5)
    assert np.all(np.diff(np.asarray(scores[0])) >= 0)  # sorted, best last


def test_length_penalty_changes_the_winner():
    """alpha trades probability against length: a long likely-enough sequence wins only when
    long sequences are penalised less (alpha > 0), matching exhaustive search both ways."""
    vocab, max_len = 5, 6
    probs = np.full((vocab, vocab), 1e-3)
    probs[0, [EOS, 2]] = [0.45, 0.55]  # alone, EOS (.45) beats 2 3 4 EOS (.31)
    probs[2, [3, EOS]] = [0.97, 0.03]
    probs[3, [4, EOS]] = [0.97, 0.03]
    probs[4, [EOS, 4]] = [0.6, 0.4]
    probs[1, 1] = 1.0
    probs /= probs.sum(-1, keepdims=True)
    tables = jnp.asarray(np.broadcast_to(np.log(probs), (1, vocab, vocab, vocab)))
    prompts = jnp.zeros((1, max_len), jnp.int32)
    winners = []
    for alpha in (0.0, 2.0):
        seqs, _ = _beam(tables, prompts, k=4, alpha=alpha, max_len=max_len)
        truth = exhaustive_finished(np.asarray(tables[0]), max_len, alpha)[0][1]
        assert seqs[0, -1].tolist() == _pad(truth, max_len)
        winners.append(truth)
    assert winners[0] == (EOS,) and len(winners[1]) > 1


@pytest.mark.slow
def test_beam_of_one_without_length_penalty_is_greedy():
    """Beam search of width 1 keeps a hypothesis that a second-ranked EOS ends (T5X semantics),
    so it equals greedy search when EOS always ranks first or below second: so here."""
    rs = np.random.RandomState(1)
    logits = rs.normal(size=(3, 5, 5, 5))
    top = logits.max(-1)
    eos_first = rs.uniform(size=top.shape) < 0.3
    logits[..., EOS] = np.where(eos_first, top + 1.0, logits.min(-1) - 1.0)
    tables = jnp.asarray(logits)
    prompts = jnp.zeros((3, 6), jnp.int32)
    greedy, greedy_lp = _greedy(tables, prompts, max_len=6)
    seqs, scores = _beam(tables, prompts, k=1, alpha=0.0, max_len=6)
    np.testing.assert_array_equal(seqs[:, 0], greedy)
    np.testing.assert_allclose(scores[:, 0], greedy_lp, rtol=1e-5)
    assert np.any(np.asarray(greedy) == EOS)  # the EOS path is exercised


@pytest.mark.slow
def test_eos_ends_rows_and_pads_with_zeros():
    tables = jnp.asarray(np.random.RandomState(2).normal(size=(4, 5, 5, 5)) * 2)
    prompts = jnp.zeros((4, 7), jnp.int32)
    greedy, _ = _greedy(tables, prompts, max_len=7)
    seqs, _ = _beam(tables, prompts, k=3, alpha=0.6, max_len=7)
    for row in [*np.asarray(greedy), *np.asarray(seqs).reshape(-1, 7)]:
        if EOS in row.tolist():
            end = row.tolist().index(EOS)
            assert np.all(row[end + 1 :] == 0)


def test_no_finished_beam_returns_live_beams():
    vocab = 4
    logits = np.zeros((1, vocab, vocab, vocab))
    logits[..., EOS] = -1e9  # EOS impossible
    seqs, scores = _beam(
        jnp.asarray(logits), jnp.zeros((1, 3), jnp.int32), k=2, alpha=0.6, max_len=3
    )
    assert EOS not in np.asarray(seqs).ravel().tolist()
    np.testing.assert_allclose(scores[0], 3 * np.log(1 / 3), rtol=1e-5)  # raw log-probs


@pytest.mark.slow
def test_prompts_are_forced_then_continued():
    tables = _designed_table()
    prompts = jnp.asarray([[3, 4, 0, 0, 0], [2, 0, 0, 0, 0]], jnp.int32)
    batch_tables = jnp.concatenate([tables, tables])
    greedy, greedy_lp = _greedy(batch_tables, prompts, max_len=5)
    assert greedy.tolist() == [[3, 4, EOS, 0, 0], [2, 4, EOS, 0, 0]]
    # Only generated tokens are scored.
    assert float(greedy_lp[0]) == pytest.approx(log_softmax(tables[0, 3, 4])[EOS], rel=1e-4)
    seqs, _ = _beam(batch_tables, prompts, k=2, alpha=0.6, max_len=5)
    assert seqs[0, -1].tolist()[:3] == [3, 4, EOS]
    assert seqs[1, -1].tolist()[0] == 2
    assert all(s.tolist()[0] == 2 for s in seqs[1] if s.tolist()[0] != 0)


def test_flat_batch_beam_expand_matches_beam_order():
    x = jnp.arange(6).reshape(2, 3)
    out = decoding.flat_batch_beam_expand(x, 2)
    np.testing.assert_array_equal(out, [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])
