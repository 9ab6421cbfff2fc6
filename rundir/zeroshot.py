"""A run's zero-shot results: `MODEL_DIR/zeroshot/<step>.json`, one file per scored checkpoint,
written by `xlscale zeroshot` (`evals.results`, through `write_results_file`).

The file holds, per lm-eval task, `acc`, `acc_norm` (lm-evaluation-harness's length-normalised
accuracy, the CPT paper's metric), their standard errors, the item count `n`, the task's
`language` and its `chance` level; `fitting` and the reports read them through `read_zeroshot`
without importing lm-eval or JAX.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from etils import epath

from rundir import names, records, storage

ZEROSHOT_SUBDIR = names.ZEROSHOT_SUBDIR
FORMAT = "xlscale-zeroshot/1"
METRIC_PREFIX = records.ZEROSHOT_PREFIX  # metrics.jsonl keys: zeroshot/<task>/<metric>


class ZeroshotFormatError(ValueError):
    """A zero-shot JSON that is not in `FORMAT` (naming the file and what is wrong)."""


@dataclasses.dataclass(frozen=True)
class ZeroshotScore:
    """One task's score at one checkpoint of a run.

    Attributes:
      step: the checkpoint step.
      task: the lm-eval task name.
      language: ISO 639-1 code of the task's language ("" when unknown).
      acc, acc_norm: accuracy and length-normalised accuracy (nan when the task has none).
      n: items scored.
      chance: accuracy of guessing (None when unknown).
      kind: what the task is (`continuation`, `translation`, or the benchmark's name).
    """

    step: int
    task: str
    language: str
    acc: float
    acc_norm: float
    n: int
    chance: float | None
    kind: str = ""


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def parse_zeroshot(data: dict[str, Any], *, source: str = "<memory>") -> list[ZeroshotScore]:
    """The scores of one zero-shot JSON object.

    Raises:
      ZeroshotFormatError: another format, or a task entry without `n` (naming `source`).
    """
    if data.get("format") != FORMAT:
        raise ZeroshotFormatError(f"{source}: format {data.get('format')!r}, expected {FORMAT!r}")
    out = []
    for task, row in sorted((data.get("tasks") or {}).items()):
        if "n" not in row:
            raise ZeroshotFormatError(f"{source}: task {task!r} has no item count 'n'")
        chance = row.get("chance")
        out.append(
            ZeroshotScore(
                step=int(data["step"]),
                task=task,
                language=str(row.get("language") or ""),
                acc=_number(row.get("acc")),
                acc_norm=_number(row.get("acc_norm")),
                n=int(row["n"]),
                chance=None if chance is None else float(chance),
                kind=str(row.get("kind") or ""),
            )
        )
    return out


def results_file(run_dir: str | os.PathLike, step: int) -> epath.Path:
    """Where the zero-shot results of `step` of a run are (or will be)."""
    return storage.as_path(run_dir) / ZEROSHOT_SUBDIR / f"{int(step)}.json"


def write_results_file(run_dir: str | os.PathLike, data: dict[str, Any]) -> epath.Path:
    """Writes one scored checkpoint's results (a `FORMAT` object with its `step`) atomically;
    returns the file's path."""
    parse_zeroshot(data, source="the results being written")  # never write what we can't read
    path = results_file(run_dir, data["step"])
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, ensure_ascii=False, default=str)
    storage.write_text_atomic(path, text)
    return path


def read_results_file(run_dir: str | os.PathLike, step: int) -> dict[str, Any] | None:
    """The zero-shot JSON of `step` of a run, checked (None when that step is not scored).

    Raises:
      ZeroshotFormatError: a file that is not JSON or not in `FORMAT`.
    """
    path = results_file(run_dir, step)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ZeroshotFormatError(f"{path}: not JSON ({e})") from e
    parse_zeroshot(data, source=str(path))
    return data


def scored_tasks(
    run_dir: str | os.PathLike, step: int, *, limit: int | None
) -> dict[str, dict[str, Any]] | None:
    """The tasks of `step`'s results scored at `limit` items per task (a task's own `limit`,
    written by the sweep's zero-shot stage, else the file's), task -> its row; None when the
    step has no results. A sweep stage skips these and scores the rest."""
    data = read_results_file(run_dir, step)
    if data is None:
        return None
    rows = data.get("tasks") or {}
    return {t: row for t, row in rows.items() if row.get("limit", data.get("limit")) == limit}


def read_zeroshot(run_dir: str | os.PathLike) -> list[ZeroshotScore]:
    """Every score under `run_dir/zeroshot/*.json`, by step then task (empty when none)."""
    directory = storage.as_path(run_dir) / ZEROSHOT_SUBDIR
    scores: list[ZeroshotScore] = []
    if not directory.is_dir():
        return scores
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ZeroshotFormatError(f"{path}: not JSON ({e})") from e
        scores += parse_zeroshot(data, source=str(path))
    return sorted(scores, key=lambda s: (s.step, s.task))


def latest(scores: list[ZeroshotScore]) -> list[ZeroshotScore]:
    """The scores of the latest scored step."""
    if not scores:
        return []
    last = max(s.step for s in scores)
    return [s for s in scores if s.step == last]


def from_records(records: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, float]]]:
    """`{step: {task: {metric: value}}}` from metrics.jsonl records' `zeroshot/<task>/<metric>`
    keys (the same numbers as the JSON, for readers that only have metrics)."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    for rec in records:
        for key, value in rec.items():
            if key.startswith(METRIC_PREFIX):
                task, _, metric = key[len(METRIC_PREFIX) :].rpartition("/")
                out.setdefault(int(rec["step"]), {}).setdefault(task, {})[metric] = value
    return out
