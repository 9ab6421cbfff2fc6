"""The LLaMA2 decoder-only language model (Touvron et al. 2023) as the CPT paper trains it.

Architecture: token embedding -> `num_layers` pre-norm blocks (RMSNorm, causal self-attention
with RoPE on q/k and optional grouped-query attention, RMSNorm, SwiGLU MLP) -> final RMSNorm ->
untied output projection. No biases anywhere. Parameter names and logical axes:

    token_embedder/embedding              [vocab, embed]
    layers_<i>/attention_norm/scale       [embed]
    layers_<i>/attention/{query,key,value} [embed, heads, kv]
    layers_<i>/attention/out              [heads, kv, embed]
    layers_<i>/ffn_norm/scale             [embed]
    layers_<i>/mlp/{w1,w3}                [embed, mlp]
    layers_<i>/mlp/w2                     [mlp, embed]
    final_norm/scale                      [embed]
    lm_head/kernel                        [embed, vocab]

With `scan_layers=True` the blocks live under `layers/...` instead, each parameter stacked along a
new leading `layers` axis (layer i is index i); `stack_layer_params` converts between the layouts.
Logical axis names of every parameter are sown into the `params_axes` collection at init
(T5X convention); `flax.linen.partitioning.get_axis_names` turns them into PartitionSpecs.

Packed sequences: `segment_ids [batch, length]` (0 = padding, 1, 2, ... = documents) keep
attention inside each document; `positions` (RoPE positions) default to restarting at 0 at every
segment change, or to `0..length-1` without segment ids.

Decoding contract (T5X's `cache` collection):

1. Allocate: `variables = model.init(rng, jnp.zeros((batch, capacity), jnp.int32), decode=True)`
   (or `model.apply({"params": params}, zeros, decode=True, mutable=["cache"])`). With no cache
   present, a `decode=True` call creates zero `cached_key`/`cached_value` of length `capacity`
   (the input length) and `cache_index = 0` in every attention layer, and returns an ordinary
   causal forward of its input without writing to the cache.
2. Prefill: `logits, mut = model.apply({"params": params, "cache": cache}, prompt, decode=True,
   mutable=["cache"])` with `prompt [batch, P]` writes the prompt's keys/values at cache
   positions `[0, P)`, attends causally, returns logits for all `P` tokens (the last one predicts
   the first new token) and sets `cache_index = P`.
3. Step: the same call with one token `[batch, 1]` writes position `cache_index`, attends to
   cache positions `<= cache_index` and advances it by one. Any chunk length works (prefill and
   step are one code path); RoPE positions are `cache_index + arange(L)` unless `positions` is
   given. All rows share one cache index, so prompts in a batch have equal length; `segment_ids`
   are ignored once the cache exists. Writing beyond `capacity` is the caller's error (JAX
   clamps dynamic slices, it does not raise).
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning

from llama_jax.config import LlamaConfig
from llama_jax.layers import (
    DecoderLayer,
    RMSNorm,
    accum_dtype,
    data_parallel,
    kernel_init,
    positions_from_segments,
    weight,
)
from modeling import axes
from modeling.attention import target_backend
from modeling.remat import REMAT_POLICIES

constrain = nn_partitioning.with_sharding_constraint
# Backends whose embedding lookup reads the table as it is sharded (see `Embed`).
SHARDED_LOOKUP_BACKENDS = frozenset({"tpu"})


# A logical name for the lookup's batch dimension only: split over `data` (slices, replicas),
# never over `fsdp`, whose devices each gather every token from their columns of the table.
_LOOKUP_BATCH = "lookup_batch"


def _in_table_layout(rows: jax.Array) -> jax.Array:
    """The looked-up rows `[batch, length, embed]` kept sharded as the table's columns (`embed`
    over `fsdp`), so that the compute-dtype cast runs before the all-to-all that makes them
    batch-sharded: the swap then moves bf16, not float32 (half the bytes and buffers), and the
    backward pass casts the bf16 cotangent after its swap, as before. Same values."""
    rules = nn.get_logical_axis_rules()
    if not rules:  # no mesh bound: nothing to constrain
        return rows
    rules = ((_LOOKUP_BATCH, axes.DATA), *rules)
    return nn.with_logical_constraint(rows, (_LOOKUP_BATCH, axes.LENGTH, axes.EMBED), rules=rules)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def lookup_rows(table: jax.Array, tokens: jax.Array, dtype) -> jax.Array:
    """`table[tokens]` in `dtype`, read from a `dtype` copy of the table, with the gradient
    accumulated in the table's own dtype.

    The same values and gradient as `jnp.take(table, tokens, axis=0).astype(dtype)`. Casting
    the table first (as MaxText's embedding does) lets the compiler lay the narrow copy out for
    the gather in the same pass, where gathering float32 rows from a table laid out
    column-major for its sharded shape needs a float32 row-major copy of it (kept for the whole
    step, 57 MB per device for llama2_1085m on 4 chips). Plain autodiff of the cast table would
    sum repeated tokens' gradients in `dtype`; the custom backward pass widens the cotangent
    first and scatter-adds it into a zero table of the table's dtype, as autodiff of the
    uncast lookup does.
    """
    return jnp.take(table.astype(dtype), tokens, axis=0)


def _lookup_rows_fwd(table, tokens, dtype):
    # The table is a parameter, alive for the whole step anyway; the backward pass reads only
    # its shape and dtype.
    return lookup_rows(table, tokens, dtype), (table, tokens)


def _lookup_rows_bwd(dtype, residuals, g):
    del dtype
    table, tokens = residuals
    grad = jnp.zeros_like(table).at[tokens].add(g.astype(table.dtype), mode="drop")
    return grad, None


lookup_rows.defvjp(_lookup_rows_fwd, _lookup_rows_bwd)


class Embed(nn.Module):
    """Token embedding table `[vocab, embed]`, looked up by index."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Maps int tokens `[batch, length]` to `[batch, length, embed]` in the compute dtype."""
        cfg = self.config
        shape, names = (cfg.vocab_size, cfg.d_model), (axes.VOCAB, axes.EMBED)
        table = weight(cfg, "embedding", nn.initializers.normal(stddev=1.0), shape, names)
        if target_backend() in SHARDED_LOOKUP_BACKENDS:
            # Look up in the table as it is sharded (embed over `fsdp`), in the compute dtype:
            # the partitioner gathers every device's tokens from its slice of the columns and
            # swaps slices for rows with one all-to-all, and the gradient is a scatter into the
            # local slice, as MaxText's embedding does. Gathering the whole table instead costs a
            # float32 `[vocab, embed]` scatter and all-reduce per step.
            x = _in_table_layout(lookup_rows(table, tokens, cfg.compute_dtype))
            return constrain(x, axes.ACT_EMBED)
        # Elsewhere gather from a whole table (FSDP all-gathers weights before use anyway): on
        # the CPU a lookup in a vocab/embed-sharded table yields embed-sharded rows that the
        # partitioner can only turn into batch-sharded activations by "involuntary full
        # rematerialization".
        table = constrain(table, (None, None))
        x = jnp.take(table, tokens, axis=0).astype(cfg.compute_dtype)
        return constrain(x, axes.ACT_EMBED)


@jax.custom_vjp
def output_projection(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """`x [batch, length, embed] @ kernel [embed, vocab]` with float32 (or wider) logits.

    Same values and gradients as the plain einsum; the custom backward only changes how the
    kernel gradient is laid out (see `_output_projection_bwd`). Being a `jax.custom_vjp`, it
    supports reverse-mode differentiation only (no `jax.jvp` through the logits).
    """
    return jnp.einsum("bld,dv->blv", x, kernel, preferred_element_type=accum_dtype(x.dtype))


def _output_projection_fwd(x, kernel):
    return output_projection(x, kernel), (x, kernel)


def _output_projection_bwd(residuals, g):
    x, kernel = residuals
    wide = g.dtype
    # The logits' cotangent enters both matmuls in the compute dtype (accumulated wide), as
    # every other matmul of the step: a float32 operand would make them float32 matmuls, and
    # the float32 `[tokens, vocab]` cotangent is the largest array of the step to read twice.
    g = g.astype(x.dtype)
    if target_backend() == "cpu":
        # Autodiff contracts the cotangent over tokens for the kernel gradient, and XLA:CPU lays
        # that out by transposing the whole cotangent. Transposing the small activation
        # instead, kept from being folded back into the dot by an optimisation barrier, makes
        # it a plain row-major matmul (about 2x faster for the head).
        x_t = jax.lax.optimization_barrier(x.reshape(-1, x.shape[-1]).T)
        d_kernel = jnp.dot(x_t, g.reshape(-1, g.shape[-1]), preferred_element_type=wide)
    else:
        # In the compute dtype, as plain autodiff of the compute-dtype matmul gives it (and as
        # every other weight's gradient is): on 8 or more chips XLA reduce-scatters it inside a
        # windowed matmul loop whose partial sums travel between chips in the dot's output
        # dtype, and float32 partials doubled those bytes.
        d_kernel = jnp.einsum("bld,blv->dv", x, g)
    d_x = jnp.einsum("blv,dv->bld", g, kernel, preferred_element_type=wide)
    d_x, d_kernel = d_x.astype(x.dtype), d_kernel.astype(kernel.dtype)
    if target_backend() != "cpu" and not data_parallel():
        # Both gradients before either leaves: XLA otherwise schedules the kernel gradient after
        # the layers' whole backward pass, which keeps the `[tokens, vocab]` cotangent (bf16,
        # 0.5 GB a device at 4 x 2,048 tokens and 32,000 words) alive through it, at the step's
        # peak. The barrier changes no value. Under pure FSDP only: with data parallelism across
        # two slices it made XLA keep every layer's gathered bf16 weights from the forward pass
        # for the backward one instead of gathering them again (temporaries of 8 layers of
        # llama2_1085m on two v5p-8 slices: 11.47 GB without it, 11.94 GB with it).
        d_x, d_kernel = jax.lax.optimization_barrier((d_x, d_kernel))
    return d_x, d_kernel


output_projection.defvjp(_output_projection_fwd, _output_projection_bwd)


class LMHead(nn.Module):
    """Untied output projection `[embed, vocab]`; returns float32 logits (float64 in float64)."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps `[batch, length, embed]` to float32 logits `[batch, length, vocab]`."""
        cfg = self.config
        shape, names = (cfg.d_model, cfg.vocab_size), (axes.EMBED, axes.VOCAB)
        kernel = weight(cfg, "kernel", kernel_init(0, 1), shape, names)
        logits = output_projection(x, kernel.astype(cfg.compute_dtype))
        return constrain(logits, axes.ACT_VOCAB)


def _layer_class(config: LlamaConfig, *, decode: bool) -> type[nn.Module]:
    """The block class, wrapped in `nn.remat` per `config.remat_policy` (never when decoding)."""
    policy_name = config.remat_policy
    if decode or policy_name == "none":
        return DecoderLayer
    # prevent_cse guards against XLA merging recomputation with the forward pass; scan already
    # prevents that, and the guard makes scanned loops slower.
    return nn.remat(
        DecoderLayer, policy=REMAT_POLICIES[policy_name], prevent_cse=not config.scan_layers
    )


class Llama(nn.Module):
    """LLaMA2 decoder-only language model; see the module docstring for layouts and decoding."""

    config: LlamaConfig

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        decode: bool = False,
        deterministic: bool = True,
    ) -> jax.Array:
        """Returns float32 next-token logits `[batch, length, vocab]` for int `tokens`.

        Args:
          tokens: `[batch, length]` input token ids.
          segment_ids: `[batch, length]` packed-document ids (0 = padding); attention never
            crosses a change of id. None: one document per row.
          positions: `[batch, length]` RoPE positions; None derives them (see module docstring).
          decode: use/fill the `cache` collection (which must then be mutable).
          deterministic: accepted for the T5X module contract; LLaMA2 has no dropout, so it
            changes nothing.
        """
        del deterministic
        cfg = self.config
        if not decode and positions is None:
            if segment_ids is None:
                positions = jnp.broadcast_to(
                    jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape
                )
            else:
                positions = positions_from_segments(segment_ids)

        x = Embed(cfg, name="token_embedder")(tokens)
        layer_cls = _layer_class(cfg, decode=decode)
        if cfg.scan_layers:
            scanned = nn_partitioning.scan_with_axes(
                layer_cls,
                variable_axes={"params": 0, "cache": 0},
                split_rngs={"params": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                axis_name=axes.LAYERS,
            )
            x, _ = scanned(cfg, decode=decode, name="layers")(x, segment_ids, positions)
        else:
            for i in range(cfg.num_layers):
                x, _ = layer_cls(cfg, decode=decode, name=f"layers_{i}")(x, segment_ids, positions)
        x = RMSNorm(cfg, name="final_norm")(x)
        return LMHead(cfg, name="lm_head")(x)


def stack_layer_params(params: dict, num_layers: int) -> dict:
    """Converts an unscanned parameter tree (`layers_<i>/...`) to the scanned layout (`layers/...`).

    Lets a checkpoint trained one way run the other way, and lets tests check that both layouts
    compute the same function.
    """
    params = dict(params)
    per_layer = [params.pop(f"layers_{i}") for i in range(num_layers)]
    params["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *per_layer)
    return params


def unstack_layer_params(params: dict, num_layers: int) -> dict:
    """Inverse of `stack_layer_params`: scanned layout to `layers_<i>/...`."""
    params = dict(params)
    stacked = params.pop("layers")
    for i in range(num_layers):
        params[f"layers_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], stacked)
    return params


def abstract_variables(config: LlamaConfig) -> dict:
    """Shapes and dtypes of `Llama(config)`'s `params` and `params_axes`, without allocating.

    Parameter shapes do not depend on the sequence length, so a length-1 dummy input is traced.
    """
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    return jax.eval_shape(lambda t: Llama(config).init(jax.random.PRNGKey(0), t), tokens)


def param_logical_specs(config: LlamaConfig) -> dict:
    """Logical `PartitionSpec`s (names from `modeling.axes`) for every parameter, as a plain dict
    tree matching `params`; map them onto a mesh with `flax.linen.logical_to_mesh_sharding`."""
    specs = nn_partitioning.get_axis_names(abstract_variables(config)["params_axes"])
    return flax.core.unfreeze(specs)
