"""Readers of training outputs: run directories (`run.json` + `metrics.jsonl`) and TensorBoard events.

The run format is the contract of docs/interfaces.md ("Training outputs"); nothing else is needed
to fit. `read_runs` reads a directory of runs (less the runs a sweep's `[[select]]` stage
rejected, see `fitting.readers.rejected_runs`), `tidy` flattens them into one row per run ×
evaluation, and `read_tensorboard` reads scalar summaries from event files (T5X's own layout
included) without TensorFlow: the TFRecord framing is parsed here and the records are decoded with
TensorBoard's protobuf classes. Every error names the run (and line or step) at fault.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from fitting.checks import FitInputError
from fitting.formats import num
from fitting.readers import t5x_runs
from fitting.readers.event_files import read_tensorboard, records_from_scalars
from fitting.readers.rejected_runs import read_selection, rejected_runs
from fitting.readers.run_data import EVAL_PREFIX, RunData
from rundir import names, records, storage

RUN_FILE = names.RUN_FILE
METRICS_FILE = names.METRICS_FILE
COMPLETED_FILE = names.COMPLETED_FILE
log = logging.getLogger(__name__)


def read_run(path: str | os.PathLike) -> RunData:
    """Reads one run directory (local or `gs://`); falls back to TensorBoard events when
    metrics.jsonl is absent.

    Raises:
      FitInputError: no run.json, unreadable JSON, or neither metrics.jsonl nor event files.
    """
    path = storage.as_path(path)
    run_id = path.name
    if not records.has_run_json(path):
        raise FitInputError(f"run {run_id!r} ({path}): no {RUN_FILE}")
    try:
        meta = records.read_run_json(path)
    except ValueError as e:
        raise FitInputError(f"run {run_id!r}: {e}") from e
    if records.metrics_file(path).is_file():
        try:
            found = records.read_metrics(path)
        except records.MetricsFileError as e:
            raise FitInputError(f"run {run_id!r}: {METRICS_FILE} line {e.line} {e.reason}") from e
    else:
        scalars = read_tensorboard(path)
        if not scalars:
            raise FitInputError(
                f"run {run_id!r} ({path}): no {METRICS_FILE} and no TensorBoard event files"
            )
        found = records_from_scalars(scalars, meta)
    if not found:
        raise FitInputError(f"run {run_id!r}: {METRICS_FILE} holds no records")
    completed = records.read_completed(path)
    found = sorted(found, key=lambda r: r["step"])
    return RunData(run_id, path, meta, tuple(found), completed)


def _is_xlscale_run(path: epath.Path) -> bool:
    return records.has_run_json(path)


def _is_t5x_run(path: epath.Path) -> bool:
    return not records.has_run_json(path) and t5x_runs.is_t5x_run(path)


@dataclasses.dataclass(frozen=True)
class RunFormat:
    """A kind of run directory `read_runs` recognises: `detect(path)` says whether a directory is
    one, `read(path)` reads it."""

    detect: Callable[[epath.Path], bool]
    read: Callable[[epath.Path], RunData]


# Run-directory formats, tried in order: xlscale's (run.json) and T5X's MODEL_DIR (config.gin +
# summaries or checkpoint_<step>/, `fitting.readers.t5x_runs`).
RUN_FORMATS: Mapping[str, RunFormat] = {
    "xlscale": RunFormat(_is_xlscale_run, read_run),
    "t5x": RunFormat(_is_t5x_run, t5x_runs.read_t5x_run),
}


def run_format(path: epath.Path) -> str | None:
    """The `RUN_FORMATS` name of a run directory, or None for any other directory."""
    for name, fmt in RUN_FORMATS.items():
        if fmt.detect(path):
            return name
    return None


def read_runs(
    root: str | os.PathLike, *, pattern: str = "*", use_selection: bool = True
) -> list[RunData]:
    """Reads every run directory directly under `root`: xlscale's (run.json) and T5X's
    (`RUN_FORMATS`; a T5X MODEL_DIR is read by `fitting.readers.t5x_runs`), mixed freely.

    A subdirectory with metrics.jsonl but no run.json, or with run.json but no metrics, is an error
    naming it; other subdirectories (e.g. plots) are ignored. `root` may itself be a run.

    When `root` holds a sweep's `selection.json` (and `use_selection`), the candidates its
    `[[select]]` stages did not choose (the other learning rates of a grid) are skipped, with a
    log line saying how many and why, so that fits use only the selected runs.

    Raises:
      FitInputError: `root` missing, no runs found, or a broken run directory.
    """
    root = storage.as_path(root)
    if not root.is_dir():
        raise FitInputError(f"runs directory {root} does not exist")
    own = run_format(root)
    if own is not None:
        return [RUN_FORMATS[own].read(root)]
    runs = []
    rejected = rejected_runs(read_selection(root)) if use_selection else {}
    skipped = []
    for sub in sorted(p for p in root.glob(pattern) if p.is_dir()):
        fmt = run_format(sub)
        if sub.name in rejected and fmt is not None:
            skipped.append(sub.name)
        elif fmt is not None:
            runs.append(RUN_FORMATS[fmt].read(sub))
        elif (sub / METRICS_FILE).is_file():
            raise FitInputError(f"run {sub.name!r} ({sub}): {METRICS_FILE} but no {RUN_FILE}")
    if skipped:
        log.warning(
            "%s: skipping %d runs that selection.json did not choose (e.g. %s: %s)",
            root,
            len(skipped),
            skipped[0],
            rejected[skipped[0]],
        )
    if not runs:
        raise FitInputError(
            f"no run directories (with {RUN_FILE}, or T5X's config.gin and summaries) under {root}"
        )
    return runs


def tidy(runs: Iterable[RunData]) -> list[dict[str, Any]]:
    """One row per run × evaluation step, with everything the fits need.

    Row keys: run_id, strategy, family, model, language, source_lang, replay_ratio, n_params
    (non-embedding), n_params_total, step, tokens, tokens_by_task, flops, losses (task → loss),
    scores (task/metric → value, e.g. mt_en_fr/bleu), init_checkpoint, init_step, completed.
    """
    rows = []
    for run in runs:
        info = run.info
        for rec in run.evals():
            losses, scores = {}, {}
            for key, value in rec.items():
                if not key.startswith(EVAL_PREFIX):
                    continue
                parts = key[len(EVAL_PREFIX) :].rsplit("/", 1)
                if len(parts) != 2 or parts[1] == "tokens":
                    continue
                task, metric = parts
                if metric == "loss":
                    losses[task] = num(value)
                else:
                    scores[f"{task}/{metric}"] = num(value)
            rows.append(
                {
                    "run_id": run.run_id,
                    "strategy": run.strategy,
                    "family": info.family,
                    "model": info.model,
                    "language": run.target_lang,
                    "source_lang": info.source_lang,
                    "replay_ratio": num(info.replay_ratio or 0.0),
                    "n_params": num(info.params_non_embedding),
                    "n_params_total": num(info.params_total),
                    "step": int(rec["step"]),
                    "tokens": num(rec.get("tokens")),
                    "tokens_by_task": dict(rec.get("tokens_by_task") or {}),
                    "flops": num(rec.get("flops")),
                    "losses": losses,
                    "scores": scores,
                    "init_checkpoint": info.init_checkpoint,
                    "init_step": info.init_step,
                    "completed": run.completed is not None,
                }
            )
    return rows


def column(rows: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    """One column of a tidy table as a numpy array."""
    return np.asarray([r[key] for r in rows])
