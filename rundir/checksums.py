"""Checksums of committed checkpoints, verified on restore.

Orbax offers no checksums for these checkpoints, so once a step is committed we write
`<step>/xlscale_checksums.json`: each file's path (relative to the step directory), size and
SHA-256. A restore verifies it first: a truncated or bit-flipped file is named with its step
instead of loading silently or failing deep inside TensorStore. A step without the manifest (the
job was killed between the commit and the hashing) is still restorable, unverified.
"""

from __future__ import annotations

import hashlib
import json
import os

from etils import epath

from rundir import names, storage

MANIFEST_FILE = names.CHECKSUMS_FILE
_CHUNK = 1 << 20


class CheckpointCorruptError(RuntimeError):
    """A checkpoint's files do not match the checksums written when it was committed."""


def _sha256(path: epath.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(step_dir: epath.Path) -> list[epath.Path]:
    # Not the manifest, nor its temporary file left by a job killed while writing it.
    return [p for p in storage.list_files(step_dir) if not p.name.startswith(MANIFEST_FILE)]


def write_manifest(step_dir: str | os.PathLike) -> epath.Path:
    """Hashes every file of a committed step directory and writes the manifest (atomically).

    Returns:
      The manifest's path.
    """
    step_dir = storage.as_path(step_dir)
    files = {
        p.relative_to(step_dir).as_posix(): {"size": p.stat().length, "sha256": _sha256(p)}
        for p in _files(step_dir)
    }
    path = step_dir / MANIFEST_FILE
    storage.write_text_atomic(path, json.dumps({"files": files}, indent=1) + "\n")
    return path


def has_manifest(step_dir: str | os.PathLike) -> bool:
    """Whether the step directory carries a checksum manifest."""
    return (storage.as_path(step_dir) / MANIFEST_FILE).is_file()


def verify_manifest(step_dir: str | os.PathLike, *, step: int, source: str) -> bool:
    """Checks every file listed in the step's manifest (size, then SHA-256).

    Args:
      step_dir: the step's directory.
      step: its step number (for messages).
      source: what the checkpoint is to the user, e.g. "INIT_CHECKPOINT '/runs/x'" or the
        checkpoints directory (for messages).

    Returns:
      True when verified, False when the step has no manifest (nothing to check against).
    Raises:
      CheckpointCorruptError: naming the first file that is missing, truncated or altered,
        and the step.
    """
    step_dir = storage.as_path(step_dir)
    path = step_dir / MANIFEST_FILE
    if not path.is_file():
        return False
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointCorruptError(
            f"{source}: step {step}'s checksum manifest {path} is unreadable ({e})"
        ) from e
    for name, expected in files.items():
        file = step_dir / name
        if not file.is_file():
            problem = "is missing"
        elif (size := file.stat().length) != expected["size"]:
            problem = f"has {size} bytes, {expected['size']} when saved (truncated or altered)"
        elif _sha256(file) != expected["sha256"]:
            problem = "does not match its SHA-256 from when it was saved (corrupted)"
        else:
            continue
        raise CheckpointCorruptError(f"{source}: step {step}: file {file} {problem}")
    return True
