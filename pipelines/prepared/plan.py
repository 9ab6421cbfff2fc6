"""The bookkeeping of one preparation: its plan and fingerprint, which shard files of its
directory are its own, and which of its shards are done (their sidecars).

The fingerprint is what makes two runs the same preparation: the task, split and shard count,
the vocabulary's sha256, the pre-cache preprocessors, the features, the document limit and the
source (a file-based source's split files with their sizes). A shard whose sidecar holds another
fingerprint, or a file of another shard count, is refused in one line naming what differs, so a
rerun never reuses shards tokenized from other data nor leaves two preparations side by side.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from array_record.python import array_record_module

from pipelines.prepared import manifest as manifest_lib
from pipelines.prepared import shards as shards_lib
from pipelines.prepared.manifest import PreparedDataError

# A shard of a preparation, its sidecar, or a temporary file a killed run left.
_SHARD_NAME = re.compile(r"data-\d{5}-of-(\d{5})\.")
_SHOWN = 3  # file names a refusal lists before "..."


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every shard of one preparation shares (picklable, for the workers).

    Attributes:
      task: the seqio task.
      split: its split.
      directory: `<out>/<task>`.
      num_shards: shards of the split.
      features: the token features of a record (`targets`, or `inputs` and `targets`).
      max_documents: at most this many documents per shard (None: all).
      fingerprint: `fingerprint(...)` of the settings (JSON, written into every sidecar).
    """

    task: str
    split: str
    directory: str
    num_shards: int
    features: tuple[str, ...]
    max_documents: int | None
    fingerprint: str

    def path(self, index: int, name: Callable[[int, int], str]) -> str:
        """The path of shard `index`'s file named by `name` (`manifest.shard_file`, ...)."""
        return os.path.join(self.directory, name(index, self.num_shards))

    @property
    def settings(self) -> dict[str, Any]:
        """The fingerprint's settings as a dict."""
        return json.loads(self.fingerprint)


def fingerprint(
    *,
    task: str,
    split: str,
    num_shards: int,
    vocab_sha256: str,
    precache: Sequence[str],
    features: Sequence[str],
    max_documents: int | None,
    source: dict[str, Any],
) -> str:
    """The settings a preparation is a function of, as canonical JSON (see the module
    docstring); `source` is `prepare.describe_source`, recorded as the manifest's `source`."""
    settings = {
        "format_version": manifest_lib.FORMAT_VERSION,
        "task": task,
        "split": split,
        "num_shards": num_shards,
        "vocab_sha256": vocab_sha256,
        "precache": list(precache),
        "features": list(features),
        "max_documents": max_documents,
        "source": source,
    }
    return json.dumps(settings, sort_keys=True)


def _source_difference(theirs: Any, ours: Any, *, other: str) -> str:
    """The first way two recorded sources differ, short: a file's size, a file only one has,
    else both descriptions."""
    if all(isinstance(x, dict) and "files" in x for x in (theirs, ours)):
        old = {f["path"]: f["bytes"] for f in theirs["files"]}
        new = {f["path"]: f["bytes"] for f in ours["files"]}
        changed = [p for p in sorted(old.keys() | new.keys()) if old.get(p) != new.get(p)]
        if changed:

            def size(sizes: dict[str, int], path: str) -> str:
                return f"{sizes[path]:,} bytes" if path in sizes else "absent"

            more = f" and {len(changed) - 1} more file(s)" if len(changed) > 1 else ""
            first = changed[0]
            return f"source file {first} {size(old, first)} ({other}: {size(new, first)}){more}"
    return f"source {theirs!r} ({other}: {ours!r})"


def differences(theirs: str, ours: str, *, other: str = "this run") -> str:
    """What differs between two fingerprints, as `key <theirs> (<other>: <ours>)`, joined."""
    old, new = json.loads(theirs), json.loads(ours)
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return ", ".join(
        _source_difference(old.get(k), new.get(k), other=other)
        if k == "source"
        else f"{k} {old.get(k)!r} ({other}: {new.get(k)!r})"
        for k in keys
    )


def finished(plan: Plan, index: int, log: Callable[[str], None]) -> shards_lib.Sidecar | None:
    """Shard `index`'s sidecar when the shard is complete and agrees with it, else None.

    Raises:
      PreparedDataError: the shard was prepared with other settings (another source, vocabulary,
        task, shard count or document limit): the directory is not this preparation's.
    """
    sidecar_path = plan.path(index, manifest_lib.sidecar_file)
    try:
        sidecar = shards_lib.read_sidecar(sidecar_path)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, OSError) as e:
        log(f"shard {index}: unreadable sidecar ({e}); preparing it again")
        return None
    if sidecar.fingerprint != plan.fingerprint:
        raise PreparedDataError(
            f"{sidecar_path}: prepared with {differences(sidecar.fingerprint, plan.fingerprint)}"
            "; use another --out, or delete the directory"
        )
    shard_path = plan.path(index, manifest_lib.shard_file)
    size = os.path.getsize(shard_path) if os.path.exists(shard_path) else None
    if size != sidecar.bytes:
        log(f"shard {index}: file has {size} bytes, sidecar says {sidecar.bytes}; preparing again")
        return None
    reader = array_record_module.ArrayRecordReader(shard_path, shards_lib.READER_OPTIONS)
    records = reader.num_records()
    reader.close()
    if records != sidecar.documents:
        log(f"shard {index}: {records} records, sidecar says {sidecar.documents}; preparing again")
        return None
    return sidecar


def _shard_files(directory: str) -> dict[int, list[str]]:
    """Shard count -> the names of `directory`'s shard files (shards, sidecars, temporaries)."""
    if not os.path.isdir(directory):
        return {}
    found: dict[int, list[str]] = {}
    for name in sorted(os.listdir(directory)):
        match = _SHARD_NAME.match(name)
        if match:
            found.setdefault(int(match.group(1)), []).append(name)
    return found


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")


def shard_count(directory: str, num_shards: int | None) -> int | None:
    """The shard count of the preparation in `directory`: `num_shards`, checked against the
    files there, or (None) the one count the files have (None when there are none).

    Raises:
      PreparedDataError: files of another shard count (or of several, `num_shards` None) are
        there, named: two preparations would lie side by side and a finalize could pick either.
    """
    found = _shard_files(directory)
    others = sorted(m for m in found if m != num_shards)
    if num_shards is None and len(others) <= 1:
        return others[0] if others else None
    if not others:
        return num_shards
    names = [n for m in others for n in found[m]]
    counts = " and ".join(map(str, others))
    if num_shards is None:
        asked = "allowed: --shards naming the one to finalize, once the others are deleted"
    else:
        asked = f"this run: --shards {num_shards}; use another --out, or delete those files"
    raise PreparedDataError(
        f"{directory}: holds {len(names)} file(s) of a preparation into {counts} shards "
        f"({_listed(names)}); {asked}"
    )


def recorded_settings(directory: str, num_shards: int) -> dict[str, Any] | None:
    """The settings the sidecars of the `num_shards`-shard preparation in `directory` record
    (None: no readable sidecar; an unreadable one is prepared again by a rerun).

    Raises:
      PreparedDataError: two sidecars record different settings (naming both and what differs).
    """
    first: tuple[str, str] | None = None
    for name in _shard_files(directory).get(num_shards, []):
        if not name.endswith(manifest_lib.SIDECAR_SUFFIX):
            continue
        try:
            recorded = shards_lib.read_sidecar(os.path.join(directory, name)).fingerprint
        except (ValueError, KeyError, OSError):
            continue
        if first is None:
            first = (name, recorded)
        elif recorded != first[1]:
            raise PreparedDataError(
                f"{os.path.join(directory, name)}: prepared with "
                f"{differences(recorded, first[1], other=first[0])}; the sidecars disagree: "
                "delete the directory and prepare again"
            )
    return None if first is None else json.loads(first[1])
