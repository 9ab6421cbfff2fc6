"""Multi-host runs match one host: global input sharding, host rows, eval, `jax.distributed` setup,
and real 2-process runs on 127.0.0.1 (CPU collectives through gloo)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from tests.test_trainer_runs import tiny_kwargs
from trainer import data, partitioning, validation


def _first(stream, n):
    return list(itertools.islice(stream, n))


def test_global_host_sharding_concatenates_to_the_one_host_batch(tiny_data, seqio_registry):
    config = tiny_kwargs(tiny_data)["data"]
    data.register(config)
    assert config.host_sharding == "global"

    def host(index, count):
        return _first(
            data.train_batches(config, seed=0, start_step=1, shard_index=index, num_shards=count),
            2,
        )

    one, first, second = host(0, 1), host(0, 2), host(1, 2)
    for whole, a, b in zip(one, first, second, strict=True):
        assert a["decoder_target_tokens"].shape == (4, 64)
        for key, value in whole.items():
            np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), value, err_msg=key)
    # The opt-in per-host packing reads other documents: not the one-host batch.
    per_host = dataclasses.replace(config, host_sharding="per_host")
    shard0 = _first(
        data.train_batches(per_host, seed=0, start_step=1, shard_index=0, num_shards=2), 1
    )[0]
    assert shard0["decoder_target_tokens"].shape == (4, 64)
    assert not np.array_equal(shard0["decoder_target_tokens"], first[0]["decoder_target_tokens"])


def test_host_rows_follow_the_batch_sharding():
    mesh = partitioning.build_mesh(partitioning.MeshConfig(data=2, fsdp=2, model=2))
    partitioner = partitioning.Partitioner(mesh=mesh, rules=())
    assert partitioner.host_rows(8) == ((0, 8),)
    batch = {"x": np.arange(12).reshape(6, 2)}
    taken = data.take_rows(batch, ((0, 2), (4, 6)))
    np.testing.assert_array_equal(taken["x"], batch["x"][[0, 1, 4, 5]])
    assert data.even_rows(batch_size=8, shard_index=1, num_shards=4) == ((2, 4),)


def test_unknown_host_sharding_names_the_macro_and_the_choices():
    with pytest.raises(validation.ConfigError, match="HOST_SHARDING.*'global', 'per_host'"):
        data.DataConfig(host_sharding="per_process")


def test_explicit_distributed_variables_are_passed_and_checked():
    args = partitioning.explicit_process_args
    assert args({}) == {}
    env = {
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "1",
    }
    assert args(env) == {
        "coordinator_address": "127.0.0.1:1234",
        "num_processes": 2,
        "process_id": 1,
    }
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES, JAX_PROCESS_ID missing"):
        args({"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234"})
    with pytest.raises(ValueError, match="JAX_COORDINATOR_ADDRESS missing"):
        args({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"})
    with pytest.raises(ValueError, match="JAX_PROCESS_ID = 'one'"):
        args({**env, "JAX_PROCESS_ID": "one"})
    # SLURM gives the count and the id; the coordinator address alone is then enough.
    slurm = {"SLURM_NTASKS": "2", "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}
    assert args(slurm) == {"coordinator_address": "10.0.0.1:1234"}
