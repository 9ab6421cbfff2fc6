"""Real 2-process runs on 127.0.0.1 (1 CPU device each, collectives through gloo) of the tiny
source run of `experiments/tiny.gin` (`host_argv`; on prepared data with `prepared=`):
`two_hosts` runs processes 0 and 1 of such a job."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from conftest import fast_compile_flags
from tiny_runs import REPO, tiny_source_argv

STEPS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_argv(model_dir, tiny_data, prepared=None, pace_s: float = 0.0):
    """The tiny source run of `experiments/tiny.gin`: 6 steps of 8 rows, evaluated at steps 3
    and 6, saved every 2 steps; read from `prepared` when given (`tiny_runs.prepared_flag`);
    each step taking at least `pace_s` seconds (`MIN_STEP_SECONDS`) when given."""
    pace = {"MIN_STEP_SECONDS": pace_s} if pace_s else {}
    return tiny_source_argv(
        model_dir,
        tiny_data,
        prepared=prepared,
        TRAIN_STEPS=STEPS,
        CHECKPOINT_PERIOD=2,
        EVAL_PERIOD=3,
        EVAL_MAX_TOKENS=512,
        LOG_EVERY=1,
        **pace,
    )


def start_host(model_dir, tiny_data, *, cache, process, port, log, prepared=None, pace_s=0.0):
    """Process `process` of a 2-host `python -m trainer.train` job (1 CPU device each),
    coordinated on 127.0.0.1:`port`."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=1 {fast_compile_flags()}"
    env["JAX_COMPILATION_CACHE_DIR"] = os.fspath(cache)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] = "gloo"
    env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
    env["JAX_NUM_PROCESSES"] = "2"
    env["JAX_PROCESS_ID"] = str(process)
    argv = host_argv(model_dir, tiny_data, prepared, pace_s)
    command = [sys.executable, "-m", "trainer.train", *argv]
    return subprocess.Popen(command, cwd=REPO, env=env, stderr=log, stdout=log)


def two_hosts(model_dir, tiny_data, tmp, *, name, cache, on_start=None, prepared=None, pace_s=0.0):
    """Runs processes 0 and 1 of a 2-host job (1 CPU device each), read from `prepared` when
    given, each step taking at least `pace_s` seconds; returns their exit codes and stderr
    texts."""
    port = free_port()
    logs = [open(tmp / f"{name}_{i}.log", "w") for i in range(2)]  # noqa: SIM115
    procs = [
        start_host(
            model_dir,
            tiny_data,
            cache=cache,
            process=i,
            port=port,
            log=logs[i],
            prepared=prepared,
            pace_s=pace_s,
        )
        for i in range(2)
    ]
    try:
        if on_start is not None:
            on_start(procs, [tmp / f"{name}_{i}.log" for i in range(2)])
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    return codes, [(tmp / f"{name}_{i}.log").read_text() for i in range(2)]
