"""Deleting old checkpoint steps (the keep policy) so that a deletion cut short is recognised.

Orbax deletes a step that its keep policy drops right after the next step commits, file by file.
A process killed in the middle used to leave a partial step directory behind, which the next
start took for a committed step without its integrity record ("written by older code") and set
aside for good. Here every deletion first marks the step, then deletes it:

- local disk: the step directory is renamed to `<step>.deleting` (one atomic rename, which needs
  no free space even on a full disk), and that directory is then removed. Whatever a kill leaves
  is named `<step>.deleting`, never `<step>`;
- object storage, which has no rename: an empty marker object `<step>.deleting` is written beside
  the step first, then the step's objects are deleted, then the marker.

So `<step>.deleting` in a checkpoints directory always means "this step was being deleted", and
orbax never lists it as a step (it is not a step's name). The next writer that opens the
checkpoints (`finish_interrupted`, before anything counts the steps) removes what is left -- the
renamed directory, or the marker and what remains of the step it names -- with one log line per
step, so a step cut short in its deletion is neither resumed, nor set aside, nor left behind.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence

import jax
import orbax.checkpoint as ocp
from etils import epath

from rundir import storage

log = logging.getLogger(__name__)

DELETING_SUFFIX = ".deleting"
_MARKED = re.compile(rf"^(\d+){re.escape(DELETING_SUFFIX)}$")


def deleting_name(step: int) -> str:
    """The name a step has (local disk) or its marker has (object storage) while it is deleted."""
    return f"{step}{DELETING_SUFFIX}"


class MarkedDeleter:
    """Orbax's `CheckpointDeleter` for a run's checkpoints: each step is marked, then deleted
    (see the module docstring). Process 0 deletes, as orbax's own deleter does; the files are
    removed by orbax's `PathDeleter` (parallel on local disk, its GCS rules on object storage).

    A deletion that fails is logged, not raised: orbax runs it after the newer step committed,
    and an error here would report that save as failed. The step stays marked (or whole, when
    even the mark failed) and the next start, or a later keep policy, removes it.

    Args:
      directory: the checkpoints directory.
    """

    def __init__(self, directory: epath.Path):
        self.directory = storage.as_path(directory)
        self._paths = ocp.path.deleter.PathDeleter(self.directory)

    def delete(self, step: int) -> None:
        """Marks, then deletes one committed step (process 0 only)."""
        if jax.process_index() != 0:
            return
        try:
            delete_step(self.directory, step, paths=self._paths)
        except Exception as e:  # noqa: BLE001 - see the class docstring
            log.warning(
                "checkpoint step %d not deleted yet (%s): the next start finishes it", step, e
            )

    def delete_steps(self, steps: Sequence[int]) -> None:
        """Deletes each step of `steps`."""
        for step in steps:
            self.delete(step)

    def close(self) -> None:
        """Nothing to release: every deletion ran in the caller's thread."""


def delete_step(directory: epath.Path, step: int, *, paths=None) -> None:
    """Marks committed `step` of `directory` as being deleted, then deletes it (see the module
    docstring). `paths`: orbax's `PathDeleter` to remove files with (a new one by default)."""
    paths = paths or ocp.path.deleter.PathDeleter(directory)
    step_dir, marked = directory / str(step), directory / deleting_name(step)
    if storage.is_remote(directory):
        storage.write_bytes(marked, b"")  # the marker first: a kill from here on is recognised
        with storage.service_errors(step_dir, "deleting checkpoint"):
            paths.delete(step_dir)
            marked.unlink(missing_ok=True)
        return
    try:
        os.replace(step_dir, marked)  # atomic: from here on the step is no step any more
    except FileNotFoundError:
        return  # already gone: nothing to delete
    paths.delete(marked)


def finish_interrupted(directory: epath.Path) -> list[int]:
    """Removes what deletions cut short left in the checkpoints `directory` (renamed step
    directories, markers and the steps they name), logging one line per step. Process 0 removes
    them, the other processes wait for it.

    Returns:
      The steps whose deletion was finished, ascending (on process 0; [] on the others).
    Raises:
      rundir.storage.StorageError: the storage service failed while listing or deleting.
    """
    directory = storage.as_path(directory)
    finished: list[int] = []
    if jax.process_index() == 0 and storage.is_dir(directory):
        paths = ocp.path.deleter.PathDeleter(directory)
        with storage.service_errors(directory, "finishing checkpoint deletions in"):
            marked = sorted(
                (int(m[1]), entry.name)
                for entry in directory.iterdir()
                if (m := _MARKED.match(entry.name))
            )
            for step, name in marked:
                entry = directory / name
                if entry.is_dir():  # local disk: the renamed step itself
                    paths.delete(entry)
                else:  # object storage: the marker, beside what is left of the step
                    if storage.is_dir(directory / str(step)):
                        paths.delete(directory / str(step))
                    entry.unlink(missing_ok=True)
                log.info(
                    "checkpoint step %d: its deletion (keep policy) was cut short by a kill; "
                    "removed what was left of it in %s",
                    step,
                    directory,
                )
                finished.append(step)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("xlscale_finish_interrupted_deletions")
    return finished
