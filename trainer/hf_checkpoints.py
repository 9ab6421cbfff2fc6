"""Deprecated: moved to `convert.hf_checkpoints` (import, export) and `convert.hf_cache` (`hf:`).

A re-export for one release (issue 24); import from `convert` instead. It imports `convert` only,
which never imports `trainer`, so it adds no import cycle.
"""

import warnings

from convert.hf_cache import CACHE_ENV, cache_root, cached_import, local_init_spec
from convert.hf_checkpoints import (
    DTYPES,
    EXPORT_RECORD,
    HF_PREFIX,
    IMPORT_KIND,
    IMPORT_STEP,
    RUN_FIELD,
    START_TOKEN_ID,
    TOKENIZER_FILE,
    hf_to_orbax,
    meta_to_orbax,
    orbax_to_hf,
    run_fields,
)

__all__ = [
    "CACHE_ENV",
    "DTYPES",
    "EXPORT_RECORD",
    "HF_PREFIX",
    "IMPORT_KIND",
    "IMPORT_STEP",
    "RUN_FIELD",
    "START_TOKEN_ID",
    "TOKENIZER_FILE",
    "cache_root",
    "cached_import",
    "hf_to_orbax",
    "local_init_spec",
    "meta_to_orbax",
    "orbax_to_hf",
    "run_fields",
]

warnings.warn(
    "trainer.hf_checkpoints is deprecated: use convert.hf_checkpoints and convert.hf_cache",
    DeprecationWarning,
    stacklevel=2,
)
