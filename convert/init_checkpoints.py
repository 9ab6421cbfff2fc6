"""`INIT_CHECKPOINT` directories, read and written without the trainer: params-only orbax steps.

Conversion reads one step of a run (or of an import) and writes run-like directories that
`INIT_CHECKPOINT` accepts, in `trainer.checkpoints.CheckpointStore`'s layout:

    <dir>/checkpoints/<step>/{params, train_state, integrity record}   (a run also has opt_state)
    <dir>/run.json

Here are the pieces that both sides need, so that each has one home: `parse_init_checkpoint`
(the `'<dir>[@step]'` syntax), `params_hash` (the records' `params_hash` must equal a run's
`init_params_hash`), `RecordOnCommit` (each step's integrity record written inside orbax's commit,
`rundir.checksums`), and params-only saves and restores (`write_params`, `resolve_step`,
`read_params`, `record_step`). `trainer.checkpoints` imports the first two from here; this package never
imports `trainer` (the project's layers, `tests/test_layering.py`: trainer and convert sit side
by side, and only trainer looks across), so no module of one imports back into the other.
"""

from __future__ import annotations

import contextlib
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
    if storage.is_dir(directory / names.CHECKPOINTS_SUBDIR):
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


# What orbax's commit writes after its post-finalization callback: the commit marker and the step
# metadata's commit timestamp. They hold no values, so the record leaves them out.
COMMIT_FILES = (ocp.path.atomicity_types.COMMIT_SUCCESS_FILE, "_CHECKPOINT_METADATA")


class RecordOnCommit:
    """Writes each step's integrity record (`rundir.checksums`) inside orbax's commit.

    Given to orbax as `AsyncOptions(post_finalization_callback=...)`, it runs on the async-commit
    thread of the primary process (process 0) once every host's files are written and finalized,
    just before orbax commits the step (the atomic rename of `<step>.orbax-checkpoint-tmp`; on
    gs://, the `commit_success.txt` marker). A step therefore commits with its record or not at
    all: a kill between the two is impossible, and a failed record write fails the save as a
    failed data write does (the error surfaces at the next save or wait).

    The callback takes no arguments, so the saver names the step with `expect(step)` before each
    save, once the previous save has finished (orbax runs one save at a time).

    Args:
      directory: the checkpoints directory orbax saves into.
    """

    def __init__(self, directory: epath.Path):
        self.directory = storage.as_path(directory)
        self._step: int | None = None

    def expect(self, step: int) -> None:
        """Names the step of the next save (no save may be in flight)."""
        self._step = step

    def async_options(self) -> ocp.AsyncOptions:
        """Orbax's async options with this record as the post-finalization callback."""
        return ocp.AsyncOptions(post_finalization_callback=self)

    def __call__(self) -> None:
        if self._step is None:
            raise RuntimeError(f"{self.directory}: a checkpoint was saved without expect(step)")
        final = self.directory / str(self._step)
        # Where the step's files are until the commit: orbax's own choice for this path.
        writing = ocp.path.atomicity_defaults.get_default_temporary_path_class(final).from_final(
            final
        )
        checksums.write_manifest(writing.get(), skip=COMMIT_FILES)
        self._step = None


class _ReadOnlyNotice(logging.Filter):
    """Drops orbax's "Given directory is read only" warning: opening a checkpoint to read it is
    what a reader asked for, not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Given directory is read only")


@contextlib.contextmanager
def quiet_read_only_notice():
    """Keeps orbax's read-only notice (one per opened reader) off the logs while opening one."""
    absl_logger, notice = logging.getLogger("absl"), _ReadOnlyNotice()
    absl_logger.addFilter(notice)
    try:
        yield
    finally:
        absl_logger.removeFilter(notice)


def _params_manager(
    directory: epath.Path, *, read_only: bool, record: RecordOnCommit | None = None
) -> ocp.CheckpointManager:
    """An orbax manager of the params and train_state items only (a run's opt_state, when there
    is one, is left alone); a writer records each step in its commit (`record`)."""
    with quiet_read_only_notice():
        return ocp.CheckpointManager(
            directory,
            options=ocp.CheckpointManagerOptions(
                save_interval_steps=0 if read_only else 1,
                create=not read_only,
                read_only=read_only,
                enable_async_checkpointing=record is not None,
                async_options=record.async_options() if record is not None else None,
            ),
            item_handlers={
                "params": ocp.StandardCheckpointHandler(),
                "train_state": ocp.JsonCheckpointHandler(),
            },
        )


def write_params(directory: epath.Path, *, step: int, params: Any, train_state: dict) -> None:
    """Writes `directory/<step>/{params, train_state}` in `CheckpointStore`'s layout, with its
    integrity record written inside the commit (`RecordOnCommit`)."""
    record = RecordOnCommit(directory)
    manager = _params_manager(storage.as_path(directory), read_only=False, record=record)
    try:
        record.expect(step)
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


def _committed_steps(directory: epath.Path, *, spec: str, what: str) -> list[int]:
    """The committed steps of a checkpoints directory, ascending.

    Raises:
      CheckpointNotFoundError: no such directory, or no step in it.
    """
    if not storage.is_dir(directory):  # an outage raises StorageError, not "no directory"
        raise CheckpointNotFoundError(f"{what} {spec!r}: no directory {directory}")
    with storage.service_errors(directory, "listing checkpoints in"):
        manager = _params_manager(directory, read_only=True)
        try:
            steps = sorted(manager.all_steps())
        finally:
            manager.close()
    if not steps:
        raise CheckpointNotFoundError(f"{what} {spec!r}: no checkpoint in {directory}")
    return steps


def _named_step(spec: str, *, what: str, complete_only: bool) -> tuple[epath.Path, int]:
    """The directory and step `'<dir>[@step]'` names; no step: the newest one (with
    `complete_only`, the newest with its integrity record, if any: when newer steps have none,
    one warning names the step used, the newer ones skipped and why, never a silent fallback)."""
    directory, step = parse_init_checkpoint(spec)
    steps = _committed_steps(directory, spec=spec, what=what)
    if step is None and not complete_only:
        return directory, steps[-1]
    if step is None:
        complete = [s for s in steps if checksums.has_manifest(directory / str(s))]
        step = (complete or steps)[-1]  # none complete: the newest, refused by its verification
        if skipped := [s for s in steps if s > step]:
            log.warning(
                "%s",
                checksums.older_step_message(
                    source=f"{what} {spec!r}", directory=directory, step=step, skipped=skipped
                ),
            )
        return directory, step
    if step not in steps:
        raise CheckpointNotFoundError(
            f"{what} {spec!r}: no step {step} in {directory} (steps: {steps})"
        )
    return directory, step


def resolve_step(spec: str, *, what: str = "INIT_CHECKPOINT") -> tuple[epath.Path, int]:
    """The checkpoints directory and step that `'<dir>[@step]'` names (by default the newest
    complete step: one with its integrity record), after verifying the step's record; `what`
    names the flag in messages.

    Raises:
      CheckpointNotFoundError: the directory holds no (such) checkpoint.
      rundir.checksums.CheckpointUnrecordedError: the step has no integrity record (never
        restored blind; the message says how to record files one trusts).
      rundir.checksums.CheckpointCorruptError: a file of the step fails its checksums.
    """
    directory, step = _named_step(spec, what=what, complete_only=True)
    checksums.verify_manifest(
        directory / str(step), step=step, source=f"{what} {spec!r}", skip=COMMIT_FILES
    )
    return directory, step


def record_step(spec: str) -> tuple[epath.Path, int, bool]:
    """Writes the integrity record of `'<dir>[@step]'` (default: its newest committed step) from
    its files as they are now: for a checkpoint written by another tool, whose files the user
    trusts. A step that already has a record keeps it.

    Returns:
      (checkpoints directory, step, whether a record was written).
    Raises:
      CheckpointNotFoundError: no such directory or step.
    """
    directory, step = _named_step(spec, what="checkpoint", complete_only=False)
    if checksums.has_manifest(directory / str(step)):
        return directory, step, False
    checksums.write_manifest(directory / str(step))
    return directory, step, True


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
