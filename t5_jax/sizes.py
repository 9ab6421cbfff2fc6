"""The T5 sizes, in one table.

`t5_770m` and `t5_3b` are the MT paper's Tables 2 and 1 (Isik et al. 2024, appendix A.1):
T5-770M is T5.1.1-large (gated GELU, untied logits); T5-3B is the original T5 3B of Raffel et
al. (ReLU MLP, logits tied to the embedding). `t5_small` and `t5_base` are T5.1.1's small and
base. `t5_tiny` is for tests: every dimension distinct, so a transposed weight cannot pass.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from t5_jax.config import GATED_GELU, RELU, T5Config

# name: d_model, num_heads, head_dim, encoder layers, decoder layers, d_ff, MLP, tied logits
_ROWS: dict[str, tuple] = {
    "t5_tiny": (24, 4, 10, 1, 2, 36, GATED_GELU, False),
    "t5_small": (512, 6, 64, 8, 8, 1024, GATED_GELU, False),
    "t5_base": (768, 12, 64, 12, 12, 2048, GATED_GELU, False),
    "t5_770m": (1024, 16, 64, 24, 24, 2816, GATED_GELU, False),  # MT paper, Table 2
    "t5_3b": (1024, 32, 128, 24, 24, 16384, RELU, True),  # MT paper, Table 1 (original T5-3B)
}
_COLUMNS = (
    "d_model",
    "num_heads",
    "head_dim",
    "num_encoder_layers",
    "num_decoder_layers",
    "d_ff",
    "mlp_activations",
    "logits_via_embedding",
)
# The tiny test size also shrinks the vocabulary and the relative-position buckets.
_EXTRA = {"t5_tiny": {"vocab_size": 104, "relpos_num_buckets": 8, "relpos_max_distance": 20}}

SIZES: MappingProxyType = MappingProxyType(
    {
        name: T5Config(**dict(zip(_COLUMNS, row, strict=True)), **_EXTRA.get(name, {}))
        for name, row in _ROWS.items()
    }
)


def get_config(name: str, **overrides) -> T5Config:
    """The `T5Config` of size `name`, with fields replaced by `overrides` (e.g. `vocab_size`).

    Raises:
      ValueError: unknown size name (the message lists the valid ones) or unknown field.
    """
    if name not in SIZES:
        raise ValueError(f"unknown T5 size {name!r}; valid sizes: {', '.join(SIZES)}")
    fields = {f.name for f in dataclasses.fields(T5Config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown T5Config fields {unknown}; valid: {sorted(fields)}")
    return dataclasses.replace(SIZES[name], **overrides)
