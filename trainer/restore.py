"""Restoring a kept step of a run for inference: the one seam `trainer.infer`, `trainer.eval`
and zero-shot scoring (`evals.scorer`) go through.

A checkpoint is named `'<dir>[@step]'`: `<dir>` is a run's `MODEL_DIR` (its `checkpoints/` is
used) or a checkpoints directory, local or on object storage; no step means the newest kept one.
The parameters are checked against the model from metadata first and the step's checksums are
verified, as for `INIT_CHECKPOINT` — but errors here speak of the checkpoint being read (with the
flag that named it) rather than of initialising a run.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from etils import epath

from convert import init_checkpoints
from trainer import checkpoints as ckpt_lib


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


def kept_steps(checkpoint: str | os.PathLike, *, flag: str = "checkpoint") -> list[int]:
    """The steps kept under `'<dir>[@step]'` (ascending; the step part is ignored).

    Raises:
      CheckpointNotFoundError: the directory does not exist (naming `flag` and the value).
    """
    directory, _ = init_checkpoints.parse_init_checkpoint(os.fspath(checkpoint))
    if not directory.is_dir():
        raise CheckpointNotFoundError(f"{flag} {os.fspath(checkpoint)!r}: no directory {directory}")
    store = ckpt_lib.CheckpointStore(directory, ckpt_lib.CheckpointConfig(), read_only=True)
    try:
        return store.all_steps()
    finally:
        store.close()


def resolve_step(checkpoint: str | os.PathLike, step: int | None, *, flag: str) -> int:
    """`step`, or the newest kept step of `checkpoint`.

    Raises:
      CheckpointNotFoundError: no checkpoint at all, or `step` is not kept (listing the kept
        steps), naming `flag`.
    """
    kept = kept_steps(checkpoint, flag=flag)
    if not kept:
        raise CheckpointNotFoundError(f"{flag} {os.fspath(checkpoint)!r}: no checkpoint in it")
    if step is None:
        return kept[-1]
    if int(step) not in kept:
        raise CheckpointNotFoundError(
            f"{flag} {os.fspath(checkpoint)!r}: step {step} is not kept; kept steps: {kept}"
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
      rundir.checksums.CheckpointCorruptError: a file of the step fails its checksums.
    """
    spec = ckpt_lib.local_init_spec(os.fspath(checkpoint))
    directory, step = init_checkpoints.parse_init_checkpoint(spec)
    step = resolve_step(directory, step, flag=flag)
    params, directory, step = ckpt_lib.restore_init_params(
        f"{directory}@{step}", abstract_params=abstract_params, what=flag
    )
    return Restored(params=params, directory=directory, step=step)
