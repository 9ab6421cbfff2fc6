"""T5 throughput on this machine: decoding (greedy, beam 4) and a training step.

    .venv/bin/python benchmarks/t5_decode.py [--sizes t5_tiny t5_small] [--json out.json]

Decoding: sentences/s of `t5_jax.predict.predict_batch` (jitted encode + cached decoder loop),
on random encoder inputs with freshly initialised weights. Such weights rarely produce EOS, so
nearly every sentence runs to `--targets-length`: the numbers are for full-length outputs.
Training: tokens/s of a jitted forward + backward of the token cross-entropy (no optimizer
update), counting encoder plus decoder tokens; dropout off. Compilation is excluded; each
figure is the median over `--repeats` timed calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from t5_jax import predict
from t5_jax.counting import param_counts
from t5_jax.model import Transformer
from t5_jax.sizes import get_config


def _median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn())  # compile + warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def benchmark_size(
    name: str, *, batch: int, inputs_length: int, targets_length: int, repeats: int, seed: int = 0
) -> dict:
    """Measures one size; returns a JSON-able row of settings and throughputs."""
    cfg = get_config(name)
    model = Transformer(cfg)
    rs = np.random.RandomState(seed)
    enc = jnp.asarray(rs.randint(2, cfg.vocab_size, (batch, inputs_length)), jnp.int32)
    tgt = jnp.asarray(rs.randint(2, cfg.vocab_size, (batch, targets_length)), jnp.int32)
    dec_in = jnp.pad(tgt[:, :-1], ((0, 0), (1, 0)))
    params = jax.jit(model.init)(jax.random.PRNGKey(seed), enc, dec_in, tgt)["params"]

    row = {
        "size": name,
        "params": param_counts(cfg).total,
        "batch": batch,
        "inputs_length": inputs_length,
        "targets_length": targets_length,
        "device": str(jax.devices()[0].device_kind),
    }
    for method, beams in (("greedy", 1), ("beam", 4)):
        seconds = _median_seconds(
            lambda method=method, beams=beams: predict.predict_batch(
                model,
                params,
                enc,
                max_decode_length=targets_length,
                method=method,
                num_decodes=beams,
            ),
            repeats,
        )
        key = "greedy" if method == "greedy" else "beam4"
        row[f"{key}_sentences_per_s"] = batch / seconds
        row[f"{key}_seconds_per_batch"] = seconds

    @jax.jit
    def loss_and_grad(p):
        def loss(p):
            logits = model.apply({"params": p}, enc, dec_in, tgt)
            log_probs = jax.nn.log_softmax(logits)
            return -jnp.mean(jnp.take_along_axis(log_probs, tgt[..., None], axis=-1))

        return jax.value_and_grad(loss)(p)

    seconds = _median_seconds(lambda: loss_and_grad(params), repeats)
    row["train_tokens_per_s"] = batch * (inputs_length + targets_length) / seconds
    row["train_seconds_per_step"] = seconds
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    """Parses flags, runs each size, prints one JSON line per size (and writes `--json`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["t5_tiny", "t5_small"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--inputs-length", type=int, default=32)
    parser.add_argument("--targets-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    for name in args.sizes:
        row = benchmark_size(
            name,
            batch=args.batch,
            inputs_length=args.inputs_length,
            targets_length=args.targets_length,
            repeats=args.repeats,
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
