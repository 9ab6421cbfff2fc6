"""Restoring a kept step of a run for inference: the one seam `trainer.infer`, `trainer.eval`
and zero-shot scoring (`evals.scorer`) go through.

A checkpoint is named `'<dir>[@step]'`: `<dir>` is a run's `MODEL_DIR` (its `checkpoints/` is
used) or a checkpoints directory, local or on object storage; no step means the newest kept one.
The parameters are checked against the model from metadata first and the step's integrity record
is verified, as for `INIT_CHECKPOINT` — but errors here speak of the checkpoint being read (with
the flag that named it) rather than of initialising a run. Only complete steps (committed with
their record, `rundir.checksums`) are kept steps; one without a record is refused, never read
unverified.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from etils import epath

from convert import init_checkpoints
from rundir import checksums, storage
from trainer import checkpoints as ckpt_lib

log = logging.getLogger(__name__)


class CheckpointNotFoundError(init_checkpoints.CheckpointNotFoundError):
    """The run or the step asked for holds no checkpoint (the message lists the kept steps); a
    configuration refusal (`rundir.exits`), as for `INIT_CHECKPOINT`."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """Parameters restored from a run, and where from.

    Attributes:
      params: sharded as the abstract parameters said.
      directory: the checkpoints directory.
      step: the step restored.
    """

    params: Any
    directory: epath.Path
    step: int

    @property
    def model_dir(self) -> epath.Path:
        """The run directory (where its `run.json` is)."""
        d = self.directory
        return d.parent if d.name == ckpt_lib.CHECKPOINTS_SUBDIR else d


def _steps(checkpoint: str | os.PathLike, *, flag: str) -> tuple[epath.Path, list[int], list[int]]:
    """The checkpoints directory of `'<dir>[@step]'`, its committed steps and its complete ones
    (with their integrity record), ascending.

    Raises:
      CheckpointNotFoundError: the directory does not exist (naming `flag` and the value).
    """
    directory, _ = init_checkpoints.parse_init_checkpoint(os.fspath(checkpoint))
    if not storage.is_dir(directory):  # an outage raises StorageError, not "no directory"
        raise CheckpointNotFoundError(f"{flag} {os.fspath(checkpoint)!r}: no directory {directory}")
    store = ckpt_lib.CheckpointStore(directory, ckpt_lib.CheckpointConfig(), read_only=True)
    try:
        committed = store.all_steps()
        return directory, committed, [s for s in committed if store.recorded(s)]
    finally:
        store.close()


def kept_steps(checkpoint: str | os.PathLike, *, flag: str = "checkpoint") -> list[int]:
    """The complete steps kept under `'<dir>[@step]'` (ascending; the step part is ignored).

    Raises:
      CheckpointNotFoundError: the directory does not exist (naming `flag` and the value).
    """
    return _steps(checkpoint, flag=flag)[2]


def resolve_step(checkpoint: str | os.PathLike, step: int | None, *, flag: str) -> int:
    """`step`, or the newest complete step of `checkpoint` (when newer steps have no integrity
    record, one warning names the step used and the newer ones skipped).

    Raises:
      CheckpointNotFoundError: no checkpoint at all, or `step` is not kept (listing the kept
        steps), naming `flag`.
      rundir.checksums.CheckpointUnrecordedError: `step` was committed without its integrity
        record (the message says how to record files one trusts).
    """
    directory, committed, kept = _steps(checkpoint, flag=flag)
    name = f"{flag} {os.fspath(checkpoint)!r}"
    if not committed:
        raise CheckpointNotFoundError(f"{name}: no checkpoint in it")
    if step is None:
        step = (kept or committed)[-1]  # none complete: refused below
        if skipped := [s for s in committed if s > step]:
            log.warning(
                "%s",
                checksums.older_step_message(
                    source=name, directory=directory, step=step, skipped=skipped
                ),
            )
    if int(step) not in committed:
        raise CheckpointNotFoundError(f"{name}: step {step} is not kept; kept steps: {kept}")
    if int(step) not in kept:
        raise checksums.CheckpointUnrecordedError(
            checksums.unrecorded_message(source=name, step_dir=directory / str(step), step=step)
        )
    return int(step)


def restore_params(
    checkpoint: str | os.PathLike, *, abstract_params: Any, flag: str = "checkpoint"
) -> Restored:
    """Restores the parameters of `'<dir>[@step]'` for inference (`'hf:<dir>'` too).

    Args:
      checkpoint: what to read.
      abstract_params: the model's abstract parameters with their shardings.
      flag: what named the checkpoint, for messages (`--model-dir`, `CHECKPOINT`, ...).

    Raises:
      CheckpointNotFoundError: no such run or step (the kept steps listed).
      ValueError: parameters missing or of other shapes (each named).
      rundir.checksums.CheckpointUnrecordedError: the step has no integrity record.
      rundir.checksums.CheckpointCorruptError: a file of the step fails its checksums.
    """
    spec = ckpt_lib.local_init_spec(os.fspath(checkpoint))
    directory, step = init_checkpoints.parse_init_checkpoint(spec)
    step = resolve_step(directory, step, flag=flag)
    params, directory, step = ckpt_lib.restore_init_params(
        f"{directory}@{step}", abstract_params=abstract_params, what=flag
    )
    return Restored(params=params, directory=directory, step=step)
