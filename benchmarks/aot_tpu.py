"""Ahead-of-time compile a sharded LLaMA2 training step for a TPU topology, on this CPU machine.

Uses `jax.experimental.topologies.get_topology_desc` (needs `libtpu`, e.g.
`pip install 'jax[tpu]==0.10.2'`; no TPU is needed) to get compile-only TPU devices, builds the
`('data', 'fsdp', 'model')` mesh over them, compiles the trainer's own train and eval steps
(`trainer.jobs.compile_job`: forward + backward + AdamW, parameters and optimizer state sharded by
their logical axes) for a paper size, and prints XLA's per-device memory analysis and FLOP
estimate. Without libtpu it says so and exits 0.

    .venv/bin/python benchmarks/aot_tpu.py --size llama2_1393m --topology v5e:4x4 --mesh 1,16,1
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile for TPU, run nothing: no TPU backend


def _gib(n: int) -> str:
    return f"{n / 2**30:8.3f} GiB"


def compile_step(args: argparse.Namespace) -> None:
    """Compiles the trainer's own train and eval steps for `args.topology`; prints memory, FLOPs.

    The same `trainer.jobs.compile_job` as a training run (model wrapper, logical-axis
    partitioner, AdamW + cosine, optimizer state sharded like the parameters, donated state), on
    a mesh of compile-only TPU devices, so what is checked here is what a pod would run.
    """
    import jax
    import numpy as np
    from jax.experimental import topologies

    from llama_jax.counting import matmul_flops_per_token
    from modeling import axes
    from trainer import jobs, models, partitioning, steps
    from trainer.optimizers import OptimizerConfig
    from trainer.partitioning import MeshConfig, Partitioner
    from trainer.schedules import ScheduleConfig

    spec = models.ModelSpec(
        family="llama2",
        size=args.size,
        overrides={"dtype": args.dtype, "remat_policy": args.remat_policy, "scan_layers": True},
    )
    wrapper = models.build_model(spec)
    topology = topologies.get_topology_desc(args.topology, platform="tpu")
    devices = topology.devices
    data, fsdp, model = (int(n) for n in args.mesh.split(","))
    if data * fsdp * model != len(devices):
        raise SystemExit(
            f"mesh {args.mesh} needs {data * fsdp * model} devices, "
            f"topology {args.topology} has {len(devices)}"
        )
    mesh = partitioning.build_mesh(MeshConfig(data=data, fsdp=fsdp, model=model), devices)
    partitioner = Partitioner(mesh=mesh, rules=axes.logical_axis_rules())
    variables = wrapper.abstract_variables()
    abstract = jax.tree.map(
        lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
        partitioning.unbox(variables["params"]),
        partitioner.params_shardings(variables),
    )
    total, non_embedding = wrapper.param_counts()
    print(
        f"{args.size}: {total:,} parameters ({non_embedding:,} non-embedding) on {args.topology} "
        f"({devices[0].device_kind}, {len(devices)} devices), mesh data {data} x fsdp {fsdp} x "
        f"model {model}; global batch {args.batch} x {args.seq_len}"
    )
    start = time.perf_counter()
    job = jobs.compile_job(
        model=wrapper,
        partitioner=partitioner,
        abstract_params=abstract,
        components=["lm"],
        total_steps=1000,
        batch_size=args.batch,
        seq_len=args.seq_len,
        eval_batch_size=args.batch,
        optimizer=OptimizerConfig(),
        schedule=ScheduleConfig(),
        step_config=steps.StepConfig(num_microbatches=1, z_loss=0.0, num_components=1),
    )
    print(f"compiled train + eval steps in {time.perf_counter() - start:.1f} s")

    def sharded_fraction(tree) -> float:
        leaves = jax.tree.leaves(tree)
        big = [s for s in leaves if np.prod(s.shape) >= 1024]
        return sum(not s.sharding.is_fully_replicated for s in big) / max(len(big), 1)

    state = job.abstract_state_with_shardings()
    print(
        f"sharded leaves (>= 1024 elements): params {sharded_fraction(state.params):.0%}, "
        f"optimizer state {sharded_fraction(state.opt_state):.0%}"
    )
    mem = job.train_step.memory_analysis()
    print("train step, per-device memory:")
    for field in (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "generated_code_size_in_bytes",
    ):
        print(f"  {field:<30} {_gib(getattr(mem, field))}")
    peak = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
    print(f"  {'arguments+outputs-aliased+temp':<30} {_gib(peak + mem.temp_size_in_bytes)}")
    cost = job.train_step.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    model_flops = (
        matmul_flops_per_token(wrapper.config, seq_len=args.seq_len) * args.batch * args.seq_len
    )
    if cost and "flops" in cost:
        print(
            f"XLA cost-analysis flops per device {cost['flops']:.3e} (loop bodies counted once); "
            f"model FLOPs per device {model_flops / len(devices):.3e}"
        )


def main() -> int:
    """Parses flags; exits 0 with a message when libtpu is not installed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="llama2_1393m")
    parser.add_argument("--topology", default="v5e:4x4", help="e.g. v5e:4x4, v4:2x2x2, v6e:4x4")
    parser.add_argument("--mesh", default="1,16,1", help="data,fsdp,model sizes")
    parser.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--remat-policy", default="full")
    args = parser.parse_args()
    if importlib.util.find_spec("libtpu") is None:
        print(
            "libtpu is not installed; install it with `pip install 'jax[tpu]==0.10.2'` "
            "to compile for TPU topologies. Nothing to do."
        )
        return 0
    compile_step(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
