"""The T5 encoder–decoder: naming, size table, exact counts, cache, packing, dropout, sharding.

Compiles are the cost on a CPU: parameters are drawn with numpy into the `eval_shape` tree
(Flax's initialisers are covered by one small test), and each config's forward is jitted once.
"""

import dataclasses
import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding

from modeling import decoding
from modeling.axes import MESH_AXES, logical_axis_rules
from t5_jax import layers, predict
from t5_jax.config import RELU, T5Config
from t5_jax.counting import flops_per_example, param_counts
from t5_jax.model import EncoderLayer, Transformer
from t5_jax.sizes import SIZES, get_config

TINY = get_config("t5_tiny")
TINY_T5_1_0 = get_config("t5_tiny", mlp_activations=RELU, logits_via_embedding=True)
LI, LT = 9, 7  # encoder / decoder lengths used throughout (one compile per config)


def _batch(cfg: T5Config, batch=2, seed=0):
    rs = np.random.RandomState(seed)
    enc = rs.randint(2, cfg.vocab_size, (batch, LI)).astype(np.int32)
    enc[-1, LI - 3 :] = 0  # padding in the last row
    tgt = rs.randint(2, cfg.vocab_size, (batch, LT)).astype(np.int32)
    dec_in = np.pad(tgt[:, :-1], ((0, 0), (1, 0)))
    return jnp.asarray(enc), jnp.asarray(dec_in), jnp.asarray(tgt)


def _shapes(cfg: T5Config):
    enc = jnp.ones((1, 4), jnp.int32)
    return jax.eval_shape(lambda: Transformer(cfg).init(jax.random.PRNGKey(0), enc, enc, enc))


@functools.lru_cache
def _params(cfg: T5Config, seed=0):
    rs = np.random.RandomState(seed)

    def draw(s):
        scale = 1.0 / np.sqrt(s.shape[0]) if len(s.shape) == 2 else 0.5
        return jnp.asarray(
            1.0 + 0.1 * rs.normal(size=s.shape)
            if len(s.shape) == 1
            else scale * rs.normal(size=s.shape),
            jnp.float32,
        )

    return jax.tree.map(draw, _shapes(cfg)["params"])


@functools.lru_cache
def _forward(cfg: T5Config):
    return jax.jit(
        Transformer(cfg).apply, static_argnames=("enable_dropout", "decode", "mutable", "method")
    )


def test_t5x_parameter_names():
    names = set(traverse_util.flatten_dict(_shapes(TINY)["params"], sep="/"))
    for name in [
        "token_embedder/embedding",
        "encoder/relpos_bias/rel_embedding",
        "encoder/layers_0/pre_attention_layer_norm/scale",
        "encoder/layers_0/attention/query/kernel",
        "encoder/layers_0/attention/out/kernel",
        "encoder/layers_0/mlp/wi_0/kernel",
        "encoder/layers_0/mlp/wi_1/kernel",
        "encoder/layers_0/mlp/wo/kernel",
        "encoder/encoder_norm/scale",
        "decoder/relpos_bias/rel_embedding",
        "decoder/layers_1/pre_self_attention_layer_norm/scale",
        "decoder/layers_1/self_attention/key/kernel",
        "decoder/layers_1/pre_cross_attention_layer_norm/scale",
        "decoder/layers_1/encoder_decoder_attention/value/kernel",
        "decoder/decoder_norm/scale",
        "decoder/logits_dense/kernel",
    ]:
        assert name in names, name
    query = _params(TINY)["decoder"]["layers_0"]["self_attention"]["query"]["kernel"]
    assert query.shape == (TINY.d_model, TINY.num_heads * TINY.head_dim)


def test_tied_relu_variant_names_and_axes():
    variables = _shapes(TINY_T5_1_0)
    names = set(traverse_util.flatten_dict(variables["params"], sep="/"))
    assert "decoder/logits_dense/kernel" not in names
    assert "encoder/layers_0/mlp/wi/kernel" in names
    assert not any("wi_0" in n for n in names)
    # Logical axis names ride along in T5X's `params_axes` collection.
    axes = nn.partitioning.get_axis_names(variables["params_axes"])
    assert tuple(axes["token_embedder"]["embedding"]) == ("vocab", "embed")
    assert tuple(axes["decoder"]["relpos_bias"]["rel_embedding"]) == ("heads", "relpos_buckets")
    assert tuple(axes["encoder"]["layers_0"]["attention"]["out"]["kernel"]) == (
        "joined_kv",
        "embed",
    )


def test_attention_initialiser_folds_in_head_scaling():
    mod = layers.MultiHeadDotProductAttention(num_heads=4, head_dim=16, out_features=64)
    x = jnp.ones((1, 2, 64))
    params = mod.init(jax.random.PRNGKey(0), x, x)["params"]
    std_q, std_k = (float(np.std(params[n]["kernel"])) for n in ("query", "key"))
    assert std_k == pytest.approx(1 / np.sqrt(64), rel=0.1)
    assert std_q == pytest.approx(std_k / np.sqrt(16), rel=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIZES))
def test_param_counts_equal_initialised_tree(name):
    cfg = SIZES[name]
    leaves = jax.tree.leaves(_shapes(cfg)["params"])
    counts = param_counts(cfg)
    assert counts.total == sum(int(np.prod(x.shape)) for x in leaves)
    emb = cfg.vocab_size * cfg.d_model
    assert counts.embedding == (emb if cfg.logits_via_embedding else 2 * emb)
    assert (
        counts.non_embedding == counts.encoder + counts.decoder == counts.total - counts.embedding
    )


def test_param_counts_tied_relu_variant():
    leaves = jax.tree.leaves(_shapes(TINY_T5_1_0)["params"])
    assert param_counts(TINY_T5_1_0).total == sum(int(np.prod(x.shape)) for x in leaves)


def test_sizes_match_mt_paper_tables():
    # Isik et al. 2024, appendix A.1: Table 2 (T5-770M) and Table 1 (T5-3B).
    table2 = dict(d_model=1024, num_heads=16, num_encoder_layers=24, num_decoder_layers=24)
    table2.update(head_dim=64, d_ff=2816)
    table1 = dict(d_model=1024, num_heads=32, num_encoder_layers=24, num_decoder_layers=24)
    table1.update(head_dim=128, d_ff=16384)
    for name, row in (("t5_770m", table2), ("t5_3b", table1)):
        cfg = get_config(name)
        assert {k: getattr(cfg, k) for k in row} == row, name
    assert get_config("t5_770m").mlp_activations == ("gelu", "linear")
    assert not get_config("t5_770m").logits_via_embedding
    assert get_config("t5_3b").mlp_activations == ("relu",)
    # The sizes their names promise (32128-token vocabulary).
    assert abs(param_counts(get_config("t5_770m")).total / 770e6 - 1) < 0.03
    assert abs(param_counts(get_config("t5_3b")).total / 2.85e9 - 1) < 0.01


def test_get_config_errors_and_overrides():
    with pytest.raises(ValueError, match="t5_small"):
        get_config("t5_huge")
    with pytest.raises(ValueError, match="unknown T5Config fields"):
        get_config("t5_small", n_layers=3)
    cfg = get_config("t5_small", vocab_size=1000)
    assert cfg.vocab_size == 1000 and cfg.d_model == 512
    with pytest.raises(ValueError):
        T5Config(mlp_activations=("swish",))
    assert hash(TINY) == hash(dataclasses.replace(TINY))


def test_flops_per_example():
    counts = param_counts(TINY)
    flops = flops_per_example(TINY, inputs_length=10, targets_length=4)
    assert flops.six_n == 6 * (counts.encoder * 10 + counts.decoder * 4)
    assert flops.with_attention > flops.six_n


@pytest.mark.parametrize("cfg", [TINY, TINY_T5_1_0], ids=["t5.1.1", "t5.1.0"])
def test_cached_decoding_equals_teacher_forced_logits(cfg):
    model, params = Transformer(cfg), _params(cfg)
    enc, dec_in, tgt = _batch(cfg)
    full = _forward(cfg)({"params": params}, enc, dec_in)
    encoded = _forward(cfg)({"params": params}, enc, method=Transformer.encode)
    cache = predict.init_cache(model, params, batch_size=2, inputs_length=LI, max_decode_length=LT)
    step = jax.jit(predict.make_tokens_to_logits(model, params, encoded, enc))
    steps = []
    for t in range(LT):
        state = decoding.DecodingState(
            cur_index=jnp.array(t), sequences=dec_in, cur_token=dec_in[:, t : t + 1], cache=cache
        )
        logits, cache = step(state)
        steps.append(logits)
    np.testing.assert_allclose(jnp.stack(steps, axis=1), full, atol=5e-5, rtol=1e-5)


def test_packing_and_padding_masks():
    """Rows 0 and 1 hold one example each, then padding; row 2 packs both; row 3 is row 0 with
    segment id 1 over its padding too, so only the padding mask hides it. One compile."""
    a_enc, a_tgt = [5, 6, 7, 8], [9, 10, 11]
    b_enc, b_tgt = [12, 13, 14, 15, 16], [17, 18, 19, 20]

    def shift(t):
        return [0] + t[:-1]

    def row(*parts, width):
        flat = [x for p in parts for x in p]
        return flat + [0] * (width - len(flat))

    enc = [row(a_enc, width=LI), row(b_enc, width=LI), row(a_enc, b_enc, width=LI)]
    dec_in = [row(shift(a_tgt), width=LT), row(shift(b_tgt), width=LT)]
    dec_in.append(row(shift(a_tgt), shift(b_tgt), width=LT))
    tgt = [row(a_tgt, width=LT), row(b_tgt, width=LT), row(a_tgt, b_tgt, width=LT)]
    enc_seg = [row([1] * 4, width=LI), row([1] * 5, width=LI), row([1] * 4, [2] * 5, width=LI)]
    dec_seg = [row([1] * 3, width=LT), row([1] * 4, width=LT), row([1] * 3, [2] * 4, width=LT)]
    enc, dec_in, tgt = enc + enc[:1], dec_in + dec_in[:1], tgt + tgt[:1]
    enc_seg.append([1] * LI)
    dec_seg.append([1] * LT)
    out = _forward(TINY)(
        {"params": _params(TINY)},
        *(jnp.asarray(x, jnp.int32) for x in (enc, dec_in, tgt)),
        encoder_segment_ids=jnp.asarray(enc_seg, jnp.int32),
        decoder_segment_ids=jnp.asarray(dec_seg, jnp.int32),
    )
    np.testing.assert_allclose(out[2, :3], out[0, :3], atol=5e-5, rtol=1e-5)
    np.testing.assert_allclose(out[2, 3:7], out[1, :4], atol=5e-5, rtol=1e-5)
    np.testing.assert_allclose(out[3, :3], out[0, :3], atol=5e-5, rtol=1e-5)
    assert np.abs(np.asarray(out[0, :3] - out[1, :3])).max() > 1e-3


def test_dropout_reaches_every_layer_only_when_enabled():
    enc, dec_in, tgt = _batch(TINY)

    def jaxpr(enable_dropout):
        return str(
            jax.make_jaxpr(
                lambda p: Transformer(TINY).apply(
                    {"params": p},
                    enc,
                    dec_in,
                    tgt,
                    enable_dropout=enable_dropout,
                    rngs={"dropout": jax.random.PRNGKey(0)},
                )
            )(_params(TINY))
        )

    assert "random_fold_in" not in jaxpr(False)
    # Embeddings (2), per encoder layer 4 (attention weights, two residual branches, MLP),
    # per decoder layer 6, final norms (2).
    cfg = TINY
    sites = 2 + 4 * cfg.num_encoder_layers + 6 * cfg.num_decoder_layers + 2
    assert jaxpr(True).count("random_fold_in") == sites  # one `make_rng` per site


def test_dropout_changes_a_layer_output_only_when_enabled():
    layer = EncoderLayer(config=dataclasses.replace(TINY, dropout_rate=0.3))
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, TINY.d_model))
    params = {"params": _params(TINY)["encoder"]["layers_0"]}
    run = jax.jit(layer.apply, static_argnames="deterministic")
    rngs = {"dropout": jax.random.key(1, impl="rbg")}  # cheap to compile on CPU
    det = run(params, x, None, None, deterministic=True, rngs=rngs)
    drop = run(params, x, None, None, deterministic=False, rngs=rngs)
    assert np.abs(np.asarray(drop - det)).max() > 1e-3
    np.testing.assert_array_equal(drop, run(params, x, None, None, deterministic=False, rngs=rngs))


def test_remat_policy_rematerialises_layers():
    enc, dec_in, tgt = _batch(TINY)

    def grad_jaxpr(cfg):
        def loss(params):
            return Transformer(cfg).apply({"params": params}, enc, dec_in, tgt).sum()

        return str(jax.make_jaxpr(jax.grad(loss))(_params(TINY)))

    # Every policy rematerialises the norms and the MLP's activation (elementwise, no policy:
    # `t5_jax.layers.rms_norm`, `gated_product`); a remat policy also wraps each layer.
    none = grad_jaxpr(TINY)
    assert "remat" in none and "policy=<function" not in none
    full = grad_jaxpr(dataclasses.replace(TINY, remat_policy="full"))
    assert full.count("policy=<function") >= 3  # one per layer


@pytest.mark.slow
def test_sharded_forward_on_a_mesh_matches_unsharded():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), MESH_AXES)
    enc, dec_in, tgt = _batch(TINY, batch=4)
    params = _params(TINY)
    want = _forward(TINY)({"params": params}, enc, dec_in, tgt)
    rules = logical_axis_rules()
    names = flax.core.unfreeze(nn.partitioning.get_axis_names(_shapes(TINY)["params_axes"]))
    specs = nn.logical_to_mesh(names, rules)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    sharded = jax.device_put(params, shardings)
    wi_0 = sharded["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert tuple(wi_0.sharding.spec) == ("fsdp", "model")

    @jax.jit
    def forward(p, e, d, t):
        with nn.logical_axis_rules(rules):
            return Transformer(TINY).apply({"params": p}, e, d, t)

    with jax.set_mesh(mesh):
        got = forward(sharded, enc, dec_in, tgt)
    # The logits' logical constraint (batch, length, vocab) took effect.
    assert tuple(got.sharding.spec) == (("data", "fsdp"), None, "model")
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-5)
