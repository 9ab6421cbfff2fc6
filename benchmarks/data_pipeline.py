"""Training input at paper scale: the prepared (by-index) path against the seqio (replay) path.

Prints, in one run on this machine:

1. **Time to the first batch** when a run resumes at step 0, 10^3, 10^5 and 10^6, for the
   prepared path (`pipelines.prepared.batches` over `xlscale data prepare` shards), and for the seqio path
   (`pipelines.streams.batches`, which replays every skipped batch) at the small steps. The target
   is step 10^6 within 1.5x of step 0 for the prepared path.
2. **Tokens/s per core** of both paths on the same documents (the same task, vocabulary and
   batch shape; CPU seconds of this process, the steadier figure on a shared machine). Target:
   prepared >= 5x seqio.
3. **Input work per host** for 1, 2 and 4 hosts: documents each host reads for the same 20
   global batches (prepared path; the seqio path's 'global' sharding builds the whole batch on
   every host).
4. **The demand table**: tokens/s one host must supply to keep the smallest and the largest
   paper models at 50% MFU on a v5p-8 host (4 chips) and an 8xH100 host, from FLOPs per token
   (`cost_per_token`: 6N + attention + output layer, at the paper's sequence length) and each
   chip's dense bf16 peak; divided by the measured per-core rates, how many cores each needs.

    .venv/bin/python benchmarks/data_pipeline.py              # Debian corpora if built, else fixture
    .venv/bin/python benchmarks/data_pipeline.py --fixture --seconds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import bench_data

LANG = "en"
TASK = f"lm_{LANG}"
SEQ_LEN = 2048
BATCH = 8
PREPARED_STEPS = (0, 1_000, 100_000, 1_000_000)
SEQIO_STEPS = (0, 200, 1_000)
MFU = 0.5
# (host, chips, dense bf16 peak FLOP/s per chip): trainer.metrics_log.PEAK_FLOPS's values.
HOSTS = (("v5p-8 host (4 chips)", 4, 459e12), ("8xH100 host", 8, 989e12))
# (label, family, size, targets length, inputs length): the smallest and largest model of each
# paper at its sequence lengths (CPT: 2,048-token context; MT: T5's 512 inputs / 114 targets).
PAPER_MODELS = (
    ("CPT smallest", "llama2", "llama2_49m", 2048, None),
    ("CPT largest", "llama2", "llama2_5534m", 2048, None),
    ("MT smallest", "t5", "t5_770m", 114, 512),
    ("MT largest", "t5", "t5_3b", 114, 512),
)


def _first_batch_s(make, step: int, repeats: int) -> float:
    """Median wall time from building a stream at `step` to holding its first batch."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        next(make(step))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _rate(make, seconds: float) -> dict:
    """Real (loss-weighted) tokens per wall second and per CPU second of this process."""
    it = make(0)
    next(it)
    tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        tokens += int(next(it)["decoder_loss_weights"].sum())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / max(cpu, 1e-9)}


def _demand() -> list[dict]:
    from modeling import family as family_lib

    rows = []
    for label, name, size, targets, inputs in PAPER_MODELS:
        family = family_lib.get(name)
        config = family.get_config(size)
        flops = family.cost_per_token(config, seq_len=targets, inputs_len=inputs)
        for host, chips, peak in HOSTS:
            rows.append(
                {
                    "model": f"{label} ({size})",
                    "host": host,
                    "flops_per_token": flops,
                    "tokens_per_s": MFU * chips * peak / flops,
                }
            )
    return rows


def main() -> None:
    """Prepares the task once, measures both paths and prints the four tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_data.add_arguments(parser, vocab_size_help="as the issue's measurement")
    parser.add_argument("--seconds", type=float, default=10.0, help="rate measuring time per path")
    parser.add_argument("--repeats", type=int, default=3, help="first-batch timings per step")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    from pipelines import streams
    from pipelines import vocab as vocab_lib
    from pipelines.prepared import batches as prepared_batches
    from pipelines.prepared import prepare as prepare_lib
    from pipelines.prepared import shards

    results: dict = {"cpus": os.cpu_count(), "seq_len": SEQ_LEN, "batch": BATCH}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpora, where = bench_data.corpora(args, tmp, (LANG,))
        model, vocabulary, _ = bench_data.register(args, corpora, tmp, langs=(LANG,), extra_ids=0)
        print(f"data: {where}; task {TASK}; {os.cpu_count()} CPUs; batches {BATCH} x {SEQ_LEN}")

        t = time.perf_counter()
        manifest = prepare_lib.prepare(
            task_name=TASK,
            split="train",
            out_dir=tmp / "prepared",
            num_shards=4,
            workers=min(4, os.cpu_count() or 1),
            registration=prepare_lib.Registration(
                vocab_path=os.fspath(model), corpora_dir=os.fspath(corpora)
            ),
            log=lambda line: None,
        )
        prep_s = time.perf_counter() - t
        dataset = shards.PreparedDataset.open(tmp / "prepared" / TASK)
        tokens = int(dataset.lengths("targets").sum())
        results["prepare"] = {"seconds": prep_s, "documents": dataset.num_docs, "tokens": tokens}
        print(
            f"prepare: {dataset.num_docs:,} documents, {tokens:,} tokens in {prep_s:.1f}s "
            f"({tokens / prep_s:,.0f} tokens/s with {manifest and len(manifest.shards)} shards)"
        )

        def prepared(step, rows=None, ds=None):
            return prepared_batches.batches(
                components=[prepared_batches.Component(TASK, ds or dataset, 1.0)],
                sequence_length=SEQ_LEN,
                global_batch_size=BATCH,
                seed=0,
                start_step=step,
                host_rows=rows,
                start_id=vocab_lib.start_id(vocabulary),
                eos_id=vocabulary.eos_id,
                vocab_size=vocabulary.vocab_size,
            )

        def seqio(step):
            return streams.batches(
                mixture_or_task=TASK,
                split="train",
                sequence_length=SEQ_LEN,
                batch_size=BATCH,
                seed=0,
                start_step=step,
            )

        print("\n1. time to the first batch when resuming at step s (median of repeats)")
        first = {"prepared": {}, "seqio": {}}
        for step in PREPARED_STEPS:
            first["prepared"][step] = _first_batch_s(prepared, step, args.repeats)
        for step in SEQIO_STEPS:
            first["seqio"][step] = _first_batch_s(seqio, step, 1)
        print(f"{'step':>10} {'prepared':>10} {'seqio (replay)':>15}")
        for step in sorted(set(PREPARED_STEPS) | set(SEQIO_STEPS)):
            p, q = first["prepared"].get(step), first["seqio"].get(step)
            print(
                f"{step:>10,} {'' if p is None else f'{p:.3f}s':>10} "
                f"{'' if q is None else f'{q:.2f}s':>15}"
            )
        ratio = first["prepared"][PREPARED_STEPS[-1]] / first["prepared"][0]
        print(f"prepared: step {PREPARED_STEPS[-1]:,} / step 0 = {ratio:.2f}x (target <= 1.5x)")
        results["first_batch_s"] = first
        results["first_batch_ratio"] = ratio

        print(f"\n2. tokens/s per core on the same documents ({args.seconds:g}s each)")
        rates = {"prepared": _rate(prepared, args.seconds), "seqio": _rate(seqio, args.seconds)}
        for name, r in rates.items():
            print(
                f"{name:>10}: {r['tokens_per_cpu_s']:>12,.0f} tokens/cpu-s "
                f"({r['tokens_per_s']:,.0f} tokens/s wall)"
            )
        speedup = rates["prepared"]["tokens_per_cpu_s"] / rates["seqio"]["tokens_per_cpu_s"]
        print(f"prepared / seqio per core = {speedup:.1f}x (target >= 5x)")
        results["rates"] = rates
        results["per_core_speedup"] = speedup

        print("\n3. documents read per host for the same 20 global batches (prepared path)")
        work = {}
        for hosts in (1, 2, 4):
            per_host = BATCH // hosts
            reads = []
            for h in range(hosts):
                ds = shards.PreparedDataset.open(tmp / "prepared" / TASK)
                it = prepared(500, rows=((h * per_host, (h + 1) * per_host),), ds=ds)
                for _ in range(20):
                    next(it)
                reads.append(ds.reads)
            work[hosts] = reads
            print(f"{hosts} host(s): {reads} (total {sum(reads)})")
        results["reads_per_host"] = work

    print(f"\n4. demand at {MFU:.0%} MFU: tokens/s a host must supply, and cores at measured rates")
    print("   FLOPs/token = cost_per_token (6N + attention + output layer); peaks: dense bf16")
    demand = _demand()
    per_core = {k: v["tokens_per_cpu_s"] for k, v in rates.items()}
    print(
        f"{'model':<28} {'host':<22} {'FLOPs/token':>12} {'tokens/s':>12} "
        f"{'cores (prepared)':>17} {'cores (seqio)':>14}"
    )
    for row in demand:
        row["cores"] = {k: row["tokens_per_s"] / v for k, v in per_core.items()}
        print(
            f"{row['model']:<28} {row['host']:<22} {row['flops_per_token']:>12.3e} "
            f"{row['tokens_per_s']:>12,.0f} {row['cores']['prepared']:>17.1f} "
            f"{row['cores']['seqio']:>14.1f}"
        )
    for host, chips, peak in HOSTS:
        print(f"   {host}: {chips} x {peak:.3g} FLOP/s")
    results["demand"] = demand
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
