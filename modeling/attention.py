"""The attention seam: one `attend` that every family calls, over a registry of kernels.

Callers say what defines the mask (a causal flag, packed-document segment ids, an additive bias
such as T5's relative positions, the query offset of a cached decoding step) and never build a
`[B, 1, Q, K]` mask themselves, so a fused kernel can keep the mask implicit:

- `xla`: einsum logits in the compute dtype, masked softmax in float32 (or wider; its backward
  pass keeps only the compute-dtype exponentials, `shifted_exp_as`), einsum, normalised after
  the einsum. The reference, and the only kernel for cached decoding, attention-weight dropout and anything else a fused kernel refuses.
- `cudnn`: cuDNN fused (flash) attention on GPU, bf16/fp16 (`jax._src.cudnn.
  fused_attention_stablehlo`, what `jax.nn.dot_product_attention(implementation="cudnn")` calls);
  segment ids become a boolean `[B, 1, Q, K]` mask folded into its bias. (jax 0.10's packed
  layout, `q_offsets`/`kv_offsets`, is not used: its softmax statistics take `B * max_segments`
  rows, and it strides key offsets by the query heads, which breaks grouped-query attention.)
- `splash`: Pallas splash attention (TPU) with `SegmentIds`; on other backends it runs in Pallas
  interpret mode, which is slow and meant for tests.
- `auto` (the default): `cudnn` on GPU, `splash` on TPU, `xla` elsewhere.

A kernel that cannot take a call falls back to `xla` and logs why, once per reason. A packed
call never reaches a kernel that does not keep segments apart (a known MaxText bug).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
logger = logging.getLogger(__name__)

# Masked logits get this value rather than -inf, so a fully masked row stays finite.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)

# What `auto` picks per target backend (`target_backend()`); any other backend gets `xla`.
AUTO_BY_BACKEND = {"gpu": "cudnn", "tpu": "splash"}


def target_backend() -> str:
    """The platform the program being traced is for: that of the mesh in scope
    (`jax.set_mesh`), so that compiling ahead of time for a TPU topology on a CPU host picks the
    TPU kernels (not Pallas's interpreter), else `jax.default_backend()`."""
    mesh = jax.sharding.get_abstract_mesh()  # usable inside `jax.jit`, unlike `get_mesh`
    device = None if mesh.empty else mesh.abstract_device
    platform = getattr(device, "platform", None)
    return platform or jax.default_backend()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Problem:
    """The static facts of one attention call that decide which kernel can run it."""

    backend: str
    dtype: np.dtype
    head_dim: int
    q_length: int
    kv_length: int
    causal: bool
    segmented: bool
    has_bias: bool
    decoding: bool  # a nonzero (or traced) query offset: a cached decoding step
    dropout: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kernel:
    """One attention implementation.

    Attributes:
      run: `(query, key, value, *, causal, q_segment_ids, kv_segment_ids, bias, q_offset, scale,
        dropout) -> out`, shapes as in `attend`.
      keeps_segments_apart: whether `run` honours segment ids; a packed call never reaches a
        kernel without it.
      why_not: returns the reason this kernel cannot take a `Problem`, or None when it can.
    """

    run: Callable[..., Array]
    keeps_segments_apart: bool
    why_not: Callable[[Problem], str | None]


def _logits_dtype(dtype) -> jnp.dtype:
    return jnp.promote_types(dtype, jnp.float32)


def _mask_dtype(dtype, wide) -> jnp.dtype:
    """The dtype of the additive mask: `dtype` (the compute dtype) where it holds MASK_VALUE,
    else `wide`. Added to the widened logits, it gives the same sums either way."""
    if jnp.issubdtype(dtype, jnp.floating) and float(jnp.finfo(dtype).max) > -MASK_VALUE:
        return jnp.dtype(dtype)
    return jnp.dtype(wide)


def _scale_query(query: Array, scale: float | None) -> Array:
    """Multiplies by `scale` in the query's own dtype (the LLaMA/T5X convention)."""
    if scale is None or scale == 1.0:
        return query
    return query * jnp.asarray(scale, query.dtype)


def reference_mask(
    *,
    q_length: int,
    kv_length: int,
    causal: bool,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    q_offset: Array | int = 0,
) -> Array:
    """Boolean mask `[batch or 1, 1, q_length, kv_length]`: True where a query may attend a key.

    The query at row index `q_offset + i` sees, when `causal`, keys at row index <= its own, and,
    with segment ids, only keys of its own nonzero segment: padding (segment 0) neither sees nor
    is seen. Causality is by index in the row, not by per-document positions.
    """
    mask = jnp.ones((1, 1, q_length, kv_length), bool)
    if causal:
        q_index = q_offset + jnp.arange(q_length, dtype=jnp.int32)
        k_index = jnp.arange(kv_length, dtype=jnp.int32)
        mask = (k_index[None, :] <= q_index[:, None])[None, None]
    if q_segment_ids is not None:
        same = q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :]
        mask = mask & same & (q_segment_ids != 0)[:, None, :, None]
    return mask


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def shifted_exp_as(logits: Array, dtype) -> tuple[Array, Array]:
    """`exp(logits - max(logits))` over the last axis in `dtype`, and its row sums in the
    logits' (float32) dtype: softmax's numerator and denominator, left apart so that the
    division runs on the attention's output `[B, Q, H, D]` instead of on `[B, H, Q, K]`.

    The maximum is a constant for differentiation (the quotient does not depend on it), and the
    backward pass, `e * (g_e + g_s)`, runs in float32 from the kept `dtype` exponentials, the only
    `[B, H, Q, K]` array kept."""
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    exps = jnp.exp(shifted)
    return exps.astype(dtype), jnp.sum(exps, axis=-1, keepdims=True)


def _shifted_exp_as_fwd(logits: Array, dtype):
    exps, sums = shifted_exp_as(logits, dtype)
    return (exps, sums), exps


def _shifted_exp_as_bwd(dtype, exps: Array, grads) -> tuple[Array]:
    del dtype
    grad_exps, grad_sums = grads
    wide = _logits_dtype(exps.dtype)
    return (exps.astype(wide) * (grad_exps.astype(wide) + grad_sums.astype(wide)),)


shifted_exp_as.defvjp(_shifted_exp_as_fwd, _shifted_exp_as_bwd)


@jax.custom_vjp
def divide_rows(unnormalised: Array, sums: Array) -> Array:
    """`unnormalised / sums` computed in the sums' (float32) dtype and returned in the
    unnormalised dtype: the attention output's normalisation.

    Its backward pass keeps only the output (which the attention's out projection keeps anyway)
    and the row sums: `d sums = -sum(g * out) / sums`. Plain autodiff would keep a float32 copy
    of the unnormalised output and the squared sums as well."""
    return (unnormalised.astype(sums.dtype) / sums).astype(unnormalised.dtype)


def _divide_rows_fwd(unnormalised: Array, sums: Array):
    out = divide_rows(unnormalised, sums)
    return out, (out, sums)


def _divide_rows_bwd(kept, grad: Array) -> tuple[Array, Array]:
    out, sums = kept
    # The products in the cotangent's dtype, summed in float32: a float32 copy of the cotangent
    # shared by this sum and the division below is what XLA would otherwise write (the out
    # projection's backward matmul widened to a float32 output, then relaid out for its two
    # consumers). A bf16 product of two bf16 values is off by at most half a unit in the last
    # place, far below what the sum's own rounding to the logits' cotangent keeps.
    grad_sums = -jnp.sum(grad * out, axis=-1, keepdims=True, dtype=sums.dtype) / sums
    return (grad.astype(sums.dtype) / sums).astype(out.dtype), grad_sums


divide_rows.defvjp(_divide_rows_fwd, _divide_rows_bwd)


def _xla(
    query,
    key,
    value,
    *,
    causal,
    q_segment_ids,
    kv_segment_ids,
    bias,
    q_offset,
    scale,
    dropout,
    float32_logits=False,
):
    """Einsum attention with grouped key/value heads; the softmax in float32 or wider."""
    batch, q_length, heads, head_dim = query.shape
    kv_heads = key.shape[2]
    group = heads // kv_heads
    q = _scale_query(query, scale).reshape(batch, q_length, kv_heads, group, head_dim)
    wide = _logits_dtype(query.dtype)
    # The logits leave the matmul in the compute dtype (as T5X, MaxText and Hugging Face's LLaMA
    # compute them) and are widened for the mask and softmax inside the fusion that consumes
    # them: a float32 `[B, H, Q, K]` array written and read back per layer would be the
    # attention's largest memory traffic.
    out_type = wide if float32_logits else None
    logits = jnp.einsum("bqkgd,bskd->bkgqs", q, key, preferred_element_type=out_type)
    if causal or q_segment_ids is not None:
        mask = reference_mask(
            q_length=q_length,
            kv_length=key.shape[1],
            causal=causal,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
            q_offset=q_offset,
        )
        # Added, not selected: a select's backward pass keeps the float32 logits it chose
        # from (JAX saves them to build its zero tangent), an addition keeps nothing. Beside
        # MASK_VALUE the logits are far below one unit in the last place, so the sum is
        # MASK_VALUE itself, as the select gave, and adding zero is exact. The sum is taken in
        # the logits' own dtype where that holds MASK_VALUE (bf16 does, float16 does not): the
        # same mask serves every layer, so XLA materialises it once, in the dtype it is added
        # in, and a float32 `[B, Q, K]` copy is twice the bytes kept for the whole step (64 MB
        # per device at 4 sequences of 2,048).
        mask_dtype = _mask_dtype(logits.dtype, wide)
        logits = logits.astype(mask_dtype) + jnp.where(mask[:, :, None], 0.0, MASK_VALUE).astype(
            mask_dtype
        )
    if bias is not None:
        # Added in the logits' dtype, as T5X's and Hugging Face's T5 add their relative
        # position biases: in float32 the logits' cotangent stays float32 up to the bias's
        # gradient (a sum over the batch), and XLA recomputes it inside each of the two
        # backward matmuls that consume it instead of writing it once in the compute dtype.
        bias = bias.astype(logits.dtype)
        logits = logits + bias.reshape(bias.shape[0], kv_heads, group, *bias.shape[2:])
    logits = logits.astype(wide)
    # Softmax's numerator and denominator apart: the value einsum takes the exponentials and
    # the division runs on its output `[B, Q, H, D]`, as MaxText's attention does. Normalising
    # `[B, H, Q, K]` first costs one more pass over it each way, and the backward pass's row
    # sums then come from `[B, Q, H, D]` arrays too (the division's own backward).
    weights, sums = shifted_exp_as(logits, value.dtype)
    if dropout is not None:
        weights = dropout(weights)
    out = jnp.einsum("bkgqs,bskd->bqkgd", weights, value)
    out = divide_rows(out, jnp.moveaxis(sums, 3, 1))
    return out.reshape(batch, q_length, heads, head_dim)


def _xla_why_not(problem: Problem) -> str | None:
    del problem
    return None


def _cudnn(
    query,
    key,
    value,
    *,
    causal,
    q_segment_ids,
    kv_segment_ids,
    bias,
    q_offset,
    scale,
    dropout,
    float32_logits=False,
):
    """cuDNN fused attention. Causality is cuDNN's own mask; segments enter as a boolean
    `[B, 1, Q, K]` mask that cuDNN folds into its bias (bf16/fp16 and shared by the heads, rather
    than the float32 `[B, H, Q, K]` softmax of the xla kernel)."""
    del q_offset, dropout  # refused by `_cudnn_why_not`
    del float32_logits  # the fused kernel keeps its logits in float32 inside
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    mask = None
    if q_segment_ids is not None:
        mask = reference_mask(
            q_length=query.shape[1],
            kv_length=key.shape[1],
            causal=False,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
        )
    if bias is not None:
        bias = bias.astype(query.dtype)
    mask_type = cudnn.MaskType.CAUSAL if causal else cudnn.MaskType.NO_MASK
    return cudnn.dot_product_attention(
        query, key, value, bias, mask, scale=1.0 if scale is None else scale, mask_type=mask_type
    )


def _cudnn_why_not(problem: Problem) -> str | None:
    if problem.backend != "gpu":
        return f"cudnn needs a GPU backend, not {problem.backend}"
    if problem.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cudnn takes bfloat16/float16, not {problem.dtype}"
    if problem.head_dim > 256 or problem.head_dim % 8:
        return f"cudnn takes head_dim <= 256 and a multiple of 8, not {problem.head_dim}"
    if problem.decoding:
        return "cudnn is not used for cached decoding"
    if problem.dropout:
        return "cudnn is not used with attention dropout"
    if (problem.has_bias or problem.segmented) and (problem.q_length % 2 or problem.kv_length % 2):
        return "cudnn with a bias or segment ids needs even sequence lengths"
    return None


# `splash.BlockSizes` fields by the axis they tile.
_SPLASH_Q_BLOCKS = ("block_q", "block_q_dkv", "block_q_dq")
_SPLASH_KV_BLOCKS = (
    "block_kv",
    "block_kv_compute",
    "block_kv_dkv",
    "block_kv_dkv_compute",
    "block_kv_dq",
)


def _splash_block(length: int) -> int:
    """The largest of 512, 256, 128 that divides `length` (splash tiles are multiples of 128)."""
    return next(b for b in (512, 256, 128) if length % b == 0)


def _splash_kernel(q_length, kv_length, heads, causal, mqa, interpret):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    # Every query-side tile of the forward and both backward passes is `bq`, every key/value-side
    # tile `bkv`.
    bq, bkv = _splash_block(q_length), _splash_block(kv_length)
    blocks = splash.BlockSizes(
        **dict.fromkeys(_SPLASH_Q_BLOCKS, bq), **dict.fromkeys(_SPLASH_KV_BLOCKS, bkv)
    )
    shape = (q_length, kv_length)
    mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
    make = splash.make_splash_mqa_single_device if mqa else splash.make_splash_mha_single_device
    # Built per trace, not cached: its mask tables become constants of the program being
    # traced (made eagerly, they would need a device, and a mesh of compile-only devices -- a
    # TPU topology compiled ahead of time -- has none to place them on). Splash caches the
    # numpy mask processing itself.
    return make(
        mask=splash.MultiHeadMask([mask] * heads),
        block_sizes=blocks,
        mask_value=MASK_VALUE,
        interpret=interpret,
    )


def _splash(
    query,
    key,
    value,
    *,
    causal,
    q_segment_ids,
    kv_segment_ids,
    bias,
    q_offset,
    scale,
    dropout,
    float32_logits=False,
):
    """Pallas splash attention, run per device shard under the current mesh.

    A Pallas call is opaque to XLA's SPMD partitioner, which would gather a sharded operand to
    every device; so under a mesh (`jax.set_mesh`, as the trainer traces its steps) the kernel
    runs in a `shard_map` over the batch's mesh axes and, where the head counts divide, the
    heads' (the activation rules of `modeling.axes` in scope), as MaxText wraps it.
    """
    del bias, q_offset, dropout  # refused by `_splash_why_not`
    del float32_logits  # the fused kernel keeps its logits in float32 inside
    local = functools.partial(_splash_local, causal=causal, scale=scale)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return local(query, key, value, q_segment_ids, kv_segment_ids)
    from flax import linen as nn
    from jax.sharding import PartitionSpec

    from modeling import axes

    batch_axes, _, heads_axes, _ = nn.logical_to_mesh_axes(axes.ACT_HEADS)

    def size(names) -> int:
        names = (names,) if isinstance(names, str) else names or ()
        return int(np.prod([mesh.shape[n] for n in names]))

    if query.shape[0] % size(batch_axes):
        batch_axes = None
    if query.shape[2] % size(heads_axes) or key.shape[2] % size(heads_axes):
        heads_axes = None
    qkv = PartitionSpec(batch_axes, None, heads_axes, None)
    seg = None if q_segment_ids is None else PartitionSpec(batch_axes, None)
    sharded = jax.shard_map(
        local, mesh=mesh, in_specs=(qkv, qkv, qkv, seg, seg), out_specs=qkv, check_vma=False
    )
    return sharded(query, key, value, q_segment_ids, kv_segment_ids)


def _splash_local(query, key, value, q_segment_ids, kv_segment_ids, *, causal, scale):
    """Splash attention on one device's arrays, per batch row; GQA runs the MQA kernel once per
    key/value head."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, q_length, heads, head_dim = query.shape
    kv_length, kv_heads = key.shape[1], key.shape[2]
    group = heads // kv_heads
    interpret = target_backend() != "tpu"
    q = _scale_query(query, scale).transpose(0, 2, 1, 3)  # [B, H, Q, D]
    k, v = key.transpose(0, 2, 1, 3), value.transpose(0, 2, 1, 3)
    segments = None
    if q_segment_ids is not None:
        segments = splash.SegmentIds(
            q=q_segment_ids.astype(jnp.int32), kv=kv_segment_ids.astype(jnp.int32)
        )
    if group == 1:
        kernel = _splash_kernel(q_length, kv_length, heads, causal, False, interpret)
        per_row = kernel
    else:
        kernel = _splash_kernel(q_length, kv_length, group, causal, True, interpret)

        def per_row(q_row, k_row, v_row, seg=None):
            q_row = q_row.reshape(kv_heads, group, q_length, head_dim)
            out = jax.vmap(lambda qq, kk, vv: kernel(qq, kk, vv, segment_ids=seg))(
                q_row, k_row, v_row
            )
            return out.reshape(heads, q_length, head_dim)

    if segments is None:
        out = jax.vmap(lambda a, b, c: per_row(a, b, c))(q, k, v)
    else:
        out = jax.vmap(lambda a, b, c, s: per_row(a, b, c, s))(q, k, v, segments)
    return out.transpose(0, 2, 1, 3).astype(query.dtype)


def _splash_why_not(problem: Problem) -> str | None:
    if problem.has_bias:
        return "splash takes no additive bias"
    if problem.decoding:
        return "splash is not used for cached decoding"
    if problem.dropout:
        return "splash is not used with attention dropout"
    if problem.q_length % 128 or problem.kv_length % 128:
        return "splash needs sequence lengths that are multiples of 128"
    return None


KERNELS: dict[str, Kernel] = {
    "xla": Kernel(run=_xla, keeps_segments_apart=True, why_not=_xla_why_not),
    "cudnn": Kernel(run=_cudnn, keeps_segments_apart=True, why_not=_cudnn_why_not),
    "splash": Kernel(run=_splash, keeps_segments_apart=True, why_not=_splash_why_not),
}
FALLBACK = "xla"
_LOGGED: set[tuple[str, str]] = set()


def kernel_names() -> tuple[str, ...]:
    """The values `attention_kernel` may take: `auto` and every registered kernel."""
    return ("auto", *KERNELS)


def check_kernel_name(name: str, *, field: str = "attention_kernel") -> None:
    """Raises ValueError naming `field` and the allowed names unless `name` is one of them."""
    if name not in kernel_names():
        raise ValueError(f"{field} must be one of {kernel_names()}, got {name!r}")


def choose_kernel(name: str, problem: Problem) -> str:
    """Resolves `name` (`auto` by backend) to the kernel that will run `problem`.

    A kernel that refuses the problem, or ignores segment ids on a packed call, gives way to
    `xla`, with one log line per (kernel, reason).
    """
    check_kernel_name(name)
    if name == "auto":
        name = AUTO_BY_BACKEND.get(problem.backend, FALLBACK)
    kernel = KERNELS[name]
    reason = kernel.why_not(problem)
    if reason is None and problem.segmented and not kernel.keeps_segments_apart:
        reason = f"{name} ignores segment ids and this batch is packed"
    if reason is None:
        return name
    _log_fallback(name, reason)
    return FALLBACK


def _log_fallback(name: str, reason: str) -> None:
    if (name, reason) not in _LOGGED:
        _LOGGED.add((name, reason))
        logger.warning("attention kernel %s falls back to %s: %s", name, FALLBACK, reason)


def attend(
    query: Array,
    key: Array,
    value: Array,
    *,
    causal: bool,
    q_segment_ids: Array | None = None,
    kv_segment_ids: Array | None = None,
    bias: Array | None = None,
    q_offset: Array | int = 0,
    scale: float | None = None,
    dropout: Callable[[Array], Array] | None = None,
    kernel: str = "auto",
    float32_logits: bool = False,
) -> Array:
    """Softmax attention whose mask is described, not materialised.

    Args:
      query: `[batch, q_length, heads, head_dim]`.
      key, value: `[batch, kv_length, kv_heads, head_dim]`; `kv_heads` divides `heads` and query
        head `h` uses key/value head `h // (heads // kv_heads)` (grouped-query attention).
      causal: query `q_offset + i` sees only keys at row index <= its own.
      q_segment_ids, kv_segment_ids: int `[batch, length]` packed-document ids, 0 = padding; a
        query sees only keys with its own nonzero id. `kv_segment_ids` defaults to
        `q_segment_ids` (self-attention). Documents are contiguous runs within a row. Outputs at
        padding queries are finite but kernel-dependent: mask them out of any loss.
      bias: added to the logits, `[1 or batch, heads, q_length, kv_length]` (T5's relative
        positions).
      q_offset: row index of the first query (a cached decoding step); may be traced.
      scale: multiplies the query (in its dtype) before the logits; None means
        `head_dim ** -0.5`; T5 passes 1.0 (the scaling is folded into its query initialiser).
      dropout: applied to the attention weights (training with attention dropout); only the
        `xla` kernel takes it.
      kernel: a name from `kernel_names()`.
      float32_logits: the `xla` kernel's logits leave their matmul in float32 rather than the
        compute dtype (T5X's `float32_attention_logits`); the softmax is float32 either way.

    Returns:
      `[batch, q_length, heads, head_dim]` in `query`'s dtype.
    """
    if q_segment_ids is not None and kv_segment_ids is None:
        kv_segment_ids = q_segment_ids
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("give q_segment_ids with kv_segment_ids, or neither")
    if query.shape[2] % key.shape[2]:
        raise ValueError(f"kv_heads={key.shape[2]} must divide heads={query.shape[2]}")
    if scale is None:
        scale = query.shape[-1] ** -0.5
    problem = Problem(
        backend=target_backend(),
        dtype=jnp.dtype(query.dtype),
        head_dim=query.shape[-1],
        q_length=query.shape[1],
        kv_length=key.shape[1],
        causal=causal,
        segmented=q_segment_ids is not None,
        has_bias=bias is not None,
        decoding=not (isinstance(q_offset, int) and q_offset == 0),
        dropout=dropout is not None,
    )
    name = choose_kernel(kernel, problem)
    args = dict(
        causal=causal,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        bias=bias,
        q_offset=q_offset,
        scale=scale,
        dropout=dropout,
        float32_logits=float32_logits,
    )
    try:
        return KERNELS[name].run(query, key, value, **args)
    except NotImplementedError as error:  # a fused kernel refusing a shape while tracing
        if name == FALLBACK:
            raise
        _log_fallback(name, f"{type(error).__name__}: {error}")
        return KERNELS[FALLBACK].run(query, key, value, **args)
