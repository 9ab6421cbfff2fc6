"""The one path type of the project and the storage primitives every run-directory writer uses.

Every path is a URL (STYLE.md 16): `as_path` turns a local path or a `gs://BUCKET/...` URL into an
`etils.epath.Path` (the type orbax uses), and refuses anything else before a byte is written. The
primitives below behave alike on local disk and on Google Cloud Storage:

- `write_text_atomic` / `write_bytes`: readers see the old file or the new one, never a part.
- `append_text`: appends one chunk; on GCS by compose (the chunk is uploaded once, the object is
  not re-uploaded), so a long `metrics.jsonl` costs O(chunk) per append.
- `create_exclusive`, `read_versioned` + `replace_if` / `delete_if`: create-if-absent and
  compare-and-swap on one file; what a lease needs on object storage (GCS generation
  preconditions; on local disk a directory `flock` around check-and-replace).

Backends: gs:// goes through fsspec/gcsfs for our own calls AND for every `epath.Path` (orbax's
metadata included), never through TensorFlow's GCS client, so one client with one configuration
(endpoint, credentials, retries) serves the whole process. Importing this module therefore pins
`EPATH_USE_TF=false` and gcsfs's plain JSON-API filesystem (see `_select_backends`). Failures of
the storage service surface as `StorageError`, one line naming the path and the cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import hashlib
import json
import os
import pathlib
import re
import uuid
from collections.abc import Iterator

import fsspec
from etils import epath

Path = epath.Path
PathLike = str | os.PathLike

SUPPORTED_SCHEMES = ("local", "gs://")  # what `as_path` accepts

# epath reads a local absolute path whose first part is one of these as that scheme's URL
# (`/gs/b/x` is `gs://b/x`), so such local paths are refused rather than silently remote.
_EPATH_URI_ROOTS = ("gs", "s3", "az", "hf")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_GS_URL = re.compile(r"^gs://([^/]*)(/.*)?$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")
_KNOWN_SCHEMES = {"gs", "gcs", "s3", "s3a", "az", "abfs", "hf", "http", "https", "file", "ftp"}

# Uploads smaller than this go as one multipart request (our own, so that it can carry a
# generation precondition); larger `write_bytes` payloads use gcsfs's resumable upload.
_MULTIPART_MAX = 32 * 2**20
# How often a conditional step is retried when another writer wins the race in between.
_CAS_ATTEMPTS = 8


class UnsupportedPathError(ValueError):
    """A path whose scheme the storage stack cannot write (refused before anything is written)."""


class StorageError(OSError):
    """The storage service failed (refused connection, 5xx after retries, bad request...)."""


@dataclasses.dataclass(frozen=True)
class Version:
    """Which state of one file a reader saw; `replace_if` / `delete_if` act only on that state.

    On GCS it is the object's generation (every write makes a new one). On local disk it is the
    inode, modification time, size and content digest: a rewrite changes the inode (files are
    replaced, never edited), an append the size, and the digest covers an inode reused within the
    filesystem's coarse clock tick.
    """

    token: str

    @property
    def generation(self) -> int | None:
        """The GCS generation, or None for a local file's version."""
        kind, _, value = self.token.partition(":")
        return int(value) if kind == "gs" else None


# --------------------------------------------------------------------------- paths


def _select_backends() -> None:
    """Routes gs:// through fsspec's plain gcsfs filesystem, for epath (orbax) and for us.

    - `EPATH_USE_TF=false`: etils otherwise uses TensorFlow's GCS client whenever TF is installed,
      which ignores `STORAGE_EMULATOR_HOST` and our retries; etils caches that choice on first
      use (`gpath._is_tf_installed`), so the cache is cleared too if someone used gs:// earlier.
    - gcsfs's JSON-API `GCSFileSystem`, not its `ExtendedGcsFileSystem` default: the extended one
      asks the Storage Control gRPC API for every bucket's layout (a 60 s retry loop where that
      API is not served, e.g. an emulator) and our preconditions and compose are JSON-API calls.
    - No listing cache: gcsfs caches directory listings forever by default, so a reader would not
      see objects another process wrote (checkpoints, metrics); local disk has no such staleness.
    """
    os.environ["EPATH_USE_TF"] = "false"
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # for child processes
    from etils.epath import gpath

    cached = getattr(gpath, "_is_tf_installed", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
    for protocol in ("gs", "gcs"):
        if protocol in fsspec.registry:  # already imported (maybe the extended class)
            from gcsfs.core import GCSFileSystem

            fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)
        else:
            fsspec.register_implementation(protocol, "gcsfs.core.GCSFileSystem", clobber=True)
    fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)


_select_backends()


def _refuse(name: str | None, value: str, why: str) -> UnsupportedPathError:
    supported = "local paths and gs://BUCKET/PATH"
    return UnsupportedPathError(f"{name or 'path'}={value!r}: {why} (supported: {supported})")


def as_path(url: PathLike, *, name: str | None = None) -> epath.Path:
    """The project's path type for any path or URL: an absolute local path or a gs:// URL.

    Args:
      url: a str, `os.PathLike` or `epath.Path`; `~` is expanded, relative paths are made absolute
        (orbax refuses relative ones).
      name: what the value is called where the user set it (e.g. `MODEL_DIR`), for the error.

    Raises:
      UnsupportedPathError: other schemes (`s3://`, `http://`, `file://`), a mangled URL
        (`gs:/bucket`, as `pathlib.Path("gs://bucket")` makes it), `gs://` without a bucket, or a
        local path that epath would read as a URL (`/gs/...`); nothing has been written then.
    """
    text = os.fsdecode(os.fspath(url))
    if not text:
        raise _refuse(name, text, "empty path")
    if text.startswith("gs://"):
        bucket = _GS_URL.match(text).group(1)
        if not bucket:
            raise _refuse(name, text, "a gs:// URL needs a bucket name: gs://BUCKET/PATH")
        if not _BUCKET.match(bucket):
            raise _refuse(name, text, f"{bucket!r} is not a bucket name")
        return epath.Path(text)
    scheme = _SCHEME.match(text)
    if scheme and (
        text[scheme.end() :].startswith("/") or scheme.group(1).lower() in _KNOWN_SCHEMES
    ):
        if scheme.group(1) == "gs":
            raise _refuse(name, text, "not a gs:// URL (pathlib turns gs://b into gs:/b)")
        raise _refuse(name, text, f"scheme {scheme.group(1)!r} is not supported")
    local = os.path.abspath(os.path.expanduser(text))
    first = local.split(os.sep)[1]
    if first in _EPATH_URI_ROOTS:
        raise _refuse(name, text, f"etils.epath reads /{first}/... as {first}:// (rename the dir)")
    return epath.Path(local)


def local_dir(path: PathLike, *, name: str, why: str) -> pathlib.Path:
    """`path` as an absolute local `pathlib.Path`, for what is local by design (corpora that apt
    builds on this machine, a demo's output, lm-eval's task files), so that a gs:// value is a
    clear error instead of a local `gs:/` folder.

    Args:
      path: the value as the user gave it.
      name: the setting or flag it came from (e.g. `--data-dir`), for the error.
      why: why this path must be local, for the error.

    Raises:
      UnsupportedPathError: a gs:// URL (naming `name`, the value and `why`) or any value
        `as_path` refuses.
    """
    checked = as_path(path, name=name)
    if os.fspath(checked).startswith("gs://"):
        raise UnsupportedPathError(
            f"{name}={os.fspath(path)!r}: must be a local directory ({why}); gs:// is supported "
            "for MODEL_DIR, runs directories and corpora read by seqio"
        )
    return pathlib.Path(os.fspath(checked))


def is_remote(path: PathLike) -> bool:
    """Whether `path` lives on object storage (gs://) rather than local disk."""
    return os.fspath(as_path(path)).startswith("gs://")


# --------------------------------------------------------------------------- errors


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or "no detail"
    return f"{type(error).__name__}: {text}"


@contextlib.contextmanager
def storage_errors(path: PathLike, action: str) -> Iterator[None]:
    """Re-raises failures of the storage service under `action` on a gs:// `path` as one
    `StorageError` naming both; "absent" and "exists" answers (FileNotFoundError,
    FileExistsError) pass through, and local paths keep their own OSErrors (they name the path).
    Use it around direct `epath.Path` calls on run files."""
    try:
        yield
    except (
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        StorageError,
        UnsupportedPathError,
    ):
        raise
    except Exception as e:
        if not os.fspath(path).startswith("gs://"):
            raise
        raise StorageError(f"{action} {os.fspath(path)} failed: {_one_line(e)}") from e


# Exception types (by defining module) that mean the storage service failed, whatever library
# raised them: aiohttp (gcsfs's transport), gcsfs itself, and tensorstore.
_SERVICE_MODULES = ("aiohttp", "gcsfs", "google.auth", "google.api_core", "tensorstore")


def is_service_failure(error: BaseException) -> bool:
    """Whether `error`, or an exception it was raised from, is the storage service failing (a
    refused connection, a timeout, an HTTP error after retries), rather than a bug or a bad
    value: what a library call on a gs:// path (orbax's save) raises when the store goes away."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (StorageError, ConnectionError, TimeoutError)):
            return True
        module = type(error).__module__
        if any(module == m or module.startswith(m + ".") for m in _SERVICE_MODULES):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def service_errors(path: PathLike, action: str) -> Iterator[None]:
    """Like `storage_errors`, for calls into libraries that may fail for other reasons too
    (orbax): only service failures (`is_service_failure`) on a gs:// `path` become one
    `StorageError` naming `action` and the path; anything else passes through unchanged. The
    trainer then knows the store is unreachable and does not wait on it again."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        if not os.fspath(path).startswith("gs://") or not is_service_failure(e):
            raise
        raise StorageError(f"{action} {os.fspath(path)} failed: {_one_line(e)}") from e


# --------------------------------------------------------------------------- gs://


def _gcs():
    """The process's gcsfs filesystem: the same cached instance epath's fsspec backend uses."""
    return fsspec.filesystem("gcs", finalize_on_close=True)


def _split(path: epath.Path) -> tuple[str, str]:
    bucket, _, key = os.fspath(path)[len("gs://") :].partition("/")
    if not key:
        raise IsADirectoryError(f"{os.fspath(path)} is a bucket, not a file")
    return bucket, key


def _gs_metadata(path: epath.Path) -> dict | None:
    """The object's JSON metadata, or None when it does not exist."""
    bucket, key = _split(path)
    try:
        return _gcs().call("GET", "b/{}/o/{}", bucket, key, json_out=True)
    except FileNotFoundError:
        return None


def _gs_upload(path: epath.Path, data: bytes, *, if_generation_match: int | None = None) -> dict:
    """One multipart upload (atomic: the object appears whole or not at all).

    With `if_generation_match` the server writes only if the live generation equals it (0: only
    if absent) and answers 412, raised by gcsfs as FileExistsError, otherwise. Our own request
    rather than gcsfs's `simple_upload`, which knows only 0 and uses a fixed multipart boundary.
    """
    bucket, key = _split(path)
    boundary = uuid.uuid4().hex
    while boundary.encode() in data:
        boundary = uuid.uuid4().hex
    body = b"".join(
        [
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            json.dumps({"name": key}).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        ]
    )
    fs = _gcs()
    params = {} if if_generation_match is None else {"ifGenerationMatch": str(if_generation_match)}
    return fs.call(
        "POST",
        f"{fs._location}/upload/storage/v1/b/{{}}/o",
        bucket,
        uploadType="multipart",
        headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
        data=body,
        json_out=True,
        **params,
    )


def _gs_write(path: epath.Path, data: bytes) -> None:
    if len(data) < _MULTIPART_MAX:
        _gs_upload(path, data)
    else:
        _gcs().pipe_file(os.fspath(path), data)


def _gs_read_versioned(path: epath.Path) -> tuple[bytes, Version] | None:
    """Content and generation from one GET (GCS sends the generation it served as a header)."""
    bucket, key = _split(path)
    try:
        headers, data = _gcs().call("GET", "b/{}/o/{}", bucket, key, alt="media")
    except FileNotFoundError:
        return None
    return data, Version(f"gs:{int(headers['X-Goog-Generation'])}")


def _gs_holds(path: epath.Path, data: bytes) -> bool:
    """After a 412 to a conditional write: whether the object holds exactly `data` anyway (a
    retried request whose first attempt landed but whose answer was lost sees its own write)."""
    found = _gs_read_versioned(path)
    return found is not None and found[0] == data


def _gs_compose(path: epath.Path, parts: list[tuple[str, int | None]], generation: int) -> None:
    """`path` := concatenation of `parts` (keys, each pinned to a generation or not), only if
    `path`'s live generation is `generation` (0: absent); 412 -> FileExistsError."""
    bucket, key = _split(path)
    sources = [{"name": k} if g is None else {"name": k, "generation": str(g)} for k, g in parts]
    _gcs().call(
        "POST",
        "b/{}/o/{}/compose",
        bucket,
        key,
        ifGenerationMatch=str(generation),
        headers={"Content-Type": "application/json"},
        json={
            "kind": "storage#composeRequest",
            "sourceObjects": sources,
            "destination": {"contentType": "application/octet-stream"},
        },
        json_out=True,
    )


def _gs_append(path: epath.Path, data: bytes) -> None:
    """Appends by compose: the chunk goes up once as a temporary object, the server concatenates
    (O(chunk) traffic), the temporary object is deleted. Each compose is conditional on the
    generation it extends, so a concurrent writer's append is never overwritten; after a 412 a
    lost answer to our own compose is recognised by the object's new size and tail."""
    meta = _gs_metadata(path)
    if meta is None:
        try:
            _gs_upload(path, data, if_generation_match=0)
            return
        except FileExistsError:
            if _gs_holds(path, data):  # a retried create whose first attempt landed
                return
            meta = _gs_metadata(path)
    bucket, key = _split(path)
    directory, _, name = key.rpartition("/")
    tmp_key = f"{directory}/.{name}.append-{uuid.uuid4().hex}".lstrip("/")
    tmp = epath.Path(f"gs://{bucket}/{tmp_key}")
    _gs_upload(tmp, data)
    try:
        for _ in range(_CAS_ATTEMPTS):
            if meta is None:  # deleted meanwhile: the chunk becomes the whole object
                parts, generation, size = [(tmp_key, None)], 0, 0
            else:
                generation, size = int(meta["generation"]), int(meta["size"])
                parts = [(key, generation), (tmp_key, None)]
            try:
                _gs_compose(path, parts, generation)
                return
            except FileExistsError:
                meta = _gs_metadata(path)
                if meta is not None and int(meta["size"]) == size + len(data):
                    _, tail = _gcs().call(
                        "GET", "b/{}/o/{}", bucket, key, alt="media",
                        headers={"Range": f"bytes={size}-"},
                    )  # fmt: skip
                    if tail == data:
                        return
        raise StorageError(f"appending to {os.fspath(path)} failed: contended {_CAS_ATTEMPTS}x")
    finally:
        with contextlib.suppress(FileNotFoundError):
            _gcs().call("DELETE", "b/{}/o/{}", bucket, tmp_key)


# --------------------------------------------------------------------------- local disk


@contextlib.contextmanager
def _dir_lock(directory: str) -> Iterator[None]:
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


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _staged(target: str, data: bytes) -> Iterator[str]:
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


def _local_read_versioned(target: str) -> tuple[bytes, Version] | None:
    """Content and version read from one open file (re-read if an append changed it meanwhile)."""
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
            return data, Version(token)
    raise OSError(errno.EAGAIN, "file keeps changing while read", target)


def _local_target(path: epath.Path) -> tuple[str, str]:
    target = os.fspath(path)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    return target, directory


# --------------------------------------------------------------------------- primitives


def write_bytes(path: PathLike, data: bytes) -> None:
    """Writes the whole file at once: a reader sees the old content or the new, never a part.

    Local: temporary file + fsync + `os.replace` (+ directory fsync). GCS: one upload (an object
    is visible only once complete). Missing parent directories are created (GCS has none).
    """
    path = as_path(path)
    if is_remote(path):
        with storage_errors(path, "writing"):
            _gs_write(path, bytes(data))
        return
    target, directory = _local_target(path)
    with _staged(target, bytes(data)) as tmp, _dir_lock(directory):
        os.replace(tmp, target)
    _fsync_dir(directory)


def write_text_atomic(path: PathLike, text: str) -> None:
    """`write_bytes` of `text` in UTF-8 (run.json, COMPLETED, config.gin ...)."""
    write_bytes(path, text.encode("utf-8"))


def read_text(path: PathLike) -> str:
    """The whole file; FileNotFoundError when absent, StorageError when the service fails."""
    found = read_versioned(path)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "no such file", os.fspath(as_path(path)))
    return found[0]


def append_text(path: PathLike, text: str) -> None:
    """Appends `text` (one or more whole lines) to the file, creating it when absent.

    Local: open for append + flush + fsync. GCS, where objects cannot be appended to: the chunk is
    uploaded as a temporary object and composed onto the file (traffic O(chunk), not O(file)).
    """
    path = as_path(path)
    data = text.encode("utf-8")
    if is_remote(path):
        with storage_errors(path, "appending to"):
            _gs_append(path, data)
        return
    target, directory = _local_target(path)
    with _dir_lock(directory), open(target, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def create_exclusive(path: PathLike, text: str) -> bool:
    """Creates the file with `text` if it does not exist; False if it already does.

    Of several concurrent creators exactly one gets True. The file appears complete (local: a
    fully written temporary file is hard-linked into place, which fails if the name exists; GCS:
    an upload with `ifGenerationMatch=0`). On GCS a retried request whose first attempt created the
    file (its answer lost) finds `text` there and answers True; so give each creator distinct text
    (the lease's names its holder), or two creators of identical text may both see True.
    """
    path = as_path(path)
    data = text.encode("utf-8")
    if is_remote(path):
        with storage_errors(path, "creating"):
            try:
                _gs_upload(path, data, if_generation_match=0)
                return True
            except FileExistsError:
                return _gs_holds(path, data)
    target, directory = _local_target(path)
    with _staged(target, data) as tmp:
        try:
            os.link(tmp, target)  # (filesystems without hard links, e.g. FUSE: use gs:// itself)
        except FileExistsError:
            return False
    _fsync_dir(directory)
    return True


def read_versioned(path: PathLike) -> tuple[str, Version] | None:
    """The file's text and the `Version` it was read at, or None when it does not exist."""
    path = as_path(path)
    if is_remote(path):
        with storage_errors(path, "reading"):
            found = _gs_read_versioned(path)
    else:
        found = _local_read_versioned(os.fspath(path))
    return None if found is None else (found[0].decode("utf-8"), found[1])


def replace_if(path: PathLike, text: str, version: Version) -> bool:
    """Replaces the file with `text` only if it is still at `version`; False otherwise (changed,
    deleted). Atomic for readers as `write_text_atomic`.

    GCS: an upload with `ifGenerationMatch=<generation>`, decided by the server. Local: the
    version is re-read and the file replaced under the directory lock every writer here takes.
    """
    path = as_path(path)
    data = text.encode("utf-8")
    if is_remote(path):
        with storage_errors(path, "replacing"):
            if version.generation is None:
                return False
            try:
                _gs_upload(path, data, if_generation_match=version.generation)
                return True
            except FileExistsError:
                return _gs_holds(path, data)
    target, directory = _local_target(path)
    with _staged(target, data) as tmp, _dir_lock(directory):
        found = _local_read_versioned(target)
        if found is None or found[1] != version:
            return False
        os.replace(tmp, target)
    _fsync_dir(directory)
    return True


def delete_if(path: PathLike, version: Version) -> bool:
    """Deletes the file only if it is still at `version`; False otherwise (changed, gone).

    GCS: the generation is checked, then DELETE carries `ifGenerationMatch` so the server
    refuses a file rewritten in between (a lost answer to a retried DELETE reads as False).
    Local: check and unlink under the directory lock.
    """
    path = as_path(path)
    if is_remote(path):
        with storage_errors(path, "deleting"):
            meta = _gs_metadata(path)
            if meta is None or int(meta["generation"]) != version.generation:
                return False
            bucket, key = _split(path)
            try:
                _gcs().call(
                    "DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(version.generation)
                )
            except (FileExistsError, FileNotFoundError):
                return False
            return True
    target, directory = _local_target(path)
    with _dir_lock(directory):
        found = _local_read_versioned(target)
        if found is None or found[1] != version:
            return False
        os.unlink(target)
    _fsync_dir(directory)
    return True


def mtime(path: PathLike) -> float | None:
    """The file's last modification (seconds since the epoch), or None when it does not exist."""
    path = as_path(path)
    if not is_remote(path):
        try:
            return os.stat(path).st_mtime
        except FileNotFoundError:
            return None
    with storage_errors(path, "reading the metadata of"):
        meta = _gs_metadata(path)
    if meta is None:
        return None
    return datetime.datetime.fromisoformat(meta["updated"]).timestamp()


def list_files(path: PathLike) -> list[epath.Path]:
    """Every file under the directory `path`, recursively, sorted; [] when there is none.

    On gs:// use this rather than `epath.Path.walk()`: etils' fsspec backend yields its roots
    without the `gs://` scheme (`bucket/dir`, a relative local path), and `rglob` refuses `**`.
    """
    path = as_path(path)
    top = os.fspath(path)
    if not is_remote(path):
        found = (os.path.join(root, n) for root, _, names in os.walk(top) for n in names)
        return sorted(epath.Path(f) for f in found)
    prefix = top[len("gs://") :].rstrip("/") + "/"
    with storage_errors(path, "listing"):
        names = _gcs().find(top)
    return sorted(
        epath.Path(f"gs://{n}") for n in names if n.startswith(prefix) and not n.endswith("/")
    )


def move_tree(src: PathLike, dst: PathLike) -> None:
    """Moves a file or directory tree to `dst` (which must not exist) on the same storage.

    Local: one `os.replace` (atomic). GCS has no directories or renames: every object is copied,
    then deleted (not atomic; a reader may see both trees for a while).
    """
    src, dst = as_path(src), as_path(dst)
    if is_remote(src) != is_remote(dst):
        raise ValueError(f"cannot move {src} to {dst}: not on the same storage")
    if not is_remote(src):
        os.makedirs(os.path.dirname(os.fspath(dst)), exist_ok=True)
        os.replace(src, dst)
        return
    with storage_errors(src, f"moving to {dst}"):
        _gcs().mv(os.fspath(src), os.fspath(dst), recursive=True)
