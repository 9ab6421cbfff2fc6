"""Integrity records of checkpoints: every file's size and SHA-256, verified on restore.

Orbax offers no checksums for these checkpoints, so each step carries
`<step>/xlscale_checksums.json` (its *integrity record*): each file's path (relative to the step
directory), size and SHA-256. The trainer and the converters write it inside orbax's commit (on
its async-commit thread, just before the atomic rename: `convert.init_checkpoints.RecordOnCommit`),
so a committed step normally has it. A step counts as complete only with its record: one without
(written by older code that hashed after the commit, by another tool, or whose record write
failed) is never restored blind -- resume sets it aside, and `INIT_CHECKPOINT` or an evaluation
naming it is refused with `CheckpointUnrecordedError`, which says how to record a checkpoint whose
files one trusts (`xlscale convert record DIR@STEP`, i.e. `write_manifest`).

A restore verifies the record first: a truncated or bit-flipped file is named with its step
instead of loading silently or failing deep inside TensorStore. The record covers the whole step:
a file of the step that it does not list (other than those the commit writes after it) is a
mismatch too, so that a record which lost an entry cannot vouch for a step it no longer covers.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Sequence
from concurrent import futures

from etils import epath

from rundir import names, storage

MANIFEST_FILE = names.CHECKSUMS_FILE
_CHUNK = 1 << 20
# Files hashed at once. The record is written on orbax's commit thread while the other hosts wait
# at its barrier, and reading from object storage is latency-bound: hashing in parallel keeps
# that wait (and every restore's verification) near the storage's throughput.
_WORKERS = 16


class CheckpointCorruptError(RuntimeError):
    """A checkpoint's files do not match the checksums written when it was committed."""


class CheckpointUnrecordedError(CheckpointCorruptError):
    """A checkpoint step has no integrity record, so its files cannot be verified; it is not
    complete and is never restored blind (the message says how to record trusted files)."""


def unrecorded_message(*, source: str, step_dir: str | os.PathLike, step: int) -> str:
    """The refusal of a step without its record: what, where, and how to add the record (two
    lines, for `CheckpointUnrecordedError`)."""
    step_dir = storage.as_path(step_dir)
    return (
        f"{source}: step {step} ({step_dir}) has no integrity record ({MANIFEST_FILE}), so its "
        "files cannot be verified\n"
        f"  if you trust them, record them first: xlscale convert record '{step_dir.parent}@{step}'"
    )


def older_step_message(
    *, source: str, directory: str | os.PathLike, step: int, skipped: Sequence[int]
) -> str:
    """The one line logged when `'<dir>'` without a step resolves to an older complete step than
    its newest committed one: the step used, the newer ones skipped, why, and what to do."""
    directory = storage.as_path(directory)
    newer = f"steps {', '.join(map(str, skipped))}" if len(skipped) > 1 else f"step {skipped[0]}"
    their = "their" if len(skipped) > 1 else "its"
    return (
        f"{source}: using step {step}, the newest step with an integrity record; skipped newer "
        f"{newer}: no integrity record ({MANIFEST_FILE}), so {their} files cannot be verified "
        "(name a step with '@STEP', or record files you trust: xlscale convert record "
        f"'{directory}@{skipped[-1]}')"
    )


def _sha256(path: epath.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256s(paths: Sequence[epath.Path]) -> list[str]:
    """The SHA-256 of each file, computed in parallel (hashlib releases the GIL)."""
    if len(paths) <= 1:
        return [_sha256(p) for p in paths]
    with futures.ThreadPoolExecutor(min(_WORKERS, len(paths))) as pool:
        return list(pool.map(_sha256, paths))


def _files(step_dir: epath.Path, skip: Collection[str]) -> list[epath.Path]:
    # Not the record, nor its temporary file left by a job killed while writing it.
    return [
        p
        for p in storage.list_files(step_dir)
        if not p.name.startswith(MANIFEST_FILE) and p.relative_to(step_dir).as_posix() not in skip
    ]


def write_manifest(step_dir: str | os.PathLike, *, skip: Collection[str] = ()) -> epath.Path:
    """Hashes every file of a step directory and writes its integrity record (atomically).

    Args:
      step_dir: the step's directory (inside a commit: its temporary directory).
      skip: paths (relative to `step_dir`) not to record: files the commit itself writes or
        rewrites after the record (orbax's commit marker and commit timestamp).

    Returns:
      The record's path.
    Raises:
      CheckpointCorruptError: the directory holds no file to record (nothing to verify later).
    """
    step_dir = storage.as_path(step_dir)
    paths = _files(step_dir, skip)
    files = {
        p.relative_to(step_dir).as_posix(): {"size": p.stat().length, "sha256": digest}
        for p, digest in zip(paths, _sha256s(paths), strict=True)
    }
    if not files:
        raise CheckpointCorruptError(f"{step_dir}: no checkpoint files to record")
    path = step_dir / MANIFEST_FILE
    storage.write_text_atomic(path, json.dumps({"files": files}, indent=1) + "\n")
    return path


def has_manifest(step_dir: str | os.PathLike) -> bool:
    """Whether the step directory carries its integrity record (the step is complete).

    Raises:
      rundir.storage.StorageError: the storage service failed (never taken for "no record").
    """
    path = storage.as_path(step_dir) / MANIFEST_FILE
    with storage.service_errors(path, "reading the integrity record"):
        return path.is_file()


def verify_manifest(
    step_dir: str | os.PathLike, *, step: int, source: str, skip: Collection[str] = ()
) -> int:
    """Checks that the step's integrity record lists every file of the step, and every file it
    lists (size, then SHA-256): a step verifies only when the record covers all of it.

    Args:
      step_dir: the step's directory.
      step: its step number (for messages).
      source: what the checkpoint is to the user, e.g. "INIT_CHECKPOINT '/runs/x'" or the
        checkpoints directory (for messages).
      skip: paths (relative to `step_dir`) that may be in the step unlisted: the files the
        commit writes after the record (`write_manifest`'s `skip`).

    Returns:
      How many files were verified (at least one: an empty record is refused as unreadable).
    Raises:
      CheckpointUnrecordedError: the step has no record (`unrecorded_message`).
      CheckpointCorruptError: naming the first file that is missing, truncated, altered or not
        in the record, and the step; or a record that is unreadable or lists no file.
      rundir.storage.StorageError: the storage service failed while reading (never taken for
        a corrupt step).
    """
    step_dir = storage.as_path(step_dir)
    with storage.service_errors(step_dir, "verifying checkpoint files in"):
        return _verify(step_dir, step=step, source=source, skip=skip)


def _verify(step_dir: epath.Path, *, step: int, source: str, skip: Collection[str]) -> int:
    """`verify_manifest`'s checks, storage errors left as they come."""
    path = step_dir / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointUnrecordedError(
            unrecorded_message(source=source, step_dir=step_dir, step=step)
        )
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        if not files:
            raise ValueError("it lists no file")
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointCorruptError(
            f"{source}: step {step}'s checksum manifest {path} is unreadable ({e})"
        ) from e
    for name, expected in files.items():  # sizes first: cheap, and they name a truncation
        file = step_dir / name
        if not file.is_file():
            problem = "is missing"
        elif (size := file.stat().length) != expected["size"]:
            problem = f"has {size} bytes, {expected['size']} when saved (truncated or altered)"
        else:
            continue
        raise CheckpointCorruptError(f"{source}: step {step}: file {file} {problem}")
    unlisted = [
        p for p in _files(step_dir, skip) if p.relative_to(step_dir).as_posix() not in files
    ]
    if unlisted:
        raise CheckpointCorruptError(
            f"{source}: step {step}: file {unlisted[0]} is not listed in its integrity record "
            f"{MANIFEST_FILE} ({len(unlisted)} unlisted in all): the record does not cover the "
            "step, so it cannot be verified"
        )
    paths = [step_dir / name for name in files]
    for file, expected, digest in zip(paths, files.values(), _sha256s(paths), strict=True):
        if digest != expected["sha256"]:
            raise CheckpointCorruptError(
                f"{source}: step {step}: file {file} does not match its SHA-256 from when it was "
                "saved (corrupted)"
            )
    return len(files)
