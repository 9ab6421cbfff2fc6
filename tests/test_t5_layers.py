"""T5 layers against frozen references: relative-position buckets, RMS norm, the MLP variants."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from modeling.attention import reference_mask
from t5_jax import layers


def reference_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """Mesh-TensorFlow's `_relative_position_bucket`, one int at a time, in exact arithmetic
    (float64 plus a tolerance, so exact powers of the log base land in the upper bucket).

    relative_position = memory_position - query_position. Half the buckets (per direction when
    bidirectional; keys after the query get the upper half) hold the exact distances
    0..max_exact-1, the rest grow logarithmically up to max_distance, clamped to the last.
    """
    n = -relative_position
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    return ret + min(max_exact + int(math.floor(val + 1e-9)), num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (64, 256)])
def test_relative_position_bucket_matches_reference(bidirectional, num_buckets, max_distance):
    rel = np.arange(-600, 601)
    bucket = jax.jit(
        functools.partial(
            layers.relative_position_bucket,
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
    )
    got = np.asarray(bucket(jnp.asarray(rel)))
    want = np.array(
        [reference_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    )
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() == num_buckets - 1


@pytest.mark.slow
def test_relative_position_bucket_known_values():
    rel = np.array([0, -1, -7, 1, 7, -16, -1000, 1000, 5, -3, -15])
    got = {}
    for bidirectional in (True, False):
        out = layers.relative_position_bucket(
            jnp.asarray(rel), bidirectional=bidirectional, num_buckets=32, max_distance=128
        )
        got[bidirectional] = dict(zip(rel.tolist(), np.asarray(out).tolist(), strict=True))

    def bucket(r, bidirectional):
        return got[bidirectional][r]

    # Encoder (bidirectional): keys before the query use 0..15, keys after it 16..31.
    assert [bucket(r, True) for r in (0, -1, -7, 1, 7)] == [0, 1, 7, 17, 23]
    assert bucket(-16, True) == 10  # 8 + log2(16/8)/log2(16) * 8 = 10 exactly
    assert bucket(-1000, True) == 15 and bucket(1000, True) == 31
    # Decoder (causal): future keys collapse into bucket 0; the past uses all 32 buckets.
    assert [bucket(r, False) for r in (5, 0, -3, -15, -1000)] == [0, 0, 3, 15, 31]


def test_relative_position_biases_share_one_table_per_head():
    mod = layers.RelativePositionBiases(num_buckets=8, max_distance=20, num_heads=3)
    shapes = jax.eval_shape(
        lambda: mod.init(jax.random.PRNGKey(0), 5, 6, bidirectional=True, method=mod.full)
    )
    assert shapes["params"]["rel_embedding"].shape == (3, 8)
    table = jnp.asarray(np.random.RandomState(0).normal(size=(3, 8)), jnp.float32)
    variables = {"params": {"rel_embedding": table}}
    bias = jax.jit(lambda v: mod.apply(v, 5, 6, bidirectional=True, method=mod.full))(variables)
    assert bias.shape == (1, 3, 5, 6)
    rel = np.arange(6)[None, :] - np.arange(5)[:, None]
    buckets = np.vectorize(lambda r: reference_bucket(int(r), True, 8, 20))(rel)
    np.testing.assert_allclose(bias[0], np.asarray(table)[:, buckets])


def test_layer_norm_is_rms_without_bias():
    x = jnp.asarray(np.random.RandomState(1).normal(size=(2, 3, 7)) * 3 + 1, jnp.float32)
    mod = layers.LayerNorm(epsilon=1e-6)
    variables = jax.eval_shape(lambda: mod.init(jax.random.PRNGKey(0), x))
    assert set(variables["params"]) == {"scale"}
    scale = jnp.arange(1.0, 8.0)
    y = jax.jit(mod.apply)({"params": {"scale": scale}}, x)
    want = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(y, want, rtol=1e-5)


@pytest.mark.parametrize(
    "activations,names",
    [(("gelu", "linear"), {"wi_0", "wi_1", "wo"}), (("relu",), {"wi", "wo"})],
)
def test_mlp_variants(activations, names):
    x = jnp.asarray(np.random.RandomState(2).normal(size=(2, 4, 6)), jnp.float32)
    mod = layers.MlpBlock(intermediate_dim=10, activations=activations)
    shapes = jax.eval_shape(lambda: mod.init(jax.random.PRNGKey(0), x))["params"]
    assert set(shapes) == names
    rs = np.random.RandomState(0)
    params = jax.tree.map(lambda s: jnp.asarray(rs.normal(size=s.shape), jnp.float32), shapes)
    y = jax.jit(mod.apply)({"params": params}, x)
    if len(activations) == 2:
        h = jax.nn.gelu(x @ params["wi_0"]["kernel"]) * (x @ params["wi_1"]["kernel"])
    else:
        h = jax.nn.relu(x @ params["wi"]["kernel"])
    np.testing.assert_allclose(y, h @ params["wo"]["kernel"], rtol=1e-5, atol=1e-6)


def test_masks():
    causal = reference_mask(q_length=3, kv_length=3, causal=True)[0, 0]
    np.testing.assert_array_equal(causal, [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    seg = jnp.array([[1, 1, 2]])
    pad = jnp.array([[1, 1, 0]]) > 0
    ids = layers.attention_segments(pad, seg)
    mask = reference_mask(
        q_length=3, kv_length=3, causal=False, q_segment_ids=ids, kv_segment_ids=ids
    )
    np.testing.assert_array_equal(mask[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    # No causal flag and no segment ids: nothing is masked.
    assert bool(jnp.all(reference_mask(q_length=2, kv_length=3, causal=False)))
