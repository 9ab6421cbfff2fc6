"""One writer per run: an exclusive lease on `MODEL_DIR`.

A training job takes the lease before it writes anything else into `MODEL_DIR`: the file
`MODEL_DIR/LEASE`, created only if absent (`O_EXCL` on local disk, a generation precondition on
GCS; `rundir.storage.create_exclusive`), names its holder (host, pid, the pid's start
time, when it started) and a heartbeat time that a daemon thread refreshes. The job removes the
file when it ends, however it ends (a normal return, an exception, a preemption), unless the store
stopped answering: then the file stays behind (each request would wait again), or appears only
once the store answers the request that created it, and the next start takes it over, saying so
in one line. A second writer stops at once with a message naming the holder, instead of
interleaving metrics and deleting the first one's checkpoints.

A lease whose holder is gone is stale and taken over with a warning:
  - on the same host, when the pid is not running (or is a different process by now: its start
    time differs, or it is a zombie);
  - on any host, when the heartbeat is older than `LeaseConfig.stale_after_s`.

Every change to the file after that is a compare-and-swap on the version read
(`rundir.storage.replace_if` / `delete_if`): a heartbeat that finds another holder's lease stops,
and two takers of one stale lease cannot both win. `holder_state` tells readers (`xlscale sweep
status`) whether a run has a live writer.

Multi-host jobs: process 0 takes the lease and broadcasts the outcome, so all hosts fail
together. Evaluation and inference jobs only read a run and take no lease.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from etils import epath

from rundir import names, storage

log = logging.getLogger(__name__)

LEASE_FILE = names.LEASE_FILE
_UNREADABLE_GRACE_S = 10.0  # an unreadable lease younger than this is being written right now
# After a storage failure, how long a job that ends waits for its lease's removal (a store that
# answers removes it in milliseconds; one that fails otherwise is not waited for).
_PARTING_S = 5.0
_BROADCAST_BYTES = 4096
_HELD: set[str] = set()  # tokens of the leases this process holds
_HELD_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class LeaseConfig:
    """Heartbeat period and staleness.

    Attributes:
      heartbeat_s: the holder rewrites its heartbeat this often.
      stale_after_s: a lease whose heartbeat is older than this is stale, whatever host holds it
        (on the holder's own host a dead pid makes it stale at once).
    """

    heartbeat_s: float = 15.0
    stale_after_s: float = 120.0


class LeaseHeldError(RuntimeError):
    """Another live writer holds the run directory's lease."""


class ModelDirNotWritableError(RuntimeError):
    """`MODEL_DIR` cannot be created or written."""


def lease_path(model_dir: str | os.PathLike) -> epath.Path:
    """Where a run's lease lives."""
    return storage.as_path(model_dir, name="MODEL_DIR") / LEASE_FILE


def _pid_start(pid: int) -> tuple[int | None, bool]:
    """(start time in clock ticks since boot, is a zombie) from /proc; (None, False) elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None, False
    fields = stat[stat.rfind(")") + 2 :].split()  # fields 3.. of proc(5)
    return int(fields[19]), fields[0] == "Z"


def _pid_alive(pid: int, start: int | None) -> bool:
    """Whether `pid` still runs on this host and is the process that started at `start`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    now_start, zombie = _pid_start(pid)
    if zombie:
        return False
    return start is None or now_start is None or now_start == start


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))


def _describe(holder: dict[str, Any]) -> str:
    age = time.time() - float(holder.get("heartbeat", 0))
    return (
        f"host {holder.get('host')}, pid {holder.get('pid')}, "
        f"since {_when(float(holder.get('started', 0)))} (last heartbeat {age:.0f} s ago)"
    )


def _stale_reason(holder: dict[str, Any], config: LeaseConfig) -> str | None:
    """Why `holder`'s lease is stale, or None while its holder may still be writing."""
    host, pid = holder.get("host"), int(holder.get("pid", -1))
    if host == socket.gethostname():
        if pid == os.getpid():
            with _HELD_LOCK:
                if holder.get("token") in _HELD:
                    return None
            return "it names this process, which no longer holds it (an earlier call ended)"
        if not _pid_alive(pid, holder.get("pid_start")):
            return f"process {pid} no longer runs on {host}"
    age = time.time() - float(holder.get("heartbeat", 0))
    if age > config.stale_after_s:
        return f"its heartbeat is {age:.0f} s old (stale after {config.stale_after_s:g} s)"
    return None


def _parse(text: str) -> dict[str, Any] | None:
    try:
        holder = json.loads(text)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _read(path: epath.Path) -> tuple[dict[str, Any] | None, Any] | None:
    """(holder, version) of the lease file, the holder None when the file is empty or torn;
    None when there is no lease file."""
    found = storage.read_versioned(path)
    if found is None:
        return None
    text, version = found
    return _parse(text), version


def describe(holder: dict[str, Any]) -> str:
    """`host H, pid P, since T (last heartbeat S s ago)` for messages."""
    return _describe(holder)


def holder_state(model_dir: str | os.PathLike, *, config: LeaseConfig | None = None):
    """(holder, why it is stale) of a run's lease: (None, None) when nobody holds it, (holder,
    None) while its writer may still be writing, (holder, reason) for a lease left behind."""
    try:
        found = _read(lease_path(model_dir))
    except (OSError, ValueError):
        return None, None
    if found is None or found[0] is None:
        return None, None
    holder = found[0]
    return holder, _stale_reason(holder, config or LeaseConfig())


class Lease:
    """A held lease: `release()` ends it (idempotent). `lost` turns True if another writer took
    it over (its heartbeat had gone stale), after which this one stops refreshing it."""

    def __init__(self, path: epath.Path | None, holder: dict[str, Any], config: LeaseConfig):
        self.path = path
        self.holder = holder
        self.took_over: dict[str, Any] | None = None
        self.lost = False
        self._config = config
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if path is not None:
            with _HELD_LOCK:
                _HELD.add(holder["token"])
            self._thread = threading.Thread(target=self._beat, name="xlscale-lease", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        path = self.path  # `release` may clear `self.path` while a refresh is in flight
        failing = False  # the last refresh failed: its warning was given
        while not self._stop.wait(self._config.heartbeat_s):
            try:
                found = _read(path)
                current = None if found is None else found[0]
                if current is None or current.get("token") != self.holder["token"]:
                    self._lose(current)
                    return
                beat = {**self.holder, "heartbeat": time.time()}
                if not storage.replace_if(path, json.dumps(beat) + "\n", found[1]):
                    continue  # changed under us: judged again at the next beat
                self.holder = beat
                failing = False
            except OSError as e:  # a full disk or a storage outage must not kill training
                # One warning per outage (the job reports the failure when it meets it too),
                # none after release (the job has reported the cause).
                if not self._stop.is_set():
                    log.log(
                        logging.DEBUG if failing else logging.WARNING,
                        "could not refresh the lease %s: %s",
                        path,
                        e,
                    )
                failing = True

    def _lose(self, current: dict[str, Any] | None) -> None:
        self.lost = True
        log.error(
            "lost the lease %s: another writer holds it now (%s); this job keeps running "
            "but two writers share MODEL_DIR",
            self.path,
            _describe(current) if current else "no lease file",
        )

    def release(self, *, remove_file: bool = True) -> None:
        """Stops the heartbeat and removes the lease file if it is still this job's.

        `remove_file=False` (the store failed) stops the heartbeat without waiting for a refresh
        in flight, and removes the file only while the store still answers, for at most
        `_PARTING_S`: never once it stopped answering (`storage.store_unreachable`), where each
        request would wait again. A file left behind goes stale, and the next start takes it
        over, saying so in one line (at once on this host, the holder's pid being gone)."""
        self._stop.set()
        if self._thread is not None and remove_file:
            self._thread.join()
        self._thread = None
        path, self.path = self.path, None
        if path is None:
            return
        with _HELD_LOCK:
            _HELD.discard(self.holder["token"])
        if remove_file:
            self._remove(path)
        elif not storage.store_unreachable():
            parting = threading.Thread(
                target=self._remove, args=(path,), name="xlscale-lease-release", daemon=True
            )
            parting.start()
            parting.join(_PARTING_S)

    def _remove(self, path: epath.Path) -> None:
        """Deletes the lease file if it still names this job (a compare-and-delete)."""
        try:
            found = _read(path)
            if found is not None and (found[0] or {}).get("token") == self.holder["token"]:
                storage.delete_if(path, found[1])
        except OSError as e:  # left behind, it goes stale and is taken over
            log.warning("could not remove the lease %s: %s", path, e)


def _not_writable(model_dir, path, error: OSError) -> OSError | ModelDirNotWritableError:
    """Why the lease cannot be written: the store failing (unreachable, full, over quota) is a
    `storage.StorageError`, to be retried once it is back; only a refusal (permissions, a
    read-only filesystem, a file in the way) says that `MODEL_DIR` is not writable."""
    cause = storage.failure_cause(error)
    if cause is not None and cause != "permission":
        text = str(error) if isinstance(error, storage.StorageError) else None
        text = text or f"storage {cause}: cannot create {path}: {error.strerror or error}"
        return storage.StorageError(text, cause=cause)
    return ModelDirNotWritableError(
        f"MODEL_DIR {model_dir} is not writable: cannot create {path} "
        f"({error.strerror or error}). A training run writes its lease, checkpoints, metrics and "
        "run.json there; set --gin.MODEL_DIR to a writable directory or fix its permissions."
    )


def _take(model_dir: epath.Path, config: LeaseConfig) -> Lease:
    """Takes the lease on this host (no multi-host agreement)."""
    path = lease_path(model_dir)
    token = uuid.uuid4().hex
    now = time.time()
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_start": _pid_start(os.getpid())[0],
        "started": now,
        "heartbeat": now,
        "token": token,
    }
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _not_writable(model_dir, path, e) from e
    took_over = None
    text = json.dumps(holder) + "\n"
    for _ in range(5):  # another taker may win each race; then judge its lease again
        try:
            if storage.create_exclusive(path, text):
                lease = Lease(path, holder, config)
                lease.took_over = took_over
                return lease
            found = _read(path)
        except OSError as e:
            raise _not_writable(model_dir, path, e) from e
        if found is None:
            continue  # released meanwhile
        current, version = found
        if current is None:
            age = time.time() - (storage.mtime(path) or 0.0)
            if age < _UNREADABLE_GRACE_S:
                raise LeaseHeldError(
                    f"MODEL_DIR {model_dir} is being taken by another writer right now "
                    f"(its lease {path} is still being written). Only one job may train a run."
                )
            reason = f"the lease file is unreadable and {age:.0f} s old"
        else:
            reason = _stale_reason(current, config)
            if reason is None:
                raise LeaseHeldError(
                    f"MODEL_DIR {model_dir} is in use by another training job: "
                    f"{_describe(current)}; lease file {path}. Two writers would interleave "
                    "metrics.jsonl and delete each other's checkpoints. Wait for that job to end "
                    "or stop it, then start this one again (a killed holder's lease is taken over "
                    f"automatically: at once on its own host, else once its heartbeat is older "
                    f"than {config.stale_after_s:g} s). Delete {path} only if you are sure that "
                    "job is gone."
                )
        try:
            if not storage.delete_if(path, version):
                continue  # the file changed meanwhile (a new holder): judge it again
        except OSError as e:
            raise _not_writable(model_dir, path, e) from e
        log.warning(
            "taking over the stale lease %s, left behind by %s: %s",
            path,
            f"a job that is gone ({_describe(current)})" if current else "an unknown holder",
            reason,
        )
        took_over = current or {}
    raise LeaseHeldError(f"MODEL_DIR {model_dir}: could not take the lease {path} (contended)")


def acquire(model_dir: str | os.PathLike, *, config: LeaseConfig = LeaseConfig()) -> Lease:
    """Takes the exclusive lease on `model_dir` (creating the directory), before anything else
    is written there.

    Multi-host: process 0 takes it and broadcasts the outcome, so every host raises the same
    error together; the other processes get a `Lease` that holds no file.

    Raises:
      LeaseHeldError: a live writer holds it (the message names host, pid and since when).
      ModelDirNotWritableError: `model_dir` cannot be created or written (read-only, no
        permission), naming the directory and the path.
    """
    import jax

    model_dir = storage.as_path(model_dir, name="MODEL_DIR")
    if jax.process_count() == 1:
        return _take(model_dir, config)
    import numpy as np
    from jax.experimental import multihost_utils

    lease, error, message = None, None, ""
    if jax.process_index() == 0:
        try:
            lease = _take(model_dir, config)
        except Exception as e:  # noqa: BLE001 - every failure must reach the other hosts
            error, message = e, f"{type(e).__name__}\n{e}"
    encoded = message.encode()[:_BROADCAST_BYTES]
    buf = np.zeros(_BROADCAST_BYTES, np.uint8)
    buf[: len(encoded)] = np.frombuffer(encoded, np.uint8)
    buf = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    if error is not None:
        raise error
    text = bytes(buf).rstrip(b"\0").decode(errors="replace")
    if text:
        kind, _, detail = text.partition("\n")
        errors = {
            "LeaseHeldError": LeaseHeldError,
            "ModelDirNotWritableError": ModelDirNotWritableError,
            "StorageError": storage.StorageError,
        }
        raise errors.get(kind, RuntimeError)(f"process 0 could not take the lease: {detail}")
    return lease or Lease(None, {"host": socket.gethostname(), "pid": os.getpid()}, config)
