"""Run-time estimates for sweep plans: from a throughput measured on this machine, a given step
time, or the hardware users book (`hardware_throughput`: chips × dense bf16 peak × MFU).

With `--hardware`, each run also gets a memory plan (`memory_plan`): the first remat policy
(`modeling.memory.policy_order`) and the fewest microbatches whose estimate (`modeling.memory`)
fits one chip of the slice, its parameters and optimizer state sharded over every chip (FSDP);
`with_memory_plan` turns a plan into the run's `MODEL_OVERRIDES['remat_policy']` and
`NUM_MICROBATCHES` bindings.

The throughput is FLOPs per second of what a training step computes (`Counts.cost_per_token`:
the 6·N matmuls, attention and the output projection), measured with one jitted
forward+backward+update step of the real model (the trainer's wrapper) at the sweep's smallest size, or derived from a
step time the user gives. Every run's estimate is its computed FLOPs divided by that rate, which
is what scaling a measured step time by FLOPs means.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import time
from collections.abc import Sequence

from launch import strategies
from launch.runs import Run, gin_literal
from modeling import family as family_lib
from modeling import memory, step_memory


@dataclasses.dataclass(frozen=True)
class Throughput:
    """A training-FLOP rate and where it came from (for the plan's header)."""

    flops_per_s: float
    source: str


# Accelerator kinds for `--hardware`: (dense bf16 peak FLOP/s per chip, how the slice name counts
# chips). TPU slice names count TensorCores (v4/v5p: 2 per chip) or chips (v5e/v6e); GPU hosts are
# written `<n>x<kind>`. The peaks are `trainer.metrics_log.PEAK_FLOPS`'s.
TPU_KINDS: dict[str, tuple[float, int]] = {
    "v4": (275e12, 2),
    "v5p": (459e12, 2),
    "v5e": (197e12, 1),
    "v6e": (918e12, 1),
}
GPU_KINDS: dict[str, float] = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
_TPU_SLICE = re.compile(r"^(v4|v5p|v5e|v6e)-(\d+)$")
_GPU_HOSTS = re.compile(r"^(\d+)x(H100|H200|A100)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What a run is booked on: `chips` accelerators of `peak` dense bf16 FLOP/s each."""

    name: str
    chips: int
    peak: float


def parse_hardware(name: str) -> Hardware:
    """`v5p-128` (64 chips), `v5e-16`, `v4-8`, `v6e-256`, `8xH100`, `64xA100`, ... as `Hardware`.

    Raises:
      ValueError: naming `--hardware`, the value and the accepted forms.
    """
    if m := _TPU_SLICE.match(name):
        peak, cores_per_chip = TPU_KINDS[m.group(1)]
        cores = int(m.group(2))
        if cores % cores_per_chip == 0 and cores > 0:
            return Hardware(name, cores // cores_per_chip, peak)
    if m := _GPU_HOSTS.match(name):
        kind = next(k for k in GPU_KINDS if k.lower() == m.group(2).lower())
        if int(m.group(1)) > 0:
            return Hardware(name, int(m.group(1)), GPU_KINDS[kind])
    raise ValueError(
        f"--hardware {name!r}: allowed: a TPU slice <{'|'.join(TPU_KINDS)}>-<cores> (v4/v5p count "
        f"2 TensorCores per chip, e.g. v5p-128 = 64 chips) or GPUs <n>x<{'|'.join(GPU_KINDS)}> "
        "(e.g. 8xH100)"
    )


def hardware_throughput(hardware: Hardware, *, mfu: float) -> Throughput:
    """The training-FLOP rate of `hardware` at model FLOPs utilisation `mfu` (0 < mfu <= 1):
    chips × peak × mfu, FLOPs counted as `Counts.cost_per_token` (6N + attention + output)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu {mfu!r}: allowed: a fraction in (0, 1], e.g. 0.5")
    return Throughput(
        hardware.chips * hardware.peak * mfu,
        f"{hardware.name}: {hardware.chips} chips x {hardware.peak / 1e12:g} TFLOP/s dense bf16 "
        f"peak x {mfu:.0%} MFU; FLOPs per token = cost_per_token (6N + attention + output layer)",
    )


def smallest(runs: Sequence[Run]) -> Run | None:
    """The run with the cheapest step (fewest computed FLOPs per step); None if none counted."""
    counted = [r for r in runs if r.counts is not None]
    return min(counted, key=lambda r: r.counts.cost_per_token * r.batch_size, default=None)


def from_step_time(run: Run, seconds: float) -> Throughput:
    """The rate implied by one step of `run` taking `seconds`."""
    if run.counts is None or seconds <= 0:
        raise ValueError("a step time needs a counted run and a positive time")
    flops = run.counts.cost_per_token * run.batch_size * run.seq_len
    return Throughput(flops / seconds, f"--step-time {seconds:g}s for {run.run_id}")


def measure(run: Run, *, seq_len: int = 256, batch_size: int = 1, steps: int = 3) -> Throughput:
    """Times `steps` jitted training steps of `run`'s model on `batch_size × seq_len` tokens
    (after one compile step) on the default JAX device, through the trainer's model wrapper
    (`modeling.models`: its loss over a batch of every feature the family reads, inputs and
    targets both `seq_len` long for an encoder-decoder).

    Raises:
      ImportError: the model packages are missing.
      ValueError: the family or size is unknown to the trainer.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from trainer import model_spec as models
    from trainer import partitioning

    base, shape = _base_and_shape(run)
    wrapper = models.build_model(models.ModelSpec(family=run.family, size=base, overrides=shape))
    length = min(seq_len, run.seq_len)
    rng = np.random.default_rng(1)

    def tokens():
        ids = rng.integers(3, wrapper.vocab_size, (batch_size, length))
        return jnp.asarray(ids, jnp.int32)

    batch = {
        "decoder_input_tokens": tokens(),
        "decoder_target_tokens": tokens(),
        "decoder_loss_weights": jnp.ones((batch_size, length), jnp.int32),
    }
    if "inputs" in wrapper.feature_keys:
        batch["encoder_input_tokens"] = tokens()
    # Parameter values do not change a step's time: fill the shapes on the host instead of
    # compiling the initialiser (which costs more than the step itself on a CPU).
    shapes = partitioning.unbox(wrapper.abstract_variables()["params"])
    params = jax.tree.map(
        lambda s: jnp.asarray(0.02 * rng.standard_normal(s.shape), s.dtype), shapes
    )

    def loss_fn(p, b):
        out = wrapper.loss_fn(p, b)
        return out.loss_sum / out.weight_sum

    @jax.jit
    def step(p, b):
        loss, grads = jax.value_and_grad(loss_fn)(p, b)
        return jax.tree.map(lambda a, g: a - 1e-4 * g, p, grads), loss

    params, loss = step(params, batch)
    jnp.asarray(loss).block_until_ready()
    start = time.perf_counter()
    for _ in range(steps):
        params, loss = step(params, batch)
    jnp.asarray(loss).block_until_ready()
    elapsed = time.perf_counter() - start
    counts = strategies.counts(family_lib.get(run.family), base, shape, seq_len=length)
    flops = counts.cost_per_token * batch_size * length * steps
    device = jax.devices()[0]
    return Throughput(
        flops / elapsed,
        f"measured {run.size} on {device.platform} ({device.device_kind}): "
        f"{elapsed / steps:.3g}s per step of {batch_size}×{length} tokens",
    )


def _base_and_shape(run: Run) -> tuple[str, dict]:
    return run.base_size, dict(run.overrides)


def estimate_seconds(run: Run, throughput: Throughput | None) -> float | None:
    """Estimated wall time of `run` (None without a throughput or counts)."""
    if throughput is None or run.cost is None:
        return None
    return run.cost / throughput.flops_per_s


def throughput_for(
    runs: Sequence[Run], *, step_time: float | None = None, measure_step: bool = True
) -> tuple[Throughput | None, str]:
    """The rate for a plan: from `step_time` (seconds per step of the cheapest run), else measured
    on that run's model, else none. Returns it with a note saying why there is none."""
    base = smallest(runs)
    if base is None:
        return None, "parameter counts are unavailable"
    if step_time:
        return from_step_time(base, step_time), ""
    if not measure_step:
        return None, "not measured"
    try:
        return measure(base), ""
    except Exception as e:  # noqa: BLE001 -- any failure means "no estimate", said in the note
        return None, f"{type(e).__name__}: {e}; pass --step-time to estimate anyway"


def vocab_size(run: Run) -> int | None:
    """The model vocabulary of a run (its MODEL_OVERRIDES or the size table's), None if unknown."""
    try:
        config = family_lib.get(run.family).get_config(run.base_size, **dict(run.overrides))
    except (TypeError, ValueError, KeyError):
        return None
    return getattr(config, "vocab_size", None)


def plan_rows(runs: Sequence[Run], throughput: Throughput | None) -> list[dict]:
    """One dict per run: id, strategy, size, N, tokens, FLOPs (6ND), steps, batch, dependencies
    and the estimated seconds (None without a throughput)."""
    return [
        {
            "run_id": r.run_id,
            "strategy": r.strategy,
            "size": r.size,
            "params_non_embedding": r.counts.params_non_embedding if r.counts else None,
            "params_total": r.counts.params_total if r.counts else None,
            "vocab_size": vocab_size(r),
            "tokens": r.tokens,
            "flops": r.flops,
            "steps": r.steps,
            "batch_size": r.batch_size,
            "depends_on": list(r.depends_on),
            "selected_from": r.selected_from,
            "waits_for_selection": r.waits_for_selection,
            "estimated_s": estimate_seconds(r, throughput),
        }
        for r in runs
    ]


# Accelerator kind of a `--hardware` slice -> its `modeling.memory.CHIPS` entry (A100s are
# planned as the 80 GB part).
CHIP_OF_KIND: dict[str, str] = {
    "v4": "v4",
    "v5p": "v5p",
    "v5e": "v5e",
    "v6e": "v6e",
    "h100": "h100-80g",
    "h200": "h200",
    "a100": "a100-80g",
}

# The optimizer each family's recipe trains with (what a run's state holds): T5's Adafactor is the
# MT paper's [q:mt.s4_adafactor]; LLaMA2's AdamW is ours (LLaMA2's own optimizer: the CPT paper
# names none, runs/common/cpt_paper.gin).
RECIPE_OPTIMIZER: dict[str, str] = {"llama2": "adamw", "t5": "adafactor"}


def chip_of(hardware: Hardware) -> memory.Chip:
    """The memory of one chip of a `--hardware` slice (`v5p-128` -> v5p, `8xH100` -> H100)."""
    kind = hardware.name.split("-")[0] if "-" in hardware.name else hardware.name.split("x", 1)[1]
    return memory.CHIPS[CHIP_OF_KIND[kind.lower()]]


def _binding(run: Run, name: str):
    """A run's gin binding `name` as a Python value (None when unset or not a literal)."""
    text = dict(run.bindings).get(name)
    try:
        return None if text is None else ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def memory_plan(run: Run, hardware: Hardware) -> memory.Plan | None:
    """The remat policy and microbatches that fit `run`'s step on one chip of `hardware`, its
    batch split and its parameters sharded over every chip (FSDP), with the run's own model
    overrides (dtype, attention kernel); None where the family cannot say (an unknown size)."""
    family = family_lib.get(run.family)
    overrides = {**(_binding(run, "MODEL_OVERRIDES") or {}), **dict(run.overrides)}
    try:
        config = family.get_config(run.base_size, **overrides)
    except (TypeError, ValueError, KeyError, FileNotFoundError):
        return None
    lengths = _binding(run, "TASK_FEATURE_LENGTHS") or {}
    chip = chip_of(hardware)
    shape = step_memory.step_shape(
        family,
        config,
        batch_size=run.batch_size,
        seq_len=int(lengths.get("targets", run.seq_len)),
        inputs_len=int(lengths.get("inputs", run.seq_len)),
        data_parallel=hardware.chips,
        param_shards=hardware.chips,
        optimizer=RECIPE_OPTIMIZER.get(run.family, "adamw"),
        platform=memory.CHIP_PLATFORM[chip.name],
    )
    return step_memory.plan(family, config, shape=shape, limit=chip.usable)


def with_memory_plan(run: Run, plan: memory.Plan) -> Run:
    """`run` with the plan's `MODEL_OVERRIDES['remat_policy']` and `NUM_MICROBATCHES` bindings.

    The run keeps its id: remat and microbatches change how a step is computed, not what it
    computes (`trainer.fingerprint` leaves remat out; microbatches only reorder the float sums
    and are recorded in the fingerprint, so a resumed run keeps its chip's setting).
    """
    bindings = dict(run.bindings)
    overrides = {**(_binding(run, "MODEL_OVERRIDES") or {}), "remat_policy": plan.remat_policy}
    bindings["MODEL_OVERRIDES"] = gin_literal(dict(sorted(overrides.items())))
    bindings["NUM_MICROBATCHES"] = str(plan.num_microbatches)
    return dataclasses.replace(run, bindings=tuple(bindings.items()))
