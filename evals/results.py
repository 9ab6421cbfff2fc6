"""Writing a zero-shot job's results where `fitting` and the reports read them:
`MODEL_DIR/zeroshot/<step>.json` (`rundir.zeroshot.FORMAT`) and one `metrics.jsonl` record
(`zeroshot/<task>/acc_norm`, `.../acc`, `.../n`, mirrored to TensorBoard)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rundir import zeroshot as zeroshot_lib


def task_meta(task: str, *, include_path: str | None) -> dict[str, Any]:
    """`language`, `chance` and `kind` of a task: from the local tasks' index when the task is
    one of them, else from the paper's benchmark table, else the name's `_<lang>` suffix."""
    from evals import local_tasks, paper_tasks

    if include_path and Path(include_path).is_dir():
        if task in local_tasks.read_local_tasks(Path(include_path)):
            info = local_tasks.task_info(Path(include_path), task)
            return {k: info.get(k) for k in ("language", "chance", "kind")}
    lang = paper_tasks.task_language(task)
    if lang is None:
        tail = task.rsplit("_", 1)[-1]
        lang = tail if len(tail) == 2 and tail.isalpha() else ""
    return {
        "language": lang,
        "chance": paper_tasks.CHANCE.get(task),
        "kind": paper_tasks.benchmark_family(task),
    }


def _metric(row: dict[str, Any], name: str) -> float | None:
    for key in (f"{name},none", name):
        value = row.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def summarise(results: dict[str, Any], *, include_path: str | None) -> dict[str, dict[str, Any]]:
    """Per task: acc, acc_norm, their standard errors, n, language, chance, kind (lm-eval's
    result rows, keyed without its `,none` filter suffix); groups without items are left out."""
    n_samples = results.get("n-samples") or {}
    tasks = {}
    for task, row in sorted((results.get("results") or {}).items()):
        n = (n_samples.get(task) or {}).get("effective")
        if n is None:
            continue
        tasks[task] = {
            "acc": _metric(row, "acc"),
            "acc_stderr": _metric(row, "acc_stderr"),
            "acc_norm": _metric(row, "acc_norm"),
            "acc_norm_stderr": _metric(row, "acc_norm_stderr"),
            "n": int(n),
            **task_meta(task, include_path=include_path),
        }
    return tasks


def write_results(
    model_dir: str | os.PathLike,
    *,
    step: int,
    results: dict[str, Any],
    checkpoint: str,
    extra: dict[str, Any] | None = None,
    keep_tasks: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """Writes `MODEL_DIR/zeroshot/<step>.json` (atomically) and appends the `metrics.jsonl`
    record; returns the JSON's path.

    Args:
      results: `evals.harness.evaluate`'s output.
      checkpoint: `<dir>@<step>` that was scored (recorded).
      extra: more fields for the JSON (how the tasks were chosen, timing, settings).
      keep_tasks: rows of tasks scored earlier at this step (task -> row) that the file keeps
        beside the new ones (the sweep stage scores only a run's missing tasks).
    """
    import jax

    from trainer import metrics_log as metrics_lib

    extra = dict(extra or {})
    tasks = summarise(results, include_path=extra.get("include_path"))
    for row in tasks.values():  # each task's own limit: a merged file holds several jobs' tasks
        row["limit"] = extra.get("limit")
    tasks = {**dict(keep_tasks or {}), **tasks}
    data = {
        "format": zeroshot_lib.FORMAT,
        "step": int(step),
        "checkpoint": checkpoint,
        "model_dir": os.fspath(model_dir),
        "num_fewshot": 0,
        "tasks": tasks,
        "lm_eval": {
            "versions": results.get("versions", {}),
            "configs": results.get("configs", {}),
            "n-samples": results.get("n-samples", {}),
        },
        "scorer": results.get("scorer", {}),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }
    if jax.process_index() != 0:
        return zeroshot_lib.results_file(model_dir, step)
    path = zeroshot_lib.write_results_file(model_dir, data)
    record: dict[str, Any] = {"step": int(step)}
    for task, row in tasks.items():
        for metric in ("acc_norm", "acc", "n"):
            if row.get(metric) is not None:
                record[f"{zeroshot_lib.METRIC_PREFIX}{task}/{metric}"] = row[metric]
    writer = metrics_lib.MetricsWriter(model_dir, is_chief=True)
    try:
        writer.write(record)
    finally:
        writer.close()
    return path
