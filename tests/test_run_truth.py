"""Nothing silently mis-recorded: a run records only what it applied, resumes only onto
what it started with, and its records survive up to the newest checkpoint.

Each test names the finding it covers; the checks that need no training run with `no_compile`
(any attempt to build a job fails the test), the others share small runs of `tiny_kwargs`.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import fast_compile_flags
from tiny_runs import REPO, prepared_flag, tiny_kwargs

from trainer import data, validation
from trainer import train as train_lib
from trainer.data import DataConfig

pytestmark = pytest.mark.usefixtures("compilation_cache")


def cpt(replay_ratio: float, *, target: str = "fr") -> train_lib.RunInfo:
    return train_lib.RunInfo(
        strategy="cpt", target_lang=target, source_lang="en", replay_ratio=replay_ratio
    )


@pytest.mark.usefixtures("no_compile")
@pytest.mark.parametrize("ratio", [1.5, 0.15, 0.1])
def test_plain_cpt_refuses_a_replay_ratio_it_does_not_apply(tiny_data, tmp_path, ratio):
    # Finding 1: `lm_fr` alone replays no English, so any REPLAY_RATIO but 0 would be recorded
    # untrue (fitting would place the run on the replay curve at that ratio).
    kwargs = tiny_kwargs(tiny_data, run=cpt(ratio))
    kwargs["data"] = dataclasses.replace(kwargs["data"], mixture_or_task="lm_fr")
    with pytest.raises(validation.ConfigError) as e:
        train_lib.train(model_dir=tmp_path / "run", **kwargs)
    message = str(e.value)
    assert f"REPLAY_RATIO (train.RunInfo.replay_ratio) = {ratio!r}" in message
    assert "MIXTURE_OR_TASK_NAME (data.DataConfig.mixture_or_task) = 'lm_fr'" in message
    assert "allowed: 0" in message and "experiments/cpt_replay.gin" in message
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.mark.usefixtures("no_compile")
def test_a_replay_mixture_must_be_recorded_at_the_ratio_it_applies(tiny_data, tmp_path):
    kwargs = tiny_kwargs(tiny_data, run=cpt(0.3))
    kwargs["data"] = dataclasses.replace(kwargs["data"], mixture_or_task="cpt_fr_replay_en_10")
    with pytest.raises(validation.ConfigError, match=r"replays 0.1 .*allowed: 0.1"):
        train_lib.train(model_dir=tmp_path / "run", **kwargs)


@pytest.mark.parametrize("langs", [None, ("en", "fr")])
def test_a_missing_data_dir_names_data_dir_and_the_path(tiny_data, tmp_path, seqio_registry, langs):
    # Used to be "... 'lm_en' is not a registered task or mixture; allowed: "
    # (nothing), or a FileNotFoundError naming no setting.
    missing = tmp_path / "no_corpora"
    config = DataConfig(
        mixture_or_task="lm_en",
        vocab_path=tiny_data["vocab"],
        corpora_dir=str(missing),
        langs=langs,
    )
    with pytest.raises(validation.ConfigError) as e:
        data.register(config)
    message = str(e.value)
    assert f"DATA_DIR (data.DataConfig.corpora_dir) = '{missing}'" in message, message
    assert "xlscale data build | fixture" in message


def test_a_corrupt_vocabulary_names_the_file(tmp_path, seqio_registry):
    bad = tmp_path / "vocab.model"
    bad.write_bytes(b"\x00 not a SentencePiece model " * 8)
    with pytest.raises(validation.ConfigError) as e:
        data.register(DataConfig(mixture_or_task="lm_en", vocab_path=str(bad)))
    message = str(e.value)
    assert message.startswith(f"VOCAB_PATH (data.DataConfig.vocab_path) = '{bad}': {bad}: not a")
    assert "SentencePiece model (DecodeError" in message and "\n" not in message


def test_an_unwritable_tensorboard_directory_names_it_and_model_dir(tmp_path):
    from rundir.lease import ModelDirNotWritableError
    from trainer import metrics_log

    (tmp_path / "tb").write_text("not a directory")  # as unwritable as a chmod, even for root
    with pytest.raises(ModelDirNotWritableError) as e:
        metrics_log.MetricsWriter(tmp_path, is_chief=True)
    message = str(e.value)
    assert message.startswith(f"MODEL_DIR {tmp_path}: cannot write TensorBoard events into ")
    assert f"{tmp_path / 'tb'} (" in message and "{{" not in message and "\n" not in message


def test_an_early_refusal_leaves_no_model_dir_behind(tiny_data, tmp_path, seqio_registry):
    # Refusals found after the lease is taken (data, vocabulary, shapes) used to leave
    # an empty MODEL_DIR; one that existed before is left as it was.
    kwargs = tiny_kwargs(tiny_data)
    kwargs["data"] = dataclasses.replace(kwargs["data"], corpora_dir=str(tmp_path / "none"))
    with pytest.raises(validation.ConfigError, match="DATA_DIR"):
        train_lib.train(model_dir=tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(validation.ConfigError, match="DATA_DIR"):
        train_lib.train(model_dir=tmp_path / "mine", **kwargs)
    assert (tmp_path / "mine").is_dir() and not any((tmp_path / "mine").iterdir())


# Sends itself SIGTERM as `argv[1]` (module.function of the start-up) is called: after the lease
# is taken, while the job is being built or its state set up.
SIGTERM_AT_START = """
import importlib, os, signal, sys
from rundir import exits
from trainer import train as t
where, name = sys.argv.pop(1).rsplit(".", 1)
module = importlib.import_module(where)
real = getattr(module, name)
def called(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
setattr(module, name, called)
sys.exit(exits.run_main(t.main, prog="python -m trainer.train", argv=sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("during", "stops_before"),
    [
        ("trainer.jobs.compile_plan", "initialising the state"),  # a restore is skipped too
        ("trainer.start_state.initial_state", "opening the data"),
    ],
)
def test_sigterm_during_start_up_is_a_preemption_and_releases_the_lease(
    tiny_data, tiny_prepared, tmp_path, during, stops_before
):
    # A SIGTERM between taking the lease and the training loop used to kill the job
    # (exit -15) with MODEL_DIR/LEASE left behind. The trainer stops at the next point of its
    # start-up, not after all of it: a short notice is not spent restoring or opening the data.
    import os
    import subprocess
    import sys

    import jax

    model_dir = tmp_path / "run"
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=fast_compile_flags()
    )
    env["JAX_COMPILATION_CACHE_DIR"] = jax.config.jax_compilation_cache_dir
    flags = [
        "--gin_file=experiments/cpt_source_en.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        prepared_flag(tiny_prepared),  # no TensorFlow imported: its subject is the start-up
        "--gin.EVAL_TASKS=[]",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", SIGTERM_AT_START, during, *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == train_lib.PREEMPTED_EXIT_CODE, proc.stderr[-3000:]
    assert not (model_dir / "LEASE").exists()
    assert not (model_dir / "checkpoints").exists() or not any(
        (model_dir / "checkpoints").iterdir()
    )
    assert f"stopping before {stops_before} (SIGTERM during start-up" in proc.stderr
    assert "Traceback" not in proc.stderr
    # Nothing trained, so no run file: the rerun is a fresh start.
    assert not (model_dir / "run.json").exists(), sorted(p.name for p in model_dir.iterdir())


def test_reading_a_checkpoint_logs_no_orbax_read_only_notices(tmp_path, caplog):
    # Every zero-shot or eval restore printed orbax's read_only warnings.
    import logging

    import jax
    import numpy as np

    from trainer import checkpoints

    params = {"w": np.ones((2, 3), np.float32)}
    store = checkpoints.CheckpointStore(tmp_path, checkpoints.CheckpointConfig(async_save=False))
    store.save(1, params=params, opt_state={"m": np.zeros(2, np.float32)}, train_state={"step": 1})
    store.wait()
    store.close()
    with caplog.at_level(logging.WARNING):
        reader = checkpoints.CheckpointStore(
            tmp_path, checkpoints.CheckpointConfig(), read_only=True
        )
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
        restored = reader.restore_params(1, abstract_params=abstract)
        reader.close()
    np.testing.assert_array_equal(restored["w"], params["w"])
    assert not [r for r in caplog.records if "read only" in r.getMessage().replace("_", " ")]
