"""Multi-host runs match one host: global input sharding, host rows, eval, `jax.distributed` setup,
and real 2-process runs on 127.0.0.1 (CPU collectives through gloo)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import time

import gin
import jax
import numpy as np
import pytest
from tiny_runs import tiny_kwargs
from two_host_runs import STEPS, host_argv, two_hosts

from rundir import records as rundir_records
from trainer import checkpoints, data, partitioning, validation
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig


def _first(stream, n):
    return list(itertools.islice(stream, n))


@pytest.mark.slow
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


def test_explicit_distributed_variables_are_passed_and_checked(monkeypatch):
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
    # The job entry point refuses a partial description before starting anything.
    for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1234")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES, JAX_PROCESS_ID missing"):
        partitioning.maybe_initialize_distributed()


# --- real 2-process runs ---------------------------------------------------------------------

LOSS_KEYS = ("step", "tokens", "tokens_by_task", "train/loss", "learning_rate", "eval/lm_en/loss")


def _one_host(model_dir, tiny_data, *, cache, seqio_state, prepared):
    """The run in this process, on 2 of its CPU devices (what one host with 2 devices runs), on
    the prepared data the 2-process runs read."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    from trainer import gin_entry

    saved, configured = seqio_state.snapshot(), jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", os.fspath(cache))
    cc.reset_cache()
    gin.clear_config()
    try:
        argv = [
            *host_argv(model_dir, tiny_data, prepared),
            "--gin.partitioning.MeshConfig.num_devices=2",
        ]
        return gin_entry.call(train_lib.train, gin_entry.parse(argv, job="train"))
    finally:
        gin.clear_config()
        jax.config.update("jax_compilation_cache_dir", configured)
        cc.reset_cache()
        seqio_state.restore(saved)


def _loss_rows(model_dir):
    return [{k: r[k] for k in LOSS_KEYS if k in r} for r in rundir_records.read_metrics(model_dir)]


def _final_params(model_dir):
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    )
    try:
        step = store.latest_step()
        metadata = store.params_metadata(step)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata
        )
        return step, jax.tree.map(np.asarray, store.restore_params(step, abstract_params=abstract))
    finally:
        store.close()


def _sigterm_host_1_once_started(procs, logs):
    """SIGTERM to host 1 as soon as both hosts joined `jax.distributed` (before any step)."""
    deadline = time.time() + 120
    while time.time() < deadline and not all(
        "jax.distributed: process" in log.read_text() for log in logs
    ):
        assert all(p.poll() is None for p in procs), [log.read_text()[-2000:] for log in logs]
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGTERM)


@pytest.fixture(scope="module")
def multihost(tiny_data, tiny_prepared, tmp_path_factory, seqio_state):
    """The run on one host with 2 CPU devices (in this process), and as a 2-process job (1 device
    each) whose host 1 gets a SIGTERM once both joined, then resumed by 2 processes; both with the
    global batch of 8, on prepared data (`tiny_prepared`: the processes import no TensorFlow; the
    seqio path's global sharding is the first test's). The processes share one compilation
    cache, so the resumed run compiles nothing."""
    tmp = tmp_path_factory.mktemp("multihost")
    cache = tmp_path_factory.mktemp("multihost_xla")
    out = {
        "tmp": tmp,
        "one": _one_host(
            tmp / "one", tiny_data, cache=cache, seqio_state=seqio_state, prepared=tiny_prepared
        ),
    }
    out["term_codes"], out["term_logs"] = two_hosts(
        tmp / "two",
        tiny_data,
        tmp,
        name="term",
        cache=cache,
        on_start=_sigterm_host_1_once_started,
        prepared=tiny_prepared,
    )
    out["term_step"] = _final_params(tmp / "two")[0]
    out["term_completed"] = (tmp / "two" / "COMPLETED").exists()
    out["resume_codes"], out["resume_logs"] = two_hosts(
        tmp / "two", tiny_data, tmp, name="resume", cache=cache, prepared=tiny_prepared
    )
    return out


@pytest.mark.slow
def test_two_hosts_stop_on_one_sigterm_and_resume_to_the_one_host_run(multihost):
    """Same losses, eval losses, token counts and final parameters as one process with the same
    global batch; a SIGTERM to host 1 stops both hosts at the same step with exit code 75."""
    tmp = multihost["tmp"]
    assert multihost["one"].completed
    logs = multihost["term_logs"]
    assert multihost["term_codes"] == [train_lib.PREEMPTED_EXIT_CODE] * 2, [t[-3000:] for t in logs]
    assert "process 1 of 2" in logs[1]
    step = multihost["term_step"]
    assert 1 <= step < STEPS
    for text in logs:
        assert f"stopping at step {step} (checkpoint saved)" in text
    assert not multihost["term_completed"]
    assert multihost["resume_codes"] == [0, 0], [t[-3000:] for t in multihost["resume_logs"]]
    one, two = _loss_rows(tmp / "one"), _loss_rows(tmp / "two")
    assert [r["step"] for r in one] == list(range(1, STEPS + 1))
    assert sum("eval/lm_en/loss" in r for r in one) == 2
    assert two == one
    (final_one, params_one), (final_two, params_two) = (
        _final_params(tmp / "one"),
        _final_params(tmp / "two"),
    )
    assert final_one == final_two == STEPS
    jax.tree.map(np.testing.assert_array_equal, params_two, params_one)
