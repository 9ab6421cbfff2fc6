"""TensorBoard event files read without TensorFlow: the TFRecord framing is parsed here and the
records are decoded with TensorBoard's protobuf classes (our trainer's `tb/` and T5X's layouts)."""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from etils import epath

from fitting.readers.run_data import EVAL_PREFIX
from rundir import run_record, storage

_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64 = 1, 2, 3, 9
_TENSOR_FORMATS = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q"}


def read_tensorboard(path: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Scalar summaries of every event file under `path`: tag → [(step, value)] by step.

    Layouts: our trainer's `MODEL_DIR/tb/` (tags already `eval/<task>/loss`), and T5X's
    `MODEL_DIR/train/`, `MODEL_DIR/training_eval/<task>/` (a tag `loss` under
    training_eval/<task> becomes `eval/<task>/loss`) and `MODEL_DIR/inference_eval/<task>/`
    (seqio's `eval/bleu` there becomes `eval/<task>/bleu`). The tags stay T5X's own here;
    `fitting.readers.t5x_runs` maps them onto xlscale's. A truncated final record is ignored.
    """
    from tensorboard.compat.proto import event_pb2

    path = storage.as_path(path)
    out: dict[str, dict[int, float]] = {}
    files = storage.list_files(path) if path.is_dir() else []
    for file in (f for f in files if f.name.startswith("events.out.tfevents.")):
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


def _tag_prefix(rel: epath.Path) -> str:
    parts = rel.parts[:-1]
    for i, part in enumerate(parts):
        if part in ("training_eval", "inference_eval") and i + 1 < len(parts):
            return f"{EVAL_PREFIX}{parts[i + 1]}/"
    return ""


def _tfrecords(file: epath.Path) -> Iterable[bytes]:
    """Payloads of a TFRecord file (length, length-CRC, payload, payload-CRC framing)."""
    with file.open("rb") as f:
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
    scalars: Mapping[str, Sequence[tuple[int, float]]],
    meta: run_record.RunRecord | Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Regroups TensorBoard scalars by step into metrics.jsonl-like records.

    Token and FLOP counts missing from the events are derived from run.json (tokens = step ×
    batch_size × seq_len, flops = flops_per_token × tokens), as T5X does not log them.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for tag, points in scalars.items():
        for step, value in points:
            by_step.setdefault(int(step), {"step": int(step)})[tag] = value
    info = run_record.RunRecord.of(meta)
    per_step = None
    if info.batch_size and info.seq_len:
        per_step = float(info.batch_size) * float(info.seq_len)
    for rec in by_step.values():
        if "tokens" not in rec and per_step is not None:
            rec["tokens"] = rec["step"] * per_step
        if "flops" not in rec and "tokens" in rec and info.flops_per_token:
            rec["flops"] = float(info.flops_per_token) * rec["tokens"]
    return [by_step[s] for s in sorted(by_step)]
