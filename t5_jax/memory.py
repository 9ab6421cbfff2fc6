"""T5's memory terms: the activations its encoder and decoder blocks keep for the backward pass.

As for LLaMA (`llama_jax.memory`), the terms follow what JAX saves for `t5_jax.model`'s
`EncoderLayer` and `DecoderLayer` (`jax._src.ad_checkpoint.saved_residuals`), per example of
`Si` input and `St` target tokens, `c` the compute dtype's bytes, `a = H·head_dim`:

- `none`: per sublayer its norm's input (the block input or a residual sum) and output
  (`2·S·D·c`: the norm itself is rematerialised, `t5_jax.layers.rms_norm`); per attention the
  query, key, value and output (`(2·Sq + 2·Sk)·a·c`) and the kernel's residuals (`xla`: the
  weights in the compute dtype, `H·Sq·Sk·c`; `cudnn`: float32
  statistics and, packed, a `[Sq, Sk]` mask and bias); the MLP's input projections and their
  gated product (gated GELU `3·S·F·c`, ReLU `2·S·F·c`: the activation is rematerialised,
  `t5_jax.layers.gated_product`). With bf16 compute each layer also keeps its cast weights.
  Dropout, where on, adds its masks and the dropped attention weights.
- `dots_saveable`: the dense layers' outputs and, with `xla`, the attention logits and output.
- `dots_with_no_batch_dims_saveable`: the dense layers' outputs only.
- `full`: each block's input.

That is what JAX saves; what XLA keeps differs, because T5's layers run in a Python loop
(unrolled, no scan): with the whole stack in one graph XLA fuses every elementwise chain into
its consumer and recomputes it there, so under `none` only the fusion outputs stay live
(`layer_kept_unrolled`: matmul outputs, attention weights, the MLP's product, norm outputs and
sums), not JAX's whole list (measured: CPU compiles of
t5_small and t5_base, a TPU ahead-of-time compile of T5-770M). The remat policies' lists are already of that kind. On the
CPU backend XLA also schedules an unrolled stack's recomputation as early as the forward, so
remat saves nothing there and the estimate counts `none`.

Self-attention adds the relative-position bias, which splash refuses, so on TPU it runs the
`xla` kernel; cross-attention has no bias and runs the kernel asked for (measured on a TPU
ahead-of-time compile of T5-770M: XLA keeps float32 logits and weights for the 48
self-attentions only).

Outside the blocks: one relative-position bias `[H, S, S]` per stack (shared by the layers,
not per example), the final norms' inputs, the encoder output every cross-attention reads and
the float32 input of the output projection (`logits_dense` runs in float32).
"""

from __future__ import annotations

import dataclasses

from modeling import memory as common
from modeling.memory import DTYPE_BYTES, ActivationMemory
from t5_jax.config import T5Config


@dataclasses.dataclass(frozen=True)
class Block:
    """Where one encoder or decoder block attends, per example.

    Attributes:
      sq: the block's own positions (queries of its self-attention).
      sk: a decoder block's encoder positions, read by its cross-attention (None: an encoder
        block).
      kernel: runs self-attention; cross_kernel: cross-attention (None: the same).
      packed: rows hold several documents (segment ids).
    """

    sq: int
    sk: int | None
    kernel: str
    packed: bool
    cross_kernel: str | None = None


def _attention(
    cfg: T5Config, *, policy: str, sq: int, sk: int, kernel: str, packed: bool, self_attn: bool
) -> int:
    """Per example, what one attention sublayer keeps under `policy` (norm and sum excluded)."""
    c = DTYPE_BYTES[cfg.dtype]
    a, h = cfg.num_heads * cfg.head_dim, cfg.num_heads
    projections = (sq + 2 * sk) * a * c + sq * cfg.d_model * c  # q, k, v, out projection
    if policy == "dots_with_no_batch_dims_saveable":
        return projections
    if policy == "dots_saveable":
        logits = 4 if cfg.float32_attention_logits else c
        return projections + (logits * h * sq * sk + sq * a * c if kernel == "xla" else 0)
    by_kernel = {
        # the exponentials (`modeling.attention.shifted_exp_as`), their float32 row sums, and
        # the normalised output `[sq, heads, head_dim]` (`modeling.attention.divide_rows`),
        # beside the joined `[sq, heads * head_dim]` copy the out projection keeps
        "xla": h * sq * sk * c + 4 * h * sq + sq * a * c,
        "cudnn": 4 * h * sq + (sq * sk * (1 + c) if packed else 0),
        "splash": 8 * h * sq,
    }
    dropout = h * sq * sk * (1 + c) if cfg.dropout_rate and kernel == "xla" else 0
    return (2 * sq + 2 * sk) * a * c + by_kernel[kernel] + dropout


def _mlp(cfg: T5Config, *, policy: str, s: int) -> int:
    """Per example, what one MLP sublayer keeps under `policy`."""
    c = DTYPE_BYTES[cfg.dtype]
    if policy in ("dots_saveable", "dots_with_no_batch_dims_saveable"):
        return len(cfg.mlp_activations) * s * cfg.d_ff * c
    # the branches and their product (`wo`'s input); the activations are recomputed
    saved = len(cfg.mlp_activations) + 1
    dropout = s * cfg.d_ff * (1 + c) if cfg.dropout_rate else 0
    return saved * s * cfg.d_ff * c + dropout


def _layer_weights(cfg: T5Config, *, decoder: bool) -> int:
    """Per layer, the weight copies policy `none` keeps: the attention kernels viewed with
    their heads split (`layers.Dense`; a reshaped weight is a new array, kept for the backward
    pass in any dtype) and, with bf16 compute over float32 parameters, the cast MLP kernels."""
    c, w = DTYPE_BYTES[cfg.dtype], DTYPE_BYTES[cfg.param_dtype]
    attention = 4 * cfg.d_model * cfg.num_heads * cfg.head_dim
    mlp = (len(cfg.mlp_activations) + 1) * cfg.d_model * cfg.d_ff if c != w else 0
    return c * ((2 if decoder else 1) * attention + mlp)


def layer_saved(cfg: T5Config, block: Block, *, policy: str) -> int:
    """Per example, what one encoder or decoder `block` keeps under `policy`."""
    sq, sk, kernel, packed = block.sq, block.sk, block.kernel, block.packed
    c = DTYPE_BYTES[cfg.dtype]
    sd = sq * cfg.d_model
    if policy == "full":
        return sd * c
    attn = dict(policy=policy, kernel=kernel, packed=packed)
    total = _attention(cfg, sq=sq, sk=sq, self_attn=True, **attn) + _mlp(cfg, policy=policy, s=sq)
    sublayers = 2
    if sk is not None:
        attn["kernel"] = block.cross_kernel or kernel
        total += _attention(cfg, sq=sq, sk=sk, self_attn=False, **attn)
        sublayers = 3
    if policy == "none":
        total += 2 * sd * c * sublayers  # each norm's input (block input, sums) and output
    else:
        total += sd * c  # block input
    return total


def layer_kept_unrolled(cfg: T5Config, block: Block) -> int:
    """Per example, what XLA keeps of one block under policy `none` in T5's unrolled stack.

    With every layer in one graph XLA fuses each elementwise chain into the operation that
    consumes it, in the forward and again in the backward, so what stays live between the
    passes is the matmul outputs (`dots_saveable`'s set), the attention weights in the compute
    dtype, the MLP's gated product and each sublayer's norm input and output -- not JAX's
    residual list (`layer_saved`), whose query/key/value copies are recomputed inside
    fusions.
    """
    c = DTYPE_BYTES[cfg.dtype]
    sq, sk, kernel = block.sq, block.sk, block.kernel
    sd = sq * cfg.d_model
    cross_kernel = block.cross_kernel or kernel
    kept = layer_saved(cfg, block, policy="dots_saveable")
    sublayers = 2 if sk is None else 3
    weights = cfg.num_heads * sq * sq * c if kernel == "xla" else 0
    if sk is not None and cross_kernel == "xla":
        weights += cfg.num_heads * sq * sk * c
    return kept + weights + sq * cfg.d_ff * c + 2 * sublayers * sd * c


def activation_memory(
    cfg: T5Config,
    *,
    batch: int,
    inputs_len: int,
    targets_len: int,
    kernel: str,
    packed: bool,
    policy: str,
    cross_kernel: str | None = None,
) -> ActivationMemory:
    """`ActivationMemory` of `batch` examples on one device under `policy`; `kernel` runs
    self-attention, `cross_kernel` (default: the same) cross-attention."""
    c, w = DTYPE_BYTES[cfg.dtype], DTYPE_BYTES[cfg.param_dtype]
    si, st, d = inputs_len, targets_len, cfg.d_model
    enc = Block(sq=si, sk=None, kernel=kernel, packed=packed)
    dec = Block(sq=st, sk=si, kernel=kernel, packed=packed, cross_kernel=cross_kernel)

    def kept(block: Block) -> int:
        if policy == "none":
            return layer_kept_unrolled(cfg, block)
        return layer_saved(cfg, block, policy=policy)

    layers = cfg.num_encoder_layers * kept(enc) + cfg.num_decoder_layers * kept(dec)
    # final norms' inputs, the encoder output, the float32 input of the output projection
    outside = si * d * 2 * c + st * d * (c + 4)
    bias = cfg.num_heads * (si * si + st * st) * c
    transient = max(
        layer_kept_unrolled(cfg, enc) if cfg.num_encoder_layers else 0,
        layer_kept_unrolled(cfg, dec),
    )
    return ActivationMemory(
        saved=batch * (layers + outside) + bias,
        layer=batch * transient + _layer_weights(cfg, decoder=True),
        logits=4 * batch * st * cfg.vocab_size,
        gathered_head=(1 if cfg.logits_via_embedding else 2) * w * cfg.vocab_size * d,
        gathered_layer=w
        * (8 * d * cfg.num_heads * cfg.head_dim + (len(cfg.mlp_activations) + 1) * d * cfg.d_ff),
    )


def param_shapes(cfg: T5Config) -> list[tuple[int, ...]]:
    """Every parameter's shape, for the optimizer state (Adafactor factors the matrices)."""
    d, f, a, h = cfg.d_model, cfg.d_ff, cfg.num_heads * cfg.head_dim, cfg.num_heads
    attention = [(d, a), (d, a), (d, a), (a, d)]
    mlp = [(d, f)] * len(cfg.mlp_activations) + [(f, d)]
    encoder = [(d,), *attention, (d,), *mlp] * cfg.num_encoder_layers
    decoder = [(d,), *attention, (d,), *attention, (d,), *mlp] * cfg.num_decoder_layers
    shapes = [(cfg.vocab_size, d), *encoder, *decoder, (d,), (d,)]
    shapes += [(cfg.relpos_num_buckets, h)] * 2
    if not cfg.logits_via_embedding:
        shapes.append((d, cfg.vocab_size))
    return shapes


def memory_estimate(cfg: T5Config, *, shape: common.StepShape) -> common.MemoryEstimate:
    """Per-device bytes of the trainer's step for `cfg` at `shape` (`modeling.memory`); on
    the CPU backend under policy `none` whatever `cfg.remat_policy` says (module docstring:
    measured, `full` compiles to `none`'s bytes there)."""
    inputs_len = shape.inputs_len or shape.seq_len
    resolve = dict(dtype=cfg.dtype, head_dim=cfg.head_dim, kv_length=inputs_len)
    # Self-attention adds the relative-position bias (splash refuses it: `xla` runs on TPU);
    # cross-attention has none, so the kernel asked for (splash, cuDNN) runs there.
    kernel = common.resolve_kernel(shape, q_length=shape.seq_len, has_bias=True, **resolve)
    cross_kernel = common.resolve_kernel(shape, q_length=shape.seq_len, causal=False, **resolve)
    policy = "none" if shape.platform == "cpu" else cfg.remat_policy
    return common.estimate(
        param_shapes=param_shapes(cfg),
        param_dtype=cfg.param_dtype,
        activations=lambda batch: activation_memory(
            cfg,
            batch=batch,
            inputs_len=inputs_len,
            targets_len=shape.seq_len,
            kernel=kernel,
            packed=shape.packed,
            policy=policy,
            cross_kernel=cross_kernel,
        ),
        shape=shape,
        remat_policy=cfg.remat_policy,
        kernel=kernel,
    )
