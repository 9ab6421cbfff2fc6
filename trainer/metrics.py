"""Run outputs read by `fitting` and `launch`: `metrics.jsonl`, TensorBoard, `run.json`, `COMPLETED`.

`metrics.jsonl` holds one JSON object per logged step (docs/interfaces.md, "Training outputs").
Everything in it is a deterministic function of the run's configuration except the wall-clock
fields in `TIMING_FIELDS`, so an interrupted and resumed run writes the same file as an
uninterrupted one apart from those.

Also here: the progress line (loss, tokens/s, step time, MFU where the accelerator's peak is
known, ETA).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
COMPLETED_FILE = "COMPLETED"
TB_SUBDIR = "tb"
# Wall-clock fields: the only ones that differ between identical runs.
TIMING_FIELDS = ("tokens_per_s", "step_time_s")

# Dense bf16 peak FLOP/s per chip, matched as substrings of `jax.Device.device_kind` (first
# match wins, so the more specific names come first). Unknown kinds (CPUs) get no MFU.
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v6 lite", 918e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),
    ("TPU v4", 275e12),
    ("TPU v3", 123e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
)


def peak_flops_per_device(device_kind: str) -> float | None:
    """The accelerator's dense bf16 peak FLOP/s, or None when unknown."""
    for name, flops in PEAK_FLOPS:
        if name.lower() in device_kind.lower():
            return flops
    return None


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_run_json(model_dir: str | os.PathLike, info: Mapping[str, Any]) -> None:
    """Writes `run.json` (atomically)."""
    _atomic_write_text(Path(model_dir) / RUN_FILE, json.dumps(dict(info), indent=2) + "\n")


def read_run_json(model_dir: str | os.PathLike) -> dict[str, Any]:
    """Reads `run.json`."""
    return json.loads((Path(model_dir) / RUN_FILE).read_text(encoding="utf-8"))


def write_completed(model_dir: str | os.PathLike, *, step: int, tokens: int) -> None:
    """Writes the `COMPLETED` marker, last of all on success."""
    _atomic_write_text(
        Path(model_dir) / COMPLETED_FILE, json.dumps({"step": step, "tokens": tokens}) + "\n"
    )


class MetricsFileError(ValueError):
    """A line of `metrics.jsonl` other than the last is not JSON (the file was damaged)."""


def _parse_metrics(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """(records, whether the last line was torn and left out).

    A job killed while appending leaves a torn last line: it is left out. Any other line that
    does not parse means damage nobody can repair automatically.
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as e:
            if number == len(lines):
                return records, True
            raise MetricsFileError(
                f"{path}: line {number} is not a JSON record ({e}); the file was damaged "
                "other than by an interrupted write (only a torn last line is repaired)"
            ) from e
    return records, False


def read_metrics(model_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a run's `metrics.jsonl` (empty when there is none).

    A torn last line (a job killed mid-write) is left out with a warning naming the file.

    Raises:
      MetricsFileError: when another line is not JSON (naming the file and the line).
    """
    path = Path(model_dir) / METRICS_FILE
    if not path.exists():
        return []
    records, torn = _parse_metrics(path)
    if torn:
        log.warning("%s: ignoring a torn last line (a job was killed while writing it)", path)
    return records


def without_timing(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record minus its wall-clock fields (for comparing runs)."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


class MetricsWriter:
    """Appends records to `metrics.jsonl` and mirrors numeric fields to TensorBoard.

    Only the chief process (index 0) writes. On resume, `truncate_after(step)` drops records
    that were logged after the checkpoint being resumed from, so no step appears twice.
    """

    def __init__(self, model_dir: str | os.PathLike, *, is_chief: bool, tensorboard: bool = True):
        self.model_dir = Path(model_dir)
        self.is_chief = is_chief
        self._path = self.model_dir / METRICS_FILE
        self._tb = None
        if is_chief and tensorboard:
            from clu.metric_writers.summary_writer import SummaryWriter

            self._tb = SummaryWriter(os.fspath(self.model_dir / TB_SUBDIR))

    def truncate_after(self, step: int) -> None:
        """Keeps only the records with `step <= step`, and truncates a torn last line (a job
        killed mid-write) with a warning naming the file.

        Raises:
          MetricsFileError: when a line other than the last is not JSON.
        """
        if not self.is_chief or not self._path.exists():
            return
        records, torn = _parse_metrics(self._path)
        if torn:
            log.warning(
                "%s: truncating a torn last line (the previous job was killed while writing it)",
                self._path,
            )
        kept = [r for r in records if r["step"] <= step]
        _atomic_write_text(self._path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends one record (must contain `step`) and writes its scalars to TensorBoard."""
        if not self.is_chief:
            return
        with self._path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(dict(record)) + "\n")
        if self._tb is not None:
            scalars = {}
            for key, value in record.items():
                if key == "step":
                    continue
                if isinstance(value, Mapping):
                    scalars.update({f"{key}/{k}": v for k, v in value.items()})
                elif isinstance(value, int | float) and not isinstance(value, bool):
                    scalars[key] = value
            self._tb.write_scalars(int(record["step"]), scalars)
            self._tb.flush()

    def close(self) -> None:
        """Flushes and closes TensorBoard."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class StepRate:
    """Throughput between logged steps and the progress log line.

    Args:
      total_steps: steps of the whole run (for the ETA).
      tokens_per_step: tokens of one global batch (sequences × length).
      flops_per_token: model FLOPs per token (attention-inclusive) for MFU.
      num_devices: devices the step runs on.
      peak_flops: per-device peak FLOP/s, or None (no MFU).
    """

    def __init__(
        self,
        *,
        total_steps: int,
        tokens_per_step: int,
        flops_per_token: float,
        num_devices: int,
        peak_flops: float | None,
    ):
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.num_devices = num_devices
        self.peak_flops = peak_flops
        self._last_step: int | None = None
        self._last_time = 0.0

    def start(self, step: int) -> None:
        """Marks the time and step from which the next throughput is measured."""
        self._last_step, self._last_time = step, time.perf_counter()

    def timing(self, step: int) -> dict[str, float]:
        """Wall-clock fields for a record at `step` (since the previous call or `start`)."""
        now = time.perf_counter()
        steps = step - (self._last_step if self._last_step is not None else step)
        elapsed = now - self._last_time
        self._last_step, self._last_time = step, now
        if steps <= 0 or elapsed <= 0:
            return {}
        step_time = elapsed / steps
        return {"tokens_per_s": self.tokens_per_step / step_time, "step_time_s": step_time}

    def log_line(self, step: int, *, loss: float, learning_rate: float, timing: Mapping) -> str:
        """Formats (and logs) the progress line for `step`."""
        parts = [f"step {step}/{self.total_steps}", f"loss {loss:.4f}", f"lr {learning_rate:.3g}"]
        if timing:
            step_time = timing["step_time_s"]
            parts += [f"{timing['tokens_per_s']:,.0f} tok/s", f"{step_time * 1e3:.1f} ms/step"]
            if self.peak_flops:
                achieved = timing["tokens_per_s"] * self.flops_per_token
                parts.append(f"MFU {achieved / (self.peak_flops * self.num_devices):.1%}")
            eta = step_time * max(0, self.total_steps - step)
            parts.append(f"ETA {_duration(eta)}")
        line = " | ".join(parts)
        log.info("%s", line)
        return line


def _duration(seconds: float) -> str:
    """`1h02m`, `3m05s` or `12s`."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def component_counts(names: Sequence[str], counts: Sequence[int]) -> dict[str, int]:
    """`{component: tokens}` in component order."""
    return {name: int(count) for name, count in zip(names, counts, strict=True)}


class Counters:
    """Host-side cumulative counters and the current logging window (checkpointed as JSON).

    Per-step metrics stay on the device until a logging or checkpoint step fetches them, so the
    host never waits for a step it does not need to look at.

    Only applied updates count: a step whose update was skipped as non-finite adds no tokens (its
    batch trained nothing) and no loss; it is counted in `skipped` (`train/skipped_updates` in
    records) and listed in `nonfinite` until the loop has dealt with it.
    """

    def __init__(
        self,
        components: Sequence[str],
        saved: dict | None = None,
        *,
        tokens_paper_per_step: int | None = None,
    ):
        saved = saved or {}
        self.components = list(components)
        # Paper tokens of one applied step (`trainer.paper_units`); None: no `tokens_paper`.
        self.tokens_paper_per_step = tokens_paper_per_step
        self.tokens = int(saved.get("tokens", 0))
        # Encoder-decoder runs also count non-padding encoder tokens (None: a decoder-only run).
        self.input_tokens = saved.get("input_tokens")
        self.by_task = [int(saved.get("tokens_by_task", {}).get(c, 0)) for c in components]
        self.skipped = int(saved.get("skipped", 0))  # saved from `TrainState.skipped`
        window = saved.get("window", {})
        self.loss_sum = float(window.get("loss_sum", 0.0))
        self.z_loss_sum = float(window.get("z_loss_sum", 0.0))
        self.weight_sum = float(window.get("weight_sum", 0.0))
        self.last = dict(window.get("last", {}))
        # (step, metrics) of skipped steps not yet reported by the loop.
        self.nonfinite: list[tuple[int, dict]] = []

    def absorb(self, pending: list[tuple[int, dict]]) -> None:
        """Adds fetched per-step metrics (`(step, metrics)` in step order)."""
        for step, m in pending:
            if not bool(m["finite"]):
                self.skipped += 1
                self.nonfinite.append((step, m))
                continue
            counts = np.asarray(m["tokens_by_task"]).astype(np.int64)
            self.by_task = [a + int(b) for a, b in zip(self.by_task, counts, strict=True)]
            self.tokens += int(counts.sum())
            if "input_tokens" in m:
                self.input_tokens = int(self.input_tokens or 0) + int(m["input_tokens"])
            self.loss_sum += float(m["loss_sum"])
            self.z_loss_sum += float(m["z_loss_sum"])
            self.weight_sum += float(m["weight_sum"])
            self.last = {
                "learning_rate": float(m["learning_rate"]),
                "grad_norm": float(m["grad_norm"]),
            }

    def to_json(self) -> dict:
        """State to checkpoint."""
        extra = {} if self.input_tokens is None else {"input_tokens": self.input_tokens}
        return {
            "tokens": self.tokens,
            **extra,
            "tokens_by_task": component_counts(self.components, self.by_task),
            "window": {
                "loss_sum": self.loss_sum,
                "z_loss_sum": self.z_loss_sum,
                "weight_sum": self.weight_sum,
                "last": self.last,
            },
        }

    def record(self, step: int, *, flops_per_token: float, flops_per_token_attn: float) -> dict:
        """The deterministic part of a `metrics.jsonl` record; starts a new window.

        `tokens_paper` (when the counters know `tokens_paper_per_step`) is the papers' count of
        the data seen so far, applied steps × batch × row length (`trainer.paper_units`), beside
        the real `tokens`."""
        denom = max(self.weight_sum, 1.0)
        paper = self.tokens_paper_per_step
        record = {
            "step": step,
            "tokens": self.tokens,
            **({} if paper is None else {"tokens_paper": (step - self.skipped) * int(paper)}),
            **({} if self.input_tokens is None else {"input_tokens": self.input_tokens}),
            "tokens_by_task": component_counts(self.components, self.by_task),
            "flops": flops_per_token * self.tokens,
            "flops_attn": flops_per_token_attn * self.tokens,
            "learning_rate": self.last.get("learning_rate", 0.0),
            "train/grad_norm": self.last.get("grad_norm", 0.0),
            "train/skipped_updates": self.skipped,
        }
        if self.weight_sum:  # no applied step since the last record (or step 0): no loss
            record["train/loss"] = self.loss_sum / denom
        if self.z_loss_sum:
            record["train/z_loss"] = self.z_loss_sum / denom
        self.loss_sum = self.z_loss_sum = self.weight_sum = 0.0
        return record
