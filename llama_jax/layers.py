"""LLaMA2 building blocks: RMSNorm, rotary embeddings, attention (MHA/GQA, packed, cached), SwiGLU.

Every parameter is created with `flax.linen.partitioning.param_with_axes` and logical axis names
from `modeling.axes`; activations are constrained with logical names too, so the same module runs
unsharded, under `jax.jit` with a mesh, and inside T5X. None of the layers has a bias.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import partitioning as nn_partitioning
from jax.experimental.layout import Layout, with_layout_constraint

from llama_jax.config import STACKED_PROJECTION_BACKENDS, LlamaConfig
from modeling import axes
from modeling.attention import attend, target_backend

param_with_axes = nn_partitioning.param_with_axes
constrain = nn_partitioning.with_sharding_constraint


def accum_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float32, or `dtype` if wider: the dtype of softmax, norms and logits (float64 stays float64
    so that gradient checks can run the whole model in double precision)."""
    return jnp.promote_types(dtype, jnp.float32)


def kernel_init(
    in_axis: int | tuple[int, ...], out_axis: int | tuple[int, ...]
) -> nn.initializers.Initializer:
    """Fan-in scaled truncated-normal init (variance 1/fan_in), as in T5X's dense layers.

    Multi-axis kernels (e.g. `[embed, heads, kv]`) need the fan-in axes spelled out, otherwise
    the default would treat all but the last axis as inputs.
    """
    return nn.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=in_axis, out_axis=out_axis
    )


def weight(
    cfg: LlamaConfig, name: str, init: nn.initializers.Initializer, shape: tuple, names: tuple
) -> jax.Array:
    """The current module's parameter `name`, stored in `cfg.weight_dtype` with logical axes
    `names`: one place for how every LLaMA weight is declared (callers cast to the compute
    dtype where they use it)."""
    return param_with_axes(name, init, shape, cfg.weight_dtype, axes=names)


def rope_inverse_frequencies(head_dim: int, theta: float, dtype=jnp.float32) -> jax.Array:
    """Returns `theta ** (-2i / head_dim)` for i in [0, head_dim / 2): one frequency per pair."""
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=dtype) / head_dim))


def apply_rope(x: jax.Array, positions: jax.Array, *, theta: float) -> jax.Array:
    """Rotates query/key vectors by their position (rotary position embedding, Su et al. 2021).

    Uses the "rotate half" pairing: dimension i is paired with i + head_dim/2 (the layout of
    GPT-NeoX, Hugging Face LLaMA and MaxText; Meta's checkpoints pair adjacent dimensions, which is
    the same function up to a fixed permutation of the q/k projection columns).

    Args:
      x: `[batch, length, heads, head_dim]`.
      positions: `[batch, length]` integer positions (restarting per packed document).
      theta: RoPE base.

    Returns:
      The rotated array, in `x`'s dtype. The angles, sines and cosines are computed in float32
      or wider and the rotation in `x`'s dtype, as Hugging Face's LLaMA and MaxText do: a
      float32 rotation would widen q and k, and with them the attention matmuls' outputs in the
      backward pass, to float32 (with float32 compute the two are the same).
    """
    head_dim = x.shape[-1]
    wide = accum_dtype(x.dtype)
    inv_freq = rope_inverse_frequencies(head_dim, theta, wide)
    angles = positions[..., None].astype(wide) * inv_freq
    sin = jnp.sin(angles).astype(x.dtype)[:, :, None, :]
    cos = jnp.cos(angles).astype(x.dtype)[:, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
    """Positions that restart at 0 wherever the segment id changes along the row.

    Used when a packed batch brings `segment_ids` but no `positions`.
    """
    length = segment_ids.shape[-1]
    index = jnp.arange(length, dtype=jnp.int32)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[..., :1], bool), segment_ids[..., 1:] != segment_ids[..., :-1]],
        axis=-1,
    )
    start_index = jax.lax.cummax(jnp.where(starts, index, 0), axis=segment_ids.ndim - 1)
    return index - start_index


def stack_projections() -> bool:
    """Whether the program being traced stacks its shared-input projections: by the target
    backend (`modeling.attention.target_backend`, the mesh's platform when compiling ahead of
    time for a TPU topology on a CPU host): `STACKED_PROJECTION_BACKENDS`."""
    return target_backend() in STACKED_PROJECTION_BACKENDS


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale and no bias (Zhang & Sennrich 2019)."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalises the last axis in float32 (or wider) and returns the compute dtype."""
        cfg = self.config
        scale = weight(cfg, "scale", nn.initializers.ones, (x.shape[-1],), (axes.EMBED,))
        return rms_norm(x, scale.astype(cfg.compute_dtype), cfg.norm_eps)


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    wide = x.astype(accum_dtype(x.dtype))
    normed = wide * jax.lax.rsqrt(jnp.mean(wide * wide, axis=-1, keepdims=True) + eps)
    return normed.astype(scale.dtype) * scale


_rms_norm_recomputed = functools.partial(jax.checkpoint, static_argnums=(2,))(_rms_norm)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """`x` normalised over its last axis in float32 (or wider), times `scale`, in `scale`'s dtype.

    Rematerialised (`jax.checkpoint`) except on TPU: its residuals -- a float32 copy of the
    input and the float32 normalised value, 6 bytes per element beside the output -- cost more
    memory than recomputing a few elementwise operations costs time, and its input is kept
    anyway. XLA's TPU compiler keeps neither by itself (it fuses the norm into its neighbours),
    and there the checkpoint only adds a recomputing pass: `RMS_NORM_FUSED_BACKENDS`.
    """
    if target_backend() in RMS_NORM_FUSED_BACKENDS:
        return _rms_norm(x, scale, eps)
    return _rms_norm_recomputed(x, scale, eps)


@jax.checkpoint
def _swiglu_recomputed(gate: jax.Array, up: jax.Array) -> jax.Array:
    return nn.silu(gate) * up


def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """`silu(gate) * up`; recomputed in the backward pass from `gate` and `up` except on TPU.

    Without the checkpoint JAX keeps SiLU's three intermediates and the product beside the two
    projections (6 `[b, S, d_ff]` arrays per layer, the largest activations of a LLaMA block);
    with it, the two projections and the product (3), as PyTorch's autograd keeps for HF's
    LLaMA MLP. XLA's TPU compiler keeps the same three either way (it fuses SiLU into the
    matmuls around it), and there the checkpoint only adds a separate recomputing pass over
    `[b, S, d_ff]` (~2% of a 1.1B step): `SWIGLU_FUSED_BACKENDS`.
    """
    if target_backend() in SWIGLU_FUSED_BACKENDS:
        return nn.silu(gate) * up
    return _swiglu_recomputed(gate, up)


# Target backends whose compiler fuses SwiGLU's backward into the matmuls by itself (see
# `swiglu`); elsewhere (CPU, GPU) the explicit recomputation keeps the memory down.
SWIGLU_FUSED_BACKENDS = frozenset({"tpu"})
# Target backends whose compiler keeps no float32 residuals of RMSNorm by itself (see
# `rms_norm`); elsewhere the explicit recomputation keeps the memory down.
RMS_NORM_FUSED_BACKENDS = frozenset({"tpu"})
# Backends whose residual stream `[batch, length, embed]` is laid out length-minor: see
# `residual_layout`.
LENGTH_MINOR_RESIDUAL_BACKENDS = frozenset({"tpu"})


def residual_layout(x: jax.Array, *, scanned: bool = False) -> jax.Array:
    """The residual stream `[batch, length, embed]`, laid out with `length` minor on TPU.

    Under FSDP on more than a few TPU chips XLA runs the weight-gathering matmuls as collective
    (windowed) loops that take their activations length-minor (layout `{1,2,0}`). Left free,
    XLA lays out the residual stream embed-minor, as the norms' reductions over `embed` prefer,
    and copies it into the loops' layout and back around every projection (~8 copies of the
    `[b, S, d]` stream per layer and step at 2.8B parameters on 8 chips). Pinning the stream
    length-minor, the layout those loops and the weight gradients' contractions over tokens
    want, removes the copies; the norms reduce over a major axis just as cheaply. Values are
    unchanged: a layout is only how the array sits in memory. Only under pure FSDP (a mesh whose
    `data` axis is 1): with data parallelism across slices the same constraint made XLA add
    gathers and copies (21% more bytes accessed for llama2_1085m over two v5p-8 slices).
    Nor in `scanned` layers (`nn.scan`): in the scan's rematerialised backward pass the
    partitioner all-gathered the whole global batch's stream to lay it out (llama2_2791m on 8
    chips: 1.8% slower and 2.8% more bytes than without the constraint). Elsewhere it is the
    identity.
    """
    if scanned or target_backend() not in LENGTH_MINOR_RESIDUAL_BACKENDS or x.ndim != 3:
        return x
    if data_parallel():
        return x
    return with_layout_constraint(x, Layout(major_to_minor=(0, 2, 1)))


def data_parallel() -> bool:
    """Whether the mesh being traced under has a `data` axis over more than one device (data
    parallelism, e.g. across slices), not pure FSDP: XLA's TPU scheduling choices that pay
    under pure FSDP can cost memory or bytes there."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and dict(mesh.shape).get(axes.DATA, 1) > 1


class Attention(nn.Module):
    """Causal self-attention with RoPE on q and k, optional GQA, packing and a decoding cache.

    `decode=False`: full causal attention over the input, masked by `segment_ids`.
    `decode=True` (T5X contract, see `llama_jax.model`): the first call, when no `cache`
    variables exist, only allocates a zero cache whose capacity is the input length and returns a
    plain causal forward; later calls write their `L >= 1` keys/values at the cache index, attend to
    every cached position up to their own, and advance the index by `L` (prefill and one-token
    steps are the same code path).
    """

    config: LlamaConfig
    decode: bool = False

    @nn.compact
    def __call__(
        self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array | None
    ) -> jax.Array:
        """Maps `[batch, length, embed]` to `[batch, length, embed]`."""
        cfg = self.config
        dtype = cfg.compute_dtype
        batch, length, d_model = x.shape
        heads, kv_heads, head_dim = cfg.num_heads, cfg.kv_heads, cfg.head_size

        def kernel(name: str, num: int) -> jax.Array:
            shape = (d_model, num, head_dim)
            names = (axes.EMBED, axes.HEADS, axes.KV)
            return weight(cfg, name, kernel_init(0, (1, 2)), shape, names).astype(dtype)

        wq, wk, wv = kernel("query", heads), kernel("key", kv_heads), kernel("value", kv_heads)
        if not stack_projections():
            query, key, value = (jnp.einsum("bld,dhk->blhk", x, w) for w in (wq, wk, wv))
        elif kv_heads == heads:
            qkv = jnp.einsum("bld,dshk->blshk", x, jnp.stack([wq, wk, wv], axis=1))
            query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        else:
            query = jnp.einsum("bld,dhk->blhk", x, wq)
            kv = jnp.einsum("bld,dshk->blshk", x, jnp.stack([wk, wv], axis=1))
            key, value = kv[:, :, 0], kv[:, :, 1]
        query, key, value = (constrain(y, axes.ACT_HEADS) for y in (query, key, value))

        # The cache exists only after an allocating decode call (see the class docstring).
        cache_ready = self.decode and self.has_variable("cache", "cached_key")
        offset = 0
        if self.decode:
            cache_shape = (batch, length, kv_heads, head_dim)
            cached_key = self.variable("cache", "cached_key", jnp.zeros, cache_shape, dtype)
            cached_value = self.variable("cache", "cached_value", jnp.zeros, cache_shape, dtype)
            cache_index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
            if cache_ready:
                offset = cache_index.value
        if positions is None:
            positions = jnp.broadcast_to(
                offset + jnp.arange(length, dtype=jnp.int32), (batch, length)
            )

        query = apply_rope(query, positions, theta=cfg.rope_theta)
        key = apply_rope(key, positions, theta=cfg.rope_theta)

        if cache_ready:
            start = (0, offset, 0, 0)
            cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, start)
            cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, start)
            cache_index.value = offset + length
            key, value = cached_key.value, cached_value.value
            segment_ids = None  # a cache holds one sequence per row
        out = attend(
            query,
            key,
            value,
            causal=True,
            q_segment_ids=segment_ids,
            q_offset=offset,
            scale=head_dim**-0.5,
            kernel=cfg.attention_kernel,
        )
        out = constrain(out, axes.ACT_HEADS)
        out_names = (axes.HEADS, axes.KV, axes.EMBED)
        out_kernel = weight(
            cfg, "out", kernel_init((0, 1), 2), (heads, head_dim, d_model), out_names
        )
        y = jnp.einsum("blhk,hkd->bld", out, out_kernel.astype(dtype))
        return constrain(y, axes.ACT_EMBED)


class MLP(nn.Module):
    """SwiGLU feed-forward block: `w2(silu(w1 x) * w3 x)` (Shazeer 2020; LLaMA naming)."""

    config: LlamaConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps `[batch, length, embed]` to `[batch, length, embed]`."""
        cfg = self.config
        dtype = cfg.compute_dtype
        d_model, d_ff = x.shape[-1], cfg.d_ff

        def kernel(name: str, shape: tuple[int, int], kernel_axes: tuple[str, str]) -> jax.Array:
            return weight(cfg, name, kernel_init(0, 1), shape, kernel_axes).astype(dtype)

        w1 = kernel("w1", (d_model, d_ff), (axes.EMBED, axes.MLP))
        w3 = kernel("w3", (d_model, d_ff), (axes.EMBED, axes.MLP))
        w2 = kernel("w2", (d_ff, d_model), (axes.MLP, axes.EMBED))
        if stack_projections():
            gate_up = jnp.einsum("bld,dsf->blsf", x, jnp.stack([w1, w3], axis=1))
            gate, up = gate_up[:, :, 0], gate_up[:, :, 1]
        else:
            gate, up = jnp.einsum("bld,df->blf", x, w1), jnp.einsum("bld,df->blf", x, w3)
        gate, up = constrain(gate, axes.ACT_MLP), constrain(up, axes.ACT_MLP)
        hidden = swiglu(gate, up)
        return constrain(jnp.einsum("blf,fd->bld", hidden, w2), axes.ACT_EMBED)


class DecoderLayer(nn.Module):
    """One pre-norm LLaMA2 block: `h = x + attn(norm(x))`, `out = h + mlp(norm(h))`.

    Returns `(out, None)` so that the same class works as an `nn.scan` body.
    """

    config: LlamaConfig
    decode: bool = False

    @nn.compact
    def __call__(
        self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array | None
    ) -> tuple[jax.Array, None]:
        """Applies the block to `[batch, length, embed]`."""
        cfg = self.config
        layout = functools.partial(residual_layout, scanned=cfg.scan_layers)
        x = layout(x)
        attn_in = RMSNorm(cfg, name="attention_norm")(x)
        h = layout(
            x
            + Attention(cfg, decode=self.decode, name="attention")(attn_in, segment_ids, positions)
        )
        out = layout(h + MLP(cfg, name="mlp")(RMSNorm(cfg, name="ffn_norm")(h)))
        return constrain(out, axes.ACT_EMBED), None
