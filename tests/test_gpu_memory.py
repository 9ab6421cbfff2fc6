"""The memory model on a GPU: the compiled step's `memory_analysis()` and the device's peak bytes
after one step, against the estimate (`modeling.memory`), within ±15%, for a small LLaMA with the
cuDNN kernel and with xla.

Each measurement runs `benchmarks/memory_model.py --measure` in a fresh process, so the peak
counts only that step (and no other test's arrays). Imports only jax, numpy, pytest and the
standard library: the GPU image has no TensorFlow, seqio or gin. Skipped without a GPU.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU backend"),
]

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks" / "memory_model.py"
TOLERANCE = 0.15


def _measure(case: dict) -> dict:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "",  # the child picks the GPU
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # the peak is what the step allocates
        # no autotuning: its trial buffers, allocated while compiling, would set the peak
        "XLA_FLAGS": "--xla_gpu_autotune_level=0",
        "PYTHONPATH": str(REPO),
    }
    out = subprocess.run(
        [sys.executable, str(BENCH), "--measure", json.dumps(case)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kernel", ["cudnn", "xla"])
def test_gpu_step_memory_matches_the_estimate(kernel):
    case = {
        "family": "llama2",
        "size": "llama2_137m",
        "overrides": {"dtype": "bfloat16", "remat_policy": "none", "scan_layers": True},
        "batch": 4,
        "seq_len": 1024,
        "attention_kernel": kernel,
    }
    row = _measure(case)
    assert row["kernel"] == kernel and row["loss_finite"], row
    assert abs(row["estimate"] / row["xla"] - 1) <= TOLERANCE, row
    assert row["peak"] is not None
    assert abs(row["estimate"] / row["peak"] - 1) <= TOLERANCE, row
