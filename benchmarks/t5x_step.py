"""T5X's own T5 train step, compiled ahead of time for a TPU topology on this CPU: the peer of
`aot_step.py --family t5`, with the same JSON.

T5X (google-research/t5x; not on PyPI, nothing of it in this repository) must be importable:
run this script with its checkout and its git-only dependencies on `PYTHONPATH` (see
docs/guides/t5x.md, "Installing T5X"). The program is what `t5x.train` runs for a T5 model:
`t5x.models.EncoderDecoderModel` (z-loss 1e-4, T5X's loss and metrics), T5X's Adafactor
(decay 0.8, its factor rules), `t5x.trainer.train_with_lr`, the state partitioned by
`t5x.partitioning.PjitPartitioner`'s logical-axis rules and donated. Parameters are sharded
over the data axis (`parameter_partitioning_dims=2`, T5X's 2-D parameter sharding with one model
partition: pure FSDP, as xlscale's step) over the topology's compile-only devices.

    PYTHONPATH=$T5X:$AIRIO:$JESTIMATOR .venv/bin/python benchmarks/t5x_step.py \\
        --size t5_770m --topology v5p:2x2x1 --batch 128 --inputs-len 512 --seq-len 114 \\
        --json out.json

`--network t5x` (default) compiles T5X's own network (`t5x.examples.t5.network`, T5.1.1's
layers) at the shape of xlscale's size; `--network xlscale` puts xlscale's `t5_jax` module
inside the same T5X step, as the gin files of `t5x_configs/t5x/` do for real T5X runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import aot_step  # its sibling: the JSON's fields, usability, MFU

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile for the TPU, run nothing

NETWORKS = ("t5x", "xlscale")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: the size, mesh and batch (as `aot_step.py --family t5` takes them)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="t5_770m", help="a T5 size of xlscale (t5_jax.sizes)")
    p.add_argument("--network", default="t5x", choices=NETWORKS)
    p.add_argument("--topology", default="v5p:2x2x1")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--inputs-len", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=114, help="targets length")
    p.add_argument("--vocab", type=int, default=32128)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout rate (0: span pretraining's; finetuning's is 0.1)")  # fmt: skip
    p.add_argument("--layers", type=int, default=None, help="layers of each stack (the size's)")
    p.add_argument("--dtype", default="bfloat16", help="activation dtype (parameters float32)")
    p.add_argument(
        "--libtpu", default=os.environ.get("XLSCALE_LIBTPU", str(aot_step.DEFAULT_LIBTPU))
    )
    p.add_argument("--json", help="write the result here")
    p.add_argument("--hlo", help="write the optimised program's HLO text here")
    return p.parse_args(argv)


def t5x_network_config(xl_config, dtype: str, dropout: float):
    """T5X's `network.T5Config` of the same shape as xlscale's `T5Config`."""
    from t5x.examples.t5 import network

    return network.T5Config(
        vocab_size=xl_config.vocab_size,
        dtype=dtype,
        emb_dim=xl_config.d_model,
        num_heads=xl_config.num_heads,
        num_encoder_layers=xl_config.num_encoder_layers,
        num_decoder_layers=xl_config.num_decoder_layers,
        head_dim=xl_config.head_dim,
        mlp_dim=xl_config.d_ff,
        mlp_activations=tuple(xl_config.mlp_activations),
        dropout_rate=dropout,
        logits_via_embedding=xl_config.logits_via_embedding,
    )


def batch_shapes(args: argparse.Namespace) -> dict[str, tuple[tuple[int, ...], str]]:
    """T5X's packed encoder-decoder features (`EncDecFeatureConverter`, pack=True)."""
    enc, dec = (args.batch, args.inputs_len), (args.batch, args.seq_len)
    return {
        "encoder_input_tokens": (enc, "int32"),
        "encoder_segment_ids": (enc, "int32"),
        "encoder_positions": (enc, "int32"),
        "decoder_input_tokens": (dec, "int32"),
        "decoder_target_tokens": (dec, "int32"),
        "decoder_loss_weights": (dec, "int32"),
        "decoder_segment_ids": (dec, "int32"),
        "decoder_positions": (dec, "int32"),
    }


def compile_program(args: argparse.Namespace) -> dict:
    """Compiles T5X's step for `args` and returns its figures (`aot_step.py`'s JSON fields)."""
    import jax
    import numpy as np
    import seqio
    from jax.experimental import topologies
    from jax.sharding import Mesh, PartitionSpec
    from t5x import adafactor, models, partitioning, trainer, utils

    from modeling import family as family_lib
    from t5_jax import model as xl_model
    from t5_jax import sizes

    topology = topologies.get_topology_desc(args.topology, platform="tpu")
    devices = topology.devices
    mesh = Mesh(np.asarray(devices).reshape(len(devices), 1), ("data", "model"))

    class TopologyPartitioner(partitioning.PjitPartitioner):
        """T5X's partitioner over the topology's compile-only devices (T5X's own mesh
        helpers read `jax.devices()`, which are this machine's CPUs)."""

        @property
        def mesh(self) -> Mesh:
            return mesh

    partitioner = TopologyPartitioner(
        num_partitions=1,
        logical_axis_rules=partitioning.standard_logical_axis_rules(
            activation_partitioning_dims=1, parameter_partitioning_dims=2
        ),
    )
    layers = (
        {"num_encoder_layers": args.layers, "num_decoder_layers": args.layers}
        if args.layers
        else {}
    )
    xl_config = sizes.get_config(
        args.size, vocab_size=args.vocab, dtype=args.dtype, dropout_rate=args.dropout, **layers
    )
    if args.network == "t5x":
        from t5x.examples.t5 import network

        module = network.Transformer(config=t5x_network_config(xl_config, args.dtype, args.dropout))
    else:
        module = xl_model.Transformer(config=xl_config)
    vocabulary = seqio.PassThroughVocabulary(size=args.vocab)
    model = models.EncoderDecoderModel(
        module=module,
        input_vocabulary=vocabulary,
        output_vocabulary=vocabulary,
        optimizer_def=adafactor.Adafactor(
            decay_rate=0.8,
            step_offset=0,
            logical_factor_rules=adafactor.standard_logical_factor_rules(),
        ),
        z_loss=1e-4,
    )
    shapes = batch_shapes(args)
    initializer = utils.TrainStateInitializer(
        optimizer_def=model.optimizer_def,
        init_fn=model.get_initial_variables,
        input_shapes={k: s for k, (s, _) in shapes.items()},
        input_types={k: np.dtype(t) for k, (_, t) in shapes.items()},
        partitioner=partitioner,
    )
    state_shape = initializer.global_train_state_shape
    state_axes = initializer.train_state_axes
    batch = {k: jax.ShapeDtypeStruct(s, np.dtype(t)) for k, (s, t) in shapes.items()}

    def train_step(train_state, batch):
        return trainer.train_with_lr(
            train_state,
            batch,
            learning_rate=1e-3,
            dropout_rng=jax.random.PRNGKey(0),
            model=model,
            num_microbatches=args.microbatches if args.microbatches > 1 else None,
            weight_metrics_computer=None,
        )

    step = partitioner.partition(
        train_step,
        in_axis_resources=(state_axes, PartitionSpec("data")),
        out_axis_resources=(state_axes, None),
        donate_argnums=(0,),
    )
    start = time.perf_counter()
    compiled = step.lower(state_shape, batch).compile()
    compile_s = time.perf_counter() - start
    memory, cost, (usable, why, ops), _ = aot_step.compiled_figures(compiled, hlo_path=args.hlo)
    per_token = family_lib.get("t5").cost_per_token(
        xl_config, seq_len=args.seq_len, inputs_len=args.inputs_len
    )
    model_flops = float(per_token) * args.batch * args.seq_len
    peak = aot_step.PEAK_FLOPS.get(aot_step._chip_generation(args.topology))
    coverage = aot_step.flops_coverage(
        cost.get("flops"), len(devices), model_flops, args.microbatches
    )
    mfu = (
        aot_step.estimated_mfu(
            model_flops, cost["optimal_seconds"], len(devices) * peak, args.microbatches
        )
        if usable and peak and coverage is not None and coverage >= 1.0
        else None
    )
    return {
        "program": f"t5x ({args.network} network)",
        "settings": {
            **aot_step.recorded_paths(vars(args)),
            "family": "t5",
            "remat": "none",
            "attention": "xla",
            "scan": False,
            "num_slices": 1,
            "devices": len(devices),
        },
        "device_kind": devices[0].device_kind,
        "t5x_revision": _t5x_revision(),
        "compile_s": compile_s,
        "memory": memory,
        "cost": cost,
        "model_flops": model_flops,
        "estimated_mfu": mfu,
        "flops_coverage": coverage,
        "counts": "one microbatch (a loop body counts once)"
        if args.microbatches > 1
        else "the step",
        "usable": usable,
        "why_unusable": why,
        "uncosted_ops": ops,
    }


def _t5x_revision() -> str:
    """The commit of the T5X checkout that was imported (its git HEAD), or "unknown"."""
    import subprocess

    import t5x

    root = Path(t5x.__file__).resolve().parent.parent
    run = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return run.stdout.strip() if run.returncode == 0 else "unknown"


def main(argv: list[str] | None = None) -> int:
    """Compiles T5X's step and prints (and with `--json` writes) its figures; exits 2 without
    libtpu or without T5X on the import path, naming what is missing."""
    args = parse_args(argv)
    try:
        import t5x  # noqa: F401
    except ImportError as err:
        print(
            f"T5X is not importable ({err}): put its checkout and its git-only dependencies "
            "(airio, jestimator) on PYTHONPATH (docs/guides/t5x.md, Installing T5X)",
            file=sys.stderr,
        )
        return 2
    if not aot_step.use_libtpu(args.libtpu):
        return 2
    aot_step.report(compile_program(args), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
