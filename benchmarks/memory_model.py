"""The memory model against XLA: estimate vs `compiled.memory_analysis()` of the trainer's step.

Compiles (never runs) the trainer's own train step (`trainer.jobs.compile_job`: forward,
backward, optimizer update, donated state) for abstract shapes, and prints per row the
family's estimate (`ModelFamily.memory_estimate`), XLA's per-device bytes (arguments + outputs
− aliased + temporaries) and their ratio. Paper sizes compile on the CPU as abstract shapes in
seconds to a minute; TPU rows compile ahead of time for a topology of compile-only devices
where libtpu is installed or `XLSCALE_LIBTPU` (or `TPU_LIBRARY_PATH`) names a libtpu.so; GPU
rows where a GPU is present.

    .venv/bin/python benchmarks/memory_model.py            # CPU rows (+ TPU, GPU if present)
    .venv/bin/python benchmarks/memory_model.py --quick    # small sizes only

Imports no TensorFlow, seqio or gin (it runs on a GPU image without them).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # compiled_step beside us, also when loaded by file path
    sys.path.insert(0, HERE)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ["JAX_PLATFORMS"] == "cpu":
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import compiled_step  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from modeling import family as family_lib  # noqa: E402
from modeling.memory import GiB, MemoryEstimate, StepShape  # noqa: E402
from pipelines import features  # noqa: E402
from trainer import jobs, model_spec, steps  # noqa: E402
from trainer.optimizers import OptimizerConfig, adafactor_defaults  # noqa: E402
from trainer.partitioning import MeshConfig  # noqa: E402
from trainer.schedules import ScheduleConfig  # noqa: E402

# Names a libtpu.so that is not importable (`make test` installs one off the import path);
# TPU_LIBRARY_PATH works too.
LIBTPU_ENV = "XLSCALE_LIBTPU"

# Optimizer name -> its trainer config (the papers': AdamW for LLaMA, Adafactor for T5).
OPTIMIZERS = {"adamw": OptimizerConfig(), "adafactor": adafactor_defaults()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """One step to compile: family, size, config overrides, global batch and lengths, mesh.

    Attributes:
      fsdp: mesh `fsdp` ways (the rest of `devices` is `data`).
      devices: devices of the mesh (None: 1).
      attention_kernel: the kernel asked for (`auto` resolves by the target platform).
    """

    family: str
    size: str
    overrides: tuple[tuple[str, object], ...] = ()
    batch: int = 8
    seq_len: int = 128
    inputs_len: int | None = None
    microbatches: int = 1
    devices: int = 1
    fsdp: int = 1
    optimizer: str = "adamw"
    attention_kernel: str = "xla"

    def label(self) -> str:
        """A short row label."""
        extra = ",".join(f"{k}={v}" for k, v in self.overrides if k != "remat_policy")
        policy = dict(self.overrides).get("remat_policy", "none")
        return f"{self.size} {policy} {extra}".strip()


def step_shape(case: Case, *, platform: str) -> StepShape:
    """The memory model's `StepShape` of `case` on `platform`."""
    return StepShape(
        batch_size=case.batch,
        seq_len=case.seq_len,
        inputs_len=case.inputs_len,
        num_microbatches=case.microbatches,
        data_parallel=case.devices,
        param_shards=case.fsdp,
        optimizer=case.optimizer,
        attention_kernel=case.attention_kernel,
        platform=platform,
        packed=True,
    )


def _spec(case: Case) -> model_spec.ModelSpec:
    """The trainer's model spec of `case` (T5 without dropout, as the MT paper pretrains)."""
    return model_spec.ModelSpec(
        family=case.family,
        size=case.size,
        overrides=dict(case.overrides),
        attention_kernel=case.attention_kernel,
        dropout_rate=0.0 if case.family == "t5" else None,
    )


def estimate(case: Case, *, platform: str) -> MemoryEstimate:
    """The family's estimate of `case` on `platform`."""
    family = family_lib.get(case.family)
    config = family.build(_spec(case)).config
    return family.memory_estimate(config, shape=step_shape(case, platform=platform))


def xla_bytes(compiled) -> int:
    """Per-device bytes XLA plans for a compiled program: arguments + outputs − aliased +
    temporaries (`benchmarks/aot_tpu.py` reads the same fields)."""
    mem = compiled.memory_analysis()
    return (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
    )


def xla_peak_bytes(compiled) -> int | None:
    """XLA's own peak of the program (`peak_memory_in_bytes`: arguments plus the most
    temporaries live at once in its heap simulation), where the backend reports one (TPU);
    None where it reports only the arguments (CPU)."""
    mem = compiled.memory_analysis()
    peak = getattr(mem, "peak_memory_in_bytes", 0) or 0
    return peak if peak > mem.argument_size_in_bytes + mem.output_size_in_bytes else None


def compile_step(case: Case, devices=None):
    """The trainer's compiled train step of `case` over `devices` (default: the first
    `case.devices` of this backend); compile only, nothing runs."""
    return compile_case(case, devices).train_step


def compile_case(case: Case, devices=None) -> jobs.Job:
    """The trainer's job of `case` (its compiled train step, state shapes and shardings)."""
    devices = list(devices if devices is not None else jax.devices()[: case.devices])
    mesh = MeshConfig(data=len(devices) // case.fsdp, fsdp=case.fsdp, model=1)
    built = jobs.build_partitioned_model(_spec(case), mesh, devices=devices)
    lengths = {"inputs": case.inputs_len} if case.inputs_len else None
    job = compiled_step.compile_train_step(
        built,
        batch_size=case.batch,
        seq_len=case.seq_len,
        feature_lengths=lengths,
        optimizer=OPTIMIZERS[case.optimizer],
        schedule=ScheduleConfig(),
        step_config=steps.StepConfig(num_microbatches=case.microbatches),
        components=["lm"],
        total_steps=1000,
    )
    return job


def measure(case: Case) -> dict:
    """Compiles `case` on the default device, runs one step on zero state and a zero batch,
    and returns the estimate, XLA's bytes and the device's `peak_bytes_in_use` (run it in a
    fresh process: the peak counts everything the process allocated)."""
    device = jax.devices()[0]
    job = compile_case(case, [device])
    state = jax.tree.map(
        lambda a: jax.device_put(jnp.zeros(a.shape, a.dtype), a.sharding),
        job.abstract_state_with_shardings(),
    )
    lengths = {"inputs": case.inputs_len} if case.inputs_len else None
    abstract_batch = jobs.batch_abstract(
        job.partitioner, batch_size=case.batch, seq_len=case.seq_len, feature_lengths=lengths
    )
    host = features.synthetic_batch(
        {"targets": case.seq_len, **(lengths or {})}, batch_size=case.batch
    )
    batch = {key: jax.device_put(host[key], a.sharding) for key, a in abstract_batch.items()}
    state, metrics = job.train_step(state, batch)
    jax.block_until_ready((state, metrics))
    stats = device.memory_stats() or {}
    est = estimate(case, platform=device.platform)
    return {
        "estimate": est.total,
        "xla": xla_bytes(job.train_step),
        "peak": stats.get("peak_bytes_in_use"),
        "kernel": est.kernel,
        "loss_finite": bool(jnp.isfinite(metrics["loss_sum"])),
    }


def compare(case: Case, *, devices=None, platform: str | None = None) -> dict:
    """Compiles `case` and returns its row: estimate, XLA bytes, ratio, compile seconds."""
    platform = platform or (devices[0].platform if devices else jax.default_backend())
    start = time.perf_counter()
    compiled = compile_step(case, devices)
    seconds = time.perf_counter() - start
    est = estimate(case, platform=platform)
    xla = xla_bytes(compiled)
    peak = xla_peak_bytes(compiled)
    return {
        "platform": platform,
        "case": case.label(),
        "family": case.family,
        "size": case.size,
        "batch": case.batch,
        "seq_len": case.seq_len,
        "estimate_gib": est.total / GiB,
        "xla_gib": xla / GiB,
        "ratio": est.total / xla,
        "xla_peak_gib": None if peak is None else peak / GiB,
        "compile_s": seconds,
        "kernel": est.kernel,
    }


def _case(family, size, policy="none", **kw) -> Case:
    overrides = {"remat_policy": policy, **kw.pop("overrides", {})}
    if family == "llama2":
        overrides.setdefault("scan_layers", True)
    return Case(family=family, size=size, overrides=tuple(sorted(overrides.items())), **kw)


def cpu_cases(*, quick: bool) -> list[Case]:
    """Three or more sizes per family, each remat policy at one size, bf16 at paper sizes."""
    bf16 = {"dtype": "bfloat16"}
    cases = [
        _case("llama2", "llama2_tiny", seq_len=64),
        _case("llama2", "llama2_cpu_d128", batch=8, seq_len=256),
        _case("llama2", "llama2_cpu_d256", batch=8, seq_len=512),
        _case("t5", "t5_tiny", seq_len=64, inputs_len=48, optimizer="adafactor"),
        _case("t5", "t5_small", seq_len=128, inputs_len=96, optimizer="adafactor"),
        _case("t5", "t5_base", seq_len=256, inputs_len=256, optimizer="adafactor"),
    ]
    cases += [
        _case("llama2", "llama2_cpu_d256", p, batch=8, seq_len=512) for p in _POLICIES[1:]
    ] + [
        _case("t5", "t5_small", p, seq_len=128, inputs_len=96, optimizer="adafactor")
        for p in _POLICIES[1:]
    ]
    if not quick:
        cases += [
            _case("llama2", "llama2_1085m", batch=8, seq_len=2048, overrides=bf16),
            _case("llama2", "llama2_1085m", "full", batch=8, seq_len=2048, overrides=bf16),
            _case("llama2", "llama2_1393m", "full", batch=16, seq_len=2048, overrides=bf16),
            _case("t5", "t5_770m", batch=64, seq_len=114, inputs_len=512, overrides=bf16),
            _case(
                "t5",
                "t5_770m",
                "full",
                batch=64,
                seq_len=512,
                inputs_len=512,
                overrides=bf16,
                optimizer="adafactor",
            ),
        ]
    return cases


_POLICIES = ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "full")


def print_row(row: dict) -> None:
    """One table row, flushed."""
    print(
        f"{row['platform']:<4} {row['case']:<46} {row['batch']:>4}x{row['seq_len']:<5} "
        f"{row['kernel']:<6} {row['estimate_gib']:>9.3f} {row['xla_gib']:>9.3f} "
        f"{row['ratio']:>6.3f} {row['compile_s']:>6.1f}  {_peak_column(row)}",
        flush=True,
    )


def _peak_column(row: dict) -> str:
    """XLA's heap-simulation peak and the estimate's ratio to it, where reported (TPU). On a
    TPU ahead-of-time compile `temp_size_in_bytes` can exceed the temporaries of the program's
    own buffer assignment (LLaMA 1.1B, `full`, 8 x 2048 per chip: 8.29 GiB against a 6.19 GiB
    preallocated temp), so both are shown."""
    peak = row.get("xla_peak_gib")
    return "" if peak is None else f"{peak:>9.3f} {row['estimate_gib'] / peak:>6.3f}"


def main() -> int:
    """Prints the table (CPU rows; TPU and GPU rows where available)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--tpu-topology", default="v5p:2x2x1", help="TPU AOT topology")
    parser.add_argument(
        "--measure",
        metavar="JSON",
        help="run one step of this Case (JSON fields) on the default device and print the "
        "estimate, XLA's bytes and the peak bytes in use as JSON (what tests/test_gpu_memory.py "
        "runs in a fresh process)",
    )
    args = parser.parse_args()
    if args.measure:
        fields = json.loads(args.measure)
        fields["overrides"] = tuple(sorted(fields.get("overrides", {}).items()))
        print(json.dumps(measure(Case(**fields))))
        return 0
    header = (
        f"{'plat':<4} {'case':<46} {'batch':>10} {'kernel':<6} {'est GiB':>9} {'XLA GiB':>9} "
        f"{'ratio':>6} {'comp s':>6}  {'peak GiB':>9} {'/peak':>6}"
    )
    print(header + "\n" + "-" * len(header), flush=True)
    for case in cpu_cases(quick=args.quick):
        print_row(compare(case, platform="cpu"))
    libtpu = os.environ.get(LIBTPU_ENV) or os.environ.get("TPU_LIBRARY_PATH", "")
    if importlib.util.find_spec("libtpu") is not None or os.path.isfile(libtpu):
        from jax.experimental import topologies

        if os.path.isfile(libtpu):  # a libtpu off the import path (`make test`'s)
            os.environ["TPU_LIBRARY_PATH"] = libtpu
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only

        devices = topologies.get_topology_desc(args.tpu_topology, platform="tpu").devices
        for case in tpu_cases(len(devices), quick=args.quick):
            print_row(compare(case, devices=devices, platform="tpu"))
    else:
        print(
            f"(no TPU rows: libtpu is not installed; set {LIBTPU_ENV} to a libtpu.so or "
            "pip install 'jax[tpu]==0.10.2')"
        )
    if any(d.platform == "gpu" for d in _all_devices()):
        for case in gpu_cases():
            print_row(compare(case, devices=jax.devices("gpu")[:1], platform="gpu"))
    return 0


def tpu_cases(n_devices: int, *, quick: bool) -> list[Case]:
    """Paper sizes, pure FSDP over the topology's devices, splash attention, bf16."""
    bf16 = {"dtype": "bfloat16"}
    common = dict(devices=n_devices, fsdp=n_devices, attention_kernel="auto", overrides=bf16)
    cases = [_case("llama2", "llama2_cpu_d256", batch=8, seq_len=512, **common)]
    if not quick:
        cases += [
            _case("llama2", "llama2_1085m", batch=16, seq_len=2048, **common),
            _case("llama2", "llama2_1085m", "full", batch=32, seq_len=2048, **common),
            _case(
                "t5",
                "t5_770m",
                batch=32,
                seq_len=512,
                inputs_len=512,
                optimizer="adafactor",
                **common,
            ),
        ]
    return cases


def gpu_cases() -> list[Case]:
    """LLaMA 1.1B at HF's shape with cuDNN and xla attention, bf16, one GPU."""
    bf16 = {"dtype": "bfloat16"}
    return [
        _case("llama2", "llama2_1085m", batch=8, seq_len=2048, overrides=bf16, attention_kernel=k)
        for k in ("cudnn", "xla")
    ]


def _all_devices():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


if __name__ == "__main__":
    sys.exit(main())
