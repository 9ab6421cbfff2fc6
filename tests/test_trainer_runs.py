"""End-to-end tests of `trainer.train` on the UDHR fixture corpora with a tiny LLaMA2.

One module-scoped set of runs (a full run on a 2×2×2 mesh of 8 CPU devices, the same run stopped
at step 6 and resumed, and the same run on one device) serves several tests, because compiling
is what costs time here. CPT initialisation, the NaN guard and evaluation/inference jobs use
their own small runs; the SIGTERM test runs the real command line in a subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest
from conftest import fast_compile_flags
from tiny_runs import REPO, TRAIN_STEPS, prepared_flag, started_from, tiny_kwargs

from convert import init_checkpoints
from rundir import names
from rundir import records as rundir_records
from trainer import checkpoints, data, model_spec
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig

pytestmark = pytest.mark.usefixtures("compilation_cache")


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory, seqio_state):
    """Full run, stopped-then-resumed run, and single-device run of the same configuration."""
    saved = seqio_state.snapshot()
    root = tmp_path_factory.mktemp("runs")
    out = {"root": root}
    try:
        out["full"] = train_lib.train(model_dir=root / "full", **tiny_kwargs(tiny_data))
        out["stopped"] = train_lib.train(
            model_dir=root / "resumed",
            **tiny_kwargs(tiny_data, loop=LoopConfig(log_every=2, stop_after=6)),
        )
        out["stopped_metrics"] = rundir_records.read_metrics(root / "resumed")
        out["resumed"] = train_lib.train(model_dir=root / "resumed", **tiny_kwargs(tiny_data))
        out["single"] = train_lib.train(
            model_dir=root / "single", **tiny_kwargs(tiny_data, mesh=MeshConfig(num_devices=1))
        )
    finally:
        seqio_state.restore(saved)
    return out


@pytest.mark.slow
def test_loss_decreases_in_a_tiny_real_run(runs):
    records = rundir_records.read_metrics(runs["root"] / "full")
    assert runs["full"].completed and runs["full"].step == TRAIN_STEPS
    assert [r["step"] for r in records] == list(range(2, TRAIN_STEPS + 1, 2))
    losses = [r["train/loss"] for r in records]
    assert losses[-1] < losses[0] - 0.5, losses
    evals = [r["eval/lm_en/loss"] for r in records if "eval/lm_en/loss" in r]
    assert len(evals) == 2 and evals[1] < evals[0]


@pytest.mark.slow
def test_outputs_follow_the_training_outputs_contract(runs):
    model_dir = runs["root"] / "full"
    run = json.loads((model_dir / "run.json").read_text())
    for key in (
        "model family params_total params_non_embedding strategy languages target_lang "
        "source_lang replay_ratio mixture_or_task components init_checkpoint init_step "
        "init_params_hash seed seq_len batch_size train_steps flops_per_token "
        "flops_per_token_attn gin_config"
    ).split():
        assert key in run, key
    assert run["model"] == "llama2_tiny" and run["family"] == "llama2"
    assert run["languages"] == ["en"] and run["components"] == ["lm_en"]
    assert run["flops_per_token"] == 6 * run["params_non_embedding"]
    assert run["train_steps"] == TRAIN_STEPS and run["seq_len"] == 64
    records = rundir_records.read_metrics(model_dir)
    tokens = [r["tokens"] for r in records]
    assert all(b > a for a, b in zip(tokens, tokens[1:], strict=False))
    for r in records:
        assert r["tokens_by_task"] == {"lm_en": r["tokens"]}
        assert r["flops"] == run["flops_per_token"] * r["tokens"]
        assert r["flops_attn"] == run["flops_per_token_attn"] * r["tokens"]
        assert r["learning_rate"] > 0 and r["tokens_per_s"] > 0
    eval_record = records[-1]
    assert 0 < eval_record["eval/lm_en/tokens"] and np.isfinite(eval_record["eval/lm_en/loss"])
    completed = json.loads((model_dir / "COMPLETED").read_text())
    assert completed == {"step": TRAIN_STEPS, "tokens": records[-1]["tokens"]}
    assert (model_dir / "config.gin").exists()
    assert list((model_dir / "tb").iterdir()), "no TensorBoard events"
    steps_on_disk = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    ).all_steps()
    assert steps_on_disk == [4, 8, 12]


@pytest.mark.slow
def test_stop_and_resume_gives_identical_metrics(runs):
    assert not runs["stopped"].completed and runs["stopped"].step == 6
    assert [r["step"] for r in runs["stopped_metrics"]] == [2, 4, 6]
    full = [
        rundir_records.without_timing(r) for r in rundir_records.read_metrics(runs["root"] / "full")
    ]
    resumed = [
        rundir_records.without_timing(r)
        for r in rundir_records.read_metrics(runs["root"] / "resumed")
    ]
    assert resumed == full  # bit-exact: losses, token counts, data order, eval losses


@pytest.mark.slow
def test_eight_device_mesh_matches_one_device(runs):
    sharded = rundir_records.read_metrics(runs["root"] / "full")
    single = rundir_records.read_metrics(runs["root"] / "single")
    assert [r["tokens"] for r in sharded] == [r["tokens"] for r in single]
    for a, b in zip(sharded, single, strict=True):
        np.testing.assert_allclose(a["train/loss"], b["train/loss"], rtol=2e-4)
    np.testing.assert_allclose(
        sharded[-1]["eval/lm_en/loss"], single[-1]["eval/lm_en/loss"], rtol=2e-4
    )


@pytest.mark.slow
def test_cpt_initialisation_takes_source_params_with_fresh_optimizer(
    runs, tiny_data, tmp_path, seqio_registry
):
    from trainer import jobs

    source = f"{runs['root'] / 'full'}@8"
    kwargs = tiny_kwargs(
        tiny_data,
        data=dataclasses.replace(
            tiny_kwargs(tiny_data)["data"], mixture_or_task="cpt_fr_replay_en_10"
        ),
        # Step 0 is the source model on the target language; log-spaced: 3 points from step 1.
        evaluation=EvalConfig(
            tasks=("lm_fr", "lm_en"),
            period=0,
            max_tokens=512,
            at_start=True,
            schedule="log",
            log_points=3,
            log_start=0.25,
        ),
        run=train_lib.RunInfo(
            strategy="cpt_replay", target_lang="fr", source_lang="en", replay_ratio=0.1
        ),
        train_steps=4,
        mesh=MeshConfig(num_devices=1),  # the single-device run's eval step is reused
    )
    job = jobs.build_job(
        model=kwargs["model"],
        data=kwargs["data"],
        evaluation=EvalConfig(),
        optimizer=train_lib.OptimizerConfig(),
        schedule=kwargs["schedule"],
        mesh=kwargs["mesh"],
        train_steps=4,
        compile_train=False,
    )
    state, saved, init, source_params = started_from(
        job, runs["root"] / "full", 8, store_dir=tmp_path / "empty", seed=1
    )
    assert int(state.step) == 0 and saved == {}
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(source_params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    adam = state.opt_state[1][0]
    assert int(adam.count) == 0
    assert all(not np.asarray(m).any() for m in jax.tree.leaves((adam.mu, adam.nu)))
    assert init["init_step"] == 8
    assert init["init_params_hash"] == init_checkpoints.params_hash(source_params)

    model_dir = tmp_path / "cpt"
    result = train_lib.train(model_dir=model_dir, init_checkpoint=source, **kwargs)
    run = json.loads((model_dir / "run.json").read_text())
    assert result.completed
    assert run["init_step"] == 8 and run["init_params_hash"] == init["init_params_hash"]
    assert run["init_checkpoint"] == os.fspath(runs["root"] / "full")
    assert run["strategy"] == "cpt_replay" and run["replay_ratio"] == 0.1
    assert run["components"] == ["lm_en", "lm_fr"]
    records = rundir_records.read_metrics(model_dir)
    evaluated = [r for r in records if "eval/lm_fr/loss" in r]
    assert [r["step"] for r in evaluated] == [0, 1, 2, 4]
    assert evaluated[0]["tokens"] == 0 and evaluated[0]["flops"] == 0  # before the first update
    assert math.isfinite(evaluated[0]["eval/lm_en/loss"])
    last = records[-1]
    assert set(last["tokens_by_task"]) == {"lm_en", "lm_fr"}
    assert sum(last["tokens_by_task"].values()) == last["tokens"]
    assert 0 < last["tokens_by_task"]["lm_en"] < last["tokens_by_task"]["lm_fr"]
    assert "eval/lm_fr/loss" in last and "eval/lm_en/loss" in last  # forgetting is measured


@pytest.mark.slow
def test_mismatched_init_checkpoint_names_each_parameter(runs, tiny_data, tmp_path, seqio_registry):
    kwargs = tiny_kwargs(tiny_data)
    kwargs["model"] = model_spec.ModelSpec(
        size="llama2_tiny", overrides={"vocab_size": 512, "max_len": 128, "d_ff": 96}
    )
    with pytest.raises(ValueError) as e:
        train_lib.train(
            model_dir=tmp_path / "bad", init_checkpoint=f"{runs['root'] / 'full'}@4", **kwargs
        )
    assert "layers_0/mlp/w1: checkpoint has shape (32, 88), model wants (32, 96)" in str(e.value)


@pytest.mark.slow
def test_nan_injection_stops_without_writing_a_bad_checkpoint(
    tiny_data, tmp_path, monkeypatch, seqio_registry
):
    real = data.train_batches

    def poisoned(config, **kwargs):
        for i, batch in enumerate(real(config, **kwargs), start=kwargs["start_step"] + 1):
            if i >= 5:  # out-of-range token ids: the embedding gather yields NaN
                batch["decoder_input_tokens"] = batch["decoder_input_tokens"].copy()
                batch["decoder_input_tokens"][:, 3] = 10_000
            yield batch

    monkeypatch.setattr(data, "train_batches", poisoned)
    model_dir = tmp_path / "nan"
    kwargs = tiny_kwargs(
        tiny_data, checkpoint=CheckpointConfig(period=2), loop=LoopConfig(log_every=4)
    )
    with pytest.raises(train_lib.NonFiniteError, match="step 5"):
        train_lib.train(model_dir=model_dir, **kwargs)
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    )
    assert store.latest_step() == 4
    metadata = store.params_metadata(4)
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)
    params = store.restore_params(4, abstract_params=abstract)
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(params))
    assert [r["step"] for r in rundir_records.read_metrics(model_dir)] == [4]
    assert not (model_dir / "COMPLETED").exists()


@pytest.mark.slow
def test_eval_and_infer_jobs_read_a_checkpoint(runs, tiny_data, tmp_path, seqio_registry):
    from trainer import eval as eval_lib
    from trainer import infer as infer_lib

    kwargs = tiny_kwargs(tiny_data)
    records = eval_lib.evaluate(
        model_dir=tmp_path / "eval",
        model=kwargs["model"],
        data=dataclasses.replace(kwargs["data"], mixture_or_task=""),
        evaluation=EvalConfig(tasks=("lm_en",), max_tokens=1024),
        checkpoint=os.fspath(runs["root"] / "full"),
        all_steps=True,
        mesh=MeshConfig(num_devices=1),
    )
    assert [r["step"] for r in records] == [4, 8, 12]
    in_training = [r for r in rundir_records.read_metrics(runs["root"] / "full") if r["step"] == 12]
    np.testing.assert_allclose(
        records[-1]["eval/lm_en/loss"], in_training[0]["eval/lm_en/loss"], rtol=2e-4
    )
    lines = (tmp_path / "eval" / eval_lib.EVAL_METRICS_FILE).read_text().splitlines()
    assert len(lines) == 3

    results = infer_lib.infer(
        model_dir=tmp_path / "infer",
        model=kwargs["model"],
        vocab_path=tiny_data["vocab"],
        source=infer_lib.InferSource(prompts=["Everyone has the right", "All human beings"]),
        checkpoint=os.fspath(runs["root"] / "full"),
        decoding=infer_lib.InferDecoding(max_decode_len=16, batch_size=2),
    )
    assert [r["prompt"] for r in results] == ["Everyone has the right", "All human beings"]
    assert all(0 < len(r["tokens"]) <= 16 for r in results)
    assert (tmp_path / "infer" / infer_lib.INFER_FILE).exists()


@pytest.mark.slow
def test_sigterm_mid_run_leaves_a_loadable_checkpoint(tiny_data, tiny_prepared, tmp_path):
    model_dir = tmp_path / "preempted"
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = fast_compile_flags()
    # Same model, length and device count as the single-device run: its init compiles are reused.
    env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    command = [
        sys.executable,
        "-m",
        "trainer.train",
        "--gin_file=experiments/cpt_source_en.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        prepared_flag(tiny_prepared),  # no TensorFlow imported: its subject is the SIGTERM
        "--gin.TRAIN_STEPS=100000",
        "--gin.CHECKPOINT_PERIOD=100000",
        "--gin.EVAL_TASKS=[]",
        "--gin.LOG_EVERY=1",
    ]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if len(rundir_records.read_metrics(model_dir)) >= 3:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == train_lib.PREEMPTED_EXIT_CODE, proc.stderr.read()[-3000:]
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    )
    step = store.latest_step()
    assert step is not None and step >= 3
    metadata = store.params_metadata(step)
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)
    params = store.restore_params(step, abstract_params=abstract)
    assert params["lm_head"]["kernel"].shape == (32, 512)
    assert not (model_dir / "COMPLETED").exists()
    assert max(r["step"] for r in rundir_records.read_metrics(model_dir)) == step


@pytest.mark.slow
def test_what_the_trainer_writes_is_what_fitting_and_status_read(runs):
    # One contract (`rundir`): every entry of a finished run directory is a name `rundir.names`
    # defines, and the readers of fitting, status and the run records see the same run.
    from fitting.readers import run_dirs as fit_io
    from launch import status
    from rundir import records

    model_dir = runs["root"] / "full"
    defined = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    assert {p.name for p in model_dir.iterdir()} <= defined
    written = rundir_records.read_metrics(model_dir)
    run = fit_io.read_run(model_dir)
    assert list(run.records) == written
    assert run.meta == rundir_records.read_run_json(model_dir)
    assert (
        run.completed
        == records.read_completed(model_dir)
        == {
            "step": TRAIN_STEPS,
            "tokens": written[-1]["tokens"],
        }
    )
    assert [row["step"] for row in fit_io.tidy([run])] == [
        r["step"] for r in written if any(k.startswith("eval/") for k in r)
    ]
    run_spec = types.SimpleNamespace(
        run_id="full", model_dir=os.fspath(model_dir), done_marker=names.COMPLETED_FILE
    )
    state = status.run_status(run_spec)
    assert (state.state, state.step) == ("done", TRAIN_STEPS)
    assert state.loss == written[-1]["train/loss"]
    assert status.last_metrics(model_dir) == written[-1]
