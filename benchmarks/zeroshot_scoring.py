"""Zero-shot requests scored per second by the `xlscale` lm-eval model, with and without length
bucketing, on whatever JAX backend is present.

It trains a 2-step run of a small LLaMA (`--size`, default `llama2_cpu_d128`, context
`--seq-len` 256) on the committed fixture corpora (or scores `--model-dir`), builds the local
multiple-choice tasks (continuation and translation, en and zh), and scores their
`loglikelihood` requests (each item's context with each of its 4 choices, repeated to
`--requests`) through `XlscaleLM.loglikelihood` twice per setting: the first pass compiles,
the second is timed. It prints requests/s, padded tokens and the padding fraction per setting,
and the ratio, measured in one run.

    .venv/bin/python benchmarks/zeroshot_scoring.py
    .venv/bin/python benchmarks/zeroshot_scoring.py --model-dir /runs/cpt_zh_49m --requests 2000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


class _Request:
    """lm-eval's `Instance` as the model reads it (`.args`)."""

    def __init__(self, *args):
        self.args = args


def _requests(task_dir: Path, *, count: int) -> list[_Request]:
    from evals import local_tasks

    found = []
    for task in sorted(local_tasks.read_local_tasks(task_dir)):
        for line in (task_dir / f"{task}.jsonl").read_text(encoding="utf-8").splitlines():
            doc = json.loads(line)
            delimiter = "" if task.endswith("_zh") and task.startswith("xl_cont") else " "
            found += [_Request(doc["context"], delimiter + c) for c in doc["choices"]]
    if not found:
        raise SystemExit(f"no local task items under {task_dir}")
    return [found[i % len(found)] for i in range(count)]


def _train(root: Path, *, size: str, seq_len: int) -> tuple[Path, Path]:
    from pipelines import vocab
    from pipelines.corpora.fixture import write_fixture_corpora
    from trainer import model_spec
    from trainer import train as train_lib
    from trainer.checkpoints import CheckpointConfig
    from trainer.data import DataConfig, EvalConfig
    from trainer.schedules import ScheduleConfig

    corpora = write_fixture_corpora(root)
    model = vocab.train_vocab(
        corpora_dir=corpora, langs=["en", "zh"], out_prefix=root / "vocab" / "v", vocab_size=512
    )
    run_dir = root / "run"
    train_lib.train(
        model_dir=run_dir,
        model=model_spec.ModelSpec(size=size, overrides={"vocab_size": 512, "max_len": seq_len}),
        data=DataConfig(
            mixture_or_task="lm_en",
            task_feature_lengths={"targets": seq_len},
            batch_size=8,
            vocab_path=os.fspath(model),
            corpora_dir=os.fspath(corpora),
            langs=("en", "zh"),
        ),
        train_steps=2,
        schedule=ScheduleConfig(name="constant", peak=1e-3),
        checkpoint=CheckpointConfig(period=2),
        evaluation=EvalConfig(),
        run=train_lib.RunInfo(strategy="source", source_lang="en"),
        log_every=1,
    )
    return run_dir, corpora


def main(argv=None) -> int:
    """Prints the table (and writes `--json`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=None, help="score this run (default: train one)")
    parser.add_argument("--corpora", default=None, help="corpora for the local tasks")
    parser.add_argument("--size", default="llama2_cpu_d128")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)

    import jax

    from evals import harness, local_tasks

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.model_dir:
            run_dir, corpora = Path(args.model_dir), Path(args.corpora)
        else:
            run_dir, corpora = _train(root, size=args.size, seq_len=args.seq_len)
        tasks = local_tasks.write_local_tasks(
            corpora, root / "tasks", langs=["en", "zh"], items=200
        )
        requests = _requests(tasks.dir, count=args.requests)
        rows = {}
        for bucket in (True, False):
            lm = harness.XlscaleLM(
                model_dir=os.fspath(run_dir), batch_size=args.batch_size, bucket=bucket
            )
            lm.loglikelihood(requests)  # compiles every length this setting uses
            lm.scorer.stats = type(lm.scorer.stats)()
            t0 = time.perf_counter()
            lm.loglikelihood(requests)
            seconds = time.perf_counter() - t0
            stats = lm.scorer.stats.to_json()
            rows["bucketed" if bucket else "full context"] = {
                "requests_per_s": len(requests) / seconds,
                "seconds": seconds,
                "padding_fraction": stats["padding_fraction"],
                "tokens_padded": stats["tokens_padded"],
                "compiled_lengths": stats["compiled_shapes"],
            }
    print(
        f"xlscale lm-eval model, {args.size} (context {lm.scorer.max_len}), "
        f"{len(requests)} loglikelihood requests of {len(tasks.tasks)} local tasks, "
        f"batch {lm.scorer.rows}, backend {jax.default_backend()} ({jax.device_count()} devices)"
    )
    print(f"{'setting':<14} {'requests/s':>11} {'padding':>8} {'padded tokens':>14}  lengths")
    for name, row in rows.items():
        print(
            f"{name:<14} {row['requests_per_s']:11.1f} {row['padding_fraction']:8.0%} "
            f"{row['tokens_padded']:14,d}  {row['compiled_lengths']}"
        )
    ratio = rows["bucketed"]["requests_per_s"] / rows["full context"]["requests_per_s"]
    print(f"bucketed / full context: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
