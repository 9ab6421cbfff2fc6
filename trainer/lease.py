"""One writer per run: an exclusive lease on `MODEL_DIR`.

A training job takes the lease before it writes anything else into `MODEL_DIR`: the file
`MODEL_DIR/LEASE`, created atomically (`O_EXCL`), names its holder (host, pid, the pid's start
time, when it started) and a heartbeat time that a daemon thread refreshes. The job removes the
file when it ends, however it ends (a normal return, an exception, a preemption). A second writer
stops at once with a message naming the holder, instead of interleaving metrics and deleting the
first one's checkpoints.

A lease whose holder is gone is stale and taken over with a warning:
  - on the same host, when the pid is not running (or is a different process by now: its start
    time differs, or it is a zombie);
  - on any host, when the heartbeat is older than `LeaseConfig.stale_after_s`.

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

log = logging.getLogger(__name__)

LEASE_FILE = "LEASE"
_UNREADABLE_GRACE_S = 10.0  # an unreadable lease younger than this is being written right now
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


def lease_path(model_dir: str | os.PathLike) -> Path:
    """Where a run's lease lives."""
    return Path(model_dir) / LEASE_FILE


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


def _read(path: Path) -> dict[str, Any] | None:
    """The lease's holder, or None when the file is gone, empty or unreadable (torn)."""
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


class Lease:
    """A held lease: `release()` ends it (idempotent). `lost` turns True if another writer took
    it over (its heartbeat had gone stale), after which this one stops refreshing it."""

    def __init__(self, path: Path | None, holder: dict[str, Any], config: LeaseConfig):
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
        while not self._stop.wait(self._config.heartbeat_s):
            current = _read(self.path)
            if current is None or current.get("token") != self.holder["token"]:
                self.lost = True
                log.error(
                    "lost the lease %s: another writer holds it now (%s); this job keeps running "
                    "but two writers share MODEL_DIR",
                    self.path,
                    _describe(current) if current else "no lease file",
                )
                return
            self.holder = {**self.holder, "heartbeat": time.time()}
            tmp = self.path.with_name(f"{LEASE_FILE}.{self.holder['token']}.tmp")
            try:
                tmp.write_text(json.dumps(self.holder) + "\n", encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError as e:  # a full disk must not kill training; staleness may follow
                log.warning("could not refresh the lease %s: %s", self.path, e)

    def release(self) -> None:
        """Stops the heartbeat and removes the lease file if it is still this job's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.path is None:
            return
        with _HELD_LOCK:
            _HELD.discard(self.holder["token"])
        current = _read(self.path)
        if current is not None and current.get("token") == self.holder["token"]:
            self.path.unlink(missing_ok=True)
        self.path = None


def _create(path: Path, holder: dict[str, Any]) -> bool:
    """Creates the lease file atomically; False when it already exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(holder) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError:  # e.g. a full disk: leave no empty lease behind
        path.unlink(missing_ok=True)
        raise
    return True


def _not_writable(model_dir: Path, path: Path, error: OSError) -> ModelDirNotWritableError:
    return ModelDirNotWritableError(
        f"MODEL_DIR {model_dir} is not writable: cannot create {path} "
        f"({error.strerror or error}). A training run writes its lease, checkpoints, metrics and "
        "run.json there; set --gin.MODEL_DIR to a writable directory or fix its permissions."
    )


def _take(model_dir: Path, config: LeaseConfig) -> Lease:
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
    for _ in range(5):  # another taker may win each race; then judge its lease again
        try:
            if _create(path, holder):
                lease = Lease(path, holder, config)
                lease.took_over = took_over
                return lease
        except OSError as e:
            raise _not_writable(model_dir, path, e) from e
        current = _read(path)
        if current is None:
            try:
                age = time.time() - path.stat().st_mtime
            except FileNotFoundError:
                continue
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
            if not _set_aside(path, current):
                continue
        except OSError as e:
            raise _not_writable(model_dir, path, e) from e
        log.warning(
            "taking over the stale lease %s of %s: %s",
            path,
            _describe(current) if current else "an unknown holder",
            reason,
        )
        took_over = current or {}
    raise LeaseHeldError(f"MODEL_DIR {model_dir}: could not take the lease {path} (contended)")


def _set_aside(path: Path, judged: dict[str, Any] | None) -> bool:
    """Removes the stale lease `judged`; False (touching nothing) if the file changed meanwhile."""
    aside = path.with_name(f"{LEASE_FILE}.stale.{uuid.uuid4().hex}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return False
    moved = _read(aside)
    same = (moved or {}).get("token") == (judged or {}).get("token")
    if not same:  # a new holder's lease: put it back unless yet another one appeared
        try:
            os.link(aside, path)
        except OSError:
            pass
    aside.unlink(missing_ok=True)
    return same


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

    model_dir = Path(model_dir)
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
        }
        raise errors.get(kind, RuntimeError)(f"process 0 could not take the lease: {detail}")
    return lease or Lease(None, {"host": socket.gethostname(), "pid": os.getpid()}, config)
