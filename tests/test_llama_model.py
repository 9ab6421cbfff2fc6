"""Behaviour of the LLaMA2 module: RoPE, causality, packing, cached decoding, scan/remat, gradients.

Tiny configs with distinct dimensions (vocab 53, d_model 32, d_ff 72, 4 query heads sharing 2 kv
heads of size 8, 2 layers) so that a transposed axis cannot go unnoticed.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llama_jax.config import LlamaConfig
from llama_jax.layers import apply_rope, positions_from_segments
from llama_jax.model import Llama, abstract_variables, stack_layer_params, unstack_layer_params

CONFIG = LlamaConfig(vocab_size=53, d_model=32, d_ff=72, num_heads=4, num_kv_heads=2, num_layers=2)
BATCH, LENGTH = 2, 12


def _tokens(seed: int, shape=(BATCH, LENGTH), vocab: int = CONFIG.vocab_size) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, shape), jnp.int32)


@functools.cache
def _forward(config: LlamaConfig):
    """A jitted forward; rows without packing pass all-ones segment ids, so that every test of a
    config shares one compilation (XLA:CPU compiles take seconds)."""
    model = Llama(config)

    @jax.jit
    def forward(params, tokens, segment_ids):
        return model.apply({"params": params}, tokens, segment_ids=segment_ids)

    return forward


def _one_doc(tokens: jax.Array) -> jax.Array:
    return jnp.ones_like(tokens)


def random_params(config: LlamaConfig, seed: int = 0) -> dict:
    """Parameters with the module's exact tree (from an abstract init) filled by numpy.

    XLA:CPU compiles `jax.random` initialisers slowly (seconds per shape), so tests do not jit
    `Llama.init`. Kernels get variance 1/fan_in (the first axis, or the first two for the
    attention output); norm scales are randomised around 1 so that they matter.
    """
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return jnp.asarray(1.0 + 0.2 * rng.standard_normal(leaf.shape), leaf.dtype)
        fan_in = leaf.shape[0] * leaf.shape[1] if "'out'" in name else leaf.shape[0]
        std = 1.0 if "embedding" in name else fan_in**-0.5
        return jnp.asarray(std * rng.standard_normal(leaf.shape), leaf.dtype)

    return jax.tree_util.tree_map_with_path(fill, abstract_variables(config)["params"])


@pytest.fixture(scope="module")
def params():
    return random_params(CONFIG)


def rope_reference(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Frozen reference RoPE: pair dimension i with i + d/2 as one complex number and multiply it
    by exp(i * position * theta^(-2i/d)), in float64 numpy."""
    half = x.shape[-1] // 2
    z = x[..., :half].astype(np.float64) + 1j * x[..., half:].astype(np.float64)
    freqs = theta ** (-2.0 * np.arange(half) / x.shape[-1])
    rotated = z * np.exp(1j * positions[:, :, None, None] * freqs)
    return np.concatenate([rotated.real, rotated.imag], axis=-1)


def llama_reference(params: dict, tokens: np.ndarray, config: LlamaConfig) -> np.ndarray:
    """Frozen reference LLaMA2 forward in float64 numpy: pre-norm blocks of causal attention
    (RoPE on q/k, query head h reads kv head h // group) and SwiGLU, final norm, untied head."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)

    def rms(x, scale):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + config.norm_eps) * scale

    length = tokens.shape[1]
    positions = np.broadcast_to(np.arange(length), tokens.shape)
    causal = np.tril(np.ones((length, length), bool))
    group = config.num_heads // config.kv_heads
    x = p["token_embedder"]["embedding"][tokens]
    for i in range(config.num_layers):
        layer = p[f"layers_{i}"]
        attn = layer["attention"]
        h = rms(x, layer["attention_norm"]["scale"])
        q = rope_reference(np.einsum("bld,dhk->blhk", h, attn["query"]), positions, 1e4)
        k = rope_reference(np.einsum("bld,dhk->blhk", h, attn["key"]), positions, 1e4)
        v = np.einsum("bld,dhk->blhk", h, attn["value"])
        k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(config.head_size)
        scores = np.where(causal, scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = np.einsum("bhqk,bkhd->bqhd", weights, v)
        x = x + np.einsum("bqhd,hde->bqe", out, attn["out"])
        h = rms(x, layer["ffn_norm"]["scale"])
        gate, up = h @ layer["mlp"]["w1"], h @ layer["mlp"]["w3"]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ layer["mlp"]["w2"]
    return rms(x, p["final_norm"]["scale"]) @ p["lm_head"]["kernel"]


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_forward_matches_frozen_reference(kv_heads):
    config = CONFIG.replace(num_kv_heads=kv_heads)
    params = random_params(config, seed=kv_heads)
    tokens = _tokens(8)
    logits = _forward(config)(params, tokens, _one_doc(tokens))
    expected = llama_reference(params, np.asarray(tokens), config)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-4, rtol=1e-4)


def test_rope_matches_reference_and_is_relative():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, 3, 16)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 50, 51, 900], [5, 4, 3, 2, 1, 0, 2047]])
    rope = jax.jit(functools.partial(apply_rope, theta=10000.0))
    ours = np.asarray(rope(jnp.asarray(x), jnp.asarray(positions)))
    np.testing.assert_allclose(ours, rope_reference(x, positions, 10000.0), atol=2e-4, rtol=1e-4)
    np.testing.assert_array_equal(ours[0, 0], x[0, 0])  # position 0 is the identity
    # q·k depends only on the distance between positions.
    q, k = jnp.asarray(x[:1, :1]), jnp.asarray(x[1:, :1])

    def score(m, n):
        return float(
            np.sum(np.asarray(rope(q, jnp.array([[m]]))) * np.asarray(rope(k, jnp.array([[n]]))))
        )

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), rel=1e-3)


def test_init_tree_shapes(params):
    layer = params["layers_1"]
    assert layer["attention"]["query"].shape == (32, 4, 8)
    assert layer["attention"]["key"].shape == (32, 2, 8)
    assert layer["attention"]["out"].shape == (4, 8, 32)
    assert layer["mlp"]["w1"].shape == layer["mlp"]["w3"].shape == (32, 72)
    assert layer["mlp"]["w2"].shape == (72, 32)
    assert params["token_embedder"]["embedding"].shape == (53, 32)
    assert params["lm_head"]["kernel"].shape == (32, 53)  # untied: its own parameter
    assert set(params) == {"token_embedder", "layers_0", "layers_1", "final_norm", "lm_head"}


def test_changing_future_tokens_never_changes_earlier_logits(params):
    forward = _forward(CONFIG)
    tokens = _tokens(1)
    base = forward(params, tokens, _one_doc(tokens))
    assert base.shape == (BATCH, LENGTH, CONFIG.vocab_size) and base.dtype == jnp.float32
    for t in (1, 6, LENGTH - 1):
        changed = tokens.at[:, t:].set((tokens[:, t:] + 7) % CONFIG.vocab_size)
        logits = forward(params, changed, _one_doc(changed))
        np.testing.assert_allclose(logits[:, :t], base[:, :t], atol=1e-6)
        assert not np.allclose(logits[:, t:], base[:, t:], atol=1e-3)


def test_positions_from_segments_restart_per_document():
    segments = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    expected = [[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]]
    np.testing.assert_array_equal(positions_from_segments(segments), expected)


def test_packed_documents_do_not_attend_across_boundaries(params):
    forward = _forward(CONFIG)
    doc_a, doc_b = _tokens(2, (1, 5)), _tokens(3, (1, 7))
    other_a = (doc_a + 11) % CONFIG.vocab_size
    packed = jnp.concatenate(
        [jnp.concatenate([doc_a, doc_b], 1), jnp.concatenate([other_a, doc_b], 1)]
    )
    segments = jnp.array([[1] * 5 + [2] * 7] * 2)
    logits = forward(params, packed, segments)
    # Document B sees neither A's content nor its offset in the row...
    np.testing.assert_allclose(logits[0, 5:], logits[1, 5:], atol=1e-5)
    # ...and equals B on its own (padded with segment 0 after it, positions from 0).
    alone = jnp.concatenate([doc_b, jnp.zeros((1, 5), jnp.int32)], 1)
    alone_segments = jnp.array([[1] * 7 + [0] * 5])
    alone_logits = forward(params, jnp.tile(alone, (2, 1)), jnp.tile(alone_segments, (2, 1)))
    np.testing.assert_allclose(logits[0, 5:], alone_logits[0, :7], atol=1e-5)
    # Without segment ids, B would see A: the check above can fail.
    unpacked = forward(params, packed, _one_doc(packed))
    assert not np.allclose(unpacked[0, 5:], unpacked[1, 5:], atol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_prefill_and_one_token_steps_reproduce_full_forward(params, scan):
    config = CONFIG.replace(scan_layers=scan)
    model = Llama(config)
    model_params = stack_layer_params(params, config.num_layers) if scan else params
    prompt_len, steps, capacity = 5, LENGTH - 5, LENGTH
    tokens = _tokens(4, (BATCH, prompt_len + steps))
    full = _forward(config)(model_params, tokens, _one_doc(tokens))

    def init_cache(p):
        zeros = jnp.zeros((BATCH, capacity), jnp.int32)
        return model.apply({"params": p}, zeros, decode=True, mutable=["cache"])[1]["cache"]

    @jax.jit
    def extend(p, cache, chunk):
        logits, mutated = model.apply(
            {"params": p, "cache": cache}, chunk, decode=True, mutable=["cache"]
        )
        return logits, mutated["cache"]

    # The allocating call's shapes, without compiling it: zero caches of `capacity` entries.
    abstract_cache = jax.eval_shape(init_cache, model_params)
    key_shape = (BATCH, capacity, CONFIG.kv_heads, CONFIG.head_size)
    if scan:
        assert abstract_cache["layers"]["attention"]["cached_key"].shape == (2, *key_shape)
    else:
        assert abstract_cache["layers_1"]["attention"]["cached_value"].shape == key_shape
    cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), abstract_cache)
    logits, cache = extend(model_params, cache, tokens[:, :prompt_len])
    np.testing.assert_allclose(logits, full[:, :prompt_len], atol=1e-5)
    for i in range(prompt_len, prompt_len + steps):
        logits, cache = extend(model_params, cache, tokens[:, i : i + 1])
        np.testing.assert_allclose(logits[:, 0], full[:, i], atol=1e-5)
    index = cache["layers"]["attention"]["cache_index"] if scan else None
    if scan:
        np.testing.assert_array_equal(index, [prompt_len + steps] * config.num_layers)
    else:
        assert int(cache["layers_0"]["attention"]["cache_index"]) == prompt_len + steps


@pytest.mark.slow
def test_scan_layout_computes_the_same_function(params):
    stacked = stack_layer_params(params, CONFIG.num_layers)
    assert stacked["layers"]["mlp"]["w1"].shape == (2, 32, 72)
    np.testing.assert_array_equal(
        unstack_layer_params(stacked, 2)["layers_1"]["mlp"]["w2"], params["layers_1"]["mlp"]["w2"]
    )
    tokens = _tokens(5)
    unrolled = _forward(CONFIG)(params, tokens, _one_doc(tokens))
    scanned = _forward(CONFIG.replace(scan_layers=True))(stacked, tokens, _one_doc(tokens))
    np.testing.assert_allclose(scanned, unrolled, atol=1e-5)


@pytest.mark.slow
def test_bfloat16_compute_gives_float32_logits_close_to_float32(params):
    tokens = _tokens(6)
    logits32 = _forward(CONFIG)(params, tokens, _one_doc(tokens))
    logits16 = _forward(CONFIG.replace(dtype="bfloat16"))(params, tokens, _one_doc(tokens))
    assert logits16.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(logits16 - logits32))) < 0.15


@pytest.mark.slow
def test_gradients_match_finite_differences_in_float64():
    """Central differences on a few entries of every kind of parameter, in double precision.

    (Scanned, rematerialised gradients are compared with these unrolled ones in
    test_llama_sharding.py, on the sharded path.)"""
    config = LlamaConfig(
        vocab_size=13,
        d_model=8,
        d_ff=12,
        num_heads=2,
        num_kv_heads=1,
        num_layers=2,
        dtype="float64",
        param_dtype="float64",
    )
    with jax.enable_x64(True):
        tokens = _tokens(7, (2, 6), vocab=13)
        segments = jnp.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 1]])
        params = jax.tree_util.tree_map(np.asarray, random_params(config, seed=1))

        def loss(cfg, p):
            logits = Llama(cfg).apply({"params": p}, tokens[:, :-1], segment_ids=segments[:, :-1])
            logp = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

        loss_fn = jax.jit(functools.partial(loss, config))
        grads = jax.jit(jax.grad(functools.partial(loss, config)))(params)
        probes = [
            (("token_embedder", "embedding"), (int(tokens[0, 2]), 3)),
            (("layers_0", "attention", "query"), (1, 1, 2)),
            (("layers_0", "attention", "key"), (5, 0, 3)),  # shared by both query heads (GQA)
            (("layers_1", "attention", "value"), (2, 0, 1)),
            (("layers_1", "attention", "out"), (1, 2, 6)),
            (("layers_0", "mlp", "w1"), (4, 7)),
            (("layers_1", "mlp", "w2"), (9, 0)),
            (("layers_1", "ffn_norm", "scale"), (2,)),
            (("final_norm", "scale"), (5,)),
            (("lm_head", "kernel"), (7, int(tokens[1, 3]))),
        ]

        def get(tree, path):
            return functools.reduce(lambda t, k: t[k], path, tree)

        eps = 1e-6
        for path, index in probes:

            def shifted(delta, path=path, index=index):
                new = jax.tree_util.tree_map(np.copy, params)
                get(new, path)[index] += delta
                return float(loss_fn(new))

            numeric = (shifted(eps) - shifted(-eps)) / (2 * eps)
            analytic = float(get(grads, path)[index])
            assert abs(analytic) > 1e-6, path  # a probe that sees no gradient tests nothing
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-10), path
