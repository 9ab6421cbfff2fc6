"""One entry point to the memory model for a family's train step: the step's shape as the memory
model sees it (`step_shape`) and its estimator under each remat policy (`estimator`), with the
estimate (`estimate`) and the planner's choice (`plan`) built on them.

The trainer's memory check (`trainer.memory_check`), the sweep's `--hardware` plan
(`launch.estimate.memory_plan`) and `xlscale sizes --memory` all ask through here, so the three
describe a step the same way (which lengths an encoder-decoder adds, which attention kernel a
config asks for) and estimate it with the same remat-policy substitution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from modeling import memory


def step_shape(
    family: Any,
    config: Any,
    *,
    batch_size: int,
    seq_len: int,
    inputs_len: int | None,
    data_parallel: int,
    param_shards: int,
    optimizer: str,
    platform: str,
    num_microbatches: int = 1,
) -> memory.StepShape:
    """The memory model's view of a train step of `family`'s model `config`: `inputs_len` is
    kept only for a family whose batches carry inputs (an encoder-decoder), the attention kernel
    is the config's (`auto` where it names none), and batches are packed (segment ids).

    Args:
      batch_size: global batch, in sequences; seq_len: targets length.
      data_parallel: ways the batch is split; param_shards: ways parameters are split.
      optimizer: `adamw` or `adafactor`; platform: the backend (`cpu`, `gpu`, `tpu`).
    """
    return memory.StepShape(
        batch_size=batch_size,
        seq_len=seq_len,
        inputs_len=inputs_len if len(family.feature_keys) > 1 else None,
        num_microbatches=num_microbatches,
        data_parallel=data_parallel,
        param_shards=param_shards,
        optimizer=optimizer,
        attention_kernel=getattr(config, "attention_kernel", "auto"),
        platform=platform,
        packed=True,
    )


def estimator(family: Any, config: Any) -> Callable[[str, memory.StepShape], memory.MemoryEstimate]:
    """`(remat policy, shape) -> MemoryEstimate` of `config` under each policy: what the planner
    (`memory.plan`) tries."""

    def estimate_with(policy: str, shape: memory.StepShape) -> memory.MemoryEstimate:
        return family.memory_estimate(dataclasses.replace(config, remat_policy=policy), shape=shape)

    return estimate_with


def estimate(family: Any, config: Any, shape: memory.StepShape) -> memory.MemoryEstimate:
    """The per-device bytes of a step of `shape` under the config's own remat policy."""
    return family.memory_estimate(config, shape=shape)


def plan(
    family: Any,
    config: Any,
    *,
    shape: memory.StepShape,
    limit: int,
    policies: Iterable[str] | None = None,
) -> memory.Plan:
    """The first remat policy (of `policies`; default `memory.policy_order` for the config's
    layers, scanned or not) and fewest microbatches whose estimate fits `limit` bytes
    (`memory.plan` over `estimator`)."""
    if policies is None:
        policies = memory.policy_order(scanned=bool(getattr(config, "scan_layers", False)))
    return memory.plan(estimator(family, config), shape=shape, limit=limit, policies=policies)
