"""Stopping what a training run opened -- its preemption watcher, metrics writer and checkpoint
store -- when it ends, normally or by a failure (`trainer.train`)."""

from __future__ import annotations

import logging

from pipelines import native_logs
from rundir import storage

log = logging.getLogger(__name__)


def close(watcher, writer, store, *, failed: BaseException | None) -> None:
    """Stops the preemption watcher, the metrics writer and the checkpoint store (those that
    were opened: None for one that was not).

    After a failure, a close that fails too is logged rather than raised (the first error is the
    one to report). After a storage failure the store is not closed: its save in flight may
    retry against an unreachable store for many minutes (TensorStore's retry policy), and a
    step that is not committed is not seen by a resume (the failure report already let a local
    save end: `CheckpointStore.last_committed`); nor are TensorBoard's staged events copied
    (each request would wait out the storage client's retries again). TensorFlow's own lines of
    a flush that fails (a full disk) go to the third-party log, as the trainer's records' do.
    """
    unreachable = isinstance(failed, storage.StorageError)
    closers = []
    if watcher is not None:
        closers.append(watcher.close)
    if writer is not None:
        closers.append(lambda: _quietly(writer.close, sync=not unreachable))
    if store is not None and not unreachable:
        closers.append(store.close)
    for stop in closers:
        try:
            stop()
        except Exception as e:
            if failed is None:
                raise
            log.warning("while stopping after %s: %s", type(failed).__name__, e)


def _quietly(stop, **kwargs) -> None:
    """`stop(**kwargs)` with file descriptor 2 pointed at the third-party log."""
    with native_logs.stderr_to():
        stop(**kwargs)
