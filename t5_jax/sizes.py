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

_ROWS: dict[str, dict] = {
    # name: d_model, heads x head_dim, enc + dec layers, d_ff, MLP, tied logits
    "t5_tiny": dict(
        vocab_size=104,
        d_model=24,
        num_heads=4,
        head_dim=10,
        num_encoder_layers=1,
        num_decoder_layers=2,
        d_ff=36,
        relpos_num_buckets=8,
        relpos_max_distance=20,
    ),
    "t5_small": dict(
        d_model=512, num_heads=6, head_dim=64, num_encoder_layers=8, num_decoder_layers=8, d_ff=1024
    ),
    "t5_base": dict(
        d_model=768,
        num_heads=12,
        head_dim=64,
        num_encoder_layers=12,
        num_decoder_layers=12,
        d_ff=2048,
    ),
    # MT paper, Table 2.
    "t5_770m": dict(
        d_model=1024,
        num_heads=16,
        head_dim=64,
        num_encoder_layers=24,
        num_decoder_layers=24,
        d_ff=2816,
    ),
    # MT paper, Table 1 (original T5-3B: ReLU, tied embedding).
    "t5_3b": dict(
        d_model=1024,
        num_heads=32,
        head_dim=128,
        num_encoder_layers=24,
        num_decoder_layers=24,
        d_ff=16384,
        mlp_activations=RELU,
        logits_via_embedding=True,
    ),
}

SIZES: MappingProxyType = MappingProxyType(
    {
        name: T5Config(**{"mlp_activations": GATED_GELU, "logits_via_embedding": False, **row})
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
