"""Tiny trainer runs whose run directories live in a bucket (the GCS tests): their command line
(`run_argv`), the environment of their `python -m trainer.train` subprocesses
(`subprocess_env`), waiting for one (`wait_or_dump_stacks`) and the checkpoint steps a run has
in the bucket (`bucket_step_dirs`)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import jax
import pytest
from conftest import fast_compile_flags

REPO = Path(__file__).resolve().parent.parent
STEPS = 8


def run_argv(
    model_dir: str, tiny_data, *, experiment: str, vocab=None, prepared=None, **macros
) -> list[str]:
    """The trainer's command line for a tiny run of `experiment` in `model_dir` on the fixture
    corpora (`vocab`: another VOCAB_PATH; `prepared`: a PREPARED_DATA directory, such as the
    `tiny_prepared` fixture's, for a run that builds no seqio task or tf.data pipeline);
    `macros` are more `--gin.K=V`."""
    argv = [
        f"--gin_file=experiments/{experiment}.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        f"--gin.VOCAB_PATH='{vocab or tiny_data['vocab']}'",
        f"--gin.TRAIN_STEPS={STEPS}",
        "--gin.CHECKPOINT_PERIOD=2",
        "--gin.EVAL_PERIOD=4",
        "--gin.EVAL_MAX_TOKENS=512",
        "--gin.LOG_EVERY=1",
    ]
    if prepared is not None:
        argv.append(f"--gin.PREPARED_DATA='{prepared}'")
    return argv + [f"--gin.{k}={v}" for k, v in macros.items()]


def subprocess_env() -> dict[str, str]:
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=fast_compile_flags()
    )
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(REPO), env.get("PYTHONPATH", "")])
    cache = jax.config.jax_compilation_cache_dir
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    return env


def wait_or_dump_stacks(process, log: Path, *, timeout: float) -> int:
    """The exit code of `process`; past `timeout` it is made to dump its threads' stacks (SIGABRT
    under faulthandler) and the test fails with them, so that a hang says where it hung."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait(timeout=30)
        pytest.fail(f"still running after {timeout} s; its stacks:\n{log.read_text()[-12000:]}")


def bucket_step_dirs(gcs_server, model_dir: str) -> list[int]:
    """The checkpoint step directories of a run in the bucket, read from the server's own files
    (so that polling costs no requests). On GCS orbax writes a step in place: a new step
    directory is a save in flight, and orbax starts one only once the previous one committed."""
    path = Path(gcs_server.root) / "data" / model_dir.removeprefix("gs://") / "checkpoints"
    return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) if path.is_dir() else []
