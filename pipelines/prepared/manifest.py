"""The manifest of a prepared task: what was tokenized, with which vocabulary, into which shards.

A prepared task is one directory `<out>/<task>/` (its train split; another split, e.g. the
validation split evaluation reads, is `<out>/<task>@<split>/`, `task_dir_name`):

- `data-KKKKK-of-NNNNN.array_record`: shard k, one record per tokenized document (the output of
  the task's pre-cache preprocessors for seqio shard k of the split, in order; `pipelines.prepared.shards`
  holds the record layout);
- `data-KKKKK-of-NNNNN.lengths.npz`: its sidecar, written atomically once the shard is complete:
  the per-document token counts of every feature, the shard's size and sha256, and the settings
  it was prepared with (a rerun skips a shard whose sidecar matches);
- `manifest.json` (this module), written last, atomically, once every shard exists.

The manifest is what a reader verifies before it reads anything (`PreparedDataset.open`): every
shard's size and document count, and the vocabulary's sha256 against the run's `VOCAB_PATH`.
Nothing here imports TensorFlow or seqio: training-time readers need neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
SHARD_SUFFIX = ".array_record"
SIDECAR_SUFFIX = ".lengths.npz"

# What the reader does after the prepared (pre-cache) part, per kind of task: LM chunks of the
# targets, T5 span corruption, or inputs/targets pairs (EOS appended after trimming).
POSTPROCESS_KINDS = ("lm_chunks", "span_corruption", "pairs")


TRAIN_SPLIT = "train"
SPLIT_SEPARATOR = "@"  # no task name holds it


def task_dir_name(task: str, split: str) -> str:
    """The directory name of a prepared task's split under the prepared root (`PREPARED_DATA`):
    `<task>` for the `train` split (what training reads), `<task>@<split>` for any other (the
    `validation` split evaluation reads), so both splits of a task sit side by side."""
    return task if split == TRAIN_SPLIT else f"{task}{SPLIT_SEPARATOR}{split}"


class PreparedDataError(ValueError):
    """A prepared directory that cannot be read as it is: one line naming the file and what
    differs (expected vs found)."""


def shard_stem(index: int, num_shards: int) -> str:
    """`data-00003-of-00008`: the common stem of shard `index`'s files."""
    return f"data-{index:05d}-of-{num_shards:05d}"


def shard_file(index: int, num_shards: int) -> str:
    """The ArrayRecord file name of shard `index` of `num_shards`."""
    return shard_stem(index, num_shards) + SHARD_SUFFIX


def sidecar_file(index: int, num_shards: int) -> str:
    """The sidecar (per-document lengths, size, sha256) name of shard `index` of `num_shards`."""
    return shard_stem(index, num_shards) + SIDECAR_SUFFIX


def file_sha256(path: str | os.PathLike, *, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a local file, read in chunks (shards and vocabularies can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest records it.

    Attributes:
      file: the ArrayRecord file name (relative to the prepared directory).
      documents: records (tokenized documents) in the shard.
      tokens: token count per feature, summed over its documents.
      bytes: the file's size.
      sha256: the file's hex sha256 (checked by `PreparedDataset.verify`, which a training
        run calls while it plans, not at open).
    """

    file: str
    documents: int
    tokens: Mapping[str, int]
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a prepared task holds and how it was made (`manifest.json`).

    Attributes:
      task: the seqio task name (`lm_en`, `span_fr`, `mt_en_de`, ...).
      split: the split prepared.
      source: `{"repr": repr(task.source), "files": [{"path", "bytes"}, ...]}` (files of a
        file-based seqio source; named sources add their own keys).
      vocab_path: the SentencePiece model the task was registered with.
      vocab_hash: hex sha256 of that file (`open(vocab_hash=...)` compares it).
      vocab_size: the vocabulary size, extra ids included.
      eos_id: the vocabulary's EOS id (the reader appends it; prepared tokens carry none).
      preprocessors: `{"precache": [...], "postcache": [...]}`: the task's preprocessor names
        on either side of `seqio.CacheDatasetPlaceholder`.
      postprocess: what the reader applies, one of `POSTPROCESS_KINDS`.
      features: the token features of every record, in record order.
      shards: one `ShardEntry` per shard, in shard order (global document index: shard k holds
        `[offset_k, offset_k + documents_k)`).
      documents: total documents.
      tokens: total tokens per feature.
      max_documents: documents kept per shard at most (a sample or smoke run), or None (all).
      created: ISO-8601 UTC time the manifest was written.
      xlscale_version: the package version that prepared it.
      format_version: the on-disk format (`FORMAT_VERSION`).
    """

    task: str
    split: str
    source: Mapping[str, Any]
    vocab_path: str
    vocab_hash: str
    vocab_size: int
    eos_id: int
    preprocessors: Mapping[str, Sequence[str]]
    postprocess: str
    features: tuple[str, ...]
    shards: tuple[ShardEntry, ...]
    documents: int
    tokens: Mapping[str, int]
    max_documents: int | None
    created: str
    xlscale_version: str
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        """The manifest as indented JSON (what `manifest.json` holds)."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parses `to_json`'s output.

        Raises:
          ValueError: not JSON, another format version, missing or unknown fields, or an
            unknown postprocess kind (the message says which).
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(f"format_version {version!r}, this reader reads {FORMAT_VERSION}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(n for n in names if n not in data and n != "format_version")
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"missing fields {missing}, unknown fields {unknown}")
        if data["postprocess"] not in POSTPROCESS_KINDS:
            raise ValueError(
                f"postprocess {data['postprocess']!r}, allowed: {', '.join(POSTPROCESS_KINDS)}"
            )
        data["features"] = tuple(data["features"])
        data["shards"] = tuple(ShardEntry(**s) for s in data["shards"])
        data["preprocessors"] = {k: tuple(v) for k, v in data["preprocessors"].items()}
        return cls(**data)

    @property
    def offsets(self) -> tuple[int, ...]:
        """The global index of each shard's first document (and, last, the total)."""
        out = [0]
        for shard in self.shards:
            out.append(out[-1] + shard.documents)
        return tuple(out)

    def content_digest(self) -> str:
        """The sha256 of what the prepared task holds (task, split, vocabulary, read-time kind,
        features, the sample size, and every shard's documents, tokens and sha256), not of how or
        where it was made (time, source paths, the vocabulary file's path): re-preparing the same
        data, or mounting it elsewhere, gives the same digest; other data gives another. A run's
        fingerprint records it (`trainer.data.prepared_input`)."""
        content = {
            "task": self.task,
            "split": self.split,
            "vocab_hash": self.vocab_hash,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "postprocess": self.postprocess,
            "preprocessors": {k: list(v) for k, v in self.preprocessors.items()},
            "features": list(self.features),
            "max_documents": self.max_documents,
            "shards": [[s.documents, dict(s.tokens), s.sha256] for s in self.shards],
            "format_version": self.format_version,
        }
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()

    def without_time(self) -> Manifest:
        """The manifest with `created` blanked: what two preparations of the same data share."""
        return dataclasses.replace(self, created="")
