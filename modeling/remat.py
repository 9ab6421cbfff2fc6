"""The registry of rematerialisation (gradient checkpointing) policies, shared by every family.

A gin/CLI string (`remat_policy`) selects a policy through this dict instead of an if/elif
chain; each family wraps its blocks in `flax.linen.remat(..., policy=REMAT_POLICIES[name])`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

# Name -> jax.checkpoint policy (None: no rematerialisation at all).
REMAT_POLICIES: dict[str, Callable[..., Any] | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
