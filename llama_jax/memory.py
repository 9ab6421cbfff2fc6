"""LLaMA2's memory terms: the activations one decoder block keeps for its backward pass.

The terms follow what JAX saves for `llama_jax.layers.DecoderLayer` (read with
`jax._src.ad_checkpoint.saved_residuals`, which a test compares these formulas with), per
sequence of `S` tokens, with `c` the compute dtype's bytes:

- `none` saves every intermediate a primitive's backward needs: the block input and the
  residual sum `h` (`S·D·c` each); each RMSNorm's output (`S·D·c`: the norm itself is
  rematerialised, `llama_jax.layers.rms_norm`); query, key, value and the attention output
  (`S·(2H + 2K)·h·c`) and the RoPE sine/cosine tables (`2·S·h·c`); SwiGLU's gate and up
  projections and their product (`3·S·F·c`: the SiLU is rematerialised,
  `llama_jax.layers.swiglu`); and the attention kernel's own residuals: the `xla` kernel keeps
  only the unnormalised weights in the compute dtype, `[H, S, S]` (`H·S²·c`: its softmax's
  backward pass runs from them, `modeling.attention.shifted_exp_as`), while `cudnn` and `splash` keep only float32 softmax
  statistics `[H, S]` (cuDNN on a packed batch also a `[1, S, S]` boolean mask and the bias it
  becomes). It also keeps the compute-dtype copies of the block's weights (on CPU, where the
  projections run stacked, the stacked q/k/v and w1/w3 matrices; with bf16 compute every cast
  weight): per layer, not per sequence.
- `dots_saveable` keeps only matmul outputs: q/k/v, the out projection, gate/up, and with the
  `xla` kernel the attention logits (compute dtype) and the attention output (a fused kernel is not a
  matmul to JAX, so its outputs are recomputed).
- `dots_with_no_batch_dims_saveable` keeps the weight matmuls' outputs only (the attention
  einsums have batch dimensions).
- `full` keeps each block's input only.

Outside the blocks the forward keeps the last block's output and the final RMSNorm's output,
the output projection's input (its custom VJP saves `x` and the kernel, never the logits),
`2·S·D·c`.
"""

from __future__ import annotations

import math

from llama_jax.config import STACKED_PROJECTION_BACKENDS, LlamaConfig
from modeling.memory import (
    DTYPE_BYTES,
    ActivationMemory,
    MemoryEstimate,
    StepShape,
    estimate,
    resolve_kernel,
)


def _attention_kernel_bytes(cfg: LlamaConfig, *, seq_len: int, kernel: str, packed: bool) -> int:
    """Per sequence and layer, what the attention kernel itself keeps (policy `none`)."""
    c = DTYPE_BYTES[cfg.dtype]
    heads, s = cfg.num_heads, seq_len
    by_kernel = {
        # the exponentials in the compute dtype (`modeling.attention.shifted_exp_as`) and their
        # float32 row sums
        "xla": heads * s * s * c + 4 * heads * s,
        # float32 softmax statistics; a packed batch's [1, S, S] mask and its bias
        "cudnn": 4 * heads * s + (s * s * (1 + c) if packed else 0),
        # float32 logsumexp and max per query row
        "splash": 8 * heads * s,
    }
    return by_kernel[kernel]


def _weight_copies(cfg: LlamaConfig, *, stacked: bool) -> int:
    """Per layer, the compute-dtype weight copies policy `none` keeps (not per sequence);
    `stacked`: the shared-input projections run stacked (`llama_jax.layers.stack_projections`)."""
    c, w = DTYPE_BYTES[cfg.dtype], DTYPE_BYTES[cfg.param_dtype]
    d, f, h = cfg.d_model, cfg.d_ff, cfg.head_size
    q, kv = cfg.num_heads * h, cfg.kv_heads * h
    if c == w and not stacked:  # no casts, no stacks: the parameters themselves
        return 0
    if c == w:  # no casts: only the stacked matrices are new arrays
        qkv = 3 * d * q if cfg.kv_heads == cfg.num_heads else 2 * d * kv
        return c * (qkv + 2 * d * f)
    return c * (2 * d * q + 2 * d * kv + 3 * d * f)


def layer_saved(
    cfg: LlamaConfig, *, policy: str, seq_len: int, kernel: str, packed: bool, platform: str = "cpu"
) -> tuple[int, int]:
    """(bytes per sequence, bytes per layer independent of the batch) one block saves under
    `policy` (see the module docstring) on `platform` (which decides whether the projections
    run stacked: `llama_jax.layers.STACKED_PROJECTION_BACKENDS`)."""
    c = DTYPE_BYTES[cfg.dtype]
    s, d, f, h = seq_len, cfg.d_model, cfg.d_ff, cfg.head_size
    q, kv = s * cfg.num_heads * h, s * cfg.kv_heads * h
    block_input = s * d * c
    if policy == "full":
        return block_input, 0
    weight_dots = (q + 2 * kv) * c + s * d * c + 2 * s * f * c  # q/k/v, out proj, gate/up
    if policy == "dots_with_no_batch_dims_saveable":
        return block_input + weight_dots, 0
    if policy == "dots_saveable":
        attention = c * cfg.num_heads * s * s + q * c if kernel == "xla" else 0
        return block_input + weight_dots + attention, 0
    per_seq = (
        2 * s * d * c  # block input, residual sum
        + 2 * s * d * c  # the two RMSNorm outputs (the norms recompute the rest)
        + (2 * q + 2 * kv) * c  # query, key, value, attention output
        + 2 * s * h * c  # RoPE tables (sine and cosine for q and for k)
        + 3 * s * f * c  # SwiGLU: gate, up, and their product (the SiLU is recomputed)
        + _attention_kernel_bytes(cfg, seq_len=s, kernel=kernel, packed=packed)
    )
    return per_seq, _weight_copies(cfg, stacked=platform in STACKED_PROJECTION_BACKENDS)


def activation_memory(
    cfg: LlamaConfig, *, batch: int, seq_len: int, kernel: str, packed: bool, platform: str = "cpu"
) -> ActivationMemory:
    """`ActivationMemory` of `batch` sequences on one device under `cfg.remat_policy`.

    The layer transient is one block's `none` residuals (what its backward recomputes, or
    already holds, and about as many cotangents are live as residuals are freed).
    """
    c, w = DTYPE_BYTES[cfg.dtype], DTYPE_BYTES[cfg.param_dtype]
    # XLA:CPU widens narrower-than-float32 logits in separate operations, so a program compiled
    # for the CPU also keeps the float32 logits and their exponent of each layer (8·H·S² per
    # sequence), which a TPU or GPU fuses into the softmax (JAX's own residuals are the
    # compute-dtype weights alone, `layer_saved`).
    widened = 0
    if platform == "cpu" and kernel == "xla" and c < 4:
        widened = 8 * cfg.num_heads * seq_len * seq_len
    per_seq, per_layer = layer_saved(
        cfg,
        policy=cfg.remat_policy,
        seq_len=seq_len,
        kernel=kernel,
        packed=packed,
        platform=platform,
    )
    full_seq, full_layer = layer_saved(
        cfg, policy="none", seq_len=seq_len, kernel=kernel, packed=packed, platform=platform
    )
    outside = 2 * seq_len * cfg.d_model * c  # last block's output, the final norm's
    kept = widened if cfg.remat_policy == "none" else 0
    return ActivationMemory(
        saved=cfg.num_layers * (batch * (per_seq + kept) + per_layer) + batch * outside,
        layer=batch * (full_seq + widened) + full_layer,
        logits=4 * batch * seq_len * cfg.vocab_size,
        gathered_head=2 * w * cfg.vocab_size * cfg.d_model,
        gathered_layer=w
        * sum(math.prod(s) for s in param_shapes(cfg.replace(scan_layers=False))[1:10]),
    )


def param_shapes(cfg: LlamaConfig) -> list[tuple[int, ...]]:
    """Every parameter's shape (scanned layout when `cfg.scan_layers`), for optimizer state."""
    d, f, h = cfg.d_model, cfg.d_ff, cfg.head_size
    block = [
        (d,),
        (d, cfg.num_heads, h),
        (d, cfg.kv_heads, h),
        (d, cfg.kv_heads, h),
        (cfg.num_heads, h, d),
        (d,),
        (d, f),
        (d, f),
        (f, d),
    ]
    if cfg.scan_layers:
        layers = [(cfg.num_layers, *s) for s in block]
    else:
        layers = block * cfg.num_layers
    return [(cfg.vocab_size, d), *layers, (d,), (d, cfg.vocab_size)]


def memory_estimate(cfg: LlamaConfig, *, shape: StepShape) -> MemoryEstimate:
    """Per-device bytes of the trainer's step for `cfg` at `shape` (`modeling.memory`)."""
    kernel = resolve_kernel(
        shape,
        dtype=cfg.dtype,
        head_dim=cfg.head_size,
        q_length=shape.seq_len,
        kv_length=shape.seq_len,
    )
    return estimate(
        param_shapes=param_shapes(cfg),
        param_dtype=cfg.param_dtype,
        activations=lambda batch: activation_memory(
            cfg,
            batch=batch,
            seq_len=shape.seq_len,
            kernel=kernel,
            packed=shape.packed,
            platform=shape.platform,
        ),
        shape=shape,
        remat_policy=cfg.remat_policy,
        kernel=kernel,
    )
