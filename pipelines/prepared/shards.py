"""Reading a prepared task by document index: `PreparedDataset` (and the record and sidecar
layouts its writer, `pipelines.prepared.prepare`, shares with it).

Record layout: one ArrayRecord record per document, little-endian int32: first one length per
feature (in `Manifest.features` order), then each feature's token ids, concatenated. No pickle,
and decoding is one `np.frombuffer`. Shards are written with `group_size:1`, so every record can
be read alone (what grain and MaxText use for random access).

ArrayRecord's reader is C++ over local files: at scale, mount the bucket with gcsfuse (as
MaxText does) and open the mounted directory. The manifest and the sidecars go through
`rundir.storage` (atomic writes).

No TensorFlow or seqio here: a training host reads prepared data with numpy and array_record.
"""

from __future__ import annotations

import dataclasses
import io
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures

import numpy as np
from array_record.python import array_record_module

from pipelines.prepared import manifest as manifest_lib
from pipelines.prepared.manifest import Manifest, PreparedDataError
from rundir import storage

__all__ = ["PreparedDataError", "PreparedDataset", "Sidecar"]

# Writer options: one record per chunk, so a random read decompresses only its document.
WRITER_OPTIONS = "group_size:1"
# Reader options for random access (no read-ahead; grain's `ArrayRecordDataSource` uses the same).
READER_OPTIONS = "readahead_buffer_size:0"
# Reads of fewer documents than this stay on the calling thread: handing a few hundred small
# records to threads costs more than it saves (measured: a 2,048-token LM step reads ~400).
THREADED_READ_MIN = 4096
READ_THREADS = 8  # shards read concurrently by one `read` call


# Little-endian int32 on disk; native int32 where the machine is little-endian, so decoding
# is a view.
_TOKEN_DTYPE = np.dtype(np.int32) if np.little_endian else np.dtype("<i4")


def encode_record(arrays: Sequence[np.ndarray]) -> bytes:
    """One document's record: each feature's length, then the features' tokens, as int32."""
    header = np.array([len(a) for a in arrays], dtype="<i4")
    return b"".join([header.tobytes(), *(np.asarray(a, dtype="<i4").tobytes() for a in arrays)])


def decode_record(record: bytes, features: Sequence[str]) -> dict[str, np.ndarray]:
    """The token arrays of one record (`encode_record`'s inverse), keyed by `features`."""
    # Read-only views into the record (no copy): this runs once per document read.
    flat = np.frombuffer(record, dtype=_TOKEN_DTYPE)
    count = len(features)
    lengths = flat[:count].tolist()
    if len(flat) != count + sum(lengths):
        raise ValueError(f"record of {len(flat)} ints, header says {count} + {lengths}")
    out, start = {}, count
    for name, length in zip(features, lengths, strict=True):
        out[name] = flat[start : start + length]
        start += length
    return out


@dataclasses.dataclass(frozen=True)
class Sidecar:
    """A finished shard's sidecar (`<stem>.lengths.npz`): written after the shard is complete,
    so its presence marks a finished shard.

    Attributes:
      lengths: per-document token count of each feature (int32 `[documents]`).
      bytes: the shard file's size.
      sha256: the shard file's hex sha256.
      fingerprint: the settings the shard was prepared with (task, split, shard count,
        vocabulary hash, document limit); a rerun with other settings refuses the directory.
    """

    lengths: Mapping[str, np.ndarray]
    bytes: int
    sha256: str
    fingerprint: str

    @property
    def documents(self) -> int:
        """Documents in the shard."""
        return len(next(iter(self.lengths.values())))

    def to_bytes(self) -> bytes:
        """The `.npz` bytes (no pickled objects)."""
        buffer = io.BytesIO()
        np.savez(
            buffer,
            features=np.array(list(self.lengths), dtype=str),
            lengths=np.stack([np.asarray(v, np.int32) for v in self.lengths.values()]),
            bytes=np.int64(self.bytes),
            sha256=np.array(self.sha256),
            fingerprint=np.array(self.fingerprint),
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Sidecar:
        """Parses `to_bytes`'s output (ValueError or KeyError on anything else)."""
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            features = [str(f) for f in npz["features"]]
            lengths = npz["lengths"]
            return cls(
                lengths={f: lengths[i].astype(np.int32) for i, f in enumerate(features)},
                bytes=int(npz["bytes"]),
                sha256=str(npz["sha256"]),
                fingerprint=str(npz["fingerprint"]),
            )


def write_sidecar(path: str | os.PathLike, sidecar: Sidecar) -> None:
    """Writes a sidecar atomically (readers see it whole or not at all)."""
    storage.write_bytes(path, sidecar.to_bytes())


def read_sidecar(path: str | os.PathLike) -> Sidecar:
    """Reads a sidecar; FileNotFoundError when absent, ValueError/KeyError when unreadable."""
    return Sidecar.from_bytes(storage.as_path(path).read_bytes())


def _count(value: int) -> str:
    return f"{value:,}"


def local_dir(directory: str | os.PathLike) -> str:
    if storage.is_remote(directory):
        raise PreparedDataError(
            f"{os.fspath(directory)}: ArrayRecord shards are read from local files; mount the "
            "bucket with gcsfuse (as MaxText does) and pass the mounted directory"
        )
    return os.fspath(directory)


class PreparedDataset:
    """A prepared task opened for reading by global document index.

    Shard k holds documents `[offset_k, offset_k+1)` in the order seqio's shard k gave them.
    `open` verifies the directory before anything is read; `read` returns token arrays in the
    order asked; `reads` counts the documents read through this object.
    """

    def __init__(self, directory: str, manifest: Manifest, readers: list):
        """Use `PreparedDataset.open`."""
        self.directory = directory
        self.manifest = manifest
        self._readers = readers
        self._locks = [threading.Lock() for _ in readers]
        self._offsets = np.asarray(manifest.offsets, dtype=np.int64)
        self._lengths: dict[str, np.ndarray] = {}
        self._count_lock = threading.Lock()
        self._pool: futures.ThreadPoolExecutor | None = None
        self.reads = 0

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike,
        *,
        vocab_hash: str | None = None,
        vocab_path: str | None = None,
    ) -> PreparedDataset:
        """Opens `directory` (one prepared task) after checking it against its manifest.

        Checks, before any record is read: `manifest.json` is present and parses; `vocab_hash`
        (when given) equals the manifest's; every shard file and sidecar is present, and each
        shard's size and record count are the manifest's.

        Args:
          directory: the prepared task's directory (`<out>/<task>`), a local path.
          vocab_hash: hex sha256 of this run's vocabulary file (`vocab_sha256(VOCAB_PATH)`);
            None skips the check.
          vocab_path: that file's name, only for the error message.

        Raises:
          PreparedDataError: one line naming the file and what differs (expected vs found).
        """
        root = local_dir(directory)
        manifest_path = os.path.join(root, manifest_lib.MANIFEST_FILE)
        try:
            text = storage.read_text(manifest_path)
        except FileNotFoundError:
            raise PreparedDataError(
                f"{manifest_path}: no manifest (preparation unfinished, or not a prepared task "
                "directory; `xlscale data prepare ... --finalize` writes it once all shards exist)"
            ) from None
        try:
            manifest = Manifest.from_json(text)
        except (ValueError, TypeError, KeyError) as e:
            raise PreparedDataError(f"{manifest_path}: unreadable manifest: {e}") from None
        if vocab_hash is not None and vocab_hash != manifest.vocab_hash:
            run_vocab = f"VOCAB_PATH {vocab_path}" if vocab_path else "vocabulary"
            raise PreparedDataError(
                f"{manifest_path}: prepared with vocabulary sha256 {manifest.vocab_hash[:12]}.. "
                f"({manifest.vocab_path}), this run's {run_vocab} has {vocab_hash[:12]}.."
            )
        _reserve_file_descriptors(len(manifest.shards), where=root)
        readers = []
        try:
            for entry in manifest.shards:
                readers.append(_open_shard(root, entry))
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        return cls(root, manifest, readers)

    @property
    def features(self) -> tuple[str, ...]:
        """The token features of every document: `("targets",)` or `("inputs", "targets")`."""
        return tuple(self.manifest.features)

    @property
    def num_docs(self) -> int:
        """Documents in the prepared split."""
        return int(self.manifest.documents)

    def __len__(self) -> int:
        """`num_docs`."""
        return self.num_docs

    @property
    def postprocess(self) -> str:
        """What the reader applies after these tokens (`manifest.POSTPROCESS_KINDS`)."""
        return self.manifest.postprocess

    def lengths(self, feature: str) -> np.ndarray:
        """Token count of `feature` for every document (int32 `[num_docs]`), from the sidecars:
        what packing plans need, without reading a record.

        Raises:
          KeyError: an unknown feature; PreparedDataError: a sidecar that disagrees with the
            manifest.
        """
        if feature not in self.features:
            raise KeyError(f"feature {feature!r}; allowed: {', '.join(self.features)}")
        if not self._lengths:
            self._lengths = self._load_lengths()
        return self._lengths[feature]

    def _load_lengths(self) -> dict[str, np.ndarray]:
        parts: dict[str, list[np.ndarray]] = {f: [] for f in self.features}
        num_shards = len(self.manifest.shards)
        for index, entry in enumerate(self.manifest.shards):
            path = os.path.join(self.directory, manifest_lib.sidecar_file(index, num_shards))
            try:
                sidecar = read_sidecar(path)
            except FileNotFoundError:
                raise PreparedDataError(f"{path}: missing (the shard's lengths)") from None
            except (ValueError, KeyError, OSError) as e:
                raise PreparedDataError(f"{path}: unreadable sidecar: {e}") from None
            if sidecar.sha256 != entry.sha256:  # the lengths of another shard's records
                raise PreparedDataError(
                    f"{path}: lengths of a shard with sha256 {sidecar.sha256[:12]}.., manifest "
                    f"says {entry.file} has {entry.sha256[:12]}.."
                )
            for feature in self.features:
                found = sidecar.lengths.get(feature)
                if found is None or len(found) != entry.documents:
                    size = "no" if found is None else _count(len(found))
                    raise PreparedDataError(
                        f"{path}: {size} {feature} lengths, manifest says "
                        f"{_count(entry.documents)} documents"
                    )
                total, expected = int(found.sum(dtype=np.int64)), entry.tokens.get(feature)
                if expected is not None and total != int(expected):
                    raise PreparedDataError(
                        f"{path}: {_count(total)} {feature} tokens, manifest says "
                        f"{_count(int(expected))} in {entry.file}"
                    )
                parts[feature].append(found)
        return {
            f: np.concatenate(v).astype(np.int32) if v else np.zeros(0, np.int32)
            for f, v in parts.items()
        }

    def read(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, np.ndarray]]:
        """The documents at global `indices`, in the order given (repeats allowed): each a dict
        of int32 1-D token arrays per feature.

        Indices are grouped by shard and each shard's group is read with one batched ArrayRecord
        call; several shards are read on threads (the C++ reader releases the GIL).

        Raises:
          IndexError: an index outside `[0, num_docs)`.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return []
        if idx.min() < 0 or idx.max() >= self.num_docs:
            bad = int(idx[(idx < 0) | (idx >= self.num_docs)][0])
            raise IndexError(f"document {bad} outside [0, {self.num_docs})")
        shard_of = np.searchsorted(self._offsets, idx, side="right") - 1
        groups = [(int(k), np.flatnonzero(shard_of == k)) for k in np.unique(shard_of).tolist()]
        out: list[dict[str, np.ndarray] | None] = [None] * len(idx)

        def read_group(group: tuple[int, np.ndarray]) -> None:
            shard, where = group
            positions = (idx[where] - self._offsets[shard]).tolist()
            with self._locks[shard]:
                try:
                    records = self._readers[shard].read(positions)
                except (RuntimeError, ValueError) as e:  # the C++ reader's status: name the file
                    path = os.path.join(self.directory, self.manifest.shards[shard].file)
                    raise PreparedDataError(f"{path}: unreadable records: {e}") from None
            for slot, record in zip(where.tolist(), records, strict=True):
                out[slot] = decode_record(record, self.features)

        if len(groups) == 1 or len(idx) < THREADED_READ_MIN:
            for group in groups:
                read_group(group)
        else:
            if self._pool is None:
                self._pool = futures.ThreadPoolExecutor(READ_THREADS)
            list(self._pool.map(read_group, groups))
        with self._count_lock:
            self.reads += len(idx)
        return out  # type: ignore[return-value]

    def verify_checksums(self) -> None:
        """Hashes every shard and compares with the manifest's sha256 (reads every byte, on
        `READ_THREADS` threads: hashlib releases the GIL; a manifest entry without a sha256 is
        not checked).

        Raises:
          PreparedDataError: naming the first shard (in manifest order) whose sha256 differs.
        """

        def found(entry: manifest_lib.ShardEntry) -> str | None:
            if not entry.sha256:
                return None
            return manifest_lib.file_sha256(os.path.join(self.directory, entry.file))

        with futures.ThreadPoolExecutor(READ_THREADS) as pool:
            digests = list(pool.map(found, self.manifest.shards))
        for entry, digest in zip(self.manifest.shards, digests, strict=True):
            if digest is not None and digest != entry.sha256:
                path = os.path.join(self.directory, entry.file)
                raise PreparedDataError(
                    f"{path}: sha256 {digest[:12]}.., manifest says {entry.sha256[:12]}.. "
                    "(changed since it was prepared: a flipped bit, or another shard copied here)"
                )

    def verify(self) -> None:
        """Everything a reader would otherwise find only mid-training, checked now: every
        sidecar parses and agrees with the manifest (the shard's sha256, document and token
        counts; `lengths`), and every shard's bytes hash to the manifest's sha256
        (`verify_checksums`). `open` checks only sizes and record counts.

        Raises:
          PreparedDataError: naming the file and what differs.
        """
        if not self._lengths:
            self._lengths = self._load_lengths()
        self.verify_checksums()

    def close(self) -> None:
        """Closes the shard readers (and the read threads)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        for reader in self._readers:
            reader.close()
        self._readers = []

    def __getstate__(self) -> dict:
        """Pickles as its directory and manifest (readers are C++ objects: a data-loader
        process unpickles it and opens its own, checked as `open` does)."""
        return {"directory": self.directory, "manifest": self.manifest.to_json()}

    def __setstate__(self, state: dict) -> None:
        """Reopens the shards of a pickled dataset (`reads` starts again at 0)."""
        manifest = Manifest.from_json(state["manifest"])
        readers = [_open_shard(state["directory"], entry) for entry in manifest.shards]
        self.__init__(state["directory"], manifest, readers)

    def __enter__(self) -> PreparedDataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# File descriptors kept free beyond the shards (checkpoints, logs, sockets, TensorFlow's own).
FD_HEADROOM = 256


def _reserve_file_descriptors(shards: int, *, where: str) -> None:
    """Makes room for one open file per shard, kept for the whole run: raises the soft
    `RLIMIT_NOFILE` towards the hard limit when needed (a paper-scale task has ~1000 shards and
    two components pass the usual soft limit of 1024), and refuses in one line when even the hard
    limit is too low, instead of failing mid-open with "Too many open files".

    Raises:
      PreparedDataError: naming the directory, the shards and the limit.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux: count nothing open beyond the headroom
        in_use = 0
    wanted = in_use + shards + FD_HEADROOM
    if soft == resource.RLIM_INFINITY or wanted <= soft:
        return
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if in_use + shards >= target:
        raise PreparedDataError(
            f"{where}: {shards:,} shards stay open for the run and {in_use:,} files are open "
            f"already; the limit on open files is {target:,} (raise it with `ulimit -n` / "
            "`ulimit -Hn`, or prepare fewer shards)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _open_shard(root: str, entry: manifest_lib.ShardEntry):
    """An open reader of one shard, after its size, sidecar and record count are checked."""
    path = os.path.join(root, entry.file)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise PreparedDataError(
            f"{path}: missing, manifest lists it ({_count(entry.documents)} documents, "
            f"{_count(entry.bytes)} bytes)"
        ) from None
    if size != entry.bytes:
        why = "truncated?" if size < entry.bytes else "overwritten?"
        raise PreparedDataError(
            f"{path}: {_count(size)} bytes, manifest says {_count(entry.bytes)} ({why})"
        )
    sidecar = path[: -len(manifest_lib.SHARD_SUFFIX)] + manifest_lib.SIDECAR_SUFFIX
    if not os.path.exists(sidecar):
        raise PreparedDataError(f"{sidecar}: missing (the lengths of {entry.file})")
    try:
        reader = array_record_module.ArrayRecordReader(path, READER_OPTIONS)
    except Exception as e:  # the C++ reader's status, as RuntimeError/ValueError
        raise PreparedDataError(f"{path}: not a readable ArrayRecord file: {e}") from None
    try:
        found = reader.num_records()
    except Exception as e:  # a damaged index: the C++ reader's status, as RuntimeError
        _close_quietly(reader)
        raise PreparedDataError(f"{path}: unreadable ArrayRecord index: {e}") from None
    if found != entry.documents:
        _close_quietly(reader)
        raise PreparedDataError(
            f"{path}: {_count(found)} documents, manifest says {_count(entry.documents)}"
        )
    return reader


def _close_quietly(reader) -> None:
    """Closes a reader being refused: closing a damaged file raises too (its postscript's hash),
    and the refusal names the damage already."""
    try:
        reader.close()
    except Exception:  # noqa: BLE001 -- the C++ reader's status, as RuntimeError
        pass


def vocab_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a vocabulary file (local or `gs://`): what `open(vocab_hash=...)` takes and
    the manifest records, so a run cannot read tokens of another vocabulary."""
    import hashlib

    return hashlib.sha256(storage.as_path(path).read_bytes()).hexdigest()
