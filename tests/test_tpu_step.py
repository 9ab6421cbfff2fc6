"""The train step as a TPU compiles it: attention without float32 copies of its weights, a
non-finite guard of three scalars, projections unstacked off the CPU, token counts without a
scatter, and the ahead-of-time benchmark's JSON (usable or not).

Frozen references: softmax as JAX differentiates it, the guard that checked every new value,
and `segment_sum` counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax._src.ad_checkpoint import saved_residuals
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from llama_jax import model as llama_model
from llama_jax import sizes as llama_sizes
from modeling import attention
from pipelines import features
from trainer import steps
from trainer.optimizers import (
    OptimizerConfig,
    adafactor_defaults,
    build_optimizer,
    reads_parameter_scale,
)

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "aot_step.py"


def _bench():
    spec = importlib.util.spec_from_file_location("aot_step_benchmark", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- attention: only the compute-dtype weights are kept ---------------------------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_shifted_exponentials_over_their_sums_equal_softmax_forward_and_backward(dtype):
    logits = jax.random.normal(jax.random.key(3), (2, 3, 5, 7), jnp.float32) * 4
    cot = jax.random.normal(jax.random.key(4), (2, 3, 5, 7), jnp.float32)

    def ours(x):
        exps, sums = attention.shifted_exp_as(x, dtype)
        return (exps.astype(jnp.float32) / sums * cot).sum()

    def reference(x):  # softmax as JAX differentiates it, then the cast
        return (jax.nn.softmax(x, axis=-1).astype(dtype).astype(jnp.float32) * cot).sum()

    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(ours(logits), reference(logits), rtol=tol, atol=tol)
    np.testing.assert_allclose(
        jax.grad(ours)(logits), jax.grad(reference)(logits), rtol=tol, atol=tol
    )
    # only the compute-dtype exponentials are kept for the backward pass
    _, vjp = jax.vjp(lambda x: attention.shifted_exp_as(x, dtype), logits)
    kept = [leaf for leaf in jax.tree.leaves(vjp) if getattr(leaf, "shape", ()) == logits.shape]
    assert [leaf.dtype for leaf in kept] == [jnp.dtype(dtype)]


@pytest.mark.slow
def test_xla_attention_gradients_match_the_reference_kernel_in_bf16():
    """The whole `xla` kernel, masked and packed, against a reference built from
    `jax.nn.softmax` (which keeps the float32 weights), forward and gradients."""
    b, s, h, d = 2, 16, 4, 8
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (b, s, h, d), jnp.bfloat16) for key in keys)
    seg = jnp.array([[1] * 10 + [2] * 6, [1] * 16], jnp.int32)

    def ours(q, k, v):
        out = attention.attend(q, k, v, causal=True, q_segment_ids=seg, kernel="xla")
        return out.astype(jnp.float32).sum(), out

    def reference(q, k, v):
        logits = jnp.einsum("bqhd,bkhd->bhqk", q * d**-0.5, k, preferred_element_type=jnp.float32)
        mask = attention.reference_mask(
            q_length=s, kv_length=s, causal=True, q_segment_ids=seg, kv_segment_ids=seg
        )
        weights = jax.nn.softmax(jnp.where(mask, logits, attention.MASK_VALUE), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)
        return out.astype(jnp.float32).sum(), out

    (_, out), grads = jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    (_, ref), ref_grads = jax.value_and_grad(reference, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    np.testing.assert_allclose(np.float32(out), np.float32(ref), atol=2e-2, rtol=2e-2)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.float32(g), np.float32(r), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_division_after_the_value_matmul_has_the_gradients_of_autodiff(dtype):
    # Its backward pass sums the cotangent's products with the output in float32 from the
    # compute-dtype values (no float32 copy of the cotangent); float32 is exact autodiff.
    out = jax.random.normal(jax.random.key(5), (2, 6, 3, 8), jnp.float32).astype(dtype)
    sums = jax.random.uniform(jax.random.key(6), (2, 6, 3, 1), jnp.float32, 0.5, 9.0)
    cot = jax.random.normal(jax.random.key(7), (2, 6, 3, 8), jnp.float32).astype(dtype)

    def reference(u, s):
        return (u.astype(jnp.float32) / s).astype(dtype)

    _, ours = jax.vjp(attention.divide_rows, out, sums)
    _, theirs = jax.vjp(reference, out, sums)
    tol = 1e-6 if dtype == jnp.float32 else 1e-2
    for got, want in zip(ours(cot), theirs(cot), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=tol, atol=tol)


def test_a_bias_is_added_in_the_logits_dtype_with_float32_logits_gradients_close():
    # T5's relative-position bias, in bf16 as T5X adds it; against float32 attention.
    b, s, h, d = 2, 12, 4, 8
    keys = jax.random.split(jax.random.key(8), 4)
    q, k, v = (jax.random.normal(key, (b, s, h, d), jnp.float32) for key in keys[:3])
    bias = jax.random.normal(keys[3], (1, h, s, s), jnp.float32)

    def loss(q, k, v, bias, dtype):
        cast = [x.astype(dtype) for x in (q, k, v)]
        out = attention.attend(*cast, causal=False, bias=bias, scale=1.0, kernel="xla")
        return jnp.sum(out.astype(jnp.float32) * jnp.cos(jnp.arange(d, dtype=jnp.float32)))

    grad = jax.grad(loss, argnums=(0, 1, 2, 3))
    for got, want in zip(
        grad(q, k, v, bias, jnp.bfloat16), grad(q, k, v, bias, jnp.float32), strict=True
    ):
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=0.05, atol=0.08)


def test_a_bf16_llama_block_keeps_no_float32_attention_array():
    cfg = llama_sizes.get_config(
        "llama2_tiny", dtype="bfloat16", remat_policy="none", attention_kernel="xla"
    )
    layer = llama_model._layer_class(cfg, decode=False)(cfg)
    s = 40  # distinct from every model dimension
    x = jnp.zeros((1, s, cfg.d_model), cfg.compute_dtype)
    seg = jnp.ones((1, s), jnp.int32)
    pos = jnp.zeros((1, s), jnp.int32)
    params = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, seg, pos))
    saved = saved_residuals(lambda p, x: layer.apply(p, x, seg, pos)[0], params, x)
    square = [a for a, _ in saved if a.ndim >= 2 and a.shape[-2:] == (s, s)]
    assert square and all(a.dtype == jnp.bfloat16 for a in square), square
    assert len(square) == 1  # the weights; no mask, logits or exponent


# --- the embedding and the LM head: same values and gradients as plain autodiff ---------------


def test_rows_from_a_bf16_table_have_the_float32_lookups_values_and_gradient():
    table = jax.random.normal(jax.random.key(0), (37, 12), jnp.float32)
    tokens = jnp.array([[3, 5, 5, 36, 5], [0, 3, 3, 3, 11]], jnp.int32)  # repeated tokens
    cotangent = jax.random.normal(jax.random.key(1), (2, 5, 12)).astype(jnp.bfloat16)

    def plain(t):
        return jnp.take(t, tokens, axis=0).astype(jnp.bfloat16)

    def via_copy(t):
        return llama_model.lookup_rows(t, tokens, jnp.bfloat16)

    np.testing.assert_array_equal(via_copy(table), plain(table))
    grad = jax.jit(jax.grad(lambda t: jnp.sum(via_copy(t) * cotangent, dtype=jnp.float32)))(table)
    reference = jax.grad(lambda t: jnp.sum(plain(t) * cotangent, dtype=jnp.float32))(table)
    assert grad.dtype == jnp.float32
    np.testing.assert_array_equal(grad, reference)  # repeated tokens summed in float32


def test_the_lm_heads_gradients_are_the_einsums_on_every_backend(monkeypatch):
    x = jax.random.normal(jax.random.key(2), (2, 7, 12), jnp.float32)
    kernel = jax.random.normal(jax.random.key(3), (12, 19), jnp.float32)
    g = jax.random.normal(jax.random.key(4), (2, 7, 19), jnp.float32)

    def grads(fn):
        return jax.jit(jax.grad(lambda x, k: jnp.sum(fn(x, k) * g), argnums=(0, 1)))(x, kernel)

    reference = grads(lambda x, k: jnp.einsum("bld,dv->blv", x, k))
    for backend in ("cpu", "tpu"):  # "tpu": both gradients leave through one barrier
        monkeypatch.setattr(llama_model, "target_backend", lambda b=backend: b)
        for got, want in zip(grads(llama_model.output_projection), reference, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def barriers(data: int) -> int:
        """The barriers in the TPU-branch backward pass under a mesh of `data` x `fsdp`."""
        mesh = jax.make_mesh((data, 8 // data), ("data", "fsdp"))
        fn = jax.grad(lambda x, k: jnp.sum(llama_model.output_projection(x, k) * g), (0, 1))
        with jax.set_mesh(mesh):
            return jax.jit(fn).lower(x, kernel).as_text().count("optimization_barrier")

    # The barrier only under pure FSDP: data parallel (across slices) it made XLA keep every
    # layer's gathered weights for the backward pass.
    assert barriers(1) == 1 and barriers(2) == 0


def test_the_lm_heads_kernel_gradient_leaves_its_matmul_in_the_compute_dtype_off_the_cpu(
    monkeypatch,
):
    # As autodiff of the compute-dtype matmul gives it: XLA reduce-scatters it across chips in
    # the dot's output dtype.
    x = jax.random.normal(jax.random.key(2), (2, 7, 12), jnp.bfloat16)
    kernel = jax.random.normal(jax.random.key(3), (12, 19), jnp.bfloat16)
    g = jax.random.normal(jax.random.key(4), (2, 7, 19), jnp.float32)

    def loss(fn):
        return lambda x, k: jnp.sum(fn(x, k) * g)

    def plain(x, k):
        return jnp.einsum("bld,dv->blv", x, k, preferred_element_type=jnp.float32)

    reference = jax.grad(loss(plain), argnums=(0, 1))(x, kernel)
    monkeypatch.setattr(llama_model, "target_backend", lambda: "tpu")
    fn = jax.grad(loss(llama_model.output_projection), argnums=(0, 1))
    for got, want in zip(jax.jit(fn)(x, kernel), reference, strict=True):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(
            np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2
        )
    text = jax.jit(fn).lower(x, kernel).as_text()
    assert "-> tensor<12x19xbf16>" in text and "-> tensor<12x19xf32>" not in text


# --- projections: stacked on CPU only, same numbers either way ---------------------------------


@pytest.mark.slow
def test_unstacked_projections_give_the_stacked_outputs(monkeypatch):
    from llama_jax import layers

    cfg = llama_sizes.get_config("llama2_tiny", attention_kernel="xla")  # GQA: k/v stacked only
    model = llama_model.Llama(cfg)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 1, cfg.vocab_size)
    params = model.init(jax.random.key(2), tokens)["params"]
    assert layers.stack_projections()  # the CPU backend stacks
    stacked = model.apply({"params": params}, tokens)
    monkeypatch.setattr(layers, "STACKED_PROJECTION_BACKENDS", frozenset())
    assert not layers.stack_projections()
    separate = model.apply({"params": params}, tokens)
    np.testing.assert_allclose(stacked, separate, rtol=1e-5, atol=1e-5)


def test_t5s_gated_activations_are_recomputed_except_on_tpu(monkeypatch):
    from t5_jax import layers as t5_layers

    a, b = (
        jax.random.normal(key, (2, 5, 24), jnp.float32)
        for key in jax.random.split(jax.random.key(9), 2)
    )
    acts = ("gelu", "linear")

    def grads():
        fn = lambda a, b: jnp.sum(jnp.sin(t5_layers.gated_product(acts, a, b)))  # noqa: E731
        return jax.jit(jax.grad(fn, argnums=(0, 1)))(a, b), str(jax.make_jaxpr(fn)(a, b))

    reference, jaxpr = grads()
    assert "remat" in jaxpr or "checkpoint" in jaxpr  # CPU: recomputed in the backward pass
    monkeypatch.setattr(t5_layers, "target_backend", lambda: "tpu")
    fused, jaxpr = grads()
    assert "remat" not in jaxpr and "checkpoint" not in jaxpr  # TPU: XLA fuses it by itself
    for got, want in zip(fused, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_llamas_norm_is_recomputed_except_on_tpu(monkeypatch):
    from llama_jax import layers as llama_layers

    x = jax.random.normal(jax.random.key(10), (2, 5, 24), jnp.bfloat16)
    scale = jax.random.normal(jax.random.key(11), (24,), jnp.bfloat16)

    def grads():
        fn = lambda x, s: jnp.sum(jnp.sin(llama_layers.rms_norm(x, s, 1e-6)), dtype=jnp.float32)  # noqa: E731
        return jax.jit(jax.grad(fn, argnums=(0, 1)))(x, scale), str(jax.make_jaxpr(fn)(x, scale))

    reference, jaxpr = grads()
    assert "remat" in jaxpr or "checkpoint" in jaxpr  # CPU: recomputed in the backward pass
    monkeypatch.setattr(llama_layers, "target_backend", lambda: "tpu")
    fused, jaxpr = grads()
    assert "remat" not in jaxpr and "checkpoint" not in jaxpr  # TPU: XLA keeps no residuals
    for got, want in zip(fused, reference, strict=True):
        np.testing.assert_array_equal(got, want)


# --- the non-finite guard: three scalars, the same decisions ------------------------------------


class _Linear:
    """A one-matrix model: loss = sum(x @ w) over a batch `x` (inputs may be inf or nan)."""

    def loss_fn(self, params, batch, *, z_loss, dropout_rng):
        del z_loss, dropout_rng
        x = batch["x"]
        loss = (x @ params["w"]).sum()
        return steps_output(loss, x.shape[0])


class _LossSums(NamedTuple):
    """The loss record a model's `loss_fn` returns (sums; the step divides by `weight_sum`)."""

    loss_sum: jax.Array
    z_loss_sum: jax.Array
    weight_sum: jax.Array


def steps_output(loss, n):
    """`_LossSums` of a summed loss over `n` targets."""
    return _LossSums(loss, jnp.zeros(()), jnp.asarray(float(n)))


def _reference_finite(state, grads, optimizer, loss):
    """The guard as it was: loss, gradient norm and every new parameter and optimizer value."""
    updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    return bool(
        jnp.isfinite(loss)
        & jnp.isfinite(optax.global_norm(grads))
        & steps.tree_finite(new_params)
        & steps.tree_finite(new_opt)
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, x, lr",
    [
        ("finite", 1.0, 1e-2),
        ("inf input: non-finite loss and gradients", np.inf, 1e-2),
        ("nan input", np.nan, 1e-2),
        ("huge learning rate: finite gradients, infinite update", 1.0, 3.4e38),
    ],
)
@pytest.mark.parametrize("backend", ["cpu", "tpu"])  # "tpu": the update after a barrier
def test_the_guard_skips_what_the_old_guard_skipped(case, x, lr, backend, monkeypatch):
    monkeypatch.setattr(steps, "target_backend", lambda: backend)
    optimizer = optax.adamw(lr, weight_decay=0.1)
    model = _Linear()
    step = jax.jit(
        steps.make_train_step(model, optimizer, optax.constant_schedule(lr), steps.StepConfig())
    )
    params = {"w": jnp.full((3, 2), 0.5, jnp.float32)}
    state = steps.init_train_state(model, optimizer, jnp.zeros(2, jnp.uint32), params=params)
    batch = {
        "x": jnp.full((4, 3), x, jnp.float32),
        features.DECODER_LOSS_WEIGHTS: jnp.ones((4, 1), jnp.float32),
    }
    loss = (batch["x"] @ params["w"]).sum() / 4
    grads = jax.grad(lambda p: (batch["x"] @ p["w"]).sum() / 4)(params)
    expected = _reference_finite(state, grads, optimizer, loss)
    before = jax.tree.map(np.asarray, (state.params, state.opt_state))
    new, metrics = step(state, batch)
    assert bool(metrics["finite"]) == expected, case
    assert int(new.skipped) == int(not expected)
    # The next step's guard reads the norm of the parameters this one kept.
    np.testing.assert_allclose(new.param_norm, optax.global_norm(new.params), rtol=1e-6)
    after = jax.tree.map(np.asarray, (new.params, new.opt_state))
    same = jax.tree.leaves(jax.tree.map(np.array_equal, before, after))
    if expected:
        assert not all(same)  # the update was applied
    else:  # params and optimizer state untouched, bit for bit
        assert all(same)
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(after))


def test_each_parameter_and_moment_waits_for_its_own_gradient():
    params = {"w": jnp.ones((3, 2)), "inner": {"b": jnp.arange(5.0)}}
    opt_state = optax.adamw(1e-3).init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    out = jax.jit(steps.after_their_gradients)(grads, params, opt_state)
    want = (params, opt_state)
    assert jax.tree.structure(out) == jax.tree.structure(want)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, out, want)))
    hlo = jax.jit(steps.after_their_gradients).lower(grads, params, opt_state).as_text()
    # one barrier per array: the parameters and AdamW's two moments (not its step count)
    assert hlo.count("optimization_barrier") == 3 * len(jax.tree.leaves(params))
    free = jax.jit(lambda *a: steps.after_their_gradients(*a, params_too=False))
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, free(grads, params, opt_state), want)))
    hlo = free.lower(grads, params, opt_state).as_text()
    assert hlo.count("optimization_barrier") == 2 * len(jax.tree.leaves(params))  # moments only
    # Only the named top-level modules' arrays wait: here `inner`'s one array and its moments.
    some = jax.jit(lambda *a: steps.after_their_gradients(*a, only=("inner",)))
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, some(grads, params, opt_state), want)))
    assert some.lower(grads, params, opt_state).as_text().count("optimization_barrier") == 3


def test_llamas_step_ties_only_its_embedding_to_its_gradient():
    # The embedding's update needs its table and moments in another layout (its gradient is a
    # scatter); tying the other arrays only narrowed XLA's schedule. The name must be a module.
    from trainer.model_spec import ModelSpec, build_model

    wrapper = build_model(ModelSpec(family="llama2", size="llama2_tiny"))
    params = wrapper.abstract_variables()["params"]
    assert wrapper.tied_to_gradients == ("token_embedder",)
    assert set(wrapper.tied_to_gradients) < set(params)
    t5 = build_model(ModelSpec(family="t5", size="t5_tiny"))
    assert t5.tied_to_gradients is None  # every array of T5's update waits


@pytest.mark.parametrize("microbatches", [1, 2])
def test_accumulating_the_parameters_wait_for_their_gradients_unless_the_optimizer_reads_them(
    microbatches, monkeypatch
):
    # Adafactor's parameter scale reads every parameter; when microbatches are accumulated,
    # free of the barriers, XLA takes it with the parameters' casts before the loop. The train
    # step's lowered program says which arrays wait: one barrier fewer per parameter with
    # `optimizer_reads_params` and microbatches, none fewer without them; the same values.
    monkeypatch.setattr(steps, "target_backend", lambda: "tpu")
    assert not reads_parameter_scale(OptimizerConfig())  # AdamW: the parameters wait too
    assert reads_parameter_scale(adafactor_defaults())
    tx = build_optimizer(adafactor_defaults(), learning_rate=optax.constant_schedule(1e-2))
    model = _Linear()
    params = {"w": jnp.full((3, 2), 0.5, jnp.float32)}
    state = steps.init_train_state(model, tx, jnp.zeros(2, jnp.uint32), params=params)
    batch = {
        "x": jnp.ones((4, 3), jnp.float32),
        features.DECODER_LOSS_WEIGHTS: jnp.ones((4, 1), jnp.float32),
    }
    config = steps.StepConfig(num_microbatches=microbatches)
    barriers, outputs = {}, {}
    for reads in (False, True):
        step = jax.jit(
            steps.make_train_step(
                model, tx, optax.constant_schedule(1e-2), config, optimizer_reads_params=reads
            )
        )
        barriers[reads] = step.lower(state, batch).as_text().count("optimization_barrier")
        outputs[reads] = step(state, batch)
    freed = len(jax.tree.leaves(params)) if microbatches > 1 else 0
    assert barriers[False] - barriers[True] == freed and barriers[True]
    same = jax.tree.map(np.array_equal, outputs[False], outputs[True])
    assert all(jax.tree.leaves(same))


# --- per-component token counts: no scatter ----------------------------------------------------


def test_token_counts_equal_segment_sum_and_compile_without_a_scatter():
    rng = np.random.default_rng(0)
    ids = rng.integers(-1, 5, (6, 20)).astype(np.int32)  # -1 and 4 fall outside 4 components
    weights = (rng.random((6, 20)) > 0.3).astype(np.float32)
    batch = {features.DECODER_TASK_IDS: ids, features.DECODER_LOSS_WEIGHTS: weights}
    counts = steps.tokens_by_component(batch, 4)
    bucket = np.where((ids >= 0) & (ids < 4), ids, 4)
    reference = jax.ops.segment_sum((weights > 0).astype(np.int32).ravel(), bucket.ravel(), 5)[:4]
    np.testing.assert_array_equal(counts, reference)
    only = steps.tokens_by_component({features.DECODER_LOSS_WEIGHTS: weights}, 3)
    np.testing.assert_array_equal(only, [int((weights > 0).sum()), 0, 0])
    hlo = jax.jit(lambda b: steps.tokens_by_component(b, 4)).lower(batch).as_text()
    assert "scatter" not in hlo


# --- the ahead-of-time benchmark ---------------------------------------------------------------


@pytest.mark.slow
def test_an_estimate_xla_cannot_make_is_unusable_and_names_the_ops(tpu_topology, monkeypatch):
    """A scatter-add (what `segment_sum` lowers to) compiled for a v5p runs on the SparseCore,
    whose cost XLA does not know: `optimal_seconds` comes out negative."""
    devices = tpu_topology("v5p:2x2x1")  # skips without libtpu
    monkeypatch.syspath_prepend(str(BENCH.parent))
    bench = _bench()
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("d",)), P("d"))
    shape = jax.ShapeDtypeStruct((16, 2048), jnp.int32)
    compiled = (
        jax.jit(lambda w, ids: jax.ops.segment_sum(w.ravel(), ids.ravel(), num_segments=4))
        .lower(
            jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding),
            jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding),
        )
        .compile()
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    usable, why, ops = bench.usability(dict(cost), compiled.as_text())
    assert not usable and "not a time" in why
    assert ops and all("scatter" in op for op in ops) and ops[0] in why
    assert bench.usability({"flops": 1.0}, "")[:2] == (
        False,
        "cost_analysis() has no optimal_seconds",
    )
    assert bench.usability({"optimal_seconds": 0.25}, "") == (True, None, [])


@pytest.mark.slow
def test_a_two_slice_estimate_names_its_custom_calls_and_takes_back_their_sentinels(
    tpu_topology, monkeypatch
):
    """Data parallel across two v5p slices, each gradient crosses the data-center network
    after a `ZeroCrop` custom call clears its tile padding (448 columns pad to 512); XLA
    counts each such call as -1 second, so `optimal_seconds` is negative. The rest is a time."""
    devices = tpu_topology("v5p:2x2x1", num_slices=2)  # skips without libtpu
    monkeypatch.syspath_prepend(str(BENCH.parent))
    bench = _bench()
    mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 4), ("data", "fsdp"))

    def loss(weights, x):
        for w in weights:
            x = jnp.tanh(x @ w)
        return jnp.sum(x)

    def compiled(n):
        w = jax.ShapeDtypeStruct((448, 448), jnp.float32, sharding=NamedSharding(mesh, P()))
        x = jax.ShapeDtypeStruct(
            (64, 448), jnp.float32, sharding=NamedSharding(mesh, P(("data", "fsdp")))
        )
        program = jax.jit(jax.grad(loss)).lower([w] * n, x).compile()
        cost = program.cost_analysis()
        return dict(cost[0] if isinstance(cost, list) else cost), program.as_text()

    for n in (1, 2):
        cost, hlo = compiled(n)
        usable, why, ops = bench.usability(cost, hlo, num_slices=2)
        assert not usable and "not a time" in why
        assert ops == bench.sentinel_custom_calls(hlo) and len(ops) == n
        assert all(op.startswith("ZeroCrop (") for op in ops)
        assert why.endswith(
            "ops XLA could not cost: " + ("ZeroCrop" if n == 1 else f"ZeroCrop x{n}")
        )
        costed = bench.costed_seconds(cost, hlo)
        assert costed == pytest.approx(cost["optimal_seconds"] + n) and 0 < costed < 1e-3
    # Nothing to take back, or a SparseCore op among them: no such figure.
    assert bench.costed_seconds({"optimal_seconds": 0.25}, "") is None
    sparse = '%s = f32[4] scatter(...), execution_thread="sparsecore"\n'
    assert bench.costed_seconds(cost, hlo + sparse) is None


@pytest.mark.slow
def test_the_benchmark_json_of_a_tiny_tpu_step(tpu_topology, tmp_path, monkeypatch):
    tpu_topology("v5p:2x2x1")  # skips without libtpu
    monkeypatch.syspath_prepend(str(BENCH.parent))  # its sibling `compiled_step`
    bench = _bench()
    out = tmp_path / "tiny.json"
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    args = ["--size=llama2_tiny", "--topology=v5p:2x2x1", "--batch=8", "--seq-len=128"]
    assert bench.main([*args, "--remat=none", "--components=2", f"--json={out}"]) == 0
    result = json.loads(out.read_text())
    assert set(result["memory"]) >= {
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "peak",
    }
    assert set(result["cost"]) >= {"flops", "bytes accessed", "optimal_seconds"}
    # The stock compile (token counts included) has an estimate: nothing left uncosted.
    assert result["usable"] and result["uncosted_ops"] == [], result["why_unusable"]
    assert result["cost"]["optimal_seconds"] > 0 and 0 < result["estimated_mfu"] < 1
    assert result["model_flops"] > 0 and result["settings"]["devices"] == 4
    assert result["settings"]["json"] == "tiny.json"  # by name: no machine's folder


def test_a_benchmark_json_names_no_machines_folder(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    bench = _bench()
    repo = BENCH.parent.parent
    settings = {
        "json": str(tmp_path / "row.json"),
        "hlo": None,
        "libtpu": str(repo / ".venv/libtpu-aot/libtpu/libtpu.so"),
        "size": "llama2_tiny",
    }
    assert bench.recorded_paths(settings) == {
        "json": "row.json",
        "hlo": None,
        "libtpu": ".venv/libtpu-aot/libtpu/libtpu.so",
        "size": "llama2_tiny",
    }
    assert bench.recorded_paths({"libtpu": "/opt/elsewhere/libtpu.so"}) == {"libtpu": "libtpu.so"}
    # The committed grid holds none either.
    for path in sorted((repo / "benchmarks" / "aot_grid").glob("*.json")):
        settings = json.loads(path.read_text()).get("settings", {})
        absolute = {k: v for k, v in settings.items() if isinstance(v, str) and v.startswith("/")}
        assert not absolute, (path.name, absolute)


def _load_benchmark(monkeypatch, name: str):
    """A benchmark script of `benchmarks/` as a module (its siblings importable)."""
    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCH.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _grid_module(monkeypatch):
    return _load_benchmark(monkeypatch, "aot_vs_maxtext")


def test_the_comparison_gives_maxtext_the_same_program_and_tabulates_ratios(monkeypatch, tmp_path):
    grid = _grid_module(monkeypatch)
    row = grid.ROWS["1085m_none_2slices"]
    overrides = dict(o.split("=", 1) for o in grid.maxtext_overrides(row))
    assert overrides["base_emb_dim"] == "1792" and overrides["head_dim"] == "128"
    assert overrides["per_device_batch_size"] == "4"  # 32 sequences over 2 slices of 4 chips
    assert overrides["dcn_data_parallelism"] == "2" and overrides["scan_layers"] == "false"
    assert overrides["attention"] == "dot_product" and overrides["remat_policy"] == "none"
    # Keeping the weight matmuls' outputs is MaxText's `minimal` (its named projections).
    minimal = dict(o.split("=", 1) for o in grid.maxtext_overrides(grid.ROWS["1085m_minimal"]))
    assert minimal["remat_policy"] == "minimal"
    args = grid.xlscale_args(row, tmp_path / "x.json")
    assert "--num-slices=2" in args and "--attention=xla" in args and "--no-scan" in args
    t5 = grid.ROWS["t5_770m_auto"]
    assert not t5.has_peer and t5.peer == "t5x" and row.peer == "maxtext"
    # T5X's step at the same shape, batch and microbatches as xlscale's program.
    t5x = grid.t5x_args(t5, tmp_path / "t.json", microbatches=2)
    assert {"--size=t5_770m", "--batch=128", "--inputs-len=512", "--seq-len=114"} <= set(t5x)
    assert "--microbatches=2" in t5x and t5x[1].endswith("t5x_step.py")
    path = grid.t5x_env("/a/t5x:/a/airio")["PYTHONPATH"].split(":")
    assert path[:2] == ["/a/t5x", "/a/airio"] and str(BENCH.parent) in path
    # The paper's batch tokens by gradient accumulation on both sides.
    paper = grid.ROWS["1085m_none_paper"]
    overrides = dict(o.split("=", 1) for o in grid.maxtext_overrides(paper))
    assert overrides["gradient_accumulation_steps"] == "64"
    assert overrides["per_device_batch_size"] == "4"  # 1024 sequences: 64 microbatches of 16
    assert paper.batch * paper.seq_len == 2**21  # the CPT paper's 2M tokens at 1-2.5B
    assert "--microbatches=64" in grid.xlscale_args(paper, tmp_path / "p.json")
    # Rows compiled at different commits say so.
    info = grid.provenance(argparse.Namespace(maxtext=None), {"abc": ["a"], "def": ["b", "c"]})
    assert info["xlscale commit"] == "abc (a); def (b, c)"
    assert (
        grid.provenance(argparse.Namespace(maxtext=None), {"abc": ["a"]})["xlscale commit"] == "abc"
    )

    def result(seconds, bytes_, temp):
        memory = {
            "argument_size_in_bytes": 4e9,
            "output_size_in_bytes": 4e9,
            "alias_size_in_bytes": 4e9,
            "temp_size_in_bytes": temp,
        }
        cost = {"optimal_seconds": seconds, "flops": 1e12, "bytes accessed": bytes_}
        return {"memory": memory, "cost": cost, "model_flops": 2.8e14}

    # An MFU only where XLA's FLOPs cover the model's (8 devices x 1e12 of 2.8e14: a loop's
    # body counted once), whatever the JSON says.
    assert grid.figures({**result(0.25, 3e11, 2e9), "estimated_mfu": 0.5}, row)["mfu"] is None
    whole = {**result(0.25, 3e11, 2e9), "estimated_mfu": 0.5}
    whole["cost"]["flops"] = 4e13
    assert grid.figures(whole, row)["mfu"] == 0.5
    xl = grid.figures(result(0.25, 3e11, 2e9), row)
    mt = grid.figures(result(0.20, 2e11, 1e9), row)
    bad = grid.figures(result(-1.69, 3e11, 2e9), row)
    text = grid.table({"a": (row, xl, mt), "b": (row, bad, mt)})
    assert "| a | 0.2500 / 0.2000 | 1.250 | 1.000 | 1.500 | 2.00 / 1.00 | 6.00 / 5.00 |" in text
    assert "| b | unusable / 0.2000 | – |" in text
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nOur words.\n")
    info = {"xlscale commit": "abc"}
    grid.write_doc(page, text, info, {"a": (row, xl, mt)})
    grid.write_doc(page, text, info, {"a": (row, xl, mt)})  # replaces its block
    written = page.read_text()
    assert written.startswith("# Title\n\nOur words.\n") and written.count(grid.BEGIN) == 1
    assert "| 1085m_none_2slices |" not in written and "| a | llama2_1085m" in written


def test_t5xs_step_gets_xlscales_batch_and_says_when_t5x_is_missing(monkeypatch, capsys):
    t5x_step = _load_benchmark(monkeypatch, "t5x_step")
    args = t5x_step.parse_args(["--batch=8", "--inputs-len=16", "--seq-len=12"])
    shapes = t5x_step.batch_shapes(args)
    # The features of xlscale's encoder-decoder batch, but the mixture's task ids.
    lengths = features.batch_lengths({"inputs": 16, "targets": 12})
    lengths.pop(features.DECODER_TASK_IDS, None)
    assert {k: s for k, (s, _) in shapes.items()} == {k: (8, n) for k, n in lengths.items()}
    monkeypatch.setitem(sys.modules, "t5x", None)  # T5X not importable
    assert t5x_step.main([f"--libtpu={BENCH}"]) == 2  # any existing file stands for libtpu
    assert "PYTHONPATH" in capsys.readouterr().err
