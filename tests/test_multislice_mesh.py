"""Multi-slice meshes (`MeshConfig.num_slices`): data parallelism across slices (DCN), the
`data`/`fsdp`/`model` sizes within one slice (ICI), as MaxText's `dcn_*_parallelism` settings.

The mesh's `data` axis has `num_slices * data` entries and each slice's devices are contiguous
along it, so only the `data` axis crosses the data-center network. Checked on compile-only TPU
devices of two v5p slices (libtpu; skipped without it) and on the 8 CPU host devices split into
two groups of four (CPU devices have no `slice_index`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from trainer import jobs, model_spec, partitioning, steps
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

# `make test` installs libtpu off the import path and names it here (as tests/test_memory_model.py).
LIBTPU_ENV = "XLSCALE_LIBTPU"
LIBTPU = os.environ.get(LIBTPU_ENV, "")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None or os.path.isfile(LIBTPU)
needs_libtpu = pytest.mark.skipif(
    not HAS_LIBTPU,
    reason=f"needs libtpu for compile-only TPU devices: `make test` sets {LIBTPU_ENV}, or "
    "pip install 'jax[tpu]==0.10.2'",
)
# Two v5p slices of 2x2x1 chips: 4 devices per slice, 8 in all.
TOPOLOGY = "v5p:2x2x1"

needs_8_devices = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")


@pytest.fixture(scope="module")
def tpu_devices(tpu_topology):
    """The compile-only devices of two `TOPOLOGY` slices (slice_index 0 and 1)."""
    return tpu_topology(TOPOLOGY, num_slices=2)


def _slice_of_each_entry(mesh) -> np.ndarray:
    """The slice index of every device of `mesh`, in the mesh's shape."""
    return np.vectorize(lambda d: d.slice_index, otypes=[int])(mesh.devices)


@needs_libtpu
def test_two_tpu_slices_stack_along_data(tpu_devices):
    assert sorted({d.slice_index for d in tpu_devices}) == [0, 1] and len(tpu_devices) == 8
    mesh = partitioning.build_mesh(MeshConfig(data=2, fsdp=2, model=1, num_slices=2), tpu_devices)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}  # data: 2 slices x 2
    slices = _slice_of_each_entry(mesh)
    assert (slices[:2] == 0).all() and (slices[2:] == 1).all()  # first half: slice 0
    assert partitioning.data_parallel_size(mesh) == 8
    # JAX's hybrid mesh, as is: the layout within each slice is its ICI topology's.
    from jax.experimental import mesh_utils

    expected = mesh_utils.create_hybrid_device_mesh((2, 2, 1), (2, 1, 1), devices=tpu_devices)
    assert [d.id for d in mesh.devices.flat] == [d.id for d in expected.flat]
    # -1 takes the remaining devices of one slice, not of all.
    per_slice = partitioning.build_mesh(MeshConfig(data=-1, fsdp=4, num_slices=2), tpu_devices)
    assert dict(per_slice.shape) == {"data": 2, "fsdp": 4, "model": 1}
    assert _slice_of_each_entry(per_slice)[:, :, 0].tolist() == [[0] * 4, [1] * 4]


@needs_libtpu
def test_tpu_slice_count_must_match_num_slices(tpu_devices):
    for wrong in (1, 4):
        with pytest.raises(ValueError) as error:
            partitioning.build_mesh(MeshConfig(num_slices=wrong), tpu_devices)
        message = str(error.value)
        assert message.startswith(f"MeshConfig.num_slices = {wrong}: the devices are in 2 slice")
        assert "allowed 2" in message


@pytest.mark.slow
@needs_libtpu
def test_tiny_llama_step_compiles_for_two_tpu_slices(tpu_devices):
    job = _compile_tiny_llama(MeshConfig(data=1, fsdp=4, model=1, num_slices=2), tpu_devices)
    mesh = job.partitioner.mesh
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "model": 1}
    assert _slice_of_each_entry(mesh)[:, :, 0].tolist() == [[0] * 4, [1] * 4]
    assert job.train_step is not None


@needs_8_devices
def test_cpu_devices_split_into_consecutive_slices():
    devices = jax.devices()[:8]
    mesh = partitioning.build_mesh(MeshConfig(data=-1, fsdp=2, model=1, num_slices=2), devices)
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}
    ids = np.vectorize(lambda d: d.id, otypes=[int])(mesh.devices)
    assert sorted(ids[:2].flat) == [d.id for d in devices[:4]]  # slice 0: the first four
    assert sorted(ids[2:].flat) == [d.id for d in devices[4:]]
    # Each slice's block is the single-slice mesh of its own devices.
    for block, group in ((ids[:2], devices[:4]), (ids[2:], devices[4:])):
        alone = partitioning.build_mesh(MeshConfig(data=2, fsdp=2), group)
        assert block.tolist() == [[[d.id for d in row] for row in plane] for plane in alone.devices]
    # One slice: the mesh as before.
    single = partitioning.build_mesh(MeshConfig(data=-1, fsdp=2), devices)
    assert dict(single.shape) == {"data": 4, "fsdp": 2, "model": 1}
    assert MeshConfig().num_slices == 1


def _compile_tiny_llama(mesh_config: MeshConfig, devices) -> jobs.Job:
    spec = model_spec.ModelSpec(
        family="llama2", size="llama2_tiny", overrides={"scan_layers": True}
    )
    wrapper, partitioner, abstract = jobs.build_partitioned_model(
        spec, mesh_config, devices=devices
    )
    return jobs.compile_job(
        model=wrapper,
        partitioner=partitioner,
        abstract_params=abstract,
        components=["lm"],
        total_steps=10,
        batch_size=8,
        seq_len=16,
        eval_batch_size=None,
        optimizer=OptimizerConfig(),
        schedule=ScheduleConfig(),
        step_config=steps.StepConfig(num_microbatches=1, z_loss=0.0, num_components=1),
    )


@pytest.mark.slow
@needs_8_devices
def test_tiny_llama_step_compiles_for_two_cpu_slices():
    job = _compile_tiny_llama(MeshConfig(data=1, fsdp=2, model=2, num_slices=2), jax.devices()[:8])
    partitioner = job.partitioner
    assert dict(partitioner.mesh.shape) == {"data": 2, "fsdp": 2, "model": 2}
    assert partitioner.data_parallel_size == 4
    assert partitioner.batch_sharding().spec == P(("data", "fsdp"))
    # Parameters are split within a slice (fsdp, model) and replicated across slices (data).
    specs = [s.spec for s in jax.tree.leaves(job.shardings.params)]
    assert any("fsdp" in str(spec) for spec in specs)
    assert not any("data" in str(spec) for spec in specs)
    assert job.train_step is not None


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_num_slices_must_be_a_positive_integer(value):
    with pytest.raises(
        ValueError, match=rf"MeshConfig\.num_slices = {value!r}: allowed an integer"
    ):
        partitioning.build_mesh(MeshConfig(num_slices=value), jax.devices())


@needs_8_devices
def test_bad_slice_counts_and_sizes_name_num_slices():
    devices = jax.devices()[:8]
    with pytest.raises(ValueError, match=r"num_slices = 3: 8 devices do not split into 3 equal"):
        partitioning.build_mesh(MeshConfig(num_slices=3), devices)
    with pytest.raises(ValueError, match=r"allowed 1, 2, 4, 8$"):
        partitioning.build_mesh(MeshConfig(num_slices=3), devices)
    with pytest.raises(ValueError, match=r"num_slices = 4: 6 devices do not split"):
        partitioning.build_mesh(MeshConfig(num_devices=6, num_slices=4), devices)
    # Sizes are per slice: 4 devices a slice cannot hold data=8.
    with pytest.raises(ValueError, match=r"in each slice \(8 devices / MeshConfig.num_slices = 2"):
        partitioning.build_mesh(MeshConfig(data=8, num_slices=2), devices)


@dataclasses.dataclass(frozen=True)
class _FakeTpu:
    """A stand-in device with a slice index (the checks run before any mesh is made)."""

    id: int
    slice_index: int
    platform: str = "tpu"


def test_slices_of_devices_with_slice_index_must_match():
    three = [_FakeTpu(i, i // 2) for i in range(6)]
    with pytest.raises(ValueError, match=r"num_slices = 2: the devices are in 3 slice"):
        partitioning.build_mesh(MeshConfig(num_slices=2), three)
    with pytest.raises(ValueError, match=r"num_slices = 3: the devices are in 2 slice"):
        partitioning.build_mesh(MeshConfig(num_slices=3), three[:4] + [_FakeTpu(9, 0)] * 2)
    unequal = [_FakeTpu(i, 0 if i < 3 else 1) for i in range(4)]
    with pytest.raises(ValueError, match=r"num_slices = 2: the slices hold different numbers"):
        partitioning.build_mesh(MeshConfig(num_slices=2), unequal)


def test_gin_binds_num_slices():
    import gin

    from trainer import gin_entry
    from trainer import train as train_lib

    gin.clear_config()
    try:
        gin_entry.parse(
            [
                "--gin_file=experiments/cpt_source_en.gin",
                "--gin.MODEL_DIR='/xl/run'",
                "--gin.MODEL_SIZE='llama2_49m'",
                "--gin.VOCAB_PATH='/xl/vocab.model'",
                "--gin.partitioning.MeshConfig.num_slices=2",
                "--gin.partitioning.MeshConfig.fsdp=4",
            ],
            job="train",
        )
        # By the configurable itself: the alias `train_script` belongs to the parsed file's
        # imports, and a T5X file parsed earlier in this process binds it to `__main__`.
        mesh = gin.get_bindings(train_lib.train)["mesh"]
    finally:
        gin.clear_config()
    assert mesh == MeshConfig(data=-1, fsdp=4, model=1, num_slices=2)
