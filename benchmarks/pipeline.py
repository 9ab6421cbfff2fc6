"""Packed tokens/s of the seqio input pipelines on this machine, against what the trainer eats.

For an LM replay mixture (decoder-only, `decoder_batches`) and a span-corruption mixture
(encoder-decoder, `encdec_batches`) it builds the trainer's stream, times the start (pipeline
build, mixture-rate measurement, first batch), then pulls batches for `--seconds` and reports:

- real (non-padding) tokens per second, wall clock and per CPU-second of this process (the
  machine is shared, so the CPU figure is the steadier one), and the load average;
- the real-token fraction of the packed rows;
- the realised token share of every mixture component next to the requested one;
- the ratio to `--consumption` tokens/s, the stated trainer consumption at the demo
  configurations (the demo's fastest run, demo_d48 at 8 x 128 tokens, steps in about 0.05 s:
  ~20k tokens/s; `experiments/tiny.gin` measures ~10k tokens/s), which must be >= 5x.

For span corruption the tokens counted are encoder plus decoder tokens (what one T5 step
processes); the decoder-only figure is printed too.

    .venv/bin/python benchmarks/pipeline.py                  # Debian corpora if built, else fixture
    .venv/bin/python benchmarks/pipeline.py --fixture --seconds 10
    .venv/bin/python benchmarks/pipeline.py --vocab V.model --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import bench_data
import numpy as np

CONSUMPTION = 30_000  # tokens/s; see the module docstring
REQUIRED_RATIO = 5.0
LANGS = ("en", "zh", "de")
# name -> (kind, mixture, sequence length(s), batch size)
CONFIGS: dict[str, tuple[str, str, object, int]] = {
    "lm demo (L=128, B=8)": ("decoder", "cpt_zh_replay_en_20", 128, 8),
    "lm (L=512, B=8)": ("decoder", "cpt_zh_replay_en_20", 512, 8),
    "span T5 shape (128/32, B=16)": (
        "encdec",
        "mix_en_50_de_50",
        {"inputs": 128, "targets": 32},
        16,
    ),
    "span (512/114, B=8)": ("encdec", "mix_en_50_de_50", {"inputs": 512, "targets": 114}, 8),
}


def _measure(kind: str, mixture: str, lengths, batch: int, seconds: float) -> dict:
    from pipelines import mixtures, streams

    fn = streams.decoder_batches if kind == "decoder" else streams.encdec_batches
    names = mixtures.component_names(mixture)
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    it = fn(
        mixture_or_task=mixture, split="train", sequence_length=lengths, batch_size=batch, seed=0
    )
    next(it)
    startup, startup_cpu = time.perf_counter() - t0, time.process_time() - c0
    dec = enc = steps = cells = 0
    per_component = np.zeros(len(names))
    t1, c1 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t1 < seconds:
        b = next(it)
        steps += 1
        dec += int(b["decoder_loss_weights"].sum())
        cells += b["decoder_loss_weights"].size
        ids = b["decoder_task_ids"]
        per_component += np.bincount(ids[ids >= 0], minlength=len(names))
        if "encoder_segment_ids" in b:
            enc += int((b["encoder_segment_ids"] > 0).sum())
    wall, cpu = time.perf_counter() - t1, time.process_time() - c1
    total = dec + enc
    requested = mixtures.token_fractions(mixture)
    return {
        "mixture": mixture,
        "kind": kind,
        "sequence_length": lengths,
        "batch_size": batch,
        "steps": steps,
        "startup_s": startup,
        "startup_cpu_s": startup_cpu,
        "tokens_per_s": total / wall,
        "tokens_per_cpu_s": total / cpu,
        "decoder_tokens_per_s": dec / wall,
        "real_token_fraction": dec / cells,
        "load_average": load,
        "shares": {n: float(per_component[i] / per_component.sum()) for i, n in enumerate(names)},
        "requested": requested,
    }


def main() -> None:
    """Runs every config and prints the table (and optionally writes JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_data.add_arguments(parser, vocab_size_help="as the demo's vocabulary")
    parser.add_argument("--seconds", type=float, default=15.0, help="measuring time per config")
    parser.add_argument("--consumption", type=float, default=CONSUMPTION, help="trainer tokens/s")
    parser.add_argument("--configs", nargs="*", default=None, help=f"subset of {list(CONFIGS)}")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        corpora, where = bench_data.corpora(args, Path(tmp), LANGS)
        _, _, took = bench_data.register(args, corpora, Path(tmp), langs=LANGS, extra_ids=100)
        if took is not None:
            print(f"vocabulary: {args.vocab_size} pieces on {'+'.join(LANGS)} in {took:.1f}s")
        print(
            f"data: {where}; {os.cpu_count()} CPUs; trainer reference {args.consumption:,.0f} tok/s"
        )
        results = {}
        for name in args.configs or CONFIGS:
            kind, mixture, lengths, batch = CONFIGS[name]
            r = _measure(kind, mixture, lengths, batch, args.seconds)
            r["ratio"] = r["tokens_per_s"] / args.consumption
            results[name] = r
            shares = ", ".join(
                f"{n} {r['shares'][n]:.3f} (asked {r['requested'][n]:.3f})" for n in r["shares"]
            )
            verdict = "ok" if r["ratio"] >= REQUIRED_RATIO else "BELOW 5x"
            print(
                f"{name:<30} {mixture:<20} {r['tokens_per_s']:>9,.0f} tok/s "
                f"({r['tokens_per_cpu_s']:>9,.0f}/cpu-s, decoder {r['decoder_tokens_per_s']:,.0f}) "
                f"x{r['ratio']:.1f} {verdict}; fill {r['real_token_fraction']:.3f}; "
                f"start {r['startup_s']:.1f}s ({r['startup_cpu_s']:.1f} cpu-s); "
                f"load {r['load_average']:.1f}"
            )
            print(f"{'':<30} token shares: {shares}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8"
        )


if __name__ == "__main__":
    main()
