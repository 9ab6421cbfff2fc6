"""A finetune's best validation checkpoint: the evaluated step where a metric is best.

A small finetuning set trained for 2^18 steps repeats thousands of times (mt_paper.toml), so its
last evaluation measures overfitting, and a learning rate chosen on it favours whichever rate
overfits least. The finetunes therefore evaluate at several steps (`EVAL_PERIOD`,
`trainer/eval_schedule.py`; under T5X its `eval_period`), and a `[[select]]` with `at = "best"`
(`launch.select_tables`) compares the candidates at their best evaluated step, not their last.
That step is recorded in `MODEL_DIR/best_checkpoint.json` (`rundir.names.BEST_CHECKPOINT_FILE`):

    {"metric": "eval/mt_en_de/loss", "rule": "min", "step": 98304, "value": 1.23,
     "last_step": 262144, "last_value": 1.31, "evaluations": 17,
     "checkpoint": "<MODEL_DIR>/checkpoints/98304", "kept": false}

`kept` says whether that step's checkpoint is still on disk: T5X keeps every checkpoint it saves
(mt_paper's finetunes save at each evaluation), xlscale's trainer what its `KEEP_LAST` /
`KEEP_EVERY` keep (mt_paper keeps the last only: a T5-3B checkpoint per evaluation of its ~4,000
finetunes would be hundreds of terabytes), so the best step's metrics are always recorded and its
weights only where the keep policy left them. Step 0 (`EVAL_AT_START`, the
model before finetuning) is never the best: a finetune's choice is a finetuned checkpoint.
"""

from __future__ import annotations

import json
import math
from typing import Any

from launch import status as run_states
from rundir import names, records, storage


def series(model_dir: str, metric: str) -> list[tuple[int, float]]:
    """(step, value) of every record of a run that has `metric`, by step: its metrics.jsonl, or
    a real T5X MODEL_DIR's summaries as `fitting.readers.t5x_runs` maps them."""
    if records.metrics_file(model_dir).exists():
        rows = records.read_metrics(model_dir)
    else:
        directory = run_states.any_path(model_dir)
        if not directory.is_dir():
            return []
        from fitting.readers import t5x_runs

        if not t5x_runs.is_t5x_run(directory):
            return []
        rows = list(t5x_runs.read_t5x_run(directory).records)
    return [(int(r.get("step") or 0), float(r[metric])) for r in rows if r.get(metric) is not None]


def best(points: list[tuple[int, float]], *, rule: str) -> tuple[int, float] | None:
    """The (step, value) of `points` that is best under `rule` ("min" | "max") among finite
    values at steps >= 1 (the earliest on a tie); None when there is none."""
    finite = [(s, v) for s, v in points if s >= 1 and math.isfinite(v)]
    if not finite:
        return None
    sign = 1.0 if rule == "min" else -1.0
    return min(finite, key=lambda p: (sign * p[1], p[0]))


def _checkpoint(model_dir: str, step: int) -> Any:
    """Where a step's checkpoint is (or would be): xlscale's `checkpoints/<step>`, or T5X's
    `checkpoint_<step>` in a T5X MODEL_DIR (no metrics.jsonl)."""
    root = run_states.any_path(model_dir)
    if records.metrics_file(model_dir).exists():
        return root / names.CHECKPOINTS_SUBDIR / str(step)
    return root / f"checkpoint_{step}"


def record(model_dir: str, *, metric: str, rule: str) -> dict[str, Any] | None:
    """Finds the best evaluated step of `metric` in a finished run, writes it to
    `MODEL_DIR/best_checkpoint.json` and returns it (None, and nothing written, when the run
    logged no finite value of `metric` after step 0)."""
    points = series(model_dir, metric)
    found = best(points, rule=rule)
    if found is None:
        return None
    step, value = found
    checkpoint = _checkpoint(model_dir, step)
    document = {
        "metric": metric,
        "rule": rule,
        "step": step,
        "value": value,
        "last_step": points[-1][0],
        "last_value": points[-1][1] if math.isfinite(points[-1][1]) else None,
        "evaluations": len(points),
        "checkpoint": str(checkpoint),
        "kept": checkpoint.exists(),
    }
    path = run_states.any_path(model_dir) / names.BEST_CHECKPOINT_FILE
    storage.write_text_atomic(path, json.dumps(document, indent=1) + "\n")
    return document


def read(model_dir: str) -> dict[str, Any] | None:
    """The run's best_checkpoint.json, or None when none was written."""
    path = run_states.any_path(model_dir) / names.BEST_CHECKPOINT_FILE
    return json.loads(path.read_text()) if path.exists() else None
