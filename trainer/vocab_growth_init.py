"""Deprecated: moved to `convert.vocab_growth` (growing) and `convert.init_checkpoints`
(params-only steps: `write_params`, `read_params`, `model_dir_of`, `source_vocab`).

A re-export for one release (issue 24); import from `convert` instead. It imports `convert` only,
which never imports `trainer`, so it adds no import cycle.
"""

import warnings
from typing import Any

from convert import init_checkpoints
from convert.init_checkpoints import model_dir_of, source_vocab, write_params
from convert.vocab_growth import GROWN_KIND, RUN_FIELD, grow_checkpoint, run_fields

__all__ = [
    "GROWN_KIND",
    "RUN_FIELD",
    "grow_checkpoint",
    "model_dir_of",
    "read_params",
    "run_fields",
    "source_vocab",
    "write_params",
]


def read_params(store: Any, step: int) -> dict[str, Any]:
    """A step of a `trainer.checkpoints.CheckpointStore` as host numpy arrays (the old signature
    of `convert.init_checkpoints.read_params(directory, step)`)."""
    return init_checkpoints.read_params(store.directory, step)


warnings.warn(
    "trainer.vocab_growth_init is deprecated: use convert.vocab_growth, convert.init_checkpoints",
    DeprecationWarning,
    stacklevel=2,
)
