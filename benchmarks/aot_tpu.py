"""Ahead-of-time compile a sharded LLaMA2 training step for a TPU topology, on this CPU machine.

Uses `jax.experimental.topologies.get_topology_desc` (needs `libtpu`, e.g.
`pip install 'jax[tpu]==0.10.2'`; no TPU is needed) to get compile-only TPU devices, builds the
`('data', 'fsdp', 'model')` mesh over them, lowers forward + backward + AdamW for a paper size with
parameters and optimizer state sharded by their logical axes, and prints XLA's per-device memory
analysis and FLOP estimate. Without libtpu it says so and exits 0.

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


def _shard_like_params(state, params, mesh):
    """Abstract optimizer state whose leaves mirroring a parameter (AdamW's mu and nu: same dict
    path suffix and shape) get that parameter's sharding; everything else is replicated."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def names(path):
        return tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))

    by_path = {names(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(params)}

    def place(path, leaf):
        param = by_path.get(names(path))
        fits = param is not None and param.shape == leaf.shape
        sharding = param.sharding if fits else NamedSharding(mesh, P())
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree_util.tree_map_with_path(place, state)


def compile_step(args: argparse.Namespace) -> None:
    """Lowers and compiles the sharded step for `args.topology`; prints memory and FLOPs."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import linen as nn
    from jax.experimental import topologies
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from llama_jax import axes
    from llama_jax.counting import matmul_flops_per_token, param_counts
    from llama_jax.model import Llama, abstract_variables, param_logical_specs
    from llama_jax.sizes import get_config

    config = get_config(
        args.size, dtype=args.dtype, remat_policy=args.remat_policy, scan_layers=True
    )
    topology = topologies.get_topology_desc(args.topology, platform="tpu")
    devices = topology.devices
    mesh_shape = tuple(int(n) for n in args.mesh.split(","))
    if int(np.prod(mesh_shape)) != len(devices):
        raise SystemExit(
            f"mesh {mesh_shape} needs {np.prod(mesh_shape)} devices, topology has {len(devices)}"
        )
    mesh = jax.sharding.Mesh(
        np.asarray(devices).reshape(mesh_shape),
        axes.MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * 3,
    )
    rules = axes.logical_axis_rules()
    print(
        f"{args.size}: {param_counts(config)}  on {args.topology} ({devices[0].device_kind}, "
        f"{len(devices)} devices), mesh {dict(zip(axes.MESH_AXES, mesh_shape, strict=True))}"
    )

    param_shardings = nn.logical_to_mesh_sharding(param_logical_specs(config), mesh, rules)
    params = jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        abstract_variables(config)["params"],
        param_shardings,
    )
    optimizer = optax.adamw(2e-4, weight_decay=0.1)
    batch_spec = nn.logical_to_mesh_axes((axes.BATCH, axes.LENGTH), rules)
    tokens = jax.ShapeDtypeStruct(
        (args.batch, args.seq_len + 1), jnp.int32, sharding=NamedSharding(mesh, batch_spec)
    )
    model = Llama(config)

    def loss_fn(p, t):
        logits = model.apply({"params": p}, t[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, t[:, 1:]).mean()

    def step(p, opt_state, t):
        loss, grads = jax.value_and_grad(loss_fn)(p, t)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        start = time.perf_counter()
        opt_state = _shard_like_params(jax.eval_shape(optimizer.init, params), params, mesh)
        opt_shardings = jax.tree_util.tree_map(lambda s: s.sharding, opt_state)
        compiled = (
            jax.jit(
                step,
                out_shardings=(param_shardings, opt_shardings, NamedSharding(mesh, P())),
                donate_argnums=(0, 1),
            )
            .lower(params, opt_state, tokens)
            .compile()
        )
        seconds = time.perf_counter() - start

    mem = compiled.memory_analysis()
    print(f"compiled in {seconds:.1f} s; per-device memory:")
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
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    model_flops = matmul_flops_per_token(config, seq_len=args.seq_len) * args.batch * args.seq_len
    if cost and "flops" in cost:
        print(
            f"XLA cost-analysis flops per device {cost['flops']:.3e} (loop bodies counted once); "
            f"model FLOPs per device "
            f"{model_flops / len(devices):.3e}"
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
