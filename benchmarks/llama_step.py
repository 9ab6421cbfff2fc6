"""Throughput of a jitted LLaMA2 training step (forward + backward + AdamW) on this machine.

For each config and dtype it prints tokens/s, achieved model FLOP/s and that rate divided by the
dense matmul FLOP/s measured in the same run with the same dtype (a jitted 2048^3 `jnp.dot`, the
larger of the rates measured just before and just after the config), i.e. a utilisation figure
relative to what XLA's matmul reaches here rather than to a datasheet peak. Other processes on
the machine lower both figures; rerun and keep the best when the CPU is shared.

Model FLOPs per token are `llama_jax.counting.matmul_flops_per_token`: 6 x (non-embedding
parameters + output projection) + causal attention (PaLM appendix B, halved); the input
embedding is a gather and is not counted. The 6·N-only figure is printed too.

    .venv/bin/python benchmarks/llama_step.py                 # default configs, float32 + bf16
    .venv/bin/python benchmarks/llama_step.py --dtypes float32 --steps 20
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from llama_jax.config import LlamaConfig
from llama_jax.counting import flops_per_token, matmul_flops_per_token
from llama_jax.model import Llama

# name -> (config fields, seq_len, batch)
CONFIGS: dict[str, tuple[dict, int, int]] = {
    "d256_l4": (dict(d_model=256, d_ff=1024, num_heads=4, num_layers=4), 256, 8),
    "d512_l4": (dict(d_model=512, d_ff=2048, num_heads=8, num_layers=4), 256, 8),
    "d512_l8_s512": (dict(d_model=512, d_ff=2048, num_heads=8, num_layers=8), 512, 4),
}


def _best_time(fn, *, repeats: int) -> float:
    """Best wall time of `repeats` calls of `fn` (which must block until done)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_flops_per_s(dtype: jnp.dtype, *, n: int = 2048, repeats: int = 5) -> float:
    """Dense `n x n @ n x n` matmul FLOP/s under jit, best of `repeats`."""
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(key_a, (n, n), dtype)
    b = jax.random.normal(key_b, (n, n), dtype)
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    return 2 * n**3 / _best_time(lambda: dot(a, b).block_until_ready(), repeats=repeats)


def make_step(model: Llama, optimizer: optax.GradientTransformation):
    """A jitted training step: next-token cross-entropy, gradients, AdamW update."""

    def loss_fn(params, tokens):
        logits = model.apply({"params": params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def bench_config(config: LlamaConfig, *, seq_len: int, batch: int, steps: int) -> dict:
    """Times `steps` training steps (after one compile/warm-up step); returns rates."""
    model = Llama(config)
    rng = np.random.default_rng(0)
    # seq_len + 1 tokens per row: inputs and shifted targets are both seq_len long.
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq_len + 1)), jnp.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens[:, :-1])["params"]
    optimizer = optax.adamw(1e-4, weight_decay=0.1)
    opt_state = optimizer.init(params)
    step = make_step(model, optimizer)
    params, opt_state, loss = step(params, opt_state, tokens)
    loss.block_until_ready()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens)
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
    best = min(times)
    n_tokens = batch * seq_len
    return {
        "step_s_best": best,
        "step_s_median": float(np.median(times)),
        "tokens_per_s": n_tokens / best,
        "model_flops_per_s": matmul_flops_per_token(config, seq_len=seq_len) * n_tokens / best,
        "six_n_flops_per_s": flops_per_token(config, seq_len=seq_len).six_n * n_tokens / best,
        "loss": float(loss),
    }


def main() -> None:
    """Parses flags and prints one line per dtype and config, with the matmul rate beside it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--vocab-size", type=int, default=36152, help="paper vocabulary: 36152")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (best is reported)")
    parser.add_argument("--remat-policy", default="none")
    args = parser.parse_args()

    print(f"devices: {jax.devices()}  vocab {args.vocab_size}  remat {args.remat_policy}")
    for dtype in args.dtypes:
        for name in args.configs:
            fields, seq_len, batch = CONFIGS[name]
            config = LlamaConfig(
                vocab_size=args.vocab_size,
                dtype=dtype,
                remat_policy=args.remat_policy,
                **fields,
            )
            before = matmul_flops_per_s(jnp.dtype(dtype))
            r = bench_config(config, seq_len=seq_len, batch=batch, steps=args.steps)
            # The larger of the matmul rates measured just before and after: other processes
            # sharing the CPU lower both, and taking the larger keeps the ratio conservative.
            matmul_rate = max(before, matmul_flops_per_s(jnp.dtype(dtype)))
            print(
                f"[{dtype}] {name:<13} seq {seq_len:4d} batch {batch:2d}  "
                f"step {r['step_s_best'] * 1e3:7.1f} ms (median {r['step_s_median'] * 1e3:7.1f})  "
                f"{r['tokens_per_s']:7.0f} tok/s  model {r['model_flops_per_s'] / 1e9:5.1f} GFLOP/s"
                f" / matmul {matmul_rate / 1e9:5.1f} = {r['model_flops_per_s'] / matmul_rate:.3f}"
                f"  (6N only: {r['six_n_flops_per_s'] / matmul_rate:.3f})  loss {r['loss']:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
