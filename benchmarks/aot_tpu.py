"""Ahead-of-time compile the trainer's LLaMA2 step for a TPU topology, on this CPU machine.

Uses `jax.experimental.topologies.get_topology_desc` (needs `libtpu`, e.g.
`pip install 'jax[tpu]==0.10.2'`; no TPU is needed) to get compile-only TPU devices, builds the
`('data', 'fsdp', 'model')` mesh over them and compiles the trainer's own train step
(`trainer.jobs.compile_job`: forward + backward + AdamW, parameters and optimizer state sharded by
their logical axes, splash attention in a shard_map) for paper sizes. Without libtpu it says so
and exits 0.

    # one size, in detail:
    .venv/bin/python benchmarks/aot_tpu.py --size llama2_1393m --topology v5e:4x4 --mesh 1,16,1
    # a table over sizes at the paper's batch tokens (1M/2M/4M by size band), pure FSDP:
    .venv/bin/python benchmarks/aot_tpu.py --table --sizes paper --topology v5p:4x4x4

The table gives per size: the global batch (paper recipe) and the microbatches that keep at most
`--max-per-device` sequences per device in flight, XLA's per-device memory (arguments + outputs -
aliased + temporaries), whether that fits the chip's HBM (`HBM_GIB`), and XLA's FLOPs of the step
÷ model FLOPs (6·N + causal attention + the output projection per token, PaLM appendix B). The
layers run in a scan whose body XLA's cost analysis counts once, so the FLOPs come from two small
unscanned compiles with 1 and 2 layers: `f(L) = f(1) + (L-1)·(f(2) - f(1))`, without remat (the
program's FLOPs; `full` remat adds one forward, +1/3). Those two use the `xla` attention kernel:
a Pallas (splash) call is opaque to XLA's cost analysis, so with splash the attention FLOPs (and,
on libtpu 0.0.42, some of the projections around it) go uncounted and the ratio would read low.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
    import compiled_step
    import jax
    import numpy as np
    from jax.experimental import topologies

    from llama_jax.counting import matmul_flops_per_token
    from trainer import jobs, model_spec
    from trainer.optimizers import OptimizerConfig
    from trainer.partitioning import MeshConfig
    from trainer.schedules import ScheduleConfig

    spec = model_spec.ModelSpec(
        family="llama2",
        size=args.size,
        overrides={"dtype": args.dtype, "remat_policy": args.remat_policy, "scan_layers": True},
        attention_kernel=args.attention,
    )
    topology = topologies.get_topology_desc(args.topology, platform="tpu")
    devices = topology.devices
    data, fsdp, model = (int(n) for n in args.mesh.split(","))
    if data * fsdp * model != len(devices):
        raise SystemExit(
            f"mesh {args.mesh} needs {data * fsdp * model} devices, "
            f"topology {args.topology} has {len(devices)}"
        )
    mesh = MeshConfig(data=data, fsdp=fsdp, model=model)
    built = jobs.build_partitioned_model(spec, mesh, devices=devices)
    wrapper = built[0]
    total, non_embedding = wrapper.param_counts()
    print(
        f"{args.size}: {total:,} parameters ({non_embedding:,} non-embedding) on {args.topology} "
        f"({devices[0].device_kind}, {len(devices)} devices), mesh data {data} x fsdp {fsdp} x "
        f"model {model}; global batch {args.batch} x {args.seq_len}"
    )
    start = time.perf_counter()
    job = compiled_step.compile_train_step(
        built,
        batch_size=args.batch,
        seq_len=args.seq_len,
        eval_batch_size=args.batch,
        optimizer=OptimizerConfig(),
        schedule=ScheduleConfig(),
        components=["lm"],
        total_steps=1000,
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


# HBM per chip in GiB, by topology name prefix.
HBM_GIB = {"v5p": 95.0, "v5e": 16.0, "v5litepod": 16.0, "v4": 32.0, "v6e": 32.0}


def _topology_mesh(topology: str):
    """A pure-FSDP mesh over the compile-only devices of a TPU topology, and the devices."""
    from jax.experimental import topologies

    from trainer.partitioning import MeshConfig

    devices = topologies.get_topology_desc(topology, platform="tpu").devices
    return MeshConfig(data=1, fsdp=len(devices), model=1), devices


def _compile_train(
    size: str, mesh, devices, *, batch: int, seq_len: int, microbatches: int, **overrides
):
    """The trainer's compiled train step for `size` (config `overrides`) on the `MeshConfig`
    `mesh` over `devices`."""
    import compiled_step

    from trainer import jobs, model_spec, steps
    from trainer.optimizers import OptimizerConfig
    from trainer.schedules import ScheduleConfig

    spec = model_spec.ModelSpec(family="llama2", size=size, overrides=overrides)
    built = jobs.build_partitioned_model(spec, mesh, devices=devices)
    job = compiled_step.compile_train_step(
        built,
        batch_size=batch,
        seq_len=seq_len,
        optimizer=OptimizerConfig(),
        schedule=ScheduleConfig(),
        step_config=steps.StepConfig(num_microbatches=microbatches),
        components=["lm"],
        total_steps=1000,
    )
    return built[0], job.train_step


def table(args: argparse.Namespace) -> list[dict]:
    """Compiles every size of `args.sizes` at the paper's batch; prints and returns the rows."""
    import math

    from llama_jax import sizes as size_table
    from llama_jax.counting import matmul_flops_per_token

    mesh, devices = _topology_mesh(args.topology)
    hbm = next((v for k, v in HBM_GIB.items() if args.topology.startswith(k)), None)
    names = args.sizes
    if names == ["paper"]:
        names = [n for n, row in size_table.SIZES.items() if row.nominal_m is not None]
    n_dev = len(devices)
    common = {"dtype": args.dtype, "attention_kernel": args.attention}
    print(
        f"{args.topology}: {n_dev} x {devices[0].device_kind}, pure FSDP, HBM {hbm} GiB/chip, "
        f"seq {args.seq_len}, bf16, remat {args.remat_policy}, attention {args.attention}"
    )
    header = (
        f"{'size':<14} {'N (non-emb)':>14} {'batch':>6} {'micro':>5} {'GiB/device':>10} "
        f"{'fits':>5} {'XLA/model FLOPs':>15} {'compile s':>9}"
    )
    print(header + "\n" + "-" * len(header), flush=True)
    rows = []
    for name in names:
        recipe = size_table.paper_recipe(name, seq_len=args.seq_len)
        batch = max(recipe.batch_size, n_dev)
        micro = max(1, math.ceil(batch / (n_dev * args.max_per_device)))
        while batch % (micro * n_dev):
            micro += 1
        start = time.perf_counter()
        wrapper, step = _compile_train(
            name,
            mesh,
            devices,
            batch=batch,
            seq_len=args.seq_len,
            microbatches=micro,
            remat_policy=args.remat_policy,
            scan_layers=True,
            **common,
        )
        compile_s = time.perf_counter() - start
        mem = step.memory_analysis()
        gib = (
            mem.argument_size_in_bytes
            + mem.output_size_in_bytes
            - mem.alias_size_in_bytes
            + mem.temp_size_in_bytes
        ) / 2**30
        # FLOPs of one microbatch-free step on n_dev sequences, extrapolated over layers.
        flops = []
        for layers in (1, 2):
            _, small = _compile_train(
                name,
                mesh,
                devices,
                batch=n_dev,
                seq_len=args.seq_len,
                microbatches=1,
                remat_policy="none",
                num_layers=layers,
                **{**common, "attention_kernel": "xla"},
            )
            cost = small.cost_analysis()
            cost = cost[0] if isinstance(cost, list) else cost
            flops.append(float(cost["flops"]) * n_dev)
        layers = wrapper.config.num_layers
        xla = flops[0] + (layers - 1) * (flops[1] - flops[0])
        model = matmul_flops_per_token(wrapper.config, seq_len=args.seq_len) * n_dev * args.seq_len
        _, n = wrapper.param_counts()
        row = {
            "size": name,
            "non_embedding": n,
            "batch": batch,
            "microbatches": micro,
            "gib_per_device": gib,
            "fits": None if hbm is None else gib <= hbm,
            "xla_over_model_flops": xla / model,
            "compile_s": compile_s,
        }
        rows.append(row)
        print(
            f"{name:<14} {n:>14,} {batch:>6} {micro:>5} {gib:>10.2f} "
            f"{str(row['fits']):>5} {row['xla_over_model_flops']:>15.3f} {compile_s:>9.0f}",
            flush=True,
        )
    return rows


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
    parser.add_argument("--attention", default="splash", help="attention kernel (ATTENTION_KERNEL)")
    parser.add_argument("--table", action="store_true", help="a table over --sizes")
    parser.add_argument("--sizes", nargs="+", default=["paper"], help="size names, or 'paper'")
    parser.add_argument("--max-per-device", type=int, default=8, help="sequences in flight")
    parser.add_argument("--json", help="with --table: also write the rows here")
    args = parser.parse_args()
    if importlib.util.find_spec("libtpu") is None:
        print(
            "libtpu is not installed; install it with `pip install 'jax[tpu]==0.10.2'` "
            "to compile for TPU topologies. Nothing to do."
        )
        return 0
    if args.table:
        rows = table(args)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rows, f, indent=1)
        return 0
    compile_step(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
