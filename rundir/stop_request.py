"""A request that a run stop: `MODEL_DIR/STOP_REQUESTED` (`rundir.names.STOP_REQUEST_FILE`).

Whoever wants a run to end early without killing it (`xlscale sweep run --adaptive`, a person)
writes the file; the trainer polls it (`trainer.checkpoints.PreemptionWatcher`), saves a
checkpoint at the step it notices it, writes no COMPLETED and exits with `rundir.exits.STOPPED`
(a job started while the request exists ends at once); launchers neither start nor restart a run
while its request exists. The run stays a normal,
resumable run: `withdraw` the request and start it again, and it resumes from its checkpoint
exactly as after a preemption. Local disk and object storage alike (`rundir.storage`).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

from rundir import names, storage


def path(model_dir: str | os.PathLike):
    """Where the request of the run in `model_dir` lives."""
    return storage.as_path(model_dir, name="MODEL_DIR") / names.STOP_REQUEST_FILE


def request(model_dir: str | os.PathLike, *, reason: str, by: str = "xlscale") -> None:
    """Asks the run in `model_dir` to stop (or not to start): writes the request with who asked,
    when and why (the directory is created if the run has not started)."""
    target = path(model_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    record = {"by": by, "reason": reason, "time": when}
    storage.write_text_atomic(target, json.dumps(record, sort_keys=True) + "\n")


def requested(model_dir: str | os.PathLike, *, storage_failures: bool = False) -> bool:
    """Whether a stop of the run in `model_dir` is requested (one request on object storage).

    Unreadable storage reads as no, unless `storage_failures`: then the storage service failing
    (no answer, a refusal) raises `storage.StorageError`. A running job asks for that: it
    cannot go on without its store, and a failure it ignored would wait out the store again at
    its next look, every few seconds, instead of ending the run.
    """
    try:
        return storage.mtime(path(model_dir)) is not None
    except storage.StorageError:
        if storage_failures:
            raise
        return False
    except (OSError, ValueError):
        return False


def read(model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The request's record, or None when there is none (an unparsable one reads as {})."""
    try:
        text = path(model_dir).read_text()
    except (OSError, ValueError, FileNotFoundError):
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def withdraw(model_dir: str | os.PathLike) -> bool:
    """Removes the request (the decision is reversed: start the run again to resume it);
    returns whether there was one."""
    target = path(model_dir)
    if not target.exists():
        return False
    target.unlink()
    return True
