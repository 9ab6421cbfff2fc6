"""Google Cloud Storage objects through gcsfs's JSON-API client: the requests `rundir.storage`'s
primitives make on gs:// paths (multipart uploads with generation preconditions, reads that
return the generation served, compose-based appends, conditional deletes).

`rundir.storage` is the public face (paths, errors, `Version`); this module speaks only in
objects and generations, so that the local-disk and GCS halves of each primitive sit apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid

import fsspec
from etils import epath

# Uploads smaller than this go as one multipart request (our own, so that it can carry a
# generation precondition); larger `write_bytes` payloads use gcsfs's resumable upload.
_MULTIPART_MAX = 32 * 2**20
# How often a conditional step is retried when another writer wins the race in between.
_CAS_ATTEMPTS = 8


class ContendedError(OSError):
    """A conditional step lost the race to other writers `_CAS_ATTEMPTS` times in a row."""


def filesystem():
    """The process's gcsfs filesystem: the same cached instance epath's fsspec backend uses."""
    return fsspec.filesystem("gcs", finalize_on_close=True)


def split(path: epath.Path) -> tuple[str, str]:
    bucket, _, key = os.fspath(path)[len("gs://") :].partition("/")
    if not key:
        raise IsADirectoryError(f"{os.fspath(path)} is a bucket, not a file")
    return bucket, key


def metadata(path: epath.Path) -> dict | None:
    """The object's JSON metadata, or None when it does not exist."""
    bucket, key = split(path)
    try:
        return filesystem().call("GET", "b/{}/o/{}", bucket, key, json_out=True)
    except FileNotFoundError:
        return None


def upload(path: epath.Path, data: bytes, *, if_generation_match: int | None = None) -> dict:
    """One multipart upload (atomic: the object appears whole or not at all).

    With `if_generation_match` the server writes only if the live generation equals it (0: only
    if absent) and answers 412, raised by gcsfs as FileExistsError, otherwise. Our own request
    rather than gcsfs's `simple_upload`, which knows only 0 and uses a fixed multipart boundary.
    """
    bucket, key = split(path)
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
    fs = filesystem()
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


def write(path: epath.Path, data: bytes) -> None:
    if len(data) < _MULTIPART_MAX:
        upload(path, data)
    else:
        filesystem().pipe_file(os.fspath(path), data)


def read_generation(path: epath.Path) -> tuple[bytes, int] | None:
    """Content and generation from one GET (GCS sends the generation it served as a header)."""
    bucket, key = split(path)
    try:
        headers, data = filesystem().call("GET", "b/{}/o/{}", bucket, key, alt="media")
    except FileNotFoundError:
        return None
    return data, int(headers["X-Goog-Generation"])


def holds(path: epath.Path, data: bytes) -> bool:
    """After a 412 to a conditional write: whether the object holds exactly `data` anyway (a
    retried request whose first attempt landed but whose answer was lost sees its own write)."""
    found = read_generation(path)
    return found is not None and found[0] == data


def compose(path: epath.Path, parts: list[tuple[str, int | None]], generation: int) -> None:
    """`path` := concatenation of `parts` (keys, each pinned to a generation or not), only if
    `path`'s live generation is `generation` (0: absent); 412 -> FileExistsError."""
    bucket, key = split(path)
    sources = [{"name": k} if g is None else {"name": k, "generation": str(g)} for k, g in parts]
    filesystem().call(
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


def append(path: epath.Path, data: bytes) -> None:
    """Appends by compose: the chunk goes up once as a temporary object, the server concatenates
    (O(chunk) traffic), the temporary object is deleted. Each compose is conditional on the
    generation it extends, so a concurrent writer's append is never overwritten; after a 412 a
    lost answer to our own compose is recognised by the object's new size and tail."""
    meta = metadata(path)
    if meta is None:
        try:
            upload(path, data, if_generation_match=0)
            return
        except FileExistsError:
            if holds(path, data):  # a retried create whose first attempt landed
                return
            meta = metadata(path)
    bucket, key = split(path)
    directory, _, name = key.rpartition("/")
    tmp_key = f"{directory}/.{name}.append-{uuid.uuid4().hex}".lstrip("/")
    tmp = epath.Path(f"gs://{bucket}/{tmp_key}")
    upload(tmp, data)
    try:
        for _ in range(_CAS_ATTEMPTS):
            if meta is None:  # deleted meanwhile: the chunk becomes the whole object
                parts, generation, size = [(tmp_key, None)], 0, 0
            else:
                generation, size = int(meta["generation"]), int(meta["size"])
                parts = [(key, generation), (tmp_key, None)]
            try:
                compose(path, parts, generation)
                return
            except FileExistsError:
                meta = metadata(path)
                if meta is not None and int(meta["size"]) == size + len(data):
                    _, tail = filesystem().call(
                        "GET", "b/{}/o/{}", bucket, key, alt="media",
                        headers={"Range": f"bytes={size}-"},
                    )  # fmt: skip
                    if tail == data:
                        return
        raise ContendedError(f"appending to {os.fspath(path)} failed: contended {_CAS_ATTEMPTS}x")
    finally:
        with contextlib.suppress(FileNotFoundError):
            filesystem().call("DELETE", "b/{}/o/{}", bucket, tmp_key)


def delete(path: epath.Path, generation: int | None) -> bool:
    """Deletes the object only if its live generation is `generation`; False otherwise (changed,
    gone). DELETE carries `ifGenerationMatch`, so the server refuses an object rewritten between
    the check and the request (a lost answer to a retried DELETE reads as False)."""
    meta = metadata(path)
    if meta is None or int(meta["generation"]) != generation:
        return False
    bucket, key = split(path)
    try:
        filesystem().call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(generation))
    except (FileExistsError, FileNotFoundError):
        return False
    return True
