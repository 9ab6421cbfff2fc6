"""Throughput of the trainer's own step (sharding, optimizer, guards, metrics) vs the bare module.

For each config it runs, in the same process and on the same random tokens:

- **trainer**: `trainer.jobs.compile_job` (mesh over all devices, `NamedSharding`s from the
  logical axis rules, AOT-compiled `jax.jit` with donation, AdamW with clipping and weight-decay
  mask, per-token loss over packed rows with segment ids, non-finite guard, per-component token
  counts), fed through `Partitioner.shard_batch` and with the host-side metrics path of the
  training loop (`metrics_log.Counters`, fetched every `--log-every` steps);
- **bare**: `benchmarks/llama_step.py`'s step (the module + AdamW, nothing else).

It prints tokens/s, model FLOP/s (`llama_jax.counting.matmul_flops_per_token`) divided by the
dense float32 matmul FLOP/s measured in the same run, and trainer ÷ bare (target >= 0.9). Timing
is the best of `--steps` single steps (each blocked on), like the bare benchmark, with trainer and
bare steps alternating so that both see the same load on a shared machine; the ratio of median
step times and the trainer's pipelined rate (blocking only at log steps) are shown too.

    .venv/bin/python benchmarks/train_step.py
    .venv/bin/python benchmarks/train_step.py --configs d256_l4 --steps 20 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import compiled_step
import jax
import jax.numpy as jnp
import numpy as np
import optax

from llama_jax.config import LlamaConfig
from llama_jax.counting import matmul_flops_per_token
from llama_jax.model import Llama
from pipelines import features
from trainer import jobs, metrics_log, model_spec
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig


def _load_bare():
    """`benchmarks/llama_step.py`, the bare-module benchmark beside this file."""
    path = Path(__file__).resolve().parent / "llama_step.py"
    spec = importlib.util.spec_from_file_location("llama_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


llama_step = _load_bare()


def synthetic_batch(tokens: np.ndarray) -> dict[str, np.ndarray]:
    """A decoder batch (one document per row) from `[batch, length + 1]` random tokens."""
    batch, length = tokens.shape[0], tokens.shape[1] - 1
    return features.synthetic_batch(
        {"targets": length},
        batch_size=batch,
        tokens={"targets": tokens[:, 1:]},
        decoder_inputs=tokens[:, :-1],
    )


def trainer_step(config: LlamaConfig, *, seq_len: int, batch: int, host: dict):
    """The trainer's compiled step and state for `config`, and a callable running one step the
    way the training loop does (host batch -> `shard_batch` -> step; metrics kept on device)."""
    fields = {
        k: getattr(config, k)
        for k in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "dtype")
    }
    spec = model_spec.ModelSpec(
        size="llama2_tiny", overrides={**fields, "num_kv_heads": None, "max_len": seq_len}
    )
    built = jobs.build_partitioned_model(spec, MeshConfig())
    wrapper, partitioner, _ = built
    job = compiled_step.compile_train_step(
        built,
        batch_size=batch,
        seq_len=seq_len,
        optimizer=OptimizerConfig(),
        schedule=ScheduleConfig(peak=1e-4),
    )
    box = {"state": job.init_state(np.asarray(jax.random.key_data(jax.random.key(0))))}

    def run():
        box["state"], m = job.train_step(box["state"], partitioner.shard_batch(host))
        return m

    return job, run


def bare_step(config: LlamaConfig, *, tokens: np.ndarray):
    """`benchmarks/llama_step.py`'s step (module + AdamW) as a callable running one step."""
    model = Llama(config)
    tokens = jnp.asarray(tokens)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens[:, :-1])["params"]
    optimizer = optax.adamw(1e-4, weight_decay=0.1)
    step = llama_step.make_step(model, optimizer)
    box = {"params": params, "opt_state": optimizer.init(params)}

    def run():
        box["params"], box["opt_state"], loss = step(box["params"], box["opt_state"], tokens)
        return loss

    return run


def compare(config: LlamaConfig, *, seq_len: int, batch: int, steps_: int, log_every: int):
    """Times trainer and bare steps alternately (so both see the same machine load); returns
    best-step rates of both and the trainer's pipelined rate with the loop's metrics path."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, (batch, seq_len + 1), dtype=np.int32)
    host = synthetic_batch(tokens)
    job, ours = trainer_step(config, seq_len=seq_len, batch=batch, host=host)
    bare = bare_step(config, tokens=tokens)
    jax.block_until_ready((ours(), bare()))  # compile and warm up
    counters = metrics_log.Counters(job.components)
    times = {"trainer": [], "bare": []}
    for _ in range(steps_):
        for name, fn in (("trainer", ours), ("bare", bare)):
            start = time.perf_counter()
            out = fn()
            if name == "trainer":
                counters.absorb([(0, jax.device_get(out))])
            else:
                jax.block_until_ready(out)
            times[name].append(time.perf_counter() - start)
    pending, start = [], time.perf_counter()
    for i in range(steps_):
        pending.append((i, ours()))
        if (i + 1) % log_every == 0 or i == steps_ - 1:
            counters.absorb(jax.device_get(pending))
            pending = []
    n_tokens = batch * seq_len
    flops = matmul_flops_per_token(config, seq_len=seq_len) * n_tokens
    out = {
        name: {
            "tokens_per_s": n_tokens / min(t),
            "model_flops_per_s": flops / min(t),
            "median_s": float(np.median(t)),
        }
        for name, t in times.items()
    }
    out["trainer"]["pipelined_tokens_per_s"] = n_tokens * steps_ / (time.perf_counter() - start)
    return out


def main() -> None:
    """Measures the matmul rate, then trainer and bare step for each config."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", nargs="*", default=list(llama_step.CONFIGS), choices=list(llama_step.CONFIGS)
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--vocab-size", type=int, default=36152)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()

    matmul = llama_step.matmul_flops_per_s(jnp.dtype("float32"))
    print(f"devices: {jax.devices()}  dtype {args.dtype}  vocab {args.vocab_size}")
    print(f"dense float32 2048^3 matmul: {matmul / 1e9:.1f} GFLOP/s")
    for name in args.configs:
        fields, seq_len, batch = llama_step.CONFIGS[name]
        config = LlamaConfig(vocab_size=args.vocab_size, dtype=args.dtype, **fields)
        r = compare(
            config, seq_len=seq_len, batch=batch, steps_=args.steps, log_every=args.log_every
        )
        ours, bare = r["trainer"], r["bare"]
        print(
            f"{name:<14} seq {seq_len:4d} batch {batch:2d} | trainer {ours['tokens_per_s']:8.0f} "
            f"tok/s (pipelined {ours['pipelined_tokens_per_s']:8.0f}) "
            f"{ours['model_flops_per_s'] / matmul:.3f} of matmul | bare "
            f"{bare['tokens_per_s']:8.0f} tok/s {bare['model_flops_per_s'] / matmul:.3f} of matmul "
            f"| trainer/bare {ours['tokens_per_s'] / bare['tokens_per_s']:.3f} "
            f"(medians {bare['median_s'] / ours['median_s']:.3f})"
        )


if __name__ == "__main__":
    main()
