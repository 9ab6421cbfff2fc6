"""Deprecated: moved to `convert.safetensors_files`.

A re-export for one release (issue 24); import from `convert` instead. It imports `convert` only,
which never imports `trainer`, so it adds no import cycle.
"""

import warnings

from convert.safetensors_files import (
    DEFAULT_SHARD_BYTES,
    DTYPES,
    INDEX_FILE,
    SINGLE_FILE,
    CheckpointFiles,
    SafetensorsFile,
    dtype_name,
    plan_shards,
    write_checkpoint,
)

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "DTYPES",
    "INDEX_FILE",
    "SINGLE_FILE",
    "CheckpointFiles",
    "SafetensorsFile",
    "dtype_name",
    "plan_shards",
    "write_checkpoint",
]

warnings.warn(
    "trainer.safetensors_files is deprecated: use convert.safetensors_files",
    DeprecationWarning,
    stacklevel=2,
)
