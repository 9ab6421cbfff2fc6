"""The memory check of a train step: the device's memory, the step's shape as the memory model
sees it (`modeling.memory`), and a refusal, before anything is compiled, of a step that does not
fit, with the planner's remat policy and microbatches that would (`jobs.plan_job` calls it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modeling import memory as memory_lib
from modeling import step_memory
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
    """The memory model's view of a train step on this partitioner's mesh (the shared entry
    point, `modeling.step_memory.step_shape`)."""
    mesh = partitioner.mesh
    return step_memory.step_shape(
        model.model_family,
        model.config,
        batch_size=batch_size,
        seq_len=seq_len,
        inputs_len=(feature_lengths or {}).get("inputs"),
        num_microbatches=num_microbatches,
        data_parallel=partitioner.data_parallel_size,
        param_shards=mesh.shape.get("fsdp", 1) * mesh.shape.get("model", 1),
        optimizer=optimizer.name,
        platform=mesh.devices.flat[0].platform,
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
    family, config = model.model_family, model.config  # the wrapper's own family
    est = step_memory.estimate(family, config, shape)
    if est.total <= limit:
        return est

    validation.check_step_memory(
        size=model.name,
        estimate=est,
        limit=limit,
        advice=memory_lib.advice(
            step_memory.plan(family, config, shape=shape, limit=limit),
            current_policy=config.remat_policy,
            current_microbatches=shape.num_microbatches,
            same_policy=step_memory.plan(
                family, config, shape=shape, limit=limit, policies=(config.remat_policy,)
            ),
        ),
    )
    return est
