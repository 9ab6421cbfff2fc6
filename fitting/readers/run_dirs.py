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
import re
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
# What a run directory holds from its first moments (a refused or never-started attempt leaves
# only these): a subdirectory holding one of them but no run is skipped with a warning.
_ATTEMPT_NAMES = (names.LEASE_FILE, names.CONFIG_FILE, names.CHECKPOINTS_SUBDIR)


class SkippedRunError(FitInputError):
    """A run directory that cannot be fitted but need not stop the fit of the others:
    `scan_runs` skips it with a warning naming it (the fit of that one run alone still fails)."""


class NoRecordsError(SkippedRunError):
    """A run directory with nothing to fit: no metrics.jsonl and no TensorBoard event files, or
    a metrics.jsonl with no complete record. `read_runs` skips such a run with a warning."""


class EmptyRunFileError(SkippedRunError):
    """A run directory whose run.json has 0 bytes (or only whitespace), so its strategy, language
    and N are unknown. `read_runs` skips such a run with a warning."""


@dataclasses.dataclass(frozen=True)
class RunScan:
    """What `scan_runs` found under a runs directory.

    Attributes:
      runs: the runs read.
      warnings: one line per run skipped (what it lacks, a 0-byte run.json) and per thing a read
        run lost or cannot vouch for (a torn last line of metrics.jsonl, duplicated rows, no
        COMPLETED marker, records from TensorBoard events, an empty run.json), each naming the
        run.
    """

    runs: tuple[RunData, ...]
    warnings: tuple[str, ...]


def _torn_warning(run_id: str, torn: str, kept: Sequence[Mapping[str, Any]]) -> str:
    """What a torn last line of metrics.jsonl took with it, as far as its start tells."""
    step = re.search(r'"step"\s*:\s*(\d+)', torn)
    held = "a record" + (f" of step {step.group(1)}" if step else "")
    if f'"{EVAL_PREFIX}' in torn:
        held += " with evaluation values: the fits lack that evaluation"
    else:
        held += " (cut before its values: it may have held an evaluation the fits lack)"
    last = f"the last complete record is step {kept[-1]['step']}" if kept else "none is complete"
    return (
        f"run {run_id!r}: the last line of {METRICS_FILE} is torn (a job killed while writing "
        f"it) and was left out: {held}; {last}"
    )


def _deduplicated(
    run_id: str, metrics: epath.Path, found: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], str | None]:
    """`found` keeping only the last row of each step, and a warning naming the file, how many
    rows were dropped and their steps (None when no step repeats). A repeated step would
    otherwise add its evaluation to the fits twice, weighting it silently."""
    by_step: dict[Any, Mapping[str, Any]] = {}
    for rec in found:
        by_step[rec["step"]] = rec
    dropped = len(found) - len(by_step)
    if not dropped:
        return list(found), None
    seen, repeated = set(), []
    for rec in found:
        if rec["step"] in seen and rec["step"] not in repeated:
            repeated.append(rec["step"])
        seen.add(rec["step"])
    steps = ", ".join(str(s) for s in repeated[:5]) + (", ..." if len(repeated) > 5 else "")
    return list(by_step.values()), (
        f"run {run_id!r}: {metrics} holds {dropped} duplicated row{'s' if dropped > 1 else ''} "
        f"(a step logged again; step {steps}): the last row of each step was kept"
    )


def _unfinished_warning(run_id: str, path: epath.Path, found: Sequence[Mapping[str, Any]]) -> str:
    """Why a run without a COMPLETED marker is still fitted, and up to which step: its curve may
    stop short of the run's planned length (a job killed midway, or one still training)."""
    return (
        f"run {run_id!r} ({path}): no {COMPLETED_FILE} marker (the job was killed or is still "
        f"running): fitted up to its last record, step {found[-1]['step']}"
    )


def _is_empty_file(path: epath.Path) -> bool:
    """Whether a file holds nothing but whitespace (a 0-byte run.json: a write cut short)."""
    return not path.read_bytes().strip()


def read_run(path: str | os.PathLike) -> RunData:
    """Reads one run directory (local or `gs://`); falls back to TensorBoard events when
    metrics.jsonl is absent.

    What the reader leaves out (a torn last line of metrics.jsonl, all but the last row of a
    step logged twice) or cannot tell (run.json holding `{}`; no COMPLETED marker; records read
    from TensorBoard's float32 events for want of metrics.jsonl) is in the run's `warnings`.

    Raises:
      FitInputError: no run.json, unreadable JSON; `NoRecordsError` (a `SkippedRunError`):
        neither metrics.jsonl nor event files, or no complete record; `EmptyRunFileError` (a
        `SkippedRunError`): run.json has 0 bytes.
    """
    path = storage.as_path(path)
    run_id = path.name
    if not records.has_run_json(path):
        raise FitInputError(f"run {run_id!r} ({path}): no {RUN_FILE}")
    if _is_empty_file(records.run_file(path)):
        raise EmptyRunFileError(
            f"run {run_id!r}: {records.run_file(path)} is empty (0 bytes: a write cut short): "
            "its strategy, language and N are unknown"
        )
    try:
        meta = records.read_run_json(path)
    except ValueError as e:
        raise FitInputError(f"run {run_id!r}: {e}") from e
    warnings = []
    if not meta:
        warnings.append(
            f"run {run_id!r}: {RUN_FILE} is empty ({{}}): its strategy, language and N are "
            "unknown, so no law uses its records"
        )
    metrics = records.metrics_file(path)
    torn = False
    if metrics.is_file():
        # As `records.read_metrics`, but keeping what a torn last line held, for the warning.
        text = metrics.read_bytes().decode("utf-8", errors="replace")
        try:
            found, torn = records.parse_metrics(text, source=os.fspath(metrics))
        except records.MetricsFileError as e:
            raise FitInputError(f"run {run_id!r}: {METRICS_FILE} line {e.line} {e.reason}") from e
        if torn:
            warnings.append(_torn_warning(run_id, text.splitlines()[-1], found))
        found, duplicated = _deduplicated(run_id, metrics, found)
        if duplicated:
            warnings.append(duplicated)
    else:
        scalars = read_tensorboard(path)
        if not scalars:
            raise NoRecordsError(
                f"run {run_id!r} ({path}): no {METRICS_FILE} and no TensorBoard event files"
            )
        found = records_from_scalars(scalars, meta)
        warnings.append(
            f"run {run_id!r} ({path}): no {METRICS_FILE}: its records were read from TensorBoard "
            "event files, whose float32 values hold losses to about 7 significant digits"
        )
    if not found:
        why = "; ".join(w.split(": ", 1)[1] for w in warnings)
        raise NoRecordsError(
            f"run {run_id!r}: {METRICS_FILE} holds no complete records"
            + (f" ({why})" if why else "")
        )
    completed = records.read_completed(path)
    found = sorted(found, key=lambda r: r["step"])
    if completed is None and not torn:  # a torn line's warning already says the job was killed
        warnings.insert(0, _unfinished_warning(run_id, path, found))
    return RunData(run_id, path, meta, tuple(found), completed, tuple(warnings))


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
    """The runs of `scan_runs` (its warnings logged).

    Raises:
      FitInputError: as `scan_runs`.
    """
    scan = scan_runs(root, pattern=pattern, use_selection=use_selection)
    for warning in scan.warnings:
        log.warning("%s", warning)
    return list(scan.runs)


def scan_runs(
    root: str | os.PathLike, *, pattern: str = "*", use_selection: bool = True
) -> RunScan:
    """Reads every run directory directly under `root`: xlscale's (run.json) and T5X's
    (`RUN_FORMATS`; a T5X MODEL_DIR is read by `fitting.readers.t5x_runs`), mixed freely.

    A subdirectory with nothing to fit is skipped with one warning naming it and what it lacks:
    metrics.jsonl but no run.json; a 0-byte run.json; run.json but no metrics.jsonl and no
    TensorBoard event files (or no complete record); or only what an attempt leaves from its
    first moments (`LEASE`, `config.gin`, `checkpoints/`: a refused job). Other subdirectories
    (e.g. plots) are ignored. A read run's own warnings (a torn last line, duplicated rows, no
    COMPLETED marker, records from TensorBoard events, an empty run.json) are in the scan's
    warnings too. `root` may itself be a run.

    When `root` holds a sweep's `selection.json` (and `use_selection`), the candidates its
    `[[select]]` stages did not choose (the other learning rates of a grid) are skipped, with a
    log line saying how many and why, so that fits use only the selected runs.

    Raises:
      FitInputError: `root` missing or not a directory, no runs found (naming the skipped), or a
        broken run directory (unreadable run.json, a bad line of metrics.jsonl).
    """
    root = storage.as_path(root)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise FitInputError(f"runs directory {root} {what}")
    own = run_format(root)
    if own is not None:
        run = RUN_FORMATS[own].read(root)
        return RunScan((run,), run.warnings)
    runs, warnings = [], []
    rejected = rejected_runs(read_selection(root)) if use_selection else {}
    skipped = []
    for sub in sorted(p for p in root.glob(pattern) if p.is_dir()):
        fmt = run_format(sub)
        if sub.name in rejected and fmt is not None:
            skipped.append(sub.name)
        elif fmt is not None:
            try:
                run = RUN_FORMATS[fmt].read(sub)
            except SkippedRunError as e:
                warnings.append(f"{e}; skipped")
                continue
            runs.append(run)
            warnings.extend(run.warnings)
        elif (sub / METRICS_FILE).is_file():
            warnings.append(
                f"run {sub.name!r} ({sub}): {METRICS_FILE} but no {RUN_FILE} (its strategy, "
                "language and N are unknown); skipped"
            )
        elif held := [n for n in _ATTEMPT_NAMES if (sub / n).exists()]:
            warnings.append(
                f"run {sub.name!r} ({sub}): no {RUN_FILE}, no {METRICS_FILE} and no TensorBoard "
                f"event files, only {', '.join(held)} (a refused or unstarted job); skipped"
            )
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
            + "".join(f"; {w}" for w in warnings)
        )
    return RunScan(tuple(runs), tuple(warnings))


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
