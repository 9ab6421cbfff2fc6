"""Unit tests of the trainer's parts that need no data: schedules, optimizers, mesh, validation,
checkpoint helpers, the train step's microbatching and non-finite guard, and the CLI wiring."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from convert import init_checkpoints
from trainer import checkpoints, model_spec, optimizers, partitioning, schedules, steps, validation

# --- schedules ---------------------------------------------------------------------------------


def test_cosine_warms_up_linearly_over_first_5_percent_then_decays_to_final_fraction():
    total = 1000
    lr = schedules.build_schedule(
        schedules.ScheduleConfig(name="cosine", peak=2e-4, final_fraction=0.1), total_steps=total
    )
    assert float(lr(0)) == 0.0
    assert float(lr(25)) == pytest.approx(1e-4, rel=1e-6)  # half-way through the warm-up
    assert float(lr(50)) == pytest.approx(2e-4, rel=1e-6)  # warm-up ends at 5%
    assert float(lr(49)) < float(lr(50))
    assert float(lr(51)) < float(lr(50))
    mid = 50 + (total - 50) // 2  # half-way through the decay: (peak + final) / 2
    assert float(lr(mid)) == pytest.approx((2e-4 + 2e-5) / 2, rel=1e-3)
    assert float(lr(total)) == pytest.approx(2e-5, rel=1e-6)
    assert float(lr(total + 100)) == pytest.approx(2e-5, rel=1e-6)


def test_rsqrt_is_flat_until_10k_then_one_over_sqrt_step():
    lr = schedules.build_schedule(schedules.ScheduleConfig(name="rsqrt", base=1.0), total_steps=1)
    assert float(lr(0)) == pytest.approx(0.01)
    assert float(lr(5_000)) == pytest.approx(0.01)
    assert float(lr(10_000)) == pytest.approx(0.01)
    assert float(lr(40_000)) == pytest.approx(1 / math.sqrt(40_000))
    assert float(lr(1_000_000)) == pytest.approx(0.001)


def test_constant_schedule_and_unknown_name():
    lr = schedules.build_schedule(
        schedules.ScheduleConfig(name="constant", peak=1e-3), total_steps=10
    )
    assert float(lr(0)) == float(lr(10**6)) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="choose one of"):
        schedules.build_schedule(schedules.ScheduleConfig(name="linear"), total_steps=10)


@pytest.mark.parametrize(
    "config, total",
    [
        (schedules.ScheduleConfig(), 1000),
        (schedules.ScheduleConfig(peak=3e-3, final_fraction=0.0), 160),
        (schedules.ScheduleConfig(peak=1e-3, warmup_fraction=0.0), 7),
        (schedules.ScheduleConfig(name="rsqrt", base=0.5, rsqrt_offset=30), 10),
        (schedules.ScheduleConfig(name="constant", peak=0.03), 5),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_schedules_are_optaxs_and_their_numbers_are_arguments(config, total):
    ours = schedules.build_schedule(config, total_steps=total)
    reference = schedules.optax_schedule(config, total_steps=total)
    count = np.arange(total + 40, dtype=np.int32)
    np.testing.assert_allclose(ours(count), reference(count), rtol=1e-6, atol=1e-12)

    # Traced, the numbers are the program's arguments: another run's numbers give that run's
    # rates from the same compiled function (float32 rounding differs from constants by ulps).
    def rates(numbers):
        with ours.given(numbers):
            return ours(jnp.asarray(count))

    compiled = jax.jit(rates)
    other = dataclasses.replace(config, peak=config.peak * 3, rsqrt_offset=50)
    for cfg, steps_ in ((config, total), (other, 2 * total + 3)):
        numbers = schedules.build_schedule(cfg, total_steps=steps_).numbers
        np.testing.assert_allclose(
            compiled({k: np.float32(v) for k, v in numbers.items()}),
            schedules.optax_schedule(cfg, total_steps=steps_)(count),
            rtol=2e-6,
            atol=1e-12,
        )
    assert compiled._cache_size() == 1


# --- optimizers --------------------------------------------------------------------------------


@pytest.mark.slow
def test_adamw_defaults_match_the_cpt_paper_recipe():
    config = optimizers.OptimizerConfig()
    assert (config.b1, config.b2, config.eps, config.weight_decay, config.grad_clip_norm) == (
        0.9,
        0.95,
        1e-8,
        0.1,
        1.0,
    )
    params = {"w": jnp.ones((4, 3)), "scale": jnp.ones((3,))}
    tx = optimizers.build_optimizer(config, learning_rate=optax.constant_schedule(0.1))
    state = tx.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, state, params)
    # Zero gradients: only decoupled weight decay moves the matrix; the norm scale is not decayed.
    np.testing.assert_allclose(updates["w"], -0.1 * 0.1 * np.ones((4, 3)), rtol=1e-6)
    np.testing.assert_allclose(updates["scale"], 0.0)


def test_adamw_clips_gradients_to_global_norm_one():
    params = {"w": jnp.zeros((2,))}
    tx = optimizers.build_optimizer(
        optimizers.OptimizerConfig(weight_decay=0.0), learning_rate=optax.constant_schedule(1.0)
    )
    state = tx.init(params)
    _, state = tx.update({"w": jnp.array([30.0, 40.0])}, state, params)
    mu = state[1][0].mu["w"]  # chain(clip, adamw) -> adamw's ScaleByAdamState
    np.testing.assert_allclose(mu, 0.1 * np.array([0.6, 0.8]), rtol=1e-6)


def test_adafactor_factors_second_moments_of_large_matrices():
    config = optimizers.adafactor_defaults()
    assert (config.decay_rate, config.clipping_threshold, config.multiply_by_parameter_scale) == (
        0.8,
        1.0,
        True,
    )
    params = {"w": jnp.ones((256, 128))}
    tx = optimizers.build_optimizer(config, learning_rate=optax.constant_schedule(0.01))
    state = tx.init(params)
    shapes = sorted(leaf.shape for leaf in jax.tree_util.tree_leaves(state) if leaf.ndim)
    assert (256,) in shapes and (128,) in shapes and (256, 128) not in shapes
    with pytest.raises(ValueError, match="choose one of"):
        optimizers.build_optimizer(
            optimizers.OptimizerConfig(name="sgd"), learning_rate=optax.constant_schedule(1.0)
        )


def test_adafactor_equals_optax_adafactor_with_one_pass_for_the_parameter_scale():
    # The same chain as optax.adafactor (so checkpoints of its state restore) and the same
    # updates, including a parameter whose RMS is below the minimum scale and weight decay.
    keys = jax.random.split(jax.random.key(3), 3)
    params = {
        "big": jax.random.normal(keys[0], (256, 130)),
        "vector": jax.random.normal(keys[1], (7,)),
        "tiny": jnp.full((3, 5), 1e-5),
    }
    grads = jax.tree.map(lambda p: jnp.sin(3.0 * p) + 0.1, params)
    schedule = optax.constant_schedule(0.01)
    for decay in (0.0, 0.1):
        config = dataclasses.replace(optimizers.adafactor_defaults(), weight_decay=decay)
        ours = optimizers.build_optimizer(config, learning_rate=schedule)
        theirs = optax.chain(
            optax.adafactor(
                learning_rate=schedule,
                decay_rate=0.8,
                clipping_threshold=1.0,
                multiply_by_parameter_scale=True,
                weight_decay_rate=decay or None,
                weight_decay_mask=(lambda t: jax.tree.map(lambda p: p.ndim >= 2, t))
                if decay
                else None,
            )
        )
        ours_state, theirs_state = ours.init(params), theirs.init(params)
        assert jax.tree.structure(ours_state) == jax.tree.structure(theirs_state)
        for _ in range(3):
            ours_updates, ours_state = ours.update(grads, ours_state, params)
            theirs_updates, theirs_state = theirs.update(grads, theirs_state, params)
            for name in params:
                np.testing.assert_allclose(
                    ours_updates[name], theirs_updates[name], rtol=1e-6, atol=1e-12
                )
    with pytest.raises(ValueError, match="needs the parameters"):
        optimizers.scale_by_param_rms().update(grads, optax.EmptyState())


# --- mesh and partitioning ---------------------------------------------------------------------


def test_mesh_shape_resolves_minus_one_and_rejects_bad_sizes():
    resolve = partitioning.resolve_mesh_shape
    assert resolve(partitioning.MeshConfig(), 8) == {"data": 8, "fsdp": 1, "model": 1}
    assert resolve(partitioning.MeshConfig(data=2, fsdp=-1, model=2), 8)["fsdp"] == 2
    with pytest.raises(ValueError, match="at most one"):
        resolve(partitioning.MeshConfig(data=-1, fsdp=-1), 8)
    with pytest.raises(ValueError, match="not divisible"):
        resolve(partitioning.MeshConfig(data=-1, model=3), 8)
    with pytest.raises(ValueError, match="use 4 devices"):
        resolve(partitioning.MeshConfig(data=2, fsdp=2, model=1), 8)


def test_params_and_optimizer_state_shard_by_logical_axes():
    from modeling import axes

    mesh = partitioning.build_mesh(partitioning.MeshConfig(data=2, fsdp=2, model=2))
    assert mesh.axis_names == ("data", "fsdp", "model") and mesh.devices.shape == (2, 2, 2)
    partitioner = partitioning.Partitioner(mesh=mesh, rules=axes.logical_axis_rules())
    model = model_spec.build_model(model_spec.ModelSpec(size="llama2_tiny"))
    variables = model.abstract_variables()
    shardings = partitioner.params_shardings(variables)
    spec = shardings["layers_0"]["mlp"]["w1"].spec  # [embed, mlp]
    assert tuple(spec) == ("fsdp", "model")
    assert tuple(shardings["token_embedder"]["embedding"].spec) == ("model", "fsdp")
    params = partitioning.unbox(variables["params"])
    tx = optimizers.build_optimizer(
        optimizers.OptimizerConfig(), learning_rate=optax.constant_schedule(1e-3)
    )
    opt_state = jax.eval_shape(tx.init, params)
    opt_shardings = partitioner.state_shardings(
        opt_state, abstract_params=params, params_shardings=shardings
    )
    adam = opt_shardings[1][0]
    assert adam.mu["layers_0"]["mlp"]["w1"] == shardings["layers_0"]["mlp"]["w1"]
    assert adam.count.spec == partitioning.PartitionSpec()
    assert partitioner.data_parallel_size == 4


def test_distributed_start_only_for_several_processes():
    several = partitioning._several_processes
    assert not several({})
    assert not several({"SLURM_NTASKS": "1", "TPU_WORKER_HOSTNAMES": "localhost"})
    assert several({"SLURM_NTASKS": "4"})
    assert several({"TPU_WORKER_HOSTNAMES": "w0,w1"})
    assert several({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert partitioning.maybe_initialize_distributed(mode="never") is False
    with pytest.raises(ValueError, match="auto, always, never"):
        partitioning.maybe_initialize_distributed(mode="sometimes")


# --- validation --------------------------------------------------------------------------------


def test_batch_not_divisible_by_data_parallel_size_names_binding_and_allowed_values():
    with pytest.raises(validation.ConfigError) as e:
        validation.check_batch_size(batch_size=12, data_parallel_size=8)
    assert "BATCH_SIZE" in str(e.value) and "multiples of 8" in str(e.value)
    with pytest.raises(validation.ConfigError, match="2 microbatches.*multiples of 16"):
        validation.check_batch_size(batch_size=24, data_parallel_size=8, num_microbatches=2)
    validation.check_batch_size(batch_size=16, data_parallel_size=8, num_microbatches=2)


def test_length_beyond_model_max_names_binding_and_range():
    with pytest.raises(validation.ConfigError) as e:
        validation.check_feature_lengths(
            feature_lengths={"targets": 4096}, max_len=2048, required=("targets",), model="m"
        )
    assert "TASK_FEATURE_LENGTHS['targets'] = 4096" in str(e.value)
    assert "allowed: 1..2048" in str(e.value)
    with pytest.raises(validation.ConfigError, match="lacks"):
        validation.check_feature_lengths(
            feature_lengths={"inputs": 8}, max_len=2048, required=("targets",), model="m"
        )


def test_vocab_larger_than_model_names_both_bindings():
    with pytest.raises(validation.ConfigError) as e:
        validation.check_vocab(vocab_size=32100, model_vocab_size=512, vocab_path="/v.model")
    message = str(e.value)
    assert "VOCAB_PATH" in message and "vocab_size" in message and "at most 512" in message
    validation.check_vocab(vocab_size=320, model_vocab_size=512, vocab_path="/v.model")


def test_required_macros_and_unknown_size_and_steps():
    with pytest.raises(validation.ConfigError, match=r"MODEL_DIR, BATCH_SIZE.*--gin\.MODEL_DIR"):
        validation.check_required({"MODEL_DIR": None, "BATCH_SIZE": None, "SEED": 0})
    with pytest.raises(validation.ConfigError) as e:
        validation.check_model_size(family="llama2", size="llama2_7b", allowed=["llama2_49m"])
    assert "MODEL_SIZE" in str(e.value) and "llama2_49m" in str(e.value)
    with pytest.raises(validation.ConfigError, match="TRAIN_STEPS.*TOKENS_PER_PARAM"):
        validation.check_steps(train_steps=None, tokens_per_param=None)
    with pytest.raises(validation.ConfigError, match="positive"):
        validation.check_steps(train_steps=0, tokens_per_param=20)
    with pytest.raises(validation.ConfigError, match="lm_xx.*allowed: lm_en"):
        validation.check_task(name="lm_xx", allowed=["lm_en"])


def test_unknown_model_family_lists_registry():
    with pytest.raises(ValueError, match="llama2"):
        model_spec.build_model(model_spec.ModelSpec(family="gpt", size="x"))


# --- checkpoints helpers -----------------------------------------------------------------------


def test_init_checkpoint_spec_parsing(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert init_checkpoints.parse_init_checkpoint(f"{tmp_path}/run@300") == (
        tmp_path / "run" / "checkpoints",
        300,
    )
    assert init_checkpoints.parse_init_checkpoint(f"{tmp_path}/other") == (tmp_path / "other", None)
    with pytest.raises(ValueError, match="step number"):
        init_checkpoints.parse_init_checkpoint(f"{tmp_path}/run@latest")


def test_shape_mismatch_names_each_parameter_and_both_shapes():
    saved = {"a": {"kernel": jax.ShapeDtypeStruct((4, 8), jnp.float32)}}
    target = {
        "a": {"kernel": jax.ShapeDtypeStruct((4, 16), jnp.float32)},
        "b": {"scale": jax.ShapeDtypeStruct((8,), jnp.float32)},
    }
    with pytest.raises(ValueError) as e:
        checkpoints.check_params_compatible(saved, target, source="'src'")
    message = str(e.value)
    assert "a/kernel: checkpoint has shape (4, 8), model wants (4, 16)" in message
    assert "b/scale: missing from the checkpoint (model wants (8,))" in message


def test_params_hash_depends_on_values_and_names_only():
    a = {"x": jnp.arange(6.0).reshape(2, 3), "y": jnp.ones(2)}
    b = {"y": jnp.ones(2), "x": jnp.arange(6.0).reshape(2, 3)}
    assert init_checkpoints.params_hash(a) == init_checkpoints.params_hash(b)
    c = {"x": jnp.arange(6.0).reshape(2, 3), "y": jnp.ones(2).at[0].set(2.0)}
    assert init_checkpoints.params_hash(a) != init_checkpoints.params_hash(c)


# --- the train step ----------------------------------------------------------------------------


def _tiny_step_setup(num_microbatches=1, tx=None):
    model = model_spec.build_model(
        model_spec.ModelSpec(
            size="llama2_tiny", overrides={"vocab_size": 64, "max_len": 16, "num_layers": 1}
        )
    )
    tx = tx or optimizers.build_optimizer(
        optimizers.OptimizerConfig(), learning_rate=optax.constant_schedule(1e-2)
    )
    # Small random params without the model's (slow to compile) truncated-normal initialisers.
    draw = np.random.default_rng(1)
    abstract = jax.tree.map(
        lambda a: a.value if hasattr(a, "value") else a, model.abstract_variables()["params"]
    )
    params = jax.tree.map(
        lambda a: jnp.asarray(0.3 * draw.standard_normal(a.shape), jnp.float32), abstract
    )
    rng = jnp.asarray(jax.random.key_data(jax.random.key(0)))
    state = steps.init_train_state(model, tx, rng, params=params)
    step = jax.jit(
        steps.make_train_step(
            model,
            tx,
            optax.constant_schedule(1e-2),
            steps.StepConfig(num_microbatches=num_microbatches, num_components=2),
        )
    )
    tokens = np.random.default_rng(0).integers(1, 64, (4, 16)).astype(np.int32)
    batch = {
        "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": tokens,
        "decoder_loss_weights": np.ones_like(tokens),
        "decoder_segment_ids": np.ones_like(tokens),
        "decoder_positions": np.broadcast_to(np.arange(16, dtype=np.int32), tokens.shape),
        "decoder_task_ids": np.repeat(np.array([[0], [1], [1], [0]], np.int32), 16, axis=1),
    }
    batch["decoder_loss_weights"][3, 8:] = 0
    batch["decoder_task_ids"][3, 8:] = -1
    return state, step, batch


@pytest.fixture(scope="module")
def momentum_step():
    """One compiled step with SGD + momentum (updates are linear in the gradients, unlike Adam,
    which amplifies float rounding in near-zero gradients), shared by the tests below."""
    return _tiny_step_setup(1, optax.sgd(1.0, momentum=0.9))


@pytest.mark.slow
def test_microbatched_gradients_match_the_full_batch(momentum_step):
    state1, step1, batch = momentum_step
    state2, step2, _ = _tiny_step_setup(2, optax.sgd(1.0, momentum=0.9))
    new1, m1 = step1(state1, batch)
    new2, m2 = step2(state2, batch)
    np.testing.assert_allclose(m1["loss_sum"], m2["loss_sum"], rtol=1e-5)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-4)
    for a, b in zip(jax.tree.leaves(new1.params), jax.tree.leaves(new2.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert m1["tokens_by_task"].tolist() == [16 + 8, 32]
    assert float(m1["weight_sum"]) == 56


def test_nonfinite_step_leaves_params_and_optimizer_state_unchanged(momentum_step):
    state, step, batch = momentum_step
    params = jax.tree.map(lambda p: p.at[(0,) * p.ndim].set(jnp.nan), state.params)
    poisoned = steps.TrainState(
        step=state.step,
        params=params,
        opt_state=state.opt_state,
        rng=state.rng,
        skipped=state.skipped,
        param_norm=steps.global_norm_of(params),
    )
    before = jax.tree.map(np.asarray, poisoned)
    new, metrics = step(poisoned, batch)
    assert not bool(metrics["finite"])
    assert int(new.skipped) == 1 and int(new.step) == 1
    for a, b in zip(jax.tree.leaves(before.params), jax.tree.leaves(new.params), strict=True):
        np.testing.assert_array_equal(a, b)  # NaN where poisoned, nothing else moved
    momentum = jax.tree.leaves(new.opt_state)
    assert momentum and all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(before.opt_state), momentum, strict=True)
    )


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_forwards_remaining_arguments(monkeypatch):
    import argparse

    from xlscale_cli import train as cli

    seen = {}

    def fake_main(argv):
        seen["argv"] = argv
        return 0

    monkeypatch.setattr("trainer.eval.main", fake_main)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--gin_file=runs/eval.gin", "--gin.MODEL_DIR='/x'"])
    args.command = "eval"
    assert cli.run(args) == 0
    assert seen["argv"] == ["--gin_file=runs/eval.gin", "--gin.MODEL_DIR='/x'"]


@pytest.mark.slow
def test_compiled_steps_are_shared_by_identical_jobs_of_one_process():
    # The demos run many jobs of one shape in one process; tracing and lowering their steps again
    # costs seconds each. Steps are shared only when nothing they depend on differs.
    from trainer import jobs, model_spec, steps
    from trainer.optimizers import OptimizerConfig
    from trainer.partitioning import MeshConfig
    from trainer.schedules import ScheduleConfig

    spec = model_spec.ModelSpec(
        family="llama2", size="llama2_tiny", overrides={"vocab_size": 64, "max_len": 16}
    )

    def job(total_steps, schedule="cosine", batch_size=8):
        wrapper, partitioner, abstract = jobs.build_partitioned_model(spec, MeshConfig())
        return jobs.compile_job(
            model=wrapper,
            partitioner=partitioner,
            abstract_params=abstract,
            components=["lm"],
            total_steps=total_steps,
            batch_size=batch_size,
            seq_len=8,
            eval_batch_size=8,
            optimizer=OptimizerConfig(),
            schedule=ScheduleConfig(name=schedule),
            step_config=steps.StepConfig(num_microbatches=1, z_loss=0.0, num_components=1),
        )

    first = job(10)
    assert job(10).train_step.compiled is first.train_step.compiled
    assert job(10).eval_step is first.eval_step
    # ... and so is the initialisation program: a second job draws from it, same values
    state = first.init_state(np.array([0, 7], np.uint32))
    again = job(10)
    assert again.init_programs is first.init_programs and len(first.init_programs) == 1
    # ... and the state's shapes and shardings (traced once)
    assert again.abstract_state is first.abstract_state and again.shardings is first.shardings
    same = jax.tree.map(np.array_equal, state, again.init_state(np.array([0, 7], np.uint32)))
    assert all(jax.tree.leaves(same))
    # The schedule's numbers are the step's arguments: a longer run shares the program and
    # binds its own numbers; another batch shape or schedule formula does not share it.
    longer = job(20)
    assert longer.train_step.compiled is first.train_step.compiled
    assert longer.schedule.numbers["decay"] == 19 and first.schedule.numbers["decay"] == 9
    assert job(16, batch_size=16).train_step.compiled is not first.train_step.compiled
    constant = job(10, schedule="constant")
    assert constant.train_step.compiled is not first.train_step.compiled
    assert job(30, schedule="constant").train_step.compiled is constant.train_step.compiled
