"""The run directory's records: `run.json`, `COMPLETED` and `metrics.jsonl`, read and written here.

`metrics.jsonl` holds one JSON object per logged step (docs/interfaces.md, "Training outputs").
Everything in it is a deterministic function of the run's configuration except the wall-clock
fields in `TIMING_FIELDS`, so an interrupted and resumed run writes the same file as an
uninterrupted one apart from those. A job killed while appending leaves a torn last line: readers
leave it out (with a warning) and the next writer cuts it; any other line that does not parse is
damage nobody can repair automatically (`MetricsFileError`, naming the file and line).

Every function takes a local path or a URL (`gs://...`) through `rundir.storage`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from etils import epath

from rundir import names, run_record, storage

log = logging.getLogger(__name__)

# Wall-clock fields: the only ones that differ between identical runs.
TIMING_FIELDS = ("tokens_per_s", "step_time_s")
ZEROSHOT_PREFIX = "zeroshot/"  # metrics.jsonl keys of zero-shot records: zeroshot/<task>/<metric>
_TAIL_BYTES = 65536


class MetricsFileError(ValueError):
    """A line of `metrics.jsonl` other than the last is not a JSON record (the file was damaged).

    Attributes:
      line: the line's number (from 1).
      reason: what is wrong with it.
    """

    def __init__(self, message: str, *, line: int, reason: str):
        super().__init__(message)
        self.line, self.reason = line, reason


def _read_text(path: epath.Path) -> str:
    """A text file's contents; bytes that are not UTF-8 (a torn multi-byte character) are
    replaced rather than failing the read."""
    return path.read_bytes().decode("utf-8", errors="replace")


def run_file(model_dir: str | os.PathLike) -> epath.Path:
    """Where a run's `run.json` is."""
    return storage.as_path(model_dir) / names.RUN_FILE


def has_run_json(model_dir: str | os.PathLike) -> bool:
    """Whether the directory holds a `run.json` (is an xlscale run)."""
    return run_file(model_dir).is_file()


def write_run_json(model_dir: str | os.PathLike, info: Mapping[str, Any]) -> None:
    """Writes `run.json` atomically (one writer per run: the lease holder, process 0)."""
    storage.write_text_atomic(run_file(model_dir), json.dumps(dict(info), indent=2) + "\n")


def read_run_json(model_dir: str | os.PathLike) -> dict[str, Any]:
    """Reads `run.json`.

    Raises:
      FileNotFoundError: there is none.
      ValueError: it is not a JSON object (naming the file).
    """
    path = run_file(model_dir)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{names.RUN_FILE} is not valid JSON ({e}); file {path}") from e
    if not isinstance(info, dict):
        raise ValueError(f"{names.RUN_FILE} must hold a JSON object; file {path}")
    return info


def read_run_record(model_dir: str | os.PathLike) -> run_record.RunRecord:
    """Reads `run.json` as a typed record (`rundir.run_record.RunRecord`).

    Raises:
      FileNotFoundError: there is none.
      ValueError: it is not a JSON object (naming the file).
    """
    return run_record.RunRecord.from_json(read_run_json(model_dir))


def write_completed(model_dir: str | os.PathLike, *, step: int, tokens: int) -> None:
    """Writes the `COMPLETED` marker, last of all on success."""
    storage.write_text_atomic(
        storage.as_path(model_dir) / names.COMPLETED_FILE,
        json.dumps({"step": int(step), "tokens": int(tokens)}) + "\n",
    )


def read_completed(model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The `COMPLETED` marker's contents (`{}` when unreadable), or None when the run has none."""
    path = storage.as_path(model_dir) / names.COMPLETED_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def metrics_file(model_dir: str | os.PathLike) -> epath.Path:
    """Where a run's `metrics.jsonl` is."""
    return storage.as_path(model_dir) / names.METRICS_FILE


def parse_metrics(text: str, *, source: str) -> tuple[list[dict[str, Any]], bool]:
    """(records, whether a torn last line was left out) of `metrics.jsonl`'s text.

    Raises:
      MetricsFileError: a line other than the last is not a JSON object with a `step`, naming
        `source` and the line.
    """
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            if number == len(lines):
                return records, True
            raise MetricsFileError(
                f"{source}: line {number} is not a JSON record ({e}); the file was damaged "
                "other than by an interrupted write (only a torn last line is repaired)",
                line=number,
                reason=f"is not JSON ({e})",
            ) from e
        if not isinstance(record, dict) or "step" not in record:
            raise MetricsFileError(
                f"{source}: line {number} is not a record with a 'step'",
                line=number,
                reason="has no 'step'",
            )
        records.append(record)
    return records, False


def read_metrics(model_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a run's `metrics.jsonl` (empty when there is none); a torn last line (a job
    killed mid-write, or one writing right now) is left out with a warning naming the file.

    Raises:
      MetricsFileError: another line is not a record (naming the file and the line).
    """
    path = metrics_file(model_dir)
    try:
        text = _read_text(path)
    except FileNotFoundError:
        return []
    records, torn = parse_metrics(text, source=os.fspath(path))
    if torn:
        log.warning("%s: ignoring a torn last line (a job was killed while writing it)", path)
    return records


def last_metrics(model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The last complete training record of a run (reading only the file's tail); records that
    hold only zero-shot scores (appended by `xlscale zeroshot`) are passed over. None when there
    is none or the file cannot be read."""
    try:
        with metrics_file(model_dir).open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written, or the cut first line of the tail
        if isinstance(record, dict) and any(
            k != "step" and not k.startswith(ZEROSHOT_PREFIX) for k in record
        ):
            return record
    return None


def append_metrics(model_dir: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Appends one record (must contain `step`) as one line."""
    storage.append_text(metrics_file(model_dir), json.dumps(dict(record)) + "\n")


def truncate_metrics_after(model_dir: str | os.PathLike, step: int) -> None:
    """Keeps only the records with `step <= step` (a resume from the checkpoint of `step` logs the
    later ones again), cutting a torn last line with a warning naming the file.

    Raises:
      MetricsFileError: a line other than the last is not a record.
    """
    path = metrics_file(model_dir)
    try:
        text = _read_text(path)
    except FileNotFoundError:
        return
    records, torn = parse_metrics(text, source=os.fspath(path))
    if torn:
        log.warning(
            "%s: truncating a torn last line (the previous job was killed while writing it)", path
        )
    kept = [r for r in records if r["step"] <= step]
    if torn or len(kept) != len(records):
        storage.write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


def without_timing(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record minus its wall-clock fields (for comparing runs)."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


def write_run(
    model_dir: str | os.PathLike,
    *,
    info: Mapping[str, Any],
    records: list[Mapping[str, Any]],
    completed: bool = True,
) -> epath.Path:
    """Writes a whole run directory at once: `run.json`, `metrics.jsonl` and (when `completed`)
    `COMPLETED` from the last record. For runs that are not trained step by step (the synthetic
    studies `fitting.synthetic` and `studies.paper_study` write from the papers' laws), so that
    they have exactly the trainer's format."""
    path = storage.as_path(model_dir)
    path.mkdir(parents=True, exist_ok=True)
    write_run_json(path, info)
    storage.write_text_atomic(
        metrics_file(path), "".join(json.dumps(dict(r)) + "\n" for r in records)
    )
    if completed and records:
        write_completed(path, step=records[-1]["step"], tokens=records[-1].get("tokens", 0))
    return path
