"""Memory by construction: the per-device bytes of a training step, before anything compiles.

The trainer's step (`trainer.steps.make_train_step`, jitted with donated state) holds on one
device, at its peak:

- **state** (arguments, aliased by the outputs): parameters in their dtype, divided by the
  parameter shards (FSDP × model ways), and the optimizer state (AdamW: two moments the size of
  the parameters; Adafactor: factored second moments, rows + columns per matrix);
- **batch**: the int32 feature arrays of this device's rows;
- **gradients**: one parameter-sized tree (in the parameter dtype); with microbatches a second
  one accumulates across them (`jax.lax.scan` over microbatches adds each microbatch's tree);
- **saved activations**: what the forward pass keeps for the backward pass, for every layer of
  one microbatch (`ActivationMemory.saved`, from the family: it depends on the remat policy and
  the attention kernel);
- **the largest transient** of three phases, which do not overlap: the loss (float32 logits
  `[b, S, V]` and their gradient: `modeling.models.token_cross_entropy` works in float32), one
  layer's backward (its recomputed residuals and cotangents, `ActivationMemory.layer`, plus the
  gradients being written), and the optimizer update (gradients, the new parameters and the
  new moments, computed in full before the non-finite guard selects them).

So `total = state + batch + max(saved + max(loss, layer + gradients), update)`. Under FSDP
each device also holds, while it uses them, full (all-gathered) copies of the weights in use:
the embedding and output projection at the loss, one layer's weights and their unreduced
gradients in a layer's backward (`ActivationMemory.gathered_*`). XLA's
`compiled.memory_analysis()` reports the same quantity as arguments + outputs − aliased +
temporaries, and a test holds the estimate within ±15% of it on CPU compiles of tiny and small
LLaMA and T5 models under each remat policy, and of a TPU ahead-of-time compile.

Below: the chip table (usable bytes per chip) and the planner, which picks the first remat
policy in its order (`policy_order`: by recompute cost, or for scanned layers by step time) and
the fewest microbatches whose estimate fits a chip.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

import jax.numpy as jnp
import numpy as np

from modeling.attention import AUTO_BY_BACKEND, KERNELS, Problem, check_kernel_name

GiB = 2**30
MiB = 2**20

# Remat policies in the order of their recompute cost, cheapest first: `none` recomputes
# nothing; `dots_saveable` recomputes the elementwise work between matmuls; the batch-dims
# variant also recomputes the attention matmuls (logits and mixing); `full` recomputes the
# whole forward of each layer (about +1/3 of the step's FLOPs).
POLICY_ORDER: tuple[str, ...] = (
    "none",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "full",
)
# The order for scanned layers, by step time rather than recompute: a scan's backward pass
# reads every kept intermediate from stacked `[layers, ...]` buffers that its forward pass
# writes, where unrolled layers leave XLA free to fuse or recompute the cheap ones. Keeping
# only the weight matmuls' outputs (MaxText's `minimal` policies keep the same) moves fewer
# bytes than keeping everything: XLA's TPU cost model puts a scanned llama2_1085m step at
# 0.0280 s against 0.0294 s with nothing recomputed (llama2_2791m 0.0348 against 0.0365),
# with a third of the memory.
SCANNED_POLICY_ORDER: tuple[str, ...] = (
    "dots_with_no_batch_dims_saveable",
    "none",
    "dots_saveable",
    "full",
)


def policy_order(*, scanned: bool) -> tuple[str, ...]:
    """The remat policies a planner tries, best first: `SCANNED_POLICY_ORDER` for layers run as
    a scan, `POLICY_ORDER` for unrolled ones."""
    return SCANNED_POLICY_ORDER if scanned else POLICY_ORDER


# Bytes of the dtypes a config may name.
DTYPE_BYTES: dict[str, int] = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}

# numpy dtypes of those names (bfloat16 through JAX's ml_dtypes).
DTYPE_NUMPY: dict[str, object] = {
    "float64": np.float64,
    "float32": np.float32,
    "bfloat16": jnp.bfloat16,
    "float16": np.float16,
}

# Int32 feature arrays of a training batch per row: decoder inputs, targets, loss weights,
# segment ids and positions (+ task ids), and the encoder's three for an encoder-decoder.
DECODER_FEATURES = 6
ENCODER_FEATURES = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActivationMemory:
    """A family's activation bytes for one microbatch on one device.

    Attributes:
      saved: residuals the forward keeps for the backward, summed over every layer (and what
        sits outside the layers: embeddings' output, the encoder output for cross-attention).
      layer: the transient of one layer's backward: the residuals it recomputes (all of them
        under `full`, the non-dots under the dots policies) and the cotangents it builds.
      logits: bytes of one float32 `[b, S, V]` logits array.
      gathered_head: bytes of the embedding and output projection in the parameter dtype (all
        gathered on every device for the loss when parameters are sharded).
      gathered_layer: bytes of one layer's weights in the parameter dtype (gathered, with
        their gradient before it is reduce-scattered, in that layer's backward).
    """

    saved: int
    layer: int
    logits: int
    gathered_head: int = 0
    gathered_layer: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepShape:
    """The shape of one training step on a mesh.

    Attributes:
      batch_size: global batch, in sequences.
      seq_len: targets (decoder) length.
      inputs_len: inputs (encoder) length of an encoder-decoder; None for decoder-only.
      num_microbatches: sequential microbatches per step (`NUM_MICROBATCHES`).
      data_parallel: ways the batch is split (mesh `data` × `fsdp`).
      param_shards: ways parameters and optimizer state are split (mesh `fsdp` × `model`).
      optimizer: `adamw` or `adafactor` (`trainer.optimizers.OPTIMIZERS`).
      attention_kernel: `xla`, `cudnn`, `splash`, or `auto` (resolved by `platform`).
      platform: the backend the step compiles for (`cpu`, `gpu`, `tpu`); resolves `auto`.
      packed: batches carry segment ids (packed documents); the cuDNN kernel then builds a
        `[b, 1, S, S]` mask per layer.
    """

    batch_size: int
    seq_len: int
    inputs_len: int | None = None
    num_microbatches: int = 1
    data_parallel: int = 1
    param_shards: int = 1
    optimizer: str = "adamw"
    attention_kernel: str = "auto"
    platform: str = "cpu"
    packed: bool = True

    def __post_init__(self):
        check_kernel_name(self.attention_kernel)
        if self.optimizer not in OPTIMIZER_STATE:
            raise ValueError(
                f"optimizer {self.optimizer!r}: allowed {', '.join(sorted(OPTIMIZER_STATE))}"
            )

    @property
    def kernel(self) -> str:
        """The attention kernel that runs (`auto` resolved for `platform`)."""
        if self.attention_kernel == "auto":
            return AUTO_BY_BACKEND.get(self.platform, "xla")
        return self.attention_kernel

    @property
    def micro_batch(self) -> int:
        """Sequences of one microbatch on one device (at least 1)."""
        return max(1, self.batch_size // (self.data_parallel * self.num_microbatches))

    def replace(self, **changes) -> StepShape:
        """A copy with `changes` applied."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Per-device bytes of one training step, by part (see the module docstring).

    Attributes:
      params, optimizer_state: the state, per device (sharded).
      batch: this device's feature arrays.
      gradients: the gradient tree(s) (two with microbatches: one accumulating).
      activations: residuals saved for the backward pass, one microbatch, all layers.
      loss: float32 logits and their gradient.
      layer: one layer's backward transient.
      update: the optimizer update's transient (new parameters and moments).
      remat_policy, num_microbatches, kernel: what the estimate assumed.
    """

    params: int
    optimizer_state: int
    batch: int
    gradients: int
    activations: int
    loss: int
    layer: int
    update: int
    remat_policy: str
    num_microbatches: int
    kernel: str

    @property
    def transient(self) -> int:
        """The larger of the backward pass (saved activations plus the larger of the loss and
        one layer's backward with the gradients being written) and the optimizer update (the
        activations are freed by then)."""
        backward = self.activations + max(self.loss, self.layer + self.gradients)
        return max(backward, self.update)

    @property
    def total(self) -> int:
        """Peak bytes on one device: state + batch + the larger phase."""
        return self.params + self.optimizer_state + self.batch + self.transient

    def parts_gib(self) -> dict[str, float]:
        """The parts in GiB, for tables."""
        return {
            "params": self.params / GiB,
            "optimizer": self.optimizer_state / GiB,
            "gradients": self.gradients / GiB,
            "activations": self.activations / GiB,
            "logits": self.loss / GiB,
            "total": self.total / GiB,
        }


def resolve_kernel(
    shape: StepShape,
    *,
    dtype: str,
    head_dim: int,
    q_length: int,
    kv_length: int,
    has_bias: bool = False,
    causal: bool = True,
) -> str:
    """The kernel that runs an attention call of a step of `shape` (`auto` resolved for its
    platform; a kernel that would refuse the call gives way to `xla`, as
    `modeling.attention.choose_kernel` does, but without logging)."""
    name = shape.kernel
    problem = Problem(
        backend=shape.platform,
        dtype=np.dtype(DTYPE_NUMPY[dtype]),
        head_dim=head_dim,
        q_length=q_length,
        kv_length=kv_length,
        causal=causal,
        segmented=shape.packed,
        has_bias=has_bias,
        decoding=False,
        dropout=False,
    )
    return name if KERNELS[name].why_not(problem) is None else "xla"


def _adamw_state(shapes: Sequence[tuple[int, ...]], param_bytes: int) -> int:
    """AdamW: first and second moments, each the size and dtype of its parameter."""
    return 2 * param_bytes * sum(math.prod(s) for s in shapes)


def _adafactor_state(shapes: Sequence[tuple[int, ...]], param_bytes: int) -> int:
    """Adafactor (`optax.adafactor`, no momentum): a matrix whose two largest dims are both at
    least 128 keeps float32 row and column statistics (each without one of those dims); any
    other parameter keeps a full float32 second moment."""
    del param_bytes
    total = 0
    for shape in shapes:
        order = np.argsort(shape)
        if len(shape) >= 2 and shape[order[-2]] >= 128:
            d0, d1 = int(order[-2]), int(order[-1])
            rows = math.prod(n for i, n in enumerate(shape) if i != d1)
            cols = math.prod(n for i, n in enumerate(shape) if i != d0)
            total += 4 * (rows + cols + 1)
        else:
            total += 4 * (math.prod(shape) + 2)
    return total


# Optimizer name -> bytes of its state for parameters of these shapes (and dtype size).
OPTIMIZER_STATE: dict[str, Callable[[Sequence[tuple[int, ...]], int], int]] = {
    "adamw": _adamw_state,
    "adafactor": _adafactor_state,
}


def estimate(
    *,
    param_shapes: Sequence[tuple[int, ...]],
    param_dtype: str,
    activations: Callable[[int], ActivationMemory],
    shape: StepShape,
    remat_policy: str,
    kernel: str | None = None,
) -> MemoryEstimate:
    """Combines a family's terms into the per-device estimate (module docstring).

    Args:
      param_shapes: every parameter's shape (the initialised tree's).
      param_dtype: the parameters' dtype name.
      activations: per-device microbatch size -> the family's `ActivationMemory` at this
        shape, policy and kernel.
      shape: the step's shape and mesh.
      remat_policy: recorded in the result (the family's terms already use it).
      kernel: the attention kernel the family's terms assumed (`resolve_kernel`); recorded.
    """
    w = DTYPE_BYTES[param_dtype]
    shards = max(1, shape.param_shards)
    n_params = sum(math.prod(s) for s in param_shapes)
    params = w * n_params // shards
    opt = OPTIMIZER_STATE[shape.optimizer](param_shapes, w) // shards
    grads = (2 if shape.num_microbatches > 1 else 1) * w * n_params // shards
    rows = max(1, shape.batch_size // max(1, shape.data_parallel))
    features = DECODER_FEATURES * shape.seq_len
    if shape.inputs_len is not None:
        features += ENCODER_FEATURES * shape.inputs_len
    acts = activations(shape.micro_batch)
    # The update computes new parameters and moments in full before the non-finite guard
    # selects them: about one more copy of the state beside the gradients.
    update = grads + params + opt
    sharded = shards > 1
    loss = 2 * acts.logits + (acts.gathered_head if sharded else 0)
    layer = acts.layer + (2 * acts.gathered_layer if sharded else 0)
    return MemoryEstimate(
        params=params,
        optimizer_state=opt,
        batch=4 * rows * features,
        gradients=grads,
        activations=acts.saved,
        loss=loss,
        layer=layer,
        update=update,
        remat_policy=remat_policy,
        num_microbatches=shape.num_microbatches,
        kernel=kernel or shape.kernel,
    )


# --- chips -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chip:
    """One accelerator's memory.

    Attributes:
      name: the `--hardware` name.
      memory: device memory in bytes, as the device reports it (HBM; `nvidia-smi`'s total
        for GPUs, which is what "80GB" parts hold: 81,559 MiB on an H100 80GB HBM3).
      headroom: fraction kept back for the runtime, the compiled program, collectives'
        buffers and fragmentation; `usable` is what a step may plan to use.
    """

    name: str
    memory: int
    headroom: float = 0.10

    @property
    def usable(self) -> int:
        """Bytes a step's estimate may reach."""
        return int(self.memory * (1.0 - self.headroom))


# Usable memory per chip. GPUs: XLA's allocator reserves a share for cuBLAS/cuDNN workspaces
# and the CUDA context on top of fragmentation, so 10% is kept back; TPUs keep 5% (the runtime
# reserves less, and XLA's TPU memory analysis is what the limit is checked against).
CHIPS: dict[str, Chip] = {
    "h100-80g": Chip(name="h100-80g", memory=81_559 * MiB),
    "h200": Chip(name="h200", memory=143_771 * MiB),
    "a100-80g": Chip(name="a100-80g", memory=81_920 * MiB),
    "a100-40g": Chip(name="a100-40g", memory=40_960 * MiB),
    "v5p": Chip(name="v5p", memory=95 * GiB, headroom=0.05),
    "v5e": Chip(name="v5e", memory=16 * GiB, headroom=0.05),
    "v4": Chip(name="v4", memory=32 * GiB, headroom=0.05),
    "v6e": Chip(name="v6e", memory=32 * GiB, headroom=0.05),
}

# The platform each chip compiles for (resolves the `auto` attention kernel).
CHIP_PLATFORM: dict[str, str] = {
    "h100-80g": "gpu",
    "h200": "gpu",
    "a100-80g": "gpu",
    "a100-40g": "gpu",
    "v5p": "tpu",
    "v5e": "tpu",
    "v4": "tpu",
    "v6e": "tpu",
}


def get_chip(name: str, *, flag: str = "--hardware") -> Chip:
    """The chip called `name`.

    Raises:
      ValueError: one line naming `flag`, the value and the allowed names.
    """
    if name not in CHIPS:
        raise ValueError(f"{flag} {name!r}: allowed {', '.join(CHIPS)}")
    return CHIPS[name]


# --- planning ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The planner's answer for one step shape.

    Attributes:
      fits: whether some (policy, microbatches) fits.
      remat_policy, num_microbatches: the first that fits (the policies in order, then the
        fewest microbatches); the last tried when nothing fits.
      estimate: its estimate.
      limit: the bytes it had to fit.
    """

    fits: bool
    remat_policy: str
    num_microbatches: int
    estimate: MemoryEstimate
    limit: int

    def gin_settings(self) -> dict[str, str]:
        """What a run needs set for this plan: the remat policy (a `MODEL_OVERRIDES` field)
        and `NUM_MICROBATCHES`."""
        return {
            "remat_policy": self.remat_policy,
            "NUM_MICROBATCHES": str(self.num_microbatches),
        }


def divisors(n: int) -> list[int]:
    """The positive divisors of `n`, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def plan(
    estimator: Callable[[str, StepShape], MemoryEstimate],
    *,
    shape: StepShape,
    limit: int,
    policies: Iterable[str] = POLICY_ORDER,
) -> Plan:
    """The first remat policy (in `policies`' order) and the fewest microbatches whose
    estimate fits `limit`.

    Policies are tried in the order given (`policy_order`); for each, microbatch counts among
    the divisors of the per-device batch, fewest first (each microbatch is a sequential pass,
    so fewer are faster). A policy that fits with fewer microbatches is not preferred over an
    earlier policy that needs more: recomputing the forward costs about a third of the step,
    while microbatches cost only their smaller matmuls' efficiency.

    Args:
      estimator: `(remat policy, shape) -> MemoryEstimate` (a family's `memory_estimate`).
      shape: the step (its `num_microbatches` is ignored).
      limit: usable bytes per device.
    """
    per_device = max(1, shape.batch_size // max(1, shape.data_parallel))
    last = None
    for policy in policies:
        for micro in divisors(per_device):
            est = estimator(policy, shape.replace(num_microbatches=micro))
            last = (policy, micro, est)
            if est.total <= limit:
                return Plan(
                    fits=True,
                    remat_policy=policy,
                    num_microbatches=micro,
                    estimate=est,
                    limit=limit,
                )
    policy, micro, est = last
    return Plan(fits=False, remat_policy=policy, num_microbatches=micro, estimate=est, limit=limit)


def advice(
    plan_: Plan, *, current_policy: str, current_microbatches: int, same_policy: Plan | None = None
) -> str:
    """What to change, in one phrase: the planner's policy and microbatches, and where they
    differ, the fewest microbatches that fit under the current policy (`same_policy`, a plan
    restricted to it); or, when nothing fits, more chips, a smaller batch or shorter sequences.
    """
    if not plan_.fits:
        return (
            f"nothing fits even with remat_policy='full' and NUM_MICROBATCHES="
            f"{plan_.num_microbatches} (est. {plan_.estimate.total / GiB:.1f} GiB): use more "
            "chips (FSDP), a smaller batch or shorter sequences"
        )

    def change(p: Plan) -> str:
        parts = []
        if p.remat_policy != current_policy:
            parts.append(f"MODEL_OVERRIDES remat_policy='{p.remat_policy}'")
        if p.num_microbatches != current_microbatches:
            parts.append(f"NUM_MICROBATCHES={p.num_microbatches}")
        return f"{' and '.join(parts)} (est. {p.estimate.total / GiB:.1f} GiB)"

    options = [change(plan_)]
    if same_policy is not None and same_policy.fits and same_policy != plan_:
        options.append(change(same_policy))
    return "set " + " or ".join(options)
