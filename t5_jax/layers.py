"""T5's building blocks: RMS layer norm, relative-position biases, attention with a decode
cache (over the shared seam `modeling.attention.attend`), the (gated) MLP, the token embedding.

Parameters are created with `param_with_axes` under logical axis names, and activations carry
logical sharding constraints, so a partitioner maps both onto any mesh. Names follow T5X
(`query/kernel`, `rel_embedding`, `wi_0`, `scale`, ...), so checkpoints line up with its layout.
Attention kernels are stored 2-D (`embed` x `joined_kv`) as T5X stores them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import partitioning as nn_partitioning
from jax import lax

from modeling.attention import attend, target_backend
from modeling.axes import ACT_EMBED, ACT_HEADS, ACT_MLP, EMBED, HEADS, JOINED_KV, MLP, VOCAB

# T5-only logical axis (the relative-position bucket table); T5X's name, never sharded.
RELPOS_BUCKETS = "relpos_buckets"

param_with_axes = nn_partitioning.param_with_axes
Array = jax.Array

# T5X's initialisers. Module-level objects, so each (initialiser, shape) compiles once.
DENSE_INIT = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
ATTENTION_INIT = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
RELPOS_INIT = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
EMBED_INIT = nn.initializers.normal(stddev=1.0)


def scaled_query_init(head_dim: int) -> Callable:
    """`ATTENTION_INIT` divided by sqrt(head_dim): T5 folds the logit scaling into the query."""

    def init(key, shape, dtype=jnp.float32):
        return ATTENTION_INIT(key, shape, dtype) / jnp.sqrt(head_dim).astype(dtype)

    return init


ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": nn.relu,
    "gelu": nn.gelu,  # tanh approximation, as T5.1.1 ("gelu_new")
    "silu": nn.silu,
    "linear": lambda x: x,
}


def constrain(x: Array, axes: tuple[str | None, ...]) -> Array:
    """Logical sharding constraint on an activation (a no-op outside a mesh and rules)."""
    return nn.with_logical_constraint(x, axes)


def relative_position_bucket(
    relative_position: Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Array:
    """Maps `memory_position - query_position` to a T5 relative-attention bucket.

    Half the buckets (of each direction, when bidirectional) hold exact small distances; the rest
    cover distances up to `max_distance` logarithmically; farther distances share the last
    bucket. Without `bidirectional` (causal decoder) keys after the query all map to bucket 0.
    Float32 with T5X's epsilon inside the log, so exact powers land in the upper bucket.
    """
    relative_position = jnp.asarray(relative_position, jnp.int32)
    n = -relative_position
    ret = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    scaled = (
        jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps)
        / jnp.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    )
    val_if_large = jnp.minimum(max_exact + scaled.astype(jnp.int32), num_buckets - 1)
    return ret + jnp.where(n < max_exact, n, val_if_large)


class LayerNorm(nn.Module):
    """T5 layer norm: divide by the root mean square, scale; no mean subtraction, no bias."""

    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Normalises the last axis of `x` (computed in float32), in `dtype`."""
        scale = param_with_axes(
            "scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype, axes=(EMBED,)
        )
        return rms_norm(x, jnp.asarray(scale, self.dtype), self.epsilon)


@functools.partial(jax.checkpoint, static_argnums=(2,))
def rms_norm(x: Array, scale: Array, eps: float) -> Array:
    """`x` divided by its root mean square over the last axis (in float32), times `scale`, in
    `scale`'s dtype.

    Rematerialised (`jax.checkpoint`), as `llama_jax.layers.rms_norm`: its residuals -- a
    float32 copy of the input and the float32 normalised value -- cost more memory than
    recomputing a few elementwise operations costs time; it keeps its input instead.
    """
    x = jnp.asarray(x, jnp.float32)
    mean2 = jnp.mean(lax.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * lax.rsqrt(mean2 + eps), scale.dtype)
    return y * scale


class Dense(nn.Module):
    """A bias-free projection with a 2-D, logically named `kernel` `[in, features]`.

    Attention's projections split or join heads: `heads_out=(heads, head_dim)` returns
    `[..., heads, head_dim]` (`features = heads * head_dim`), and `heads_in` contracts the input's
    last two axes `[..., heads, head_dim]` (`in = heads * head_dim`). The kernel keeps the 2-D
    shape that checkpoints store; it is the kernel that is viewed with the heads split (a free
    reshape of a weight), as T5X's `DenseGeneral` contracts the same axes. Reshaping the
    activations instead is a copy on TPU, whose tiled layouts of `[..., heads, head_dim]` and
    `[..., heads * head_dim]` differ, and the step kept both copies for the backward pass.
    """

    features: int
    kernel_axes: tuple[str, str]
    kernel_init: Callable = DENSE_INIT
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    heads_out: tuple[int, int] | None = None
    heads_in: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """Returns `x @ kernel`, over the heads' axes where `heads_in`/`heads_out` say."""
        contracted = 2 if self.heads_in else 1
        kernel = param_with_axes(
            "kernel",
            self.kernel_init,
            (math.prod(x.shape[-contracted:]), self.features),
            self.param_dtype,
            axes=self.kernel_axes,
        )
        x = jnp.asarray(x, self.dtype)
        kernel = jnp.asarray(kernel, self.dtype)
        if self.heads_out:
            kernel = kernel.reshape(kernel.shape[0], *self.heads_out)
        if self.heads_in:
            kernel = kernel.reshape(*x.shape[-2:], self.features)
        axes_x = tuple(range(x.ndim - contracted, x.ndim))
        return lax.dot_general(x, kernel, ((axes_x, tuple(range(contracted))), ((), ())))


class Embed(nn.Module):
    """Token embedding (`embedding` [vocab, embed]), also usable as the tied output layer."""

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = param_with_axes(
            "embedding",
            EMBED_INIT,
            (self.num_embeddings, self.features),
            self.param_dtype,
            axes=(VOCAB, EMBED),
        )

    def __call__(self, tokens: Array) -> Array:
        """Looks up int token ids: [...] -> [..., features]."""
        # Gather from a whole table, as llama_jax's Embed does: a lookup in a vocab/embed-sharded
        # table makes the partitioner fall back to full rematerialization.
        table = constrain(jnp.asarray(self.embedding, self.dtype), (None, None))
        out = jnp.take(table, tokens.astype(jnp.int32), axis=0)
        return constrain(out, ACT_EMBED) if out.ndim == 3 else out

    def attend(self, query: Array) -> Array:
        """Logits against every embedding row, in float32: [..., features] -> [..., vocab]."""
        query = jnp.asarray(query, jnp.float32)
        return jnp.einsum("...d,vd->...v", query, jnp.asarray(self.embedding, jnp.float32))


class RelativePositionBiases(nn.Module):
    """Per-head learned biases indexed by relative-position bucket (`rel_embedding` [heads,
    buckets]); one instance is shared by all layers of a stack."""

    num_buckets: int
    max_distance: int
    num_heads: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, query_positions: Array, key_positions: Array, *, bidirectional: bool):
        """Bias for query/key position vectors: [q], [k] -> [1, heads, q, k]."""
        rel = key_positions[None, :] - query_positions[:, None]
        buckets = relative_position_bucket(
            rel,
            bidirectional=bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        rel_embedding = param_with_axes(
            "rel_embedding",
            RELPOS_INIT,
            (self.num_heads, self.num_buckets),
            self.param_dtype,
            axes=(HEADS, RELPOS_BUCKETS),
        )
        table = jnp.asarray(rel_embedding, self.dtype)
        return jnp.take(table, buckets, axis=1)[None]

    def full(self, qlen: int, klen: int, *, bidirectional: bool) -> Array:
        """Bias for positions `0..qlen-1` attending to `0..klen-1`: [1, heads, qlen, klen]."""
        return self(jnp.arange(qlen), jnp.arange(klen), bidirectional=bidirectional)


class MultiHeadDotProductAttention(nn.Module):
    """Multi-head attention with T5's conventions and a `cache` collection for decoding.

    No 1/sqrt(head_dim) on the logits: it is folded into the query initialiser (as in T5).
    The mask is described to the seam (causal flag, segment ids), never materialised here.
    With `decode=True` the first call (no cache yet) creates zero caches sized by its inputs and
    otherwise computes as usual; later calls take one query position each. Self-attention
    (`cross=False`) writes the new key/value at `cache_index` and attends to positions
    `<= cache_index`, with the relative-position bias row for that position. Cross-attention
    (`cross=True`) projects the encoder output once, at `cache_index == 0`, and reuses it.
    """

    num_heads: int
    head_dim: int
    out_features: int
    cross: bool = False
    dropout_rate: float = 0.0
    kernel: str = "auto"
    float32_logits: bool = False
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def _dense(self, name: str, features: int, axes: tuple[str, str], init, **heads) -> Dense:
        return Dense(
            features,
            kernel_axes=axes,
            kernel_init=init,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name=name,
            **heads,
        )

    def _heads(self, name: str, init, x: Array) -> Array:
        """`x` projected to `[..., heads, head_dim]` by the kernel `name`."""
        hd, heads = self.num_heads * self.head_dim, (self.num_heads, self.head_dim)
        dense = self._dense(name, hd, (EMBED, JOINED_KV), init, heads_out=heads)
        return constrain(dense(x), ACT_HEADS)

    def _project_kv(self, inputs_kv: Array) -> tuple[Array, Array]:
        # Called from `__call__` and from inside `nn.cond` branches (module = the lifted clone).
        key = self._heads("key", ATTENTION_INIT, inputs_kv)
        value = self._heads("value", ATTENTION_INIT, inputs_kv)
        return key, value

    @nn.compact
    def __call__(
        self,
        inputs_q: Array,
        inputs_kv: Array,
        bias: Array | None = None,
        *,
        causal: bool = False,
        q_segment_ids: Array | None = None,
        kv_segment_ids: Array | None = None,
        relpos: RelativePositionBiases | None = None,
        decode: bool = False,
        deterministic: bool = True,
    ) -> Array:
        """Attends `inputs_q` [b, q, d] to `inputs_kv` [b, k, d]; returns [b, q, out_features].

        Args:
          bias: added to the logits, [1 or b, heads, q, k] (relative positions).
          causal: query i attends keys 0..i only (decoder self-attention).
          q_segment_ids, kv_segment_ids: int [b, q] and [b, k]; a query attends only keys with
            its id (0 marks padding). None: no segment mask.
          relpos: the stack's relative-position module; only used for the one-row bias of a
            cached self-attention decode step.
          decode: use and update the `cache` collection.
          deterministic: disable attention dropout.
        """
        query = self._heads("query", scaled_query_init(self.head_dim), inputs_q)
        cache_ready = decode and self.has_variable("cache", "cached_key")
        q_offset = 0
        if cache_ready and self.cross:
            key, value = self._cross_step(inputs_kv)
        elif cache_ready:
            key, value, q_offset, step_bias = self._self_step(inputs_kv, relpos)
            bias = step_bias if relpos is not None else bias
            causal, q_segment_ids, kv_segment_ids = True, None, None
        else:
            key, value = self._project_kv(inputs_kv)
            if decode:  # first call: create the (zero) caches
                self._cache_variables(key.shape, key.dtype)

        dropout = None
        if not deterministic and self.dropout_rate > 0.0:
            dropout = functools.partial(nn.Dropout(rate=self.dropout_rate), deterministic=False)
        x = attend(
            query,
            key,
            value.astype(self.dtype),
            causal=causal,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
            bias=bias,
            q_offset=q_offset,
            scale=1.0,
            dropout=dropout,
            kernel=self.kernel,
            float32_logits=self.float32_logits,
        )
        out = self._dense(
            "out", self.out_features, (JOINED_KV, EMBED), ATTENTION_INIT, heads_in=True
        )(x)
        return constrain(out, ACT_EMBED)

    def _cache_variables(self, shape, dtype):
        cached_key = self.variable("cache", "cached_key", jnp.zeros, shape, dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, shape, dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        return cached_key, cached_value, cache_index

    def _self_step(self, inputs_kv: Array, relpos: RelativePositionBiases | None):
        """One cached self-attention step: key and value over the whole cache, the step's index
        (the query offset) and its relative-position bias row."""
        key, value = self._project_kv(inputs_kv)
        cached_key, cached_value, cache_index = self._cache_variables(None, None)
        length = cached_key.value.shape[1]
        if key.shape[1] != 1:
            raise ValueError(f"a cached decode step takes one position, got {key.shape[1]}")
        index = cache_index.value
        key = lax.dynamic_update_slice(
            cached_key.value, key.astype(cached_key.value.dtype), (0, index, 0, 0)
        )
        value = lax.dynamic_update_slice(
            cached_value.value, value.astype(cached_value.value.dtype), (0, index, 0, 0)
        )
        cached_key.value, cached_value.value = key, value
        cache_index.value = index + 1
        positions = jnp.arange(length)
        bias = None if relpos is None else relpos(index[None], positions, bidirectional=False)
        return key, value, index, bias

    def _cross_step(self, encoded: Array) -> tuple[Array, Array]:
        """Cross-attention keys/values: projected at the first step, read from the cache after."""
        cached_key, cached_value, cache_index = self._cache_variables(None, None)

        def project(mdl, enc):
            key, value = mdl._project_kv(enc)
            return key.astype(cached_key.value.dtype), value.astype(cached_value.value.dtype)

        def reuse(mdl, enc):
            return cached_key.value, cached_value.value

        key, value = nn.cond(cache_index.value == 0, project, reuse, self, encoded)
        cached_key.value, cached_value.value = key, value
        cache_index.value = cache_index.value + 1
        return key, value


class MlpBlock(nn.Module):
    """T5 MLP: `wo(prod_i act_i(wi_i x))`, one input branch per activation (`wi` when one)."""

    intermediate_dim: int
    activations: tuple[str, ...] = ("relu",)
    intermediate_dropout_rate: float = 0.1
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, inputs: Array, *, deterministic: bool = True) -> Array:
        """[b, l, d] -> [b, l, d]."""
        dense = dict(kernel_init=DENSE_INIT, dtype=self.dtype, param_dtype=self.param_dtype)
        branches = [
            Dense(
                self.intermediate_dim,
                kernel_axes=(EMBED, MLP),
                name="wi" if len(self.activations) == 1 else f"wi_{i}",
                **dense,
            )(inputs)
            for i in range(len(self.activations))
        ]
        x = constrain(gated_product(tuple(self.activations), *branches), ACT_MLP)
        x = nn.Dropout(rate=self.intermediate_dropout_rate, broadcast_dims=(-2,))(
            x, deterministic=deterministic
        )
        out = Dense(inputs.shape[-1], kernel_axes=(MLP, EMBED), name="wo", **dense)(x)
        return constrain(out, ACT_EMBED)


def gated_product(activations: tuple[str, ...], *branches: Array) -> Array:
    """`prod_i act_i(branch_i)` (`ACTIVATIONS` names), recomputed in the backward pass from the
    branches except on the backends of `GATE_FUSED_BACKENDS`.

    Without the checkpoint JAX keeps each activation's intermediates beside the projections
    (tanh-GELU: five `[b, S, d_ff]` arrays, and the product), the largest activations of a T5
    block; with it, the projections (and the product, as `wo`'s input), as
    `llama_jax.layers.swiglu` does for SwiGLU. XLA's TPU compiler fuses the activations into the
    matmuls around them and keeps the same arrays without the checkpoint, which there only adds
    a separate recomputing pass over `[b, S, d_ff]`.
    """
    if target_backend() in GATE_FUSED_BACKENDS:
        return _gated(activations, *branches)
    return _gated_recomputed(activations, *branches)


# Target backends whose compiler fuses the gated activations' backward into the matmuls by
# itself (see `gated_product`); elsewhere (CPU, GPU) the explicit recomputation saves memory.
GATE_FUSED_BACKENDS = frozenset({"tpu"})


def _gated(activations: tuple[str, ...], *branches: Array) -> Array:
    x = None
    for act, branch in zip(activations, branches, strict=True):
        h = ACTIVATIONS[act](branch)
        x = h if x is None else x * h
    return x


_gated_recomputed = jax.checkpoint(_gated, static_argnums=(0,))


def attention_segments(valid: Array, segment_ids: Array | None) -> Array:
    """Segment ids for the attention seam: the packed id (or 1) where `valid`, 0 on padding.

    T5X masked padding and packing with two materialised masks; one id array says both.
    """
    ids = jnp.ones_like(valid, jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    return jnp.where(valid, ids, 0)
