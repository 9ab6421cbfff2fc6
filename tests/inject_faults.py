"""Test-only fault injection into a trainer subprocess, at a chosen point rather than a raced one.

    python tests/inject_faults.py FAULT ENTRY [ARGS...]

installs FAULT in this process, then runs ENTRY with ARGS as the real command would:
`trainer.train` as `python -m trainer.train ARGS`, `xlscale` as `xlscale ARGS` (ARGS start with
the subcommand). Nothing of the project knows about it: each fault replaces one function of a
library or of the storage layer before the command starts.

Faults (`FAULTS`):
  record_full@STEP   the write of step STEP's integrity record, inside orbax's commit of that
                     step (its background thread), fails with ENOSPC: a disk filling during a
                     commit.
  metrics_full@STEP  appending the metrics record of step STEP fails with ENOSPC, once a
                     checkpoint has committed (waited for on disk): a failure after a commit.
  kill_deleting      the first deletion of a checkpoint directory (orbax's `PathDeleter`, the
                     keep policy) removes the step's integrity record and half its other files,
                     then the process is killed with SIGKILL.
  kill_after_commit@STEP
                     when the metrics record of step STEP is appended, the process waits until a
                     checkpoint of a step between 2 and STEP has committed (its integrity record is
                     in storage, local or gs://), then kills itself with SIGKILL: a run killed
                     mid-way, after a checkpoint, whatever this machine's speed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import signal
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
CHECKSUMS_FILE = "xlscale_checksums.json"  # `rundir.names.CHECKSUMS_FILE`
# How long `metrics_full` waits for a checkpoint to commit before failing anyway.
_COMMIT_WAIT_S = 120


def _disk_full(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))


def record_full(step: str) -> None:
    """The integrity record of `step` cannot be written (ENOSPC), inside its commit."""
    from rundir import local_files

    real = local_files.staged

    @contextlib.contextmanager
    def staged(target, data):
        path = pathlib.Path(target)
        # Inside a commit the record is written into `<step>.orbax-checkpoint-tmp...`.
        if path.name == CHECKSUMS_FILE and path.parent.name.startswith(f"{step}."):
            raise _disk_full(target)
        with real(target, data) as tmp:
            yield tmp

    local_files.staged = staged


def metrics_full(step: str) -> None:
    """The metrics record of `step` cannot be appended (ENOSPC), once a checkpoint committed."""
    from rundir import records

    real = records.append_metrics

    def append_metrics(model_dir, record):
        if int(record["step"]) == int(step):
            checkpoints = pathlib.Path(os.fspath(model_dir)) / "checkpoints"
            deadline = time.monotonic() + _COMMIT_WAIT_S
            while time.monotonic() < deadline and not any(checkpoints.glob(f"*/{CHECKSUMS_FILE}")):
                time.sleep(0.05)
            raise _disk_full(records.metrics_file(model_dir))
        return real(model_dir, record)

    records.append_metrics = append_metrics


def kill_deleting(_: str = "") -> None:
    """The first checkpoint deletion stops half-way, killed."""
    from orbax.checkpoint.path import deleter

    real = deleter.PathDeleter.delete

    def delete(self, path, *, destination=None, overwrite=False):
        if destination is None:
            root = pathlib.Path(os.fspath(path))
            (root / CHECKSUMS_FILE).unlink(missing_ok=True)
            files = sorted(p for p in root.rglob("*") if p.is_file())
            for file in files[: len(files) // 2]:
                file.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, path, destination=destination, overwrite=overwrite)

    deleter.PathDeleter.delete = delete


def kill_after_commit(step: str) -> None:
    """Killed with SIGKILL at step `step`'s metrics record, once a later-than-2 step committed."""
    from rundir import names, records, storage

    real = records.append_metrics

    def committed(model_dir) -> bool:
        checkpoints = storage.as_path(model_dir) / names.CHECKPOINTS_SUBDIR
        steps = [p for p in checkpoints.iterdir()] if checkpoints.exists() else []
        return any(
            p.name.isdigit() and 2 < int(p.name) < int(step) and (p / CHECKSUMS_FILE).exists()
            for p in steps
        )

    def append_metrics(model_dir, record):
        if int(record["step"]) == int(step):
            deadline = time.monotonic() + _COMMIT_WAIT_S
            while time.monotonic() < deadline and not committed(model_dir):
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(model_dir, record)

    records.append_metrics = append_metrics


FAULTS = {
    "record_full": record_full,
    "metrics_full": metrics_full,
    "kill_deleting": kill_deleting,
    "kill_after_commit": kill_after_commit,
}


def _trainer() -> None:
    from trainer import gin_entry

    gin_entry.main("train")


def _xlscale() -> None:
    from xlscale_cli import main

    sys.exit(main.main())


ENTRIES = {"trainer.train": _trainer, "xlscale": _xlscale}


def main() -> None:
    """Installs the fault named by the first argument, then runs the entry named by the second."""
    fault, entry, *args = sys.argv[1:]
    sys.path.insert(0, os.fspath(REPO))
    name, _, arg = fault.partition("@")
    FAULTS[name](arg)
    sys.argv = [entry, *args]
    ENTRIES[entry]()


if __name__ == "__main__":
    main()
