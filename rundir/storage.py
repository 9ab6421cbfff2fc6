"""TEMPORARY local-only stand-in written by the lead so the rest can be tested; helper-1 replaces
this whole file with the real implementation (same API)."""

from __future__ import annotations

import os

os.environ.setdefault("EPATH_USE_TF", "false")

from etils import epath  # noqa: E402

Path = epath.Path
SUPPORTED_SCHEMES = ("local", "gs://")


class UnsupportedPathError(ValueError):
    pass


class StorageError(OSError):
    pass


def as_path(url, *, name=None):
    if isinstance(url, epath.Path):
        return url
    text = os.fspath(url)
    if "://" in text:
        return epath.Path(text)
    return epath.Path(os.path.abspath(text))


def is_remote(path) -> bool:
    return "://" in os.fspath(path)


def write_text_atomic(path, text):
    path = as_path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_bytes(path, data):
    as_path(path).write_bytes(data)


def append_text(path, text):
    with open(as_path(path), "a", encoding="utf-8") as f:
        f.write(text)


def create_exclusive(path, text) -> bool:
    try:
        fd = os.open(as_path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return True


def _version(path):
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read_versioned(path):
    path = as_path(path)
    try:
        v = _version(path)
        return path.read_text(), v
    except FileNotFoundError:
        return None


def replace_if(path, text, version) -> bool:
    path = as_path(path)
    try:
        if _version(path) != version:
            return False
    except FileNotFoundError:
        return False
    write_text_atomic(path, text)
    return True


def delete_if(path, version) -> bool:
    path = as_path(path)
    try:
        if _version(path) != version:
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def mtime(path):
    try:
        return os.stat(as_path(path)).st_mtime
    except FileNotFoundError:
        return None


def move_tree(src, dst):
    os.replace(as_path(src), as_path(dst))
