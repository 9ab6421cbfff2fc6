#!/usr/bin/env bash
# The one prepared call for a lent GPU, run from a checkout on a plain JAX GPU image (no install,
# no TensorFlow/seqio/gin; the device tool's `run` with carry [".gpu-wheels"]):
#
#   bash benchmarks/gpu_check.sh            # everything lands under $OUT (else gpu_check_out/)
#
# 1. the machine: GPU, driver, JAX and its devices (env.txt);
# 2. the preflight (preflight.txt): every module the GPU tests and the benchmark's children load
#    that this image lacks, named in one go (`benchmarks/gpu_preflight.py`);
# 3. `pytest -m gpu` (pytest_gpu.txt), capped at PYTEST_CAP_S: cuDNN = XLA attention, the
#    trainer's step on the GPU = the CPU step, packed batches reach cuDNN, the compiled step's
#    memory against the memory model;
# 4. the accelerator benchmark's `--quick` rows (quick.jsonl, a row per line as each finishes;
#    quick.txt; each child's output under logs/) within what is left of GPU_CHECK_BUDGET_S.
#
# pytest and the GPU tests' other imports install offline from `.gpu-wheels`
# (`make gpu-test-wheels` here) where the image lacks them. Each stage's output is written as
# it goes, so a call cut short keeps what it measured.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
PY=${PYTHON:-python3}
BUDGET_S=${GPU_CHECK_BUDGET_S:-540}
PYTEST_CAP_S=${PYTEST_CAP_S:-180}
mkdir -p "$OUT"

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1
} | tee "$OUT/env.txt"

if [ -f .gpu-wheels/names.txt ]; then
  # --no-deps, one by one: a package the image already has is left as it is.
  for p in $(cat .gpu-wheels/names.txt); do
    $PY -m pip install -q --no-index --find-links .gpu-wheels --no-deps "$p" 2>&1 | tail -1
  done
fi

echo "== preflight"
$PY benchmarks/gpu_preflight.py 2>&1 | tee "$OUT/preflight.txt"

echo "== pytest -m gpu (at most ${PYTEST_CAP_S} s)"
timeout "$PYTEST_CAP_S" $PY -m pytest -m gpu -q -rA -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt"

left=$((BUDGET_S - SECONDS - 10))
echo "== accelerator benchmark --quick (budget ${left} s)"
if [ "$left" -gt 60 ]; then
  $PY benchmarks/accelerator_step.py --quick --budget-s "$left" --out "$OUT/quick.jsonl" \
    --logs "$OUT/logs" 2>&1 | tee "$OUT/quick.txt"
else
  echo "no time left for the benchmark (${left} s); rerun with a larger GPU_CHECK_BUDGET_S" |
    tee "$OUT/quick.txt"
fi
echo "== done in ${SECONDS} s"
