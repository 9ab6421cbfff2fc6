"""The one place that builds the device mesh and turns logical axis names into shardings.

The mesh has the axes `('data', 'fsdp', 'model')` (`modeling.axes.MESH_AXES`); its sizes come from
a `MeshConfig` in which one size may be -1 ("all remaining devices"); on several TPU slices
(`MeshConfig.num_slices`) the sizes are those of one slice and `data` also spans the slices.
Parameters and optimizer state are sharded by the model's logical axis rules through
`NamedSharding`; batches are sharded along their leading axis over every data-parallel mesh axis
(`data` and `fsdp`), and each host contributes only its own rows
(`jax.make_array_from_process_local_data`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "model")
# Mesh axes that split the batch: the data-parallel size is their product.
DATA_AXES = ("data", "fsdp")

# Process counts set by SLURM and Open MPI; with `JAX_COORDINATOR_ADDRESS` (GPU clusters) and
# several `TPU_WORKER_HOSTNAMES` (TPU pod slices) they mean "this process is one of several".
_MULTIPROCESS_SIZES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; at most one may be -1 (the devices left over by the others).

    The default is pure data parallelism over every device. `num_devices` restricts the mesh to
    the first devices (single-host experiments and tests; None = all). `device_memory_gib` is
    the per-device memory a train step's estimate (`modeling.memory`) is checked against before
    compiling (`trainer.jobs`); None takes the device's own limit (`memory_stats()
    ['bytes_limit']` on GPU/TPU) and checks nothing where that is unknown (CPU). Bind it
    (`partitioning.MeshConfig.device_memory_gib = 16`) to plan for a smaller chip, or to allow
    more than the device reports when the estimate is known to be high.

    `num_slices` > 1 makes a multi-slice mesh (TPU slices joined by the data-center network,
    MaxText's `dcn_data_parallelism`): `data`, `fsdp` and `model` then describe the mesh within
    one slice (ICI; -1 takes that slice's remaining devices), and the slices are data-parallel
    replicas of it, so the mesh's `data` axis has `num_slices * data` entries with each slice's
    devices contiguous along it. Only the gradient all-reduce over `data` crosses the slow network;
    `fsdp` and `model` collectives stay inside a slice. Bind it with
    `partitioning.MeshConfig.num_slices = 2`.
    """

    data: int = -1
    fsdp: int = 1
    model: int = 1
    num_devices: int | None = None
    device_memory_gib: float | None = None
    num_slices: int = 1

    def sizes(self) -> dict[str, int]:
        """The requested sizes by axis name (may contain -1)."""
        return {"data": self.data, "fsdp": self.fsdp, "model": self.model}


def maybe_initialize_distributed(*, mode: str = "auto") -> bool:
    """Starts `jax.distributed` for multi-host jobs; must run before JAX touches a backend.

    Outside TPU pods, SLURM and Open MPI (whose environments JAX reads itself), a job is
    described by `JAX_COORDINATOR_ADDRESS` (`host:port` of process 0), `JAX_NUM_PROCESSES` and
    `JAX_PROCESS_ID`, which are passed to `jax.distributed.initialize`.

    Args:
      mode: "auto" initialises when the environment shows several processes (TPU pod slices,
        SLURM, Open MPI, or an explicit `JAX_COORDINATOR_ADDRESS`); "always" and "never" force it.

    Returns:
      Whether `jax.distributed.initialize()` was called (not again when it already ran).

    Raises:
      ValueError: only some of the explicit variables are set (naming the missing ones), or
        they are not integers.
    """
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"distributed mode {mode!r}: choose one of auto, always, never")
    if mode == "never" or jax.distributed.is_initialized():
        return False
    explicit = explicit_process_args(os.environ)
    if mode == "auto" and not explicit and not _several_processes(os.environ):
        return False
    jax.distributed.initialize(**explicit)
    log.info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())
    return True


# The explicit description of a multi-process job: environment variable -> argument of
# `jax.distributed.initialize`.
EXPLICIT_PROCESS_VARS = {
    "JAX_COORDINATOR_ADDRESS": "coordinator_address",
    "JAX_NUM_PROCESSES": "num_processes",
    "JAX_PROCESS_ID": "process_id",
}


def explicit_process_args(env: Mapping[str, str]) -> dict[str, Any]:
    """`jax.distributed.initialize` arguments from `JAX_COORDINATOR_ADDRESS`,
    `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` ({} when none is set). A coordinator address alone
    is allowed where a cluster environment (SLURM, Open MPI, TPU) gives the process count and
    id; otherwise all three are required.

    Raises:
      ValueError: naming the missing variables, or one that is not an integer.
    """
    given = {name: env[name] for name in EXPLICIT_PROCESS_VARS if env.get(name)}
    if not given:
        return {}
    cluster = any(env.get(name) for name in _MULTIPROCESS_SIZES) or env.get("TPU_WORKER_HOSTNAMES")
    if not (cluster and list(given) == ["JAX_COORDINATOR_ADDRESS"]):
        missing = [name for name in EXPLICIT_PROCESS_VARS if name not in given]
        if missing:
            raise ValueError(
                f"jax.distributed: {', '.join(sorted(given))} set but {', '.join(missing)} "
                f"missing; set all of {', '.join(EXPLICIT_PROCESS_VARS)} (outside SLURM, Open "
                "MPI and TPU pods), e.g. JAX_COORDINATOR_ADDRESS=10.0.0.1:1234 "
                "JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=0"
            )
    out: dict[str, Any] = {}
    for name, value in given.items():
        arg = EXPLICIT_PROCESS_VARS[name]
        if arg == "coordinator_address":
            out[arg] = value
            continue
        try:
            out[arg] = int(value)
        except ValueError:
            raise ValueError(f"{name} = {value!r}: must be an integer") from None
    return out


def _several_processes(env: Mapping[str, str]) -> bool:
    """Whether the environment describes one process among several."""
    if env.get("JAX_COORDINATOR_ADDRESS") or "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        return True
    return any(int(env.get(name) or 1) > 1 for name in _MULTIPROCESS_SIZES)


def resolve_mesh_shape(config: MeshConfig, num_devices: int) -> dict[str, int]:
    """Replaces a -1 size by the devices left over and checks that the sizes multiply out.

    Raises:
      ValueError: naming the sizes and the device count when they do not fit.
    """
    sizes = config.sizes()
    free = [name for name, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"mesh sizes {sizes}: at most one axis may be -1")
    bad = [name for name, size in sizes.items() if size == 0 or size < -1]
    if bad:
        raise ValueError(f"mesh sizes {sizes}: sizes must be positive or -1 (axes {bad})")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if num_devices % fixed:
            raise ValueError(
                f"mesh sizes {sizes}: {num_devices} devices are not divisible by {fixed}"
            )
        sizes[free[0]] = num_devices // fixed
    if math.prod(sizes.values()) != num_devices:
        raise ValueError(
            f"mesh sizes {sizes} use {math.prod(sizes.values())} devices, but {num_devices} exist"
        )
    return sizes


def build_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds the `('data', 'fsdp', 'model')` mesh over `devices` (default: all devices).

    Uses the physical topology (`mesh_utils.create_device_mesh`) where JAX knows it, so that the
    `model` axis lands on the fastest interconnect; falls back to device order otherwise. With
    `config.num_slices` > 1 the mesh is hybrid (`mesh_utils.create_hybrid_device_mesh`): one
    `(data, fsdp, model)` block per slice, stacked along `data` in slice order, so that only the
    `data` axis spans the data-center network between slices.

    Raises:
      ValueError: `num_devices` or `num_slices` out of range (naming the field, its value and
        what is allowed), or mesh sizes that do not fit the devices (of one slice).
    """
    devices = list(jax.devices() if devices is None else devices)
    if config.num_devices is not None:
        if not 0 < config.num_devices <= len(devices):
            raise ValueError(
                f"MeshConfig.num_devices = {config.num_devices}: allowed 1..{len(devices)}"
            )
        devices = devices[: config.num_devices]
    num_slices = _check_num_slices(config.num_slices, len(devices))
    slices = _slices(devices, num_slices)
    try:
        sizes = resolve_mesh_shape(config, len(slices[0]))
    except ValueError as e:
        if num_slices == 1:
            raise
        raise ValueError(
            f"{e} in each slice ({len(devices)} devices / MeshConfig.num_slices = {num_slices})"
        ) from None
    shape = tuple(sizes[name] for name in MESH_AXES)
    if num_slices == 1:
        return Mesh(_slice_grid(shape, devices), MESH_AXES)
    grid = None
    if _has_slice_index(devices):
        from jax.experimental import mesh_utils

        try:
            grid = mesh_utils.create_hybrid_device_mesh(
                mesh_shape=shape, dcn_mesh_shape=(num_slices, 1, 1), devices=devices
            )
        except (ValueError, AssertionError):
            grid = None  # a slice JAX cannot lay out physically: device order within each slice
    if grid is None:
        grid = np.concatenate([_slice_grid(shape, group) for group in slices], axis=0)
    return Mesh(grid, MESH_AXES)


def _check_num_slices(num_slices: Any, num_devices: int) -> int:
    """`num_slices`, after checking it is a positive integer that divides the device count.

    Raises:
      ValueError: naming `MeshConfig.num_slices`, its value and what is allowed.
    """
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
        raise ValueError(
            f"MeshConfig.num_slices = {num_slices!r}: allowed an integer >= 1 (the number of "
            "slices the mesh is data-parallel across; 1 = a single slice)"
        )
    if num_devices % num_slices:
        divisors = [n for n in range(1, num_devices + 1) if num_devices % n == 0]
        raise ValueError(
            f"MeshConfig.num_slices = {num_slices}: {num_devices} devices do not split into "
            f"{num_slices} equal slices; allowed {', '.join(map(str, divisors))}"
        )
    return num_slices


def _has_slice_index(devices: Sequence[jax.Device]) -> bool:
    """Whether every device says which slice it is in (TPU devices, compile-only ones too)."""
    return all(getattr(device, "slice_index", None) is not None for device in devices)


def _slices(devices: Sequence[jax.Device], num_slices: int) -> list[list[jax.Device]]:
    """The devices of each slice, in slice order.

    Devices with a `slice_index` (TPU) are grouped by it, and must form exactly `num_slices`
    slices of equal size: a mismatch is a configuration error, since a slice split across `fsdp`
    or `model` would put their collectives on the slow network. Devices without one (CPU, used
    by tests) are split into `num_slices` consecutive groups of the device order. A single slice
    of non-TPU devices is not checked (GPU devices may report a `slice_index` per host).

    Raises:
      ValueError: naming `MeshConfig.num_slices` when the devices' slices do not match it.
    """
    devices = list(devices)
    tpu = bool(devices) and devices[0].platform == "tpu"
    if not _has_slice_index(devices) or (num_slices == 1 and not tpu):
        per_slice = len(devices) // num_slices
        return [devices[i * per_slice : (i + 1) * per_slice] for i in range(num_slices)]
    groups: dict[int, list[jax.Device]] = {}
    for device in devices:
        groups.setdefault(device.slice_index, []).append(device)
    counts = {index: len(groups[index]) for index in sorted(groups)}
    if len(groups) != num_slices:
        raise ValueError(
            f"MeshConfig.num_slices = {num_slices}: the devices are in {len(groups)} slice(s) "
            f"(devices per slice_index: {counts}); allowed {len(groups)}, the number of slices "
            "the devices are in"
        )
    if len(set(counts.values())) > 1:
        raise ValueError(
            f"MeshConfig.num_slices = {num_slices}: the slices hold different numbers of devices "
            f"(devices per slice_index: {counts}); a multi-slice mesh needs equal slices (check "
            "MeshConfig.num_devices)"
        )
    return [groups[index] for index in sorted(groups)]


def _slice_grid(shape: tuple[int, ...], devices: Sequence[jax.Device]) -> np.ndarray:
    """The devices of one slice as an array of `shape`: laid out by their physical topology
    (`mesh_utils.create_device_mesh`) where JAX knows it, else in device order."""
    try:
        from jax.experimental import mesh_utils

        return mesh_utils.create_device_mesh(shape, devices=list(devices))
    except (ValueError, AssertionError):
        return np.asarray(devices, dtype=object).reshape(shape)


def data_parallel_size(mesh: Mesh) -> int:
    """Number of ways the batch is split: the product of the `data` and `fsdp` axis sizes."""
    return math.prod(mesh.shape[name] for name in DATA_AXES)


def _axis_names_tree(variables: Mapping[str, Any]) -> Any:
    """Logical axis names (PartitionSpec of names) for each parameter of `variables['params']`.

    Understands both conventions of the models: `nn.with_logical_partitioning` boxes and the T5X
    `params_axes` collection written by `flax.linen.partitioning.param_with_axes`.
    """
    if "params_axes" in variables:
        from flax.core import unfreeze
        from flax.linen import partitioning as flax_partitioning

        return unfreeze(flax_partitioning.get_axis_names(variables["params_axes"]))
    return nn.get_partition_spec(variables["params"])


def unbox(tree: Any) -> Any:
    """Strips flax partitioning boxes (if any), leaving plain arrays or shape structs."""
    return nn.meta.unbox(tree)


class Partitioner:
    """Maps logical axis names to `NamedSharding`s on one mesh and shards host batches.

    Args:
      mesh: the device mesh (from `build_mesh`).
      rules: logical axis rules, `(logical_name, mesh_axis_or_axes_or_None)` pairs, e.g.
        `modeling.axes.logical_axis_rules()`.
    """

    def __init__(self, *, mesh: Mesh, rules: Sequence[tuple[str, Any]]):
        self.mesh = mesh
        self.rules = tuple(rules)

    @property
    def data_parallel_size(self) -> int:
        """How many ways the global batch is split."""
        return data_parallel_size(self.mesh)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """Mesh and logical rules in scope, for tracing code with logical sharding constraints."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            yield

    def replicated(self) -> NamedSharding:
        """A sharding that keeps a full copy on every device."""
        return NamedSharding(self.mesh, PartitionSpec())

    def logical_to_sharding(
        self, logical_spec: PartitionSpec | Sequence[str | None]
    ) -> NamedSharding:
        """The `NamedSharding` of one array whose dimensions carry `logical_spec` names."""
        mesh_spec = nn.logical_to_mesh_axes(tuple(logical_spec), self.rules)
        return NamedSharding(self.mesh, mesh_spec)

    def params_shardings(self, abstract_variables: Mapping[str, Any]) -> Any:
        """Shardings for `abstract_variables['params']` (from `jax.eval_shape` of `module.init`)."""
        names = _axis_names_tree(abstract_variables)
        return jax.tree.map(
            self.logical_to_sharding,
            names,
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )

    def state_shardings(
        self, abstract_state: Any, *, abstract_params: Any, params_shardings: Any
    ) -> Any:
        """Shardings for a pytree that contains parameter-shaped leaves (optimizer state).

        A leaf whose key path ends with a parameter's key path and has that parameter's shape
        gets the parameter's sharding (Adam moments, momentum); any other leaf (counters,
        Adafactor's factored row/column statistics) is replicated: they are small.
        """
        shapes = {
            _path_keys(path): leaf.shape
            for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_params)
        }
        by_path = {
            _path_keys(path): sharding
            for path, sharding in jax.tree_util.tree_leaves_with_path(params_shardings)
        }
        params_paths = sorted(by_path, key=len, reverse=True)

        def pick(path, leaf):
            keys = _path_keys(path)
            for param_keys in params_paths:
                if keys[-len(param_keys) :] == param_keys:
                    if tuple(leaf.shape) == tuple(shapes[param_keys]):
                        return by_path[param_keys]
                    break
            return self.replicated()

        return jax.tree_util.tree_map_with_path(pick, abstract_state)

    def batch_sharding(self) -> NamedSharding:
        """Sharding of `[batch, ...]` arrays: the batch split over all data-parallel axes."""
        return NamedSharding(self.mesh, PartitionSpec(DATA_AXES))

    def host_rows(self, batch_size: int) -> tuple[tuple[int, int], ...]:
        """The `[start, stop)` row ranges of a global batch of `batch_size` rows that this
        process's devices hold, merged and in order: the rows `shard_batch` expects from this
        host, so that the assembled global array is the global batch row for row."""
        index_map = self.batch_sharding().addressable_devices_indices_map((batch_size,))
        blocks = sorted(
            {
                (s[0].start or 0, batch_size if s[0].stop is None else s[0].stop)
                for s in index_map.values()
            }
        )
        merged: list[list[int]] = []
        for start, stop in blocks:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        return tuple((start, stop) for start, stop in merged)

    def shard_batch(self, local_batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """Assembles global arrays from this host's rows of the batch (every host calls this)."""
        sharding = self.batch_sharding()
        return {
            key: jax.make_array_from_process_local_data(sharding, np.asarray(value))
            for key, value in local_batch.items()
        }


def _path_keys(path) -> tuple:
    """A key path as a tuple of plain keys (dict keys, attribute names, indices)."""
    out = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                out.append(getattr(entry, attr))
                break
        else:
            out.append(str(entry))
    return tuple(out)
