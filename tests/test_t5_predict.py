"""T5 decoding end to end (`t5_jax.predict`): outputs must agree with teacher-forced scoring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from modeling import decoding
from t5_jax import predict
from t5_jax.model import Transformer
from t5_jax.sizes import get_config

CFG = get_config("t5_tiny")
EOS, MAX_LEN = 1, 6


@pytest.fixture(scope="module")
def model_and_params():
    """Tiny T5 whose output layer only favours tokens 1..4, so EOS (1) comes at varied steps."""
    model = Transformer(CFG)
    enc = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), enc, enc, enc)["params"])
    rs = np.random.RandomState(0)
    flat = {}
    for path, s in traverse_util.flatten_dict(shapes).items():
        if len(s.shape) == 1:
            flat[path] = np.ones(s.shape, np.float32)
        else:
            flat[path] = (rs.normal(size=s.shape) / np.sqrt(s.shape[0])).astype(np.float32)
    kernel = flat[("decoder", "logits_dense", "kernel")]
    kernel[:, 5:] = 0.0
    kernel[:, 1:5] *= 8.0
    params = jax.tree.map(jnp.asarray, traverse_util.unflatten_dict(flat))
    enc = rs.randint(2, CFG.vocab_size, (3, 8)).astype(np.int32)
    enc[1, 5:] = 0
    return model, params, jnp.asarray(enc)


@jax.jit
def _teacher_forced(params, enc, seqs):
    """log p(seq[t] | seq[<t], enc) per position, and the logits, of rows [12, MAX_LEN] (each
    input row repeated 4 times: one shape, one compile, for greedy and beam outputs alike)."""
    enc = jnp.repeat(enc, 12 // enc.shape[0], axis=0)
    seqs = jnp.repeat(seqs, 12 // seqs.shape[0], axis=0)
    dec_in = jnp.pad(seqs[:, :-1], ((0, 0), (1, 0)))
    logits = Transformer(CFG).apply({"params": params}, enc, dec_in)
    log_probs = jax.nn.log_softmax(logits)
    return jnp.take_along_axis(log_probs, seqs[..., None], axis=-1)[..., 0], logits


def _length(row):
    row = list(row)
    return row.index(EOS) + 1 if EOS in row else len(row)


@pytest.mark.slow
def test_greedy_is_argmax_of_its_own_teacher_forced_logits(model_and_params):
    model, params, enc = model_and_params
    seqs, log_prob = predict.predict_batch(
        model, params, enc, max_decode_length=MAX_LEN, method="greedy"
    )
    assert seqs.shape == (3, MAX_LEN)
    token_lp, logits = _teacher_forced(params, enc, seqs)
    token_lp, logits = np.asarray(token_lp[::4]), np.asarray(logits[::4])
    lengths = [_length(r) for r in np.asarray(seqs)]
    assert any(n < MAX_LEN for n in lengths)  # some rows stop at EOS
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(np.argmax(logits[b, :n], -1), seqs[b, :n])
        assert np.all(np.asarray(seqs[b, n:]) == 0)
        assert float(log_prob[b]) == pytest.approx(float(token_lp[b, :n].sum()), abs=1e-4)


@pytest.mark.slow
def test_beam_scores_are_length_normalised_log_probs(model_and_params):
    model, params, enc = model_and_params
    seqs, scores = predict.predict_batch(
        model,
        params,
        enc,
        max_decode_length=MAX_LEN,
        method="beam",
        num_decodes=4,
        alpha=0.6,
        return_all_decodes=True,
    )
    assert seqs.shape == (3, 4, MAX_LEN) and scores.shape == (3, 4)
    flat = seqs.reshape(12, MAX_LEN)
    token_lp = np.asarray(_teacher_forced(params, enc, flat)[0])
    kinds = set()
    for i, row in enumerate(np.asarray(flat)):
        score, n = float(scores.reshape(-1)[i]), _length(row)
        if score <= decoding.NEG_INF / 2:  # an unfilled slot of a row with < 4 finished
            kinds.add("filler")
        elif EOS in row.tolist():
            kinds.add("finished")
            want = token_lp[i, :n].sum() / float(decoding.brevity_penalty(0.6, n))
            assert score == pytest.approx(float(want), abs=1e-4)
        else:  # nothing finished in this row: live beams with raw log-probabilities
            kinds.add("live")
            assert not any(EOS in r.tolist() for r in np.asarray(seqs[i // 4]))
            assert score == pytest.approx(float(token_lp[i].sum()), abs=1e-4)
    assert "finished" in kinds
    assert np.all(np.diff(np.asarray(scores), axis=1) >= 0)
    best, best_score = predict.predict_batch(
        model, params, enc, max_decode_length=MAX_LEN, method="beam", num_decodes=4, alpha=0.6
    )
    np.testing.assert_array_equal(best, seqs[:, -1])
    np.testing.assert_allclose(best_score, scores[:, -1])


def test_unknown_method_is_rejected(model_and_params):
    model, params, enc = model_and_params
    with pytest.raises(ValueError, match="greedy"):
        predict.predict_batch(model, params, enc, max_decode_length=MAX_LEN, method="sample")
