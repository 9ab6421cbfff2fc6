"""`INIT_CHECKPOINT` directories, read and written without the trainer: params-only orbax steps.

Conversion reads one step of a run (or of an import) and writes run-like directories that
`INIT_CHECKPOINT` accepts, in `trainer.checkpoints.CheckpointStore`'s layout:

    <dir>/checkpoints/<step>/{params, train_state, checksums}   (a run also has opt_state)
    <dir>/run.json

Here are the pieces that both sides need, so that each has one home: `parse_init_checkpoint`
(the `'<dir>[@step]'` syntax), `params_hash` (the records' `params_hash` must equal a run's
`init_params_hash`), and params-only saves and restores (`write_params`, `resolve_step`,
`read_params`). `trainer.checkpoints` imports the first two from here; this package never
imports `trainer` (DESIGN.md, layers: trainer and convert sit side by side, and only trainer
looks across), so no module of one imports back into the other.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rundir import checksums, names, storage

log = logging.getLogger(__name__)


class CheckpointNotFoundError(FileNotFoundError):
    """A flag (`INIT_CHECKPOINT`, `CHECKPOINT`, ...) names no directory, a directory with no
    checkpoint, or a step that is not kept; the message names the flag, the value and the steps
    that exist. A configuration refusal (`rundir.exits`)."""


class CheckpointSpecError(ValueError):
    """`'<dir>@<step>'` whose part after '@' is not a step number."""


class CheckpointMismatchError(ValueError):
    """A checkpoint's parameters do not fit the model (each missing or mis-shaped one named)."""


def parse_init_checkpoint(spec: str) -> tuple[epath.Path, int | None]:
    """Splits `'<dir>[@step]'` into the checkpoints directory and the step (None = latest).

    `<dir>` may be a run's `MODEL_DIR` (its `checkpoints/` is used) or a checkpoints directory.
    """
    path, sep, step = spec.rpartition("@") if "@" in spec else (spec, "", "")
    if sep and not step.isdigit():
        raise CheckpointSpecError(
            f"INIT_CHECKPOINT {spec!r}: the part after '@' must be a step number"
        )
    directory = storage.as_path(path, name="INIT_CHECKPOINT")
    if (directory / names.CHECKPOINTS_SUBDIR).is_dir():
        directory = directory / names.CHECKPOINTS_SUBDIR
    return directory, (int(step) if sep else None)


def model_dir_of(checkpoints_directory: epath.Path) -> epath.Path:
    """A run's MODEL_DIR from its checkpoints directory (as `trainer.train` records it)."""
    if checkpoints_directory.name == names.CHECKPOINTS_SUBDIR:
        return checkpoints_directory.parent
    return checkpoints_directory


def source_vocab(run_info: Mapping[str, Any]) -> str | None:
    """The `VOCAB_PATH` a run trained with, from its `run.json` fingerprint."""
    return (run_info.get("fingerprint") or {}).get("data", {}).get("vocab_path")


def param_name(path) -> str:
    """A parameter's name as hashed and named in messages: its keys joined by '/'."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def params_hash(params: Any, *, as_dtype: Any = None) -> str:
    """SHA-256 over every parameter's name, dtype, shape and bytes, in sorted name order.

    The same values give the same hash whatever the sharding or host count (each parameter is
    gathered to the host one at a time). `as_dtype` hashes the values cast to that dtype (one
    parameter at a time): the hash of what a restore into that dtype holds.
    """
    from jax.experimental import multihost_utils

    digest = hashlib.sha256()
    leaves = sorted(
        (param_name(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    )
    for name, leaf in leaves:
        if jax.process_count() > 1:
            value = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        else:
            value = np.asarray(jax.device_get(leaf))
        if as_dtype is not None:
            value = value.astype(as_dtype)
        digest.update(f"{name}|{value.dtype}|{value.shape}|".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def _params_manager(directory: epath.Path, *, read_only: bool) -> ocp.CheckpointManager:
    """An orbax manager of the params and train_state items only (a run's opt_state, when there
    is one, is left alone)."""
    return ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            create=not read_only, read_only=read_only, enable_async_checkpointing=False
        ),
        item_handlers={
            "params": ocp.StandardCheckpointHandler(),
            "train_state": ocp.JsonCheckpointHandler(),
        },
    )


def write_params(directory: epath.Path, *, step: int, params: Any, train_state: dict) -> None:
    """Writes `directory/<step>/{params, train_state}` in `CheckpointStore`'s layout, with
    checksums."""
    manager = _params_manager(storage.as_path(directory), read_only=False)
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                train_state=ocp.args.JsonSave(train_state),
            ),
            force=True,
        )
        manager.wait_until_finished()
    finally:
        manager.close()
    checksums.write_manifest(storage.as_path(directory) / str(step))


def resolve_step(spec: str, *, what: str = "INIT_CHECKPOINT") -> tuple[epath.Path, int]:
    """The checkpoints directory and step that `'<dir>[@step]'` names (the latest step by
    default), after verifying the step's checksums; `what` names the flag in messages.

    Raises:
      CheckpointNotFoundError: the directory holds no (such) checkpoint.
      rundir.checksums.CheckpointCorruptError: a file of the step fails its checksums.
    """
    directory, step = parse_init_checkpoint(spec)
    if not directory.is_dir():
        raise CheckpointNotFoundError(f"{what} {spec!r}: no directory {directory}")
    manager = _params_manager(directory, read_only=True)
    try:
        steps = sorted(manager.all_steps())
    finally:
        manager.close()
    if not steps:
        raise CheckpointNotFoundError(f"{what} {spec!r}: no checkpoint in {directory}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise CheckpointNotFoundError(
            f"{what} {spec!r}: no step {step} in {directory} (steps: {steps})"
        )
    if not checksums.verify_manifest(directory / str(step), step=step, source=f"{what} {spec!r}"):
        log.info("%s %r step %d has no checksums to verify", what, spec, step)
    return directory, step


def read_params(directory: epath.Path, step: int) -> dict[str, Any]:
    """A step's params as host numpy arrays in their stored dtypes, whatever mesh saved them."""
    device = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    manager = _params_manager(storage.as_path(directory), read_only=True)
    try:
        metadata = manager.item_metadata(step)["params"]
        abstract = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device),
            getattr(metadata, "tree", metadata),
        )
        restored = manager.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract))
        )
    finally:
        manager.close()
    return jax.tree.map(np.asarray, restored["params"])
