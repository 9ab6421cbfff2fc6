"""Training throughput of the trainer's T5 step on this machine (tokens/s), as a table.

    .venv/bin/python benchmarks/t5_train.py [--sizes t5_tiny t5_small] [--steps 5] [--json out.json]

For each size it builds the trainer's own step (`trainer.jobs.compile_job`: mesh over all
devices, `NamedSharding`s, AOT-compiled `jax.jit` with donation, Adafactor with the inverse square
root schedule as in span-corruption pretraining, z-loss 1e-4, non-finite guard, token counters),
feeds it a synthetic packed encoder-decoder batch (one example per row, every position real)
through `Partitioner.shard_batch`, and times single steps (each blocked on) after a warm-up. It
reports the best step's rates: target (decoder) tokens/s, the unit of `metrics.jsonl`'s
`tokens_per_s` for T5 runs; all tokens/s (encoder + decoder); and 6·N model FLOP/s with N per
stack (`t5_jax.counting.flops_per_example`). float32 unless `--dtype` says otherwise; dropout off.

Shapes: `t5_tiny` at the CPU overlay's (`experiments/t5_tiny.gin`: batch 8, inputs 64, targets
32, vocab 512); `t5_small` (T5.1.1 small, vocab 32128) at batch 8, inputs 256, targets 64;
`mt_d128` (on request) the translation study's model at its finetuning shape, batch 32 x 64/64.
"""

from __future__ import annotations

import argparse
import json
import time

import compiled_step
import jax
import numpy as np

from pipelines import features
from t5_jax import counting
from trainer import jobs, model_spec, steps
from trainer.optimizers import adafactor_defaults
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

# The translation study's model (launch/manifests/mt_demo.toml: T5.1.1 block at d_model 128).
MT_D128 = {
    "vocab_size": 2048,
    "d_model": 128,
    "num_heads": 4,
    "head_dim": 32,
    "num_encoder_layers": 2,
    "num_decoder_layers": 2,
    "d_ff": 384,
}

# name -> (model size, config overrides, batch, inputs length, targets length)
CONFIGS: dict[str, tuple[str, dict, int, int, int]] = {
    "t5_tiny": ("t5_tiny", {"vocab_size": 512}, 8, 64, 32),
    "t5_small": ("t5_small", {}, 8, 256, 64),
    "mt_d128": ("t5_small", MT_D128, 32, 64, 64),  # the MT study's finetuning shape
}


def synthetic_batch(
    rng: np.random.Generator, *, vocab: int, batch: int, inputs: int, targets: int
) -> dict[str, np.ndarray]:
    """A packed-format encoder-decoder batch with one full-length example per row."""
    lengths = {"inputs": inputs, "targets": targets}
    tokens = {k: rng.integers(3, vocab, (batch, n), dtype=np.int32) for k, n in lengths.items()}
    return features.synthetic_batch(lengths, batch_size=batch, tokens=tokens)


def benchmark(size: str, *, dtype: str, steps_: int, seed: int = 0) -> dict:
    """Compiles the trainer step for `size` and times `steps_` steps; returns a JSON-able row."""
    base, overrides, batch, li, lt = CONFIGS[size]
    spec = model_spec.ModelSpec(
        family="t5", size=base, overrides={**overrides, "dtype": dtype}, dropout_rate=0.0
    )
    built = jobs.build_partitioned_model(spec, MeshConfig())
    wrapper, partitioner, _ = built
    start = time.perf_counter()
    job = compiled_step.compile_train_step(
        built,
        batch_size=batch,
        seq_len=lt,
        feature_lengths={"inputs": li, "targets": lt},
        optimizer=adafactor_defaults(),
        schedule=ScheduleConfig(name="rsqrt", base=1.0, rsqrt_offset=10_000),
        step_config=steps.StepConfig(z_loss=1e-4, num_components=1),
    )
    compile_s = time.perf_counter() - start
    state = job.init_state(np.asarray(jax.random.key_data(jax.random.key(seed))))
    host = synthetic_batch(
        np.random.default_rng(seed), vocab=wrapper.vocab_size, batch=batch, inputs=li, targets=lt
    )
    state, m = job.train_step(state, partitioner.shard_batch(host))  # warm-up
    jax.block_until_ready(m)
    times = []
    for _ in range(steps_):
        t = time.perf_counter()
        state, m = job.train_step(state, partitioner.shard_batch(host))
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    best = min(times)
    total, non_embedding = wrapper.param_counts()
    flops = counting.flops_per_example(wrapper.config, inputs_length=li, targets_length=lt)
    return {
        "size": size,
        "params": total,
        "params_non_embedding": non_embedding,
        "dtype": dtype,
        "batch": batch,
        "inputs_length": li,
        "targets_length": lt,
        "device": str(jax.devices()[0].device_kind),
        "num_devices": jax.device_count(),
        "compile_s": compile_s,
        "best_step_s": best,
        "median_step_s": float(np.median(times)),
        "target_tokens_per_s": batch * lt / best,
        "all_tokens_per_s": batch * (li + lt) / best,
        "six_n_flops_per_s": batch * flops.six_n / best,
        "loss": float(m["loss_sum"] / m["weight_sum"]),
    }


def main() -> None:
    """Runs the sizes asked for and prints one table row each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", nargs="*", default=["t5_tiny", "t5_small"], choices=list(CONFIGS)
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = [benchmark(size, dtype=args.dtype, steps_=args.steps) for size in args.sizes]
    print(f"devices: {jax.devices()}  dtype {args.dtype}  best of {args.steps} steps")
    header = (
        f"{'size':<9} {'params':>11} {'batch':>5} {'in/tgt':>8} {'compile s':>9} "
        f"{'step ms':>9} {'target tok/s':>12} {'all tok/s':>10} {'6N GFLOP/s':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['size']:<9} {r['params']:>11,} {r['batch']:>5} "
            f"{r['inputs_length']:>4}/{r['targets_length']:<3} {r['compile_s']:>9.1f} "
            f"{r['best_step_s'] * 1e3:>9.1f} {r['target_tokens_per_s']:>12,.0f} "
            f"{r['all_tokens_per_s']:>10,.0f} {r['six_n_flops_per_s'] / 1e9:>10.2f}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
