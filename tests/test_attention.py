"""The attention seam: every kernel against the `xla` reference and a frozen numpy reference,
forward and gradients, on packed rows (two documents plus padding), GQA and a T5-style bias; and
the dispatch rules (`auto` per backend, fallbacks with one log line, packed batches never reach a
kernel that ignores segment ids).

`splash` runs in Pallas interpret mode on CPU (lengths of 128, its smallest tile); `cudnn` tests
need a GPU and are skipped without one.
"""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llama_jax.config import LlamaConfig
from llama_jax.model import Llama
from modeling import attention
from modeling.attention import KERNELS, Problem, attend, choose_kernel, reference_mask
from t5_jax.config import T5Config
from t5_jax.model import Transformer
from t5_jax.sizes import get_config

ON_GPU = jax.default_backend() == "gpu"
gpu = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _fresh_log_memory():
    """Each test sees its fallback log lines, whatever ran before it."""
    attention._LOGGED.clear()
    yield
    attention._LOGGED.clear()


def frozen_reference(q, k, v, *, causal, q_seg=None, kv_seg=None, bias=None, scale, q_offset=0):
    """Plain float64 numpy softmax attention over an explicit mask (padding = segment 0 sees and
    is seen by nothing; its rows are zeroed here, callers compare valid rows only)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    logits = np.einsum("bqhd,bkhd->bhqk", q * scale, k)
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
    allowed = np.ones((batch, 1, q_len, kv_len), bool)
    for b in range(batch):
        for i in range(q_len):
            for j in range(kv_len):
                ok = (not causal) or j <= q_offset + i
                if q_seg is not None:
                    ok = ok and q_seg[b, i] != 0 and q_seg[b, i] == kv_seg[b, j]
                allowed[b, 0, i, j] = ok
    logits = np.where(allowed, logits, -np.inf)
    row_max = np.max(logits, axis=-1, keepdims=True)
    weights = np.exp(logits - np.where(np.isfinite(row_max), row_max, 0.0))
    weights = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-300)
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


def _packed_ids(length: int, cuts: list[tuple[int, int]]) -> np.ndarray:
    """One row per (end of doc 1, end of doc 2): docs 1 and 2, then padding (0)."""
    rows = np.zeros((len(cuts), length), np.int32)
    for r, (a, b) in enumerate(cuts):
        rows[r, :a], rows[r, a:b] = 1, 2
    return rows


def _inputs(seed, *, batch=2, q_len, kv_len, heads, kv_heads, head_dim, dtype=jnp.float32):
    rs = np.random.RandomState(seed)
    q = jnp.asarray(rs.normal(size=(batch, q_len, heads, head_dim)), dtype)
    k = jnp.asarray(rs.normal(size=(batch, kv_len, kv_heads, head_dim)), dtype)
    v = jnp.asarray(rs.normal(size=(batch, kv_len, kv_heads, head_dim)), dtype)
    cotangent = jnp.asarray(rs.normal(size=(batch, q_len, heads, head_dim)), jnp.float32)
    return q, k, v, cotangent


def _valid(q_seg, q_len, batch=2):
    """[b, q, 1, 1] weights: 1 on queries that carry a loss, 0 on padding queries."""
    if q_seg is None:
        return jnp.ones((batch, q_len, 1, 1), jnp.float32)
    return (jnp.asarray(q_seg) > 0).astype(jnp.float32)[:, :, None, None]


def _forward_and_grads(kernel, q, k, v, cotangent, weight, **kw):
    """Output and d(sum(out * cotangent * weight))/d(q, k, v[, bias]) under `jax.jit`."""
    bias = kw.pop("bias", None)

    def loss(q, k, v, bias):
        out = attend(q, k, v, bias=bias, kernel=kernel, **kw)
        return jnp.sum(out.astype(jnp.float32) * cotangent * weight), out

    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    grads, out = jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))(q, k, v, bias)
    return out, grads


# ---------------------------------------------------------------- xla against the frozen one


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_xla_matches_frozen_reference_packed_gqa_bias(causal):
    q, k, v, _ = _inputs(0, q_len=10, kv_len=10, heads=4, kv_heads=2, head_dim=8)
    seg = _packed_ids(10, [(4, 8), (3, 10)])
    bias = np.random.RandomState(1).normal(size=(1, 4, 10, 10)).astype(np.float32)
    got = attend(
        q,
        k,
        v,
        causal=causal,
        q_segment_ids=jnp.asarray(seg),
        bias=jnp.asarray(bias),
        scale=0.3,
        kernel="xla",
    )
    want = frozen_reference(q, k, v, causal=causal, q_seg=seg, kv_seg=seg, bias=bias, scale=0.3)
    valid = np.asarray(_valid(seg, 10))
    np.testing.assert_allclose(np.asarray(got) * valid, want * valid, atol=2e-6, rtol=1e-5)


@pytest.mark.slow
def test_xla_cross_segments_and_decoding_offset_match_frozen_reference():
    q, k, v, _ = _inputs(2, q_len=6, kv_len=9, heads=2, kv_heads=1, head_dim=4)
    q_seg, kv_seg = _packed_ids(6, [(2, 5), (3, 6)]), _packed_ids(9, [(4, 7), (5, 9)])
    got = attend(
        q,
        k,
        v,
        causal=False,
        q_segment_ids=jnp.asarray(q_seg),
        kv_segment_ids=jnp.asarray(kv_seg),
        kernel="xla",
    )
    want = frozen_reference(q, k, v, causal=False, q_seg=q_seg, kv_seg=kv_seg, scale=0.5)
    valid = np.asarray(_valid(q_seg, 6))
    np.testing.assert_allclose(np.asarray(got) * valid, want * valid, atol=2e-6, rtol=1e-5)
    # A cached step: queries at rows 3..8 of a 9-key cache, offset traced.
    step = jax.jit(lambda q, k, v, off: attend(q, k, v, causal=True, q_offset=off, kernel="xla"))
    got = step(q, k, v, jnp.int32(3))
    want = frozen_reference(q, k, v, causal=True, scale=0.5, q_offset=3)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)


def test_reference_mask_padding_sees_nothing_and_is_unseen():
    seg = jnp.array([[1, 1, 2, 2, 0]])
    mask = np.asarray(
        reference_mask(q_length=5, kv_length=5, causal=True, q_segment_ids=seg, kv_segment_ids=seg)
    )[0, 0]
    want = np.array(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 0]],
        bool,
    )
    np.testing.assert_array_equal(mask, want)


# ---------------------------------------------------------------- splash (interpret on CPU)

SPLASH_CASES = {
    # causal self-attention, two documents plus padding per row, 4 query heads on 2 kv heads
    "packed_causal_gqa": dict(
        q_len=128,
        kv_len=128,
        heads=4,
        kv_heads=2,
        causal=True,
        q_seg=_packed_ids(128, [(50, 100), (70, 128)]),
        kv_seg=None,
    ),
    # non-causal cross-attention between differently packed rows (T5's encoder-decoder shape)
    "packed_cross": dict(
        q_len=128,
        kv_len=256,
        heads=2,
        kv_heads=2,
        causal=False,
        q_seg=_packed_ids(128, [(40, 90), (60, 128)]),
        kv_seg=_packed_ids(256, [(100, 200), (30, 250)]),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SPLASH_CASES))
def test_splash_equals_xla_forward_and_gradients(case):
    spec = SPLASH_CASES[case]
    q, k, v, cot = _inputs(
        3,
        q_len=spec["q_len"],
        kv_len=spec["kv_len"],
        heads=spec["heads"],
        kv_heads=spec["kv_heads"],
        head_dim=16,
    )
    q_seg = jnp.asarray(spec["q_seg"])
    kv_seg = None if spec["kv_seg"] is None else jnp.asarray(spec["kv_seg"])
    weight = _valid(spec["q_seg"], spec["q_len"])
    kw = dict(causal=spec["causal"], q_segment_ids=q_seg, kv_segment_ids=kv_seg)
    assert choose_kernel("splash", _problem(segmented=True, q_length=spec["q_len"])) == "splash"
    out_x, grads_x = _forward_and_grads("xla", q, k, v, cot, weight, **kw)
    out_s, grads_s = _forward_and_grads("splash", q, k, v, cot, weight, **kw)
    assert bool(jnp.all(jnp.isfinite(out_s)))
    np.testing.assert_allclose(out_s * weight, out_x * weight, atol=2e-5, rtol=1e-5)
    for g_s, g_x in zip(grads_s, grads_x, strict=True):
        np.testing.assert_allclose(g_s, g_x, atol=5e-5, rtol=1e-4)


@pytest.mark.slow
def test_splash_under_a_mesh_runs_per_shard_and_equals_xla():
    """Under the trainer's mesh context (batch over data x fsdp, heads over model) splash runs in a
    shard_map, one kernel per device's rows and heads, and still computes the xla function."""
    from flax import linen as nn
    from jax.sharding import Mesh

    from modeling import axes

    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2), axes.MESH_AXES)
    q, k, v, cot = _inputs(5, batch=4, q_len=128, kv_len=128, heads=4, kv_heads=2, head_dim=16)
    q_seg = jnp.asarray(_packed_ids(128, [(50, 100), (70, 128), (128, 128), (10, 120)]))
    weight = _valid(q_seg, 128, batch=4)
    kw = dict(causal=True, q_segment_ids=q_seg)
    with jax.set_mesh(mesh), nn.logical_axis_rules(axes.logical_axis_rules()):
        out_s, grads_s = _forward_and_grads("splash", q, k, v, cot, weight, **kw)
        text = jax.jit(lambda q, k, v: attend(q, k, v, kernel="splash", **kw)).lower(q, k, v)
        text = text.as_text()
    out_x, grads_x = _forward_and_grads("xla", q, k, v, cot, weight, **kw)
    assert "shard_map" in text or "sdy.manual_computation" in text
    np.testing.assert_allclose(out_s * weight, out_x * weight, atol=2e-5, rtol=1e-5)
    for g_s, g_x in zip(grads_s, grads_x, strict=True):
        np.testing.assert_allclose(g_s, g_x, atol=5e-5, rtol=1e-4)


@pytest.mark.slow
def test_llama_with_splash_kernel_computes_the_xla_function():
    cfg = LlamaConfig(
        vocab_size=37,
        d_model=32,
        d_ff=48,
        num_heads=4,
        num_kv_heads=2,
        num_layers=1,
        attention_kernel="splash",
    )
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 37, (2, 128)), jnp.int32)
    seg = jnp.asarray(_packed_ids(128, [(60, 110), (128, 128)]))
    params = Llama(cfg).init(jax.random.PRNGKey(0), tokens[:, :8])["params"]
    run = {
        name: jax.jit(Llama(cfg.replace(attention_kernel=name)).apply) for name in ("splash", "xla")
    }
    got, want = (run[n]({"params": params}, tokens, segment_ids=seg) for n in ("splash", "xla"))
    valid = (seg > 0)[:, :, None]
    np.testing.assert_allclose(got * valid, want * valid, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_t5_with_splash_kernel_computes_the_xla_function(caplog):
    """Cross-attention (no bias) runs splash with packed encoder/decoder ids; self-attention
    carries the relative-position bias, so it falls back to xla and says so."""
    cfg = get_config("t5_tiny", num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)
    rs = np.random.RandomState(0)
    enc = jnp.asarray(rs.randint(2, cfg.vocab_size, (2, 128)), jnp.int32)
    tgt = jnp.asarray(rs.randint(2, cfg.vocab_size, (2, 128)), jnp.int32)
    enc_seg = jnp.asarray(_packed_ids(128, [(50, 100), (64, 128)]))
    dec_seg = jnp.asarray(_packed_ids(128, [(40, 90), (70, 120)]))
    enc, tgt = enc * (enc_seg > 0), tgt * (dec_seg > 0)
    dec_in = jnp.pad(tgt[:, :-1], ((0, 0), (1, 0)))
    params = Transformer(cfg).init(jax.random.PRNGKey(0), enc[:, :4], dec_in[:, :4])["params"]
    out = {}
    with caplog.at_level(logging.WARNING, logger=attention.__name__):
        for name in ("splash", "xla"):
            model = Transformer(dataclasses.replace(cfg, attention_kernel=name))
            out[name] = jax.jit(model.apply)(
                {"params": params},
                enc,
                dec_in,
                tgt,
                encoder_segment_ids=enc_seg,
                decoder_segment_ids=dec_seg,
            )
    assert "splash takes no additive bias" in caplog.text
    valid = (dec_seg > 0)[:, :, None]
    np.testing.assert_allclose(out["splash"] * valid, out["xla"] * valid, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- cudnn (GPU only)

CUDNN_CASES = {
    "causal_gqa": dict(kv_heads=2, causal=True, packed=False, bias=False, kv_len=256),
    "packed_causal_gqa": dict(kv_heads=2, causal=True, packed=True, bias=False, kv_len=256),
    "t5_encoder": dict(kv_heads=4, causal=False, packed=True, bias=True, kv_len=256),
    "t5_decoder_self": dict(kv_heads=4, causal=True, packed=True, bias=True, kv_len=256),
    "t5_cross": dict(kv_heads=4, causal=False, packed=True, bias=False, kv_len=384),
}


@gpu
@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs a GPU")
@pytest.mark.parametrize("case", list(CUDNN_CASES))
def test_cudnn_equals_xla_forward_and_gradients(case):
    spec = CUDNN_CASES[case]
    q_len, kv_len, heads = 256, spec["kv_len"], 4
    q, k, v, cot = _inputs(
        4,
        q_len=q_len,
        kv_len=kv_len,
        heads=heads,
        kv_heads=spec["kv_heads"],
        head_dim=64,
        dtype=jnp.bfloat16,
    )
    q_seg = kv_seg = None
    if spec["packed"]:
        q_seg = _packed_ids(q_len, [(100, 200), (170, 250)])
        kv_seg = q_seg if kv_len == q_len else _packed_ids(kv_len, [(150, 300), (200, 384)])
    kw = dict(causal=spec["causal"])
    if q_seg is not None:
        kw.update(q_segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg))
    if spec["bias"]:
        kw["bias"] = jnp.asarray(
            np.random.RandomState(5).normal(size=(1, heads, q_len, kv_len)), jnp.float32
        )
    problem = _problem(
        backend="gpu",
        dtype=jnp.bfloat16,
        head_dim=64,
        q_length=q_len,
        kv_length=kv_len,
        segmented=spec["packed"],
        has_bias=spec["bias"],
    )
    assert choose_kernel("cudnn", problem) == "cudnn"
    weight = _valid(q_seg, q_len)
    out_x, grads_x = _forward_and_grads("xla", q, k, v, cot, weight, **kw)
    out_c, grads_c = _forward_and_grads("cudnn", q, k, v, cot, weight, **kw)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    np.testing.assert_allclose(f32(out_c) * weight, f32(out_x) * weight, atol=3e-2, rtol=3e-2)
    for g_c, g_x in zip(grads_c, grads_x, strict=True):
        scale = float(np.max(np.abs(f32(g_x)))) + 1e-6
        np.testing.assert_allclose(f32(g_c) / scale, f32(g_x) / scale, atol=3e-2)


@gpu
@pytest.mark.skipif(not ON_GPU, reason="cuDNN attention needs a GPU")
def test_cudnn_is_in_the_compiled_program():
    q, k, v, _ = _inputs(
        6, q_len=256, kv_len=256, heads=4, kv_heads=4, head_dim=64, dtype=jnp.bfloat16
    )
    seg = jnp.asarray(_packed_ids(256, [(100, 200), (170, 250)]))
    fn = jax.jit(lambda q, k, v: attend(q, k, v, causal=True, q_segment_ids=seg, kernel="cudnn"))
    assert "cudnn" in fn.lower(q, k, v).compile().as_text().lower()


# ---------------------------------------------------------------- dispatch


def _problem(**changes) -> Problem:
    base = dict(
        backend="cpu",
        dtype=jnp.dtype(jnp.bfloat16),
        head_dim=64,
        q_length=256,
        kv_length=256,
        causal=True,
        segmented=False,
        has_bias=False,
        decoding=False,
        dropout=False,
    )
    base.update(changes)
    if "q_length" in changes and "kv_length" not in changes:
        base["kv_length"] = base["q_length"]
    base["dtype"] = jnp.dtype(base["dtype"])
    return Problem(**base)


@pytest.mark.parametrize(
    "backend,want", [("gpu", "cudnn"), ("tpu", "splash"), ("cpu", "xla"), ("rocm", "xla")]
)
def test_auto_picks_per_backend(backend, want):
    assert choose_kernel("auto", _problem(backend=backend)) == want


def _recording(monkeypatch):
    """Replaces every kernel's `run` with xla's, recording which kernel ran."""
    ran = []
    for name, kernel in list(KERNELS.items()):

        def run(*args, _name=name, **kwargs):
            ran.append(_name)
            return attention._xla(*args, **kwargs)

        monkeypatch.setitem(KERNELS, name, dataclasses.replace(kernel, run=run))
    return ran


@pytest.mark.slow
def test_auto_dispatch_follows_the_monkeypatched_backend(monkeypatch):
    ran = _recording(monkeypatch)
    q, k, v, _ = _inputs(
        7, q_len=128, kv_len=128, heads=2, kv_heads=2, head_dim=16, dtype=jnp.bfloat16
    )
    for backend in ("gpu", "tpu", "cpu"):
        monkeypatch.setattr(attention, "target_backend", lambda b=backend: b)
        attend(q, k, v, causal=True)
    assert ran == ["cudnn", "splash", "xla"]


@pytest.mark.slow
def test_packed_batch_never_reaches_a_kernel_that_ignores_segments(monkeypatch, caplog):
    ran = _recording(monkeypatch)

    def naive_run(*args, **kwargs):
        ran.append("naive")
        return attention._xla(*args, **kwargs)

    naive = dataclasses.replace(KERNELS["xla"], run=naive_run, keeps_segments_apart=False)
    monkeypatch.setitem(KERNELS, "naive", naive)
    q, k, v, _ = _inputs(8, q_len=8, kv_len=8, heads=2, kv_heads=1, head_dim=4)
    seg = jnp.asarray(_packed_ids(8, [(3, 6), (4, 8)]))
    with caplog.at_level(logging.WARNING, logger=attention.__name__):
        attend(q, k, v, causal=True, kernel="naive")
        attend(q, k, v, causal=True, q_segment_ids=seg, kernel="naive")
    assert ran == ["naive", "xla"]
    assert "naive ignores segment ids" in caplog.text
    # Every real kernel keeps segments apart.
    assert all(KERNELS[n].keeps_segments_apart for n in ("xla", "cudnn", "splash"))
    gpu_packed = dict(backend="gpu", segmented=True)
    assert choose_kernel("cudnn", _problem(**gpu_packed)) == "cudnn"
    assert choose_kernel("splash", _problem(**gpu_packed)) == "splash"


@pytest.mark.parametrize(
    "kernel,changes,reason",
    [
        ("cudnn", dict(backend="cpu"), "needs a GPU backend"),
        ("cudnn", dict(backend="gpu", dtype=jnp.float32), "bfloat16/float16"),
        ("cudnn", dict(backend="gpu", head_dim=320), "head_dim"),
        ("cudnn", dict(backend="gpu", decoding=True), "cached decoding"),
        ("cudnn", dict(backend="gpu", segmented=True, q_length=255), "even sequence lengths"),
        ("cudnn", dict(backend="gpu", dropout=True), "dropout"),
        ("splash", dict(backend="tpu", has_bias=True), "no additive bias"),
        ("splash", dict(backend="tpu", q_length=100), "multiples of 128"),
        ("splash", dict(backend="tpu", decoding=True), "cached decoding"),
        ("auto", dict(backend="tpu", has_bias=True), "no additive bias"),
    ],
)
def test_unsupported_combinations_fall_back_with_one_log_line(kernel, changes, reason, caplog):
    problem = _problem(**changes)
    with caplog.at_level(logging.WARNING, logger=attention.__name__):
        assert choose_kernel(kernel, problem) == "xla"
        assert choose_kernel(kernel, problem) == "xla"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and reason in lines[0] and "falls back to xla" in lines[0]


def test_cached_decoding_step_runs_on_xla(monkeypatch):
    ran = _recording(monkeypatch)
    q, k, v, _ = _inputs(9, q_len=1, kv_len=128, heads=2, kv_heads=2, head_dim=16)
    jax.jit(lambda q, k, v, i: attend(q, k, v, causal=True, q_offset=i, kernel="splash"))(
        q, k, v, jnp.int32(5)
    )
    assert ran == ["xla"]


def test_unknown_kernel_name_raises_naming_the_field_and_choices():
    q = jnp.zeros((1, 2, 1, 4))
    with pytest.raises(ValueError, match=r"attention_kernel must be one of .*'xla'.*'flash'"):
        attend(q, q, q, causal=True, kernel="flash")
    with pytest.raises(ValueError, match=r"attention_kernel .*'cudnn'.*'splash'"):
        LlamaConfig(d_model=8, d_ff=8, num_heads=2, num_layers=1, attention_kernel="flash")
    with pytest.raises(ValueError, match=r"T5Config.attention_kernel .*'auto'"):
        T5Config(attention_kernel="flash")
    assert LlamaConfig(d_model=8, d_ff=8, num_heads=2, num_layers=1).attention_kernel == "auto"
    assert T5Config().attention_kernel == "auto"


def test_target_backend_is_the_mesh_platform():
    from jax.sharding import Mesh

    assert attention.target_backend() == jax.default_backend()
    mesh = Mesh(np.asarray(jax.devices()[:2]), ("data",))
    with jax.set_mesh(mesh):
        assert attention.target_backend() == mesh.devices.flat[0].platform
        seen = []
        jax.jit(lambda x: seen.append(attention.target_backend()) or x)(1.0)
        assert seen == [mesh.devices.flat[0].platform]
