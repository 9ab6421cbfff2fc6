"""T5 layers against frozen references: relative-position buckets, RMS norm, the MLP variants."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
    got = np.asarray(
        layers.relative_position_bucket(
            jnp.asarray(rel),
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
    )
    want = np.array(
        [reference_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    )
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() == num_buckets - 1


def test_relative_position_bucket_known_values():
    def bucket(r, bidirectional):
        out = layers.relative_position_bucket(
            jnp.asarray(r), bidirectional=bidirectional, num_buckets=32, max_distance=128
        )
        return int(out)

    # Encoder (bidirectional): keys before the query use 0..15, keys after it 16..31.
    assert [bucket(r, True) for r in (0, -1, -7, 1, 7)] == [0, 1, 7, 17, 23]
    assert bucket(-16, True) == 10  # 8 + log2(16/8)/log2(16) * 8 = 10 exactly
    assert bucket(-1000, True) == 15 and bucket(1000, True) == 31
    # Decoder (causal): future keys collapse into bucket 0; the past uses all 32 buckets.
    assert [bucket(r, False) for r in (5, 0, -3, -15, -1000)] == [0, 0, 3, 15, 31]


def test_relative_position_biases_share_one_table_per_head():
    mod = layers.RelativePositionBiases(num_buckets=8, max_distance=20, num_heads=3)
    variables = mod.init(jax.random.PRNGKey(0), 5, 6, bidirectional=True, method=mod.full)
    table = variables["params"]["rel_embedding"]
    assert table.shape == (3, 8)
    bias = mod.apply(variables, 5, 6, bidirectional=True, method=mod.full)
    assert bias.shape == (1, 3, 5, 6)
    rel = np.arange(6)[None, :] - np.arange(5)[:, None]
    buckets = np.vectorize(lambda r: reference_bucket(int(r), True, 8, 20))(rel)
    np.testing.assert_allclose(bias[0], np.asarray(table)[:, buckets])


def test_layer_norm_is_rms_without_bias():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 7)) * 3 + 1
    mod = layers.LayerNorm(epsilon=1e-6)
    variables = mod.init(jax.random.PRNGKey(0), x)
    assert set(variables["params"]) == {"scale"}
    scale = jnp.arange(1.0, 8.0)
    y = mod.apply({"params": {"scale": scale}}, x)
    want = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(y, want, rtol=1e-5)


@pytest.mark.parametrize(
    "activations,names",
    [(("gelu", "linear"), {"wi_0", "wi_1", "wo"}), (("relu",), {"wi", "wo"})],
)
def test_mlp_variants(activations, names):
    x = jax.random.normal(jax.random.PRNGKey(2), (2, 4, 6))
    mod = layers.MlpBlock(intermediate_dim=10, activations=activations)
    params = mod.init(jax.random.PRNGKey(0), x)["params"]
    assert set(params) == names
    y = mod.apply({"params": params}, x)
    if len(activations) == 2:
        h = jax.nn.gelu(x @ params["wi_0"]["kernel"]) * (x @ params["wi_1"]["kernel"])
    else:
        h = jax.nn.relu(x @ params["wi"]["kernel"])
    np.testing.assert_allclose(y, h @ params["wo"]["kernel"], rtol=1e-5, atol=1e-6)


def test_masks():
    causal = layers.make_causal_mask(3)[0, 0]
    np.testing.assert_array_equal(causal, [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    seg = jnp.array([[1, 1, 2]])
    pad = jnp.array([[1, 1, 0]]) > 0
    mask = layers.combine_masks(
        layers.make_attention_mask(seg, seg, jnp.equal), layers.make_attention_mask(pad, pad)
    )
    np.testing.assert_array_equal(mask[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    assert layers.combine_masks(None, None) is None
