"""The trainer's side of the run records: the `metrics.jsonl` writer (mirrored to TensorBoard),
the host-side counters behind each record, and the progress line (loss, tokens/s, step time, MFU
where the accelerator's peak is known, ETA).

The records' format, names and readers are `rundir.records`' (docs/interfaces.md, "Training
outputs").
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from rundir import durations, names, records, storage

log = logging.getLogger(__name__)

_TB_SYNC_S = 60.0  # a remote run's TensorBoard events are copied into MODEL_DIR at most this often

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


def _tb_not_writable(model_dir, tb_dir, error: Exception) -> Exception:
    """TensorFlow's error about the events directory as one line naming it and `MODEL_DIR`."""
    from rundir.lease import ModelDirNotWritableError

    text = re.sub(r"\{\{.*?\}\}\s*", "", getattr(error, "message", None) or str(error))
    text = text.split("[Op:")[0].strip() or type(error).__name__
    return ModelDirNotWritableError(
        f"MODEL_DIR {model_dir}: cannot write TensorBoard events into {tb_dir} ({text}); make "
        "that directory writable (or remove it: it holds only TensorBoard's copy of "
        "metrics.jsonl), or set --gin.MODEL_DIR to a writable directory"
    )


def _check_tb_dir(model_dir: epath.Path) -> None:
    """Refuses, creating nothing, a local `tb/` that the first record could not write into: one
    that is not a directory, or not writable."""
    tb_dir = model_dir / names.TB_SUBDIR
    if not tb_dir.exists():
        return
    if not tb_dir.is_dir():
        why = "not a directory"
    elif not os.access(os.fspath(tb_dir), os.W_OK | os.X_OK):
        why = "permission denied"
    else:
        return
    raise _tb_not_writable(model_dir, tb_dir, OSError(why))


class MetricsWriter:
    """Appends records to `metrics.jsonl` and mirrors numeric fields to TensorBoard.

    Only the chief process (index 0) writes. On resume, `truncate_after(step)` drops records
    that were logged after the checkpoint being resumed from, so no step appears twice.

    TensorBoard's writer speaks only local disk here (TensorFlow's own GCS client would bypass
    the project's storage layer), so a run on object storage writes its event files into a local
    staging directory and copies them to `MODEL_DIR/tb/` at most every minute and on `close()`.
    """

    def __init__(self, model_dir: str | os.PathLike, *, is_chief: bool, tensorboard: bool = True):
        self.model_dir = storage.as_path(model_dir, name="MODEL_DIR")
        self.is_chief = is_chief
        self._tb = None
        self._tb_remote: epath.Path | None = None
        self._tb_synced = 0.0
        # TensorBoard's events file (and `tb/`) appears with the first record, not before: a run
        # refused or diverged before it logs anything leaves no events file behind.
        self._tensorboard = is_chief and tensorboard
        if self._tensorboard and not storage.is_remote(self.model_dir):
            _check_tb_dir(self.model_dir)

    def _open_tensorboard(self) -> None:
        """Creates the events file (a remote run's in a local staging directory)."""
        from trainer import event_files

        self._tensorboard = False
        tb_dir = self.model_dir / names.TB_SUBDIR
        if storage.is_remote(self.model_dir):
            self._tb_remote, tb_dir = tb_dir, tempfile.mkdtemp(prefix="xlscale-tb-")
            # The staging directory goes at `close`; a writer never closed (a job that failed
            # before it could) still removes it when collected or when the process exits.
            self._tb_staged = weakref.finalize(self, shutil.rmtree, tb_dir, ignore_errors=True)
        try:
            self._tb = event_files.scalar_writer(tb_dir)
        except ImportError as e:  # neither TensorFlow nor tensorboard: metrics.jsonl alone
            log.warning("no TensorBoard events (%s): metrics.jsonl holds every record", e)
            return
        except Exception as e:  # TensorFlow's OpError (PermissionDenied, FailedPrecondition)
            raise _tb_not_writable(self.model_dir, tb_dir, e) from e
        self._tb_dir = tb_dir

    def truncate_after(self, step: int) -> None:
        """Keeps only the records with `step <= step`, and truncates a torn last line (a job
        killed mid-write) with a warning naming the file.

        Raises:
          rundir.records.MetricsFileError: when a line other than the last is not JSON.
        """
        if self.is_chief:
            records.truncate_metrics_after(self.model_dir, step)

    def restore_lost(self, covered: Sequence[Mapping[str, Any]], *, step: int) -> None:
        """Appends again the records a checkpoint covers (`covered`, kept in its train state)
        that `metrics.jsonl` lost, e.g. a torn last line that was the checkpoint's own row: those
        newer than the file's last record. A resume starts after the checkpoint, so nothing else
        would log them again."""
        if not self.is_chief or not covered:
            return
        present = records.read_metrics(self.model_dir)
        last = present[-1]["step"] if present else -1
        lost = [r for r in covered if last < r["step"] <= step]
        for record in lost:
            records.append_metrics(self.model_dir, record)
        if lost:
            log.warning(
                "%s: re-logged %d record%s (step %s) that checkpoint %d covers and the file had lost",
                records.metrics_file(self.model_dir),
                len(lost),
                "" if len(lost) == 1 else "s",
                ", ".join(str(r["step"]) for r in lost),
                step,
            )

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends one record (must contain `step`) and writes its scalars to TensorBoard."""
        if not self.is_chief:
            return
        records.append_metrics(self.model_dir, record)
        if self._tensorboard:
            self._open_tensorboard()
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
            if time.monotonic() - self._tb_synced > _TB_SYNC_S:
                self._sync_tensorboard()

    def _sync_tensorboard(self) -> None:
        """Copies a remote run's staged event files into `MODEL_DIR/tb/` (whole files: they are
        small, and each process writes its own)."""
        self._tb_synced = time.monotonic()
        if self._tb_remote is None:
            return
        for local in pathlib.Path(self._tb_dir).iterdir():
            storage.write_bytes(self._tb_remote / local.name, local.read_bytes())

    def close(self, *, sync: bool = True) -> None:
        """Flushes and closes TensorBoard, copying a remote run's events into `MODEL_DIR` unless
        `sync` is False (the store is unreachable)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
            if sync:
                self._sync_tensorboard()
            if self._tb_remote is not None:
                self._tb_staged()


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
            parts.append(f"ETA {durations.format_duration(eta)}")
        line = " | ".join(parts)
        log.info("%s", line)
        return line


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
        # Paper tokens of one applied step (`rundir.paper_units`); None: no `tokens_paper`.
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
        the data seen so far, applied steps × batch × row length (`rundir.paper_units`), beside
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
