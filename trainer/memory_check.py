"""The memory check of a train step: the device's memory, the step's shape as the memory model
sees it (`modeling.memory`), and a refusal, before anything is compiled, of a step that does not
fit, with the planner's remat policy and microbatches that would (`jobs.plan_job` calls it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from modeling import family as family_lib
from modeling import memory as memory_lib
from trainer import validation
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig, Partitioner


def device_memory_limit(mesh: MeshConfig, partitioner: Partitioner) -> int | None:
    """Bytes a device offers a step: `mesh.device_memory_gib` when set, else the first mesh
    device's `memory_stats()['bytes_limit']` (GPU, TPU), else None (unknown: CPU)."""
    if mesh.device_memory_gib is not None:
        return int(mesh.device_memory_gib * memory_lib.GiB)
    device = partitioner.mesh.devices.flat[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 -- compile-only and CPU devices may not answer
        return None
    return (stats or {}).get("bytes_limit")


def step_shape(
    *,
    model: Any,
    partitioner: Partitioner,
    batch_size: int,
    seq_len: int,
    feature_lengths: Mapping[str, int] | None,
    optimizer: OptimizerConfig,
    num_microbatches: int,
) -> memory_lib.StepShape:
    """The memory model's view of a train step on this partitioner's mesh."""
    mesh = partitioner.mesh
    return memory_lib.StepShape(
        batch_size=batch_size,
        seq_len=seq_len,
        inputs_len=(feature_lengths or {}).get("inputs") if len(model.feature_keys) > 1 else None,
        num_microbatches=num_microbatches,
        data_parallel=partitioner.data_parallel_size,
        param_shards=mesh.shape.get("fsdp", 1) * mesh.shape.get("model", 1),
        optimizer=optimizer.name,
        attention_kernel=model.config.attention_kernel,
        platform=mesh.devices.flat[0].platform,
        packed=True,
    )


def check_memory(
    *, model: Any, shape: memory_lib.StepShape, limit: int | None
) -> memory_lib.MemoryEstimate | None:
    """Refuses, before compiling, a train step of `shape` (`step_shape`) whose estimate exceeds
    `limit` bytes per device.

    Returns the estimate (None when `limit` is None: the memory is unknown and nothing is
    checked).

    Raises:
      trainer.validation.ConfigError: one line naming the size, the estimate, the device
        memory and the planner's remat policy and microbatches that fit.
    """
    if limit is None:
        return None
    family = family_lib.get(model.family)
    config = model.config
    est = family.memory_estimate(config, shape=shape)
    if est.total <= limit:
        return est

    def estimator(policy: str, step: memory_lib.StepShape) -> memory_lib.MemoryEstimate:
        return family.memory_estimate(dataclasses.replace(config, remat_policy=policy), shape=step)

    validation.check_step_memory(
        size=model.name,
        estimate=est,
        limit=limit,
        advice=memory_lib.advice(
            memory_lib.plan(estimator, shape=shape, limit=limit),
            current_policy=config.remat_policy,
            current_microbatches=shape.num_microbatches,
            same_policy=memory_lib.plan(
                estimator, shape=shape, limit=limit, policies=(config.remat_policy,)
            ),
        ),
    )
    return est
