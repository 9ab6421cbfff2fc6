"""Evaluation: validation cross-entropy of parameters on tasks, in training and as its own job.

    python -m trainer.eval --gin_file=t5x_configs/runs/eval.gin \\
        --gin.MODEL_DIR="'/runs/cpt_zh_49m'" --gin.MODEL_SIZE="'llama2_49m'" \\
        --gin.EVAL_TASKS="['lm_zh', 'lm_en']" --gin.VOCAB_PATH="'/data/vocab/cpt.model'"

The loss of a task is token-weighted: the summed cross-entropy (nats) of all target tokens of
its first `max_tokens` validation tokens divided by their count, so it does not depend on batch
size or packing. The eval job restores a checkpoint (`INIT_CHECKPOINT='<dir>[@step]'`, default
`MODEL_DIR`) with the same parameter checks as CPT initialisation, and appends one record per
evaluated step to `MODEL_DIR/eval_metrics.jsonl`.

Encoder-decoders evaluate on inputs/targets batches at their feature lengths, and with
`EvalConfig.decoding` also get the downstream translation scores of `trainer.downstream` (BLEU,
chrF++, ROUGE-L, COMET) with their predictions under `MODEL_DIR/predictions/`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import jax

from convert import init_checkpoints
from rundir import names, storage
from trainer import data as data_lib
from trainer import gin_entry, jobs, model_spec, restore
from trainer import platform as platform_lib
from trainer.data import DataConfig, EvalConfig
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

log = logging.getLogger(__name__)

EVAL_METRICS_FILE = names.EVAL_METRICS_FILE


def evaluate_params(
    job: Any,
    params: Any,
    evaluation: EvalConfig,
    *,
    seq_len: int,
    step: int = 0,
    final: bool = True,
    model_dir: str | os.PathLike | None = None,
) -> dict:
    """`{"eval/<task>/loss": nats, "eval/<task>/tokens": n}` for every task of `evaluation`,
    plus the downstream scores of `evaluation.decoding` when due at `step` (`final`: the run's
    last step), with their predictions written under `model_dir` (`trainer.downstream`).

    Eval batches are read once per job and kept (they are fixed), so periodic evaluation costs
    only the forward passes. Encoder-decoder jobs read inputs/targets batches at the job's
    feature lengths. A job on prepared data (`job.data`, `trainer.data.seqio_free`) reads them
    from the prepared validation splits, without seqio.
    """
    from trainer import downstream

    lengths = dict(getattr(job, "feature_lengths", None) or {"targets": seq_len})
    lengths["targets"] = seq_len
    batch_lengths = lengths if "inputs" in lengths else seq_len
    out: dict[str, float | int] = {}
    for task in evaluation.tasks:
        key = (
            task,
            evaluation.split,
            tuple(sorted(lengths.items())),
            job.eval_batch_size,
            evaluation.max_tokens,
        )
        if key not in job.eval_data:
            job.eval_data[key] = list(
                data_lib.eval_batches(
                    task=task,
                    split=evaluation.split,
                    seq_len=batch_lengths,
                    batch_size=job.eval_batch_size,
                    max_tokens=evaluation.max_tokens,
                    shard_index=jax.process_index(),
                    num_shards=jax.process_count(),
                    host_rows=job.partitioner.host_rows(job.eval_batch_size),
                    config=getattr(job, "data", None),
                )
            )
        sums = [
            job.eval_step(params, job.partitioner.shard_batch(batch))
            for batch in job.eval_data[key]
        ]
        ce, tokens = 0.0, 0.0
        for batch_ce, batch_tokens in jax.device_get(sums):
            ce += float(batch_ce)
            tokens += float(batch_tokens)
        out[f"eval/{task}/loss"] = ce / tokens if tokens else float("nan")
        out[f"eval/{task}/tokens"] = int(tokens)
    if downstream.due(evaluation.decoding, step=step, final=final):
        out.update(
            downstream.evaluate(
                job.model,
                params,
                evaluation.decoding,
                feature_lengths=lengths,
                step=step,
                model_dir=model_dir,
            )
        )
    return out


def evaluate(
    *,
    model_dir: str | os.PathLike,
    model: model_spec.ModelSpec,
    data: DataConfig,
    evaluation: EvalConfig,
    checkpoint: str | None = None,
    all_steps: bool = False,
    mesh: MeshConfig = MeshConfig(),
    expect_platform: str | None = None,
) -> list[dict]:
    """Evaluates checkpoints of a run on `evaluation.tasks`; appends to `eval_metrics.jsonl`.

    Args:
      model_dir: where results go (`MODEL_DIR`).
      model: the model the checkpoint was trained as.
      data: vocabulary/corpora to register tasks from, and the sequence length and batch size
        (`data.mixture_or_task` may be empty; the first eval task is then used for checks).
      evaluation: tasks, token budget, split.
      checkpoint: `'<dir>[@step]'` (default: `model_dir`, latest step).
      all_steps: evaluate every checkpoint kept in the directory instead of one step.
      mesh: mesh axis sizes.
      expect_platform: the platform JAX must run on (`EXPECT_PLATFORM`; see
        `trainer.platform.check`).

    Returns:
      The records written, one per step.
    """
    platform_lib.check(expect_platform)

    if not evaluation.enabled:
        raise ValueError(
            "EVAL_TASKS (data.EvalConfig.tasks) and DECODE_TASKS are empty: nothing to evaluate"
        )
    # The checkpoint first: a wrong CHECKPOINT is refused in a second, not after the tasks are
    # registered and the model built.
    spec = os.fspath(checkpoint or model_dir)
    directory, step = init_checkpoints.parse_init_checkpoint(spec)
    if all_steps:
        wanted = restore.kept_steps(spec, flag="CHECKPOINT")
    else:
        wanted = [restore.resolve_step(spec, step, flag="CHECKPOINT")]
    data_lib.register(data)
    if not data.mixture_or_task:
        first = [*evaluation.tasks, *(evaluation.decoding.tasks if evaluation.decoding else ())]
        data = dataclasses.replace(data, mixture_or_task=first[0])
    job = jobs.build_job(
        model=model,
        data=data,
        evaluation=evaluation,
        optimizer=OptimizerConfig(),
        schedule=ScheduleConfig(name="constant"),
        mesh=mesh,
        train_steps=1,
        register=False,
        compile_train=False,
    )
    abstract = job.abstract_state_with_shardings().params
    records = []
    out_dir = storage.as_path(model_dir, name="MODEL_DIR")
    out_dir.mkdir(parents=True, exist_ok=True)
    for s in wanted:
        params = restore.restore_params(
            f"{directory}@{s}", abstract_params=abstract, flag="CHECKPOINT"
        ).params
        record = {"step": s, "checkpoint": os.fspath(directory)}
        record.update(
            evaluate_params(
                job, params, evaluation, seq_len=data.seq_len, step=s, model_dir=model_dir
            )
        )
        log.info("eval %s", record)
        records.append(record)
        if jax.process_index() == 0:
            storage.append_text(out_dir / EVAL_METRICS_FILE, json.dumps(record) + "\n")
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainer.eval --gin_file=F [--gin_file=...] [--gin.KEY=VALUE ...]`."""
    return gin_entry.run("eval", argv)


if __name__ == "__main__":
    gin_entry.main("eval")
