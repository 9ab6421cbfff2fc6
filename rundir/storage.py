"""The one path type of the project and the storage primitives every run-directory writer uses.

Every path is a URL (docs/conventions.md): `as_path` turns a local path or a `gs://BUCKET/...` URL into an
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
`EPATH_USE_TF=false`, gcsfs's plain JSON-API filesystem and the time bounds of every request,
TensorStore's included (`rundir.storage_backends`, whose public names are re-exported here).
Failures of the storage service surface as `StorageError`, one line naming the path and the cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import os
import pathlib
import re
from collections.abc import Iterator

from etils import epath

from rundir import gcs_objects, local_files, storage_backends
from rundir.storage_backends import (  # noqa: F401  (re-exported: callers import them from here)
    REQUEST_TIMEOUTS_S,
    TENSORSTORE_CURL_ENV,
    TENSORSTORE_RETRIES,
    bound_orbax_retries,
    store_unreachable,
)

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


class UnsupportedPathError(ValueError):
    """A path whose scheme the storage stack cannot write (refused before anything is written)."""


# Why a storage call failed, as the user acts on it -> what to do about it. `unreachable` (no
# answer: refused, reset, timed out) and `permission` (an answer: 401/403, EACCES, EROFS) are told
# apart; `failed` is any other answer the service gave after its retries.
CAUSES: dict[str, str] = {
    "unreachable": "no answer from the storage service; check the endpoint and the network",
    "disk full": "no space left on the device; free some",
    "quota": "a storage quota is exhausted; raise it or free space",
    "permission": "refused: the credentials may not write there; fix the permissions",
    "upload lost": "the service forgot an upload in flight (it restarted)",
    "failed": "the storage service failed",
}


class StorageError(OSError):
    """The storage service failed (refused connection, 5xx after retries, a full disk...).

    Attributes:
      cause: one of `CAUSES` (what the user does about it).
    """

    def __init__(self, message: str, *, cause: str = "failed"):
        super().__init__(message)
        self.cause = cause


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

storage_backends.select_backends()  # before anything in this process touches gs://


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
    """`Type: message` in one line; a message-less error (fsspec's FSTimeoutError) borrows the
    first message of the errors it was raised from (aiohttp's "Timeout on reading data...")."""
    text, seen, cause = "", set(), error
    while not text and cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = " ".join(str(cause).split())
        cause = cause.__cause__ or cause.__context__
    return f"{type(error).__name__}: {text or 'no detail'}"


# errno -> cause, for local disks and the OSErrors libraries pass on.
_ERRNO_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "quota",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EROFS: "permission",
}
# HTTP status (gcsfs's HttpError.code) -> cause.
_HTTP_CAUSES = {401: "permission", 403: "permission", 429: "quota", 507: "disk full"}
# Words in a message -> cause, for libraries that raise plain ValueErrors or RuntimeErrors
# (tensorstore: "ABORTED: All 6 retry attempts failed: CURL error Could not connect ...",
# "... [OS error 28: No space left on device]"; gcsfs: a 404 on a resumable upload's URL once
# the service forgot the session). First match wins.
_TEXT_CAUSES = (
    ("No space left on device", "disk full"),
    ("Disk quota exceeded", "quota"),
    ("PERMISSION_DENIED", "permission"),
    ("UNAUTHENTICATED", "permission"),
    ("CURL error", "unreachable"),
    ("retry attempts failed", "failed"),
    ("DEADLINE_EXCEEDED", "unreachable"),
    ("UNAVAILABLE", "unreachable"),
    ("upload_id=", "upload lost"),
    ("uploadType=resumable", "upload lost"),
    ("/upload/resumable/", "upload lost"),
)
# Exception types (by defining module) that mean the storage service failed, whatever library
# raised them: aiohttp (gcsfs's transport), gcsfs itself, and tensorstore.
_SERVICE_MODULES = ("aiohttp", "gcsfs", "google.auth", "google.api_core", "tensorstore")
# What a local disk's failures are: a full disk or quota is storage (resume once freed); a
# permission error or a missing file stays the caller's own error.
LOCAL_CAUSES = ("disk full", "quota")


def _cause_of_one(error: BaseException) -> str | None:
    if isinstance(error, StorageError):
        return error.cause
    if isinstance(error, OSError) and error.errno in _ERRNO_CAUSES:
        return _ERRNO_CAUSES[error.errno]
    code = getattr(error, "code", None)
    if type(error).__module__.startswith("gcsfs") and code in _HTTP_CAUSES:
        return _HTTP_CAUSES[code]
    text = str(error)
    for words, cause in _TEXT_CAUSES:
        if words in text:
            return cause
    if isinstance(error, (ConnectionError, TimeoutError)):
        return "unreachable"
    module = type(error).__module__
    if module.startswith("aiohttp") and "Disconnected" in type(error).__name__:
        return "unreachable"
    if module.startswith("aiohttp") and isinstance(error, OSError):
        return "unreachable"  # aiohttp's ClientConnectorError, ClientOSError
    if any(module == m or module.startswith(m + ".") for m in _SERVICE_MODULES):
        return "failed"
    return None


def failure_cause(error: BaseException) -> str | None:
    """Why the storage failed, as one of `CAUSES`, if `error` or an exception it was raised from
    is the storage failing (no answer, a refusal, a full disk, an HTTP error after retries); None
    for anything else (a bug, a bad value). The first link of the chain that says wins."""
    seen, found = set(), None
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        cause = _cause_of_one(error)
        if cause not in (None, "failed"):
            return cause
        found = found or cause
        error = error.__cause__ or error.__context__
    return found


def is_service_failure(error: BaseException) -> bool:
    """Whether `error`, or an exception it was raised from, is the storage service failing (a
    refused connection, a timeout, an HTTP error after retries), rather than a bug or a bad
    value: what a library call on a gs:// path (orbax's save) raises when the store goes away."""
    return failure_cause(error) is not None


def as_storage_error(
    error: BaseException, path: PathLike, action: str, *, causes: tuple[str, ...] | None = None
) -> StorageError | None:
    """`error` as a `StorageError` naming the cause, `action` and `path`, or None when it is not
    a storage failure there (on local disk only a full disk or quota is), or not one of `causes`
    when given, or already a `StorageError`."""
    if isinstance(error, StorageError):
        return None
    cause = failure_cause(error)
    if cause is None or (not os.fspath(path).startswith("gs://") and cause not in LOCAL_CAUSES):
        return None
    if causes is not None and cause not in causes:
        return None
    where = os.fspath(path)
    return StorageError(
        f"storage {cause}: {action} {where} failed: {_one_line(error)}", cause=cause
    )


def told(error: StorageError, *, last: tuple[int, PathLike] | None) -> StorageError:
    """`error` as a job reports it: what failed (one line), what to do about its cause, and the
    last complete checkpoint (step, directory) where a rerun resumes (`rundir.exits` adds the
    command)."""
    where = "no checkpoint was complete yet: a rerun starts the run again"
    if last is not None:
        where = f"last complete checkpoint: step {last[0]} ({os.fspath(last[1])}); a resume "
        where += "verifies its checksums and starts there"
    return StorageError(f"{error}\n  {CAUSES[error.cause]}\n  {where}", cause=error.cause)


@contextlib.contextmanager
def storage_errors(path: PathLike, action: str) -> Iterator[None]:
    """Re-raises failures of the storage service under `action` on `path` as one `StorageError`
    naming the cause, the action and the path: on gs:// anything but the "absent" and "exists"
    answers (FileNotFoundError, FileExistsError), on local disk a full disk or quota (other local
    OSErrors name the path already). Use it around direct `epath.Path` calls on run files."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, IsADirectoryError, UnsupportedPathError):
        raise
    except Exception as e:
        remote = os.fspath(path).startswith("gs://")
        error = as_storage_error(e, path, action)
        if error is None and remote and not isinstance(e, StorageError):
            cause = failure_cause(e) or "failed"
            error = StorageError(
                f"storage {cause}: {action} {os.fspath(path)} failed: {_one_line(e)}", cause=cause
            )
        if error is None:
            raise
        raise error from e


@contextlib.contextmanager
def service_errors(path: PathLike, action: str) -> Iterator[None]:
    """Like `storage_errors`, for calls into libraries that may fail for other reasons too
    (orbax): only storage failures (`failure_cause`) become one `StorageError` naming the cause,
    `action` and the path; anything else passes through unchanged. The trainer then knows the
    store is unreachable or full and does not wait on it again."""
    try:
        yield
    except Exception as e:
        error = as_storage_error(e, path, action)
        if error is None:
            raise
        raise error from e


# --------------------------------------------------------------------------- primitives


def write_bytes(path: PathLike, data: bytes) -> None:
    """Writes the whole file at once: a reader sees the old content or the new, never a part.

    Local: temporary file + fsync + `os.replace` (+ directory fsync). GCS: one upload (an object
    is visible only once complete). Missing parent directories are created (GCS has none).
    """
    path = as_path(path)
    if is_remote(path):
        with storage_errors(path, "writing"):
            gcs_objects.write(path, bytes(data))
        return
    with storage_errors(path, "writing"):  # a full disk is a storage failure here too
        target, directory = local_files.target_and_dir(path)
        with local_files.staged(target, bytes(data)) as tmp, local_files.dir_lock(directory):
            os.replace(tmp, target)
        local_files.fsync_dir(directory)


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
            try:
                gcs_objects.append(path, data)
            except gcs_objects.ContendedError as e:
                raise StorageError(str(e)) from None
        return
    with storage_errors(path, "appending to"):
        target, directory = local_files.target_and_dir(path)
        with local_files.dir_lock(directory), open(target, "ab") as f:
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
                gcs_objects.upload(path, data, if_generation_match=0)
                return True
            except FileExistsError:
                return gcs_objects.holds(path, data)
    with storage_errors(path, "creating"):
        target, directory = local_files.target_and_dir(path)
        with local_files.staged(target, data) as tmp:
            try:
                os.link(tmp, target)  # (filesystems without hard links, e.g. FUSE: use gs://)
            except FileExistsError:
                return False
        local_files.fsync_dir(directory)
    return True


def read_versioned(path: PathLike) -> tuple[str, Version] | None:
    """The file's text and the `Version` it was read at, or None when it does not exist."""
    path = as_path(path)
    if is_remote(path):
        with storage_errors(path, "reading"):
            found = gcs_objects.read_generation(path)
        return None if found is None else (found[0].decode("utf-8"), Version(f"gs:{found[1]}"))
    found = local_files.read_versioned(os.fspath(path))
    return None if found is None else (found[0].decode("utf-8"), Version(found[1]))


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
                gcs_objects.upload(path, data, if_generation_match=version.generation)
                return True
            except FileExistsError:
                return gcs_objects.holds(path, data)
    with storage_errors(path, "replacing"):
        target, directory = local_files.target_and_dir(path)
        with local_files.staged(target, data) as tmp, local_files.dir_lock(directory):
            found = local_files.read_versioned(target)
            if found is None or Version(found[1]) != version:
                return False
            os.replace(tmp, target)
        local_files.fsync_dir(directory)
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
            return gcs_objects.delete(path, version.generation)
    target, directory = local_files.target_and_dir(path)
    with local_files.dir_lock(directory):
        found = local_files.read_versioned(target)
        if found is None or Version(found[1]) != version:
            return False
        os.unlink(target)
    local_files.fsync_dir(directory)
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
        meta = gcs_objects.metadata(path)
    if meta is None:
        return None
    return datetime.datetime.fromisoformat(meta["updated"]).timestamp()


def is_dir(path: PathLike) -> bool:
    """Whether the directory `path` exists (on gs://: objects exist under it); False when it does
    not, and `StorageError` when the storage service fails. Use it rather than
    `epath.Path.is_dir()` where the answer decides something (a resume or a fresh start): on gs://
    that one answers False when the service does not answer at all."""
    path = as_path(path)
    if not is_remote(path):
        return os.path.isdir(path)
    with storage_errors(path, "reading the metadata of"):
        try:
            return gcs_objects.filesystem().info(os.fspath(path))["type"] == "directory"
        except FileNotFoundError:
            return False


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
        names = gcs_objects.filesystem().find(top)
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
        gcs_objects.filesystem().mv(os.fspath(src), os.fspath(dst), recursive=True)
