"""Local-disk halves of `rundir.storage`'s primitives: a directory `flock` every mutator holds,
fsynced temporary copies renamed into place, and reads that return a version token.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterator

# How often a read is retried while an append keeps changing the file under it.
_CAS_ATTEMPTS = 8


@contextlib.contextmanager
def dir_lock(directory: str) -> Iterator[None]:
    """An exclusive `flock` on `directory`, held by every local mutator here, so that a
    compare-and-swap's check and its replace are one step for all writers using this module.
    Filesystems without flock (some network ones) leave the check-then-replace window open."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged(target: str, data: bytes) -> Iterator[str]:
    """A complete, fsynced temporary copy of the new content beside `target`, written before any
    lock is taken; removed on the way out unless the body moved it into place."""
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_versioned(target: str) -> tuple[bytes, str] | None:
    """Content and version token read from one open file (re-read if an append changed it
    meanwhile): inode, modification time, size and content digest."""
    for _ in range(_CAS_ATTEMPTS):
        try:
            with open(target, "rb") as f:
                before = os.fstat(f.fileno())
                data = f.read()
                after = os.fstat(f.fileno())
        except FileNotFoundError:
            return None
        if (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns):
            digest = hashlib.sha256(data).hexdigest()[:32]
            token = f"local:{after.st_ino}:{after.st_mtime_ns}:{after.st_size}:{digest}"
            return data, token
    raise OSError(errno.EAGAIN, "file keeps changing while read", target)


def target_and_dir(path: os.PathLike) -> tuple[str, str]:
    """The file's name and its directory, which is created when missing."""
    target = os.fspath(path)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    return target, directory
