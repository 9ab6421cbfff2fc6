"""Readers of training outputs: run directories (`run.json` + `metrics.jsonl`) and TensorBoard events.

The run format is the contract of docs/interfaces.md ("Training outputs"); nothing else is needed
to fit. `read_runs` reads a directory of runs (less the runs a sweep's `[[select]]` stage
rejected, see `fitting.selection`), `tidy` flattens them into one row per run ×
evaluation, and `read_tensorboard` reads scalar summaries from event files (T5X's own layout
included) without TensorFlow: the TFRecord framing is parsed here and the records are decoded with
TensorBoard's protobuf classes. Every error names the run (and line or step) at fault.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.checks import FitInputError
from fitting.formats import num
from fitting.selection import read_selection, rejected_runs

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
COMPLETED_FILE = "COMPLETED"
EVAL_PREFIX = "eval/"
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One training run as written by the trainer.

    Attributes:
      run_id: the directory name.
      path: the run directory.
      meta: the contents of run.json.
      records: metrics.jsonl objects (or TensorBoard scalars regrouped by step), by step.
      completed: the COMPLETED marker's contents, or None for a run still going (or failed).
    """

    run_id: str
    path: Path
    meta: dict[str, Any]
    records: tuple[dict[str, Any], ...]
    completed: dict[str, Any] | None = None

    @property
    def strategy(self) -> str:
        """source, scratch, cpt, cpt_replay, pretrain, finetune or finetune_scratch."""
        return str(self.meta.get("strategy", ""))

    @property
    def target_lang(self) -> str:
        """Language the run is trained for (for a source run: its only language)."""
        lang = self.meta.get("target_lang") or self.meta.get("source_lang")
        if not lang and self.meta.get("languages"):
            lang = self.meta["languages"][0]
        return str(lang or "")

    def evals(self) -> list[dict[str, Any]]:
        """Records that carry at least one eval/ value."""
        return [r for r in self.records if any(k.startswith(EVAL_PREFIX) for k in r)]


def read_run(path: str | Path) -> RunRecord:
    """Reads one run directory; falls back to TensorBoard events when metrics.jsonl is absent.

    Raises:
      FitInputError: no run.json, unreadable JSON, or neither metrics.jsonl nor event files.
    """
    path = Path(path)
    run_id = path.name
    run_file = path / RUN_FILE
    if not run_file.is_file():
        raise FitInputError(f"run {run_id!r} ({path}): no {RUN_FILE}")
    try:
        meta = json.loads(run_file.read_text())
    except json.JSONDecodeError as e:
        raise FitInputError(f"run {run_id!r}: {RUN_FILE} is not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise FitInputError(f"run {run_id!r}: {RUN_FILE} must hold a JSON object")
    metrics = path / METRICS_FILE
    if metrics.is_file():
        records = _read_jsonl(metrics, run_id)
    else:
        scalars = read_tensorboard(path)
        if not scalars:
            raise FitInputError(
                f"run {run_id!r} ({path}): no {METRICS_FILE} and no TensorBoard event files"
            )
        records = records_from_scalars(scalars, meta)
    if not records:
        raise FitInputError(f"run {run_id!r}: {METRICS_FILE} holds no records")
    completed = None
    marker = path / COMPLETED_FILE
    if marker.is_file():
        try:
            completed = json.loads(marker.read_text() or "{}")
        except json.JSONDecodeError:
            completed = {}
    records = sorted(records, key=lambda r: r["step"])
    return RunRecord(run_id, path, meta, tuple(records), completed)


def _read_jsonl(path: Path, run_id: str) -> list[dict[str, Any]]:
    """Parses metrics.jsonl; a truncated last line (a run still writing) is dropped."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) and not text.endswith("\n"):
                break
            raise FitInputError(f"run {run_id!r}: {METRICS_FILE} line {i} is not JSON ({e})") from e
        if not isinstance(obj, dict) or "step" not in obj:
            raise FitInputError(f"run {run_id!r}: {METRICS_FILE} line {i} has no 'step'")
        out.append(obj)
    return out


def _is_xlscale_run(path: Path) -> bool:
    return (path / RUN_FILE).is_file()


def _is_t5x_run(path: Path) -> bool:
    from fitting import t5x_runs

    return not (path / RUN_FILE).is_file() and t5x_runs.is_t5x_run(path)


def _read_t5x_run(path: Path) -> RunRecord:
    from fitting import t5x_runs

    return t5x_runs.read_t5x_run(path)


@dataclasses.dataclass(frozen=True)
class RunFormat:
    """A kind of run directory `read_runs` recognises: `detect(path)` says whether a directory is
    one, `read(path)` reads it (`fitting.t5x_runs` is imported only when a T5X run is met)."""

    detect: Callable[[Path], bool]
    read: Callable[[Path], RunRecord]


# Run-directory formats, tried in order: xlscale's (run.json) and T5X's MODEL_DIR (config.gin +
# summaries or checkpoint_<step>/, `fitting.t5x_runs`).
RUN_FORMATS: Mapping[str, RunFormat] = {
    "xlscale": RunFormat(_is_xlscale_run, read_run),
    "t5x": RunFormat(_is_t5x_run, _read_t5x_run),
}


def run_format(path: Path) -> str | None:
    """The `RUN_FORMATS` name of a run directory, or None for any other directory."""
    for name, fmt in RUN_FORMATS.items():
        if fmt.detect(path):
            return name
    return None


def read_runs(
    root: str | Path, *, pattern: str = "*", use_selection: bool = True
) -> list[RunRecord]:
    """Reads every run directory directly under `root`: xlscale's (run.json) and T5X's
    (`RUN_FORMATS`; a T5X MODEL_DIR is read by `fitting.t5x_runs`), mixed freely.

    A subdirectory with metrics.jsonl but no run.json, or with run.json but no metrics, is an error
    naming it; other subdirectories (e.g. plots) are ignored. `root` may itself be a run.

    When `root` holds a sweep's `selection.json` (and `use_selection`), the candidates its
    `[[select]]` stages did not choose (the other learning rates of a grid) are skipped, with a
    log line saying how many and why, so that fits use only the selected runs.

    Raises:
      FitInputError: `root` missing, no runs found, or a broken run directory.
    """
    root = Path(root)
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


def tidy(runs: Iterable[RunRecord]) -> list[dict[str, Any]]:
    """One row per run × evaluation step, with everything the fits need.

    Row keys: run_id, strategy, family, model, language, source_lang, replay_ratio, n_params
    (non-embedding), n_params_total, step, tokens, tokens_by_task, flops, losses (task → loss),
    scores (task/metric → value, e.g. mt_en_fr/bleu), init_checkpoint, init_step, completed.
    """
    rows = []
    for run in runs:
        m = run.meta
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
                    "family": m.get("family"),
                    "model": m.get("model"),
                    "language": run.target_lang,
                    "source_lang": m.get("source_lang"),
                    "replay_ratio": num(m.get("replay_ratio", 0.0) or 0.0),
                    "n_params": num(m.get("params_non_embedding")),
                    "n_params_total": num(m.get("params_total")),
                    "step": int(rec["step"]),
                    "tokens": num(rec.get("tokens")),
                    "tokens_by_task": dict(rec.get("tokens_by_task") or {}),
                    "flops": num(rec.get("flops")),
                    "losses": losses,
                    "scores": scores,
                    "init_checkpoint": m.get("init_checkpoint"),
                    "init_step": m.get("init_step"),
                    "completed": run.completed is not None,
                }
            )
    return rows


def column(rows: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    """One column of a tidy table as a numpy array."""
    return np.asarray([r[key] for r in rows])


# --- TensorBoard event files -------------------------------------------------------------------

_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64 = 1, 2, 3, 9
_TENSOR_FORMATS = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q"}


def read_tensorboard(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Scalar summaries of every event file under `path`: tag → [(step, value)] by step.

    Layouts: our trainer's `MODEL_DIR/tb/` (tags already `eval/<task>/loss`), and T5X's
    `MODEL_DIR/train/`, `MODEL_DIR/training_eval/<task>/` (a tag `loss` under
    training_eval/<task> becomes `eval/<task>/loss`) and `MODEL_DIR/inference_eval/<task>/`
    (seqio's `eval/bleu` there becomes `eval/<task>/bleu`). The tags stay T5X's own here;
    `fitting.t5x_runs` maps them onto xlscale's. A truncated final record is ignored.
    """
    from tensorboard.compat.proto import event_pb2

    path = Path(path)
    out: dict[str, dict[int, float]] = {}
    for file in sorted(path.rglob("events.out.tfevents.*")):
        prefix = _tag_prefix(file.relative_to(path))
        for record in _tfrecords(file):
            event = event_pb2.Event.FromString(record)
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                scalar = _scalar(value)
                if scalar is None:
                    continue
                tag = value.tag
                if prefix and tag.startswith(EVAL_PREFIX):  # seqio's `eval/<metric>` per task
                    tag = tag[len(EVAL_PREFIX) :]
                tag = tag if tag.startswith(EVAL_PREFIX) else prefix + tag
                out.setdefault(tag, {})[int(event.step)] = scalar
    return {tag: sorted(points.items()) for tag, points in out.items()}


def _tag_prefix(rel: Path) -> str:
    parts = rel.parts[:-1]
    for i, part in enumerate(parts):
        if part in ("training_eval", "inference_eval") and i + 1 < len(parts):
            return f"{EVAL_PREFIX}{parts[i + 1]}/"
    return ""


def _tfrecords(file: Path) -> Iterable[bytes]:
    """Payloads of a TFRecord file (length, length-CRC, payload, payload-CRC framing)."""
    with open(file, "rb") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length)
            if len(data) < length or len(f.read(4)) < 4:
                return
            yield data


def _scalar(value: Any) -> float | None:
    """The float of a scalar summary value (TF1 simple_value or a TF2 rank-0 tensor)."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if not value.HasField("tensor"):
        return None
    t = value.tensor
    if t.tensor_shape.dim and math.prod(d.size for d in t.tensor_shape.dim) != 1:
        return None
    fmt = _TENSOR_FORMATS.get(t.dtype)
    if fmt is None:
        return None
    if t.tensor_content:
        return float(struct.unpack(fmt, t.tensor_content[: struct.calcsize(fmt)])[0])
    for field in ("float_val", "double_val", "int_val", "int64_val"):
        vals = getattr(t, field)
        if len(vals):
            return float(vals[0])
    return None


def records_from_scalars(
    scalars: Mapping[str, Sequence[tuple[int, float]]], meta: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Regroups TensorBoard scalars by step into metrics.jsonl-like records.

    Token and FLOP counts missing from the events are derived from run.json (tokens = step ×
    batch_size × seq_len, flops = flops_per_token × tokens), as T5X does not log them.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for tag, points in scalars.items():
        for step, value in points:
            by_step.setdefault(int(step), {"step": int(step)})[tag] = value
    per_step = None
    if meta.get("batch_size") and meta.get("seq_len"):
        per_step = float(meta["batch_size"]) * float(meta["seq_len"])
    for rec in by_step.values():
        if "tokens" not in rec and per_step is not None:
            rec["tokens"] = rec["step"] * per_step
        if "flops" not in rec and "tokens" in rec and meta.get("flops_per_token"):
            rec["flops"] = float(meta["flops_per_token"]) * rec["tokens"]
    return [by_step[s] for s in sorted(by_step)]
