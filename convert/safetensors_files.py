"""Reading and writing (sharded) safetensors files with numpy alone, one tensor at a time.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length,
a JSON header `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`,
then the raw little-endian bytes of every tensor. A sharded checkpoint adds
`model.safetensors.index.json` (`{"metadata": {"total_size"}, "weight_map": {name: file}}`).

Why not `safetensors.safe_open(..., framework="np")`: numpy has no bfloat16, so that reader
refuses the dtype most published LLaMA checkpoints are stored in. Reading the header ourselves and
mapping each tensor's byte range with `np.memmap` as `ml_dtypes.bfloat16` (which JAX ships)
reads every dtype, touches only the tensor asked for, and needs no extra dependency; the tests
check both directions against the real library (transformers' `save_pretrained` and
`safe_open`). Writing streams too: the header is computed from the tensors' shapes before any
data, so a shard is written tensor by tensor without holding it in memory.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 * 2**30

# safetensors dtype name -> numpy dtype.
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: Any) -> str:
    """The safetensors name of a numpy dtype (e.g. bfloat16 -> "BF16")."""
    dtype = np.dtype(dtype)
    if dtype not in _NAMES:
        raise ValueError(
            f"dtype {dtype} has no safetensors name; allowed: {sorted(map(str, _NAMES))}"
        )
    return _NAMES[dtype]


class SafetensorsFile:
    """One `.safetensors` file, opened lazily: the header is read at once, tensors on demand."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._entries: dict[str, dict[str, Any]] = header
        self._data_start = 8 + length

    def names(self) -> list[str]:
        """Tensor names in file order."""
        return sorted(self._entries, key=lambda n: self._entries[n]["data_offsets"][0])

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape, from the header."""
        return tuple(self._entries[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        """The tensor `name`, memory-mapped read-only (only its own bytes are read when used).

        Raises:
          KeyError: no such tensor (naming the file).
          ValueError: an unknown dtype or a byte range that does not fit the shape.
        """
        if name not in self._entries:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        entry = self._entries[name]
        if entry["dtype"] not in DTYPES:
            raise ValueError(
                f"{self.path}: tensor {name!r} has dtype {entry['dtype']}; readable: {list(DTYPES)}"
            )
        dtype = DTYPES[entry["dtype"]]
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise ValueError(f"{self.path}: tensor {name!r} byte range does not match {shape}")
        if begin == end:
            return np.zeros(shape, dtype)
        return np.memmap(
            self.path, dtype=dtype, mode="r", offset=self._data_start + begin, shape=shape
        )


class CheckpointFiles:
    """The safetensors weights of a Hugging Face model directory: one `model.safetensors`, or
    the shards an `model.safetensors.index.json` lists. Tensors are read one at a time."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (self.directory / SINGLE_FILE).is_file():
            weight_map = dict.fromkeys(
                SafetensorsFile(self.directory / SINGLE_FILE).names(), SINGLE_FILE
            )
        else:
            raise FileNotFoundError(
                f"{self.directory}: neither {INDEX_FILE} nor {SINGLE_FILE} (a Hugging Face model "
                "saved with safetensors, e.g. save_pretrained(..., safe_serialization=True))"
            )
        self.weight_map: dict[str, str] = weight_map
        self._files: dict[str, SafetensorsFile] = {}

    def _file(self, name: str) -> SafetensorsFile:
        if name not in self.weight_map:
            raise KeyError(f"{self.directory}: no tensor {name!r} in the checkpoint")
        file = self.weight_map[name]
        if file not in self._files:
            self._files[file] = SafetensorsFile(self.directory / file)
        return self._files[file]

    def names(self) -> list[str]:
        """Every tensor name."""
        return list(self.weight_map)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape (header only)."""
        return self._file(name).shape(name)

    def get(self, name: str) -> np.ndarray:
        """One tensor, memory-mapped (see `SafetensorsFile.get`)."""
        return self._file(name).get(name)

    def files(self) -> list[Path]:
        """The weight files (for fingerprints of the source)."""
        return [self.directory / f for f in sorted(set(self.weight_map.values()))]


def _bytes(array: np.ndarray) -> memoryview:
    """An array's bytes in C order without another copy (safetensors is little-endian, as are
    the machines we run on)."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _header(specs: Sequence[tuple[str, tuple[int, ...], np.dtype]]) -> bytes:
    """The padded JSON header of tensors laid out in `specs` order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, dtype in specs:
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": dtype_name(dtype),
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def plan_shards(
    specs: Sequence[tuple[str, tuple[int, ...], np.dtype]], *, max_shard_bytes: int
) -> list[list[tuple[str, tuple[int, ...], np.dtype]]]:
    """Splits tensor specs, in order, into shards of at most `max_shard_bytes` (a larger tensor
    gets a shard of its own)."""
    shards: list[list] = [[]]
    size = 0
    for spec in specs:
        nbytes = int(np.prod(spec[1], dtype=np.int64)) * np.dtype(spec[2]).itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def write_checkpoint(
    directory: str | os.PathLike,
    *,
    specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
    tensor: Callable[[str], np.ndarray],
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[Path]:
    """Writes a Hugging Face safetensors checkpoint: `model.safetensors`, or shards
    `model-0000i-of-0000n.safetensors` and their index when it exceeds `max_shard_bytes`.

    Args:
      directory: where to write (created).
      specs: `(name, shape, dtype)` of every tensor, in the order to write them.
      tensor: `name -> array`, called once per tensor while writing (so at most one tensor is
        held at a time); its shape and dtype must be the spec's.

    Returns:
      The files written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards = plan_shards(specs, max_shard_bytes=max_shard_bytes)
    if len(shards) == 1:
        names = [SINGLE_FILE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map, total = {}, 0
    for file, shard in zip(names, shards, strict=True):
        with open(directory / file, "wb") as f:
            f.write(_header(shard))
            for name, shape, dtype in shard:
                array = np.asarray(tensor(name))
                if array.shape != tuple(shape) or array.dtype != np.dtype(dtype):
                    raise ValueError(
                        f"tensor {name!r}: got {array.shape} {array.dtype}, planned {shape} {dtype}"
                    )
                f.write(_bytes(array))
                weight_map[name] = file
                total += array.nbytes
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return [directory / n for n in names]
