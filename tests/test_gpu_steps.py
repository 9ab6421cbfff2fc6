"""The trainer's compiled step on a GPU (`pytest -m gpu`; skipped without a GPU backend, see
tests/conftest.py).

- A small LLaMA and a small T5 train for two steps on the GPU and on the CPU backend of the same
  process (`jax.devices('cpu')`), from the same initial state on the same batches: losses and
  gradient norms agree to bf16 tolerance, and so do the updates of the largest parameters.
- Packed batches reach cuDNN: with `attention_kernel='auto'` the compiled train step of a packed
  batch holds a cuDNN custom call that the `xla` kernel's step does not, and both give the same
  loss and gradient norm.

The steps are the trainer's own (`trainer.jobs.compile_job`: mesh, shardings, donation, the
non-finite guard), built on an explicit device list so that both backends run in one process.
This module imports no TensorFlow, seqio or gin: jax, numpy, flax, optax and this project's
model and trainer modules, which need orbax and array-record beside them
(`benchmarks/gpu_preflight.py` names what an image lacks).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import re
import sys

import jax
import numpy as np
import pytest

from modeling import family as families
from trainer import jobs, model_spec, partitioning, steps
from trainer.optimizers import OptimizerConfig, adafactor_defaults
from trainer.partitioning import MeshConfig, Partitioner
from trainer.schedules import ScheduleConfig

pytestmark = pytest.mark.gpu

# bf16 compute on two backends: the same program up to rounding and summation order.
LOSS_RTOL = 2e-2
GRAD_NORM_RTOL = 5e-2
# The update of a parameter (new - old): cosine similarity and norm ratio. AdamW's first updates
# are close to lr·sign(g), so coordinates whose gradient is within rounding of zero may flip.
UPDATE_COSINE = 0.9
UPDATE_NORM_RTOL = 0.1
LEARNING_RATE = 1e-3


@dataclasses.dataclass(frozen=True)
class Case:
    """One small model and the shape of its batches."""

    family: str
    size: str
    batch: int
    targets: int
    inputs: int | None = None
    overrides: tuple[tuple[str, object], ...] = ()

    def spec(self, *, attention: str) -> model_spec.ModelSpec:
        overrides = {**dict(self.overrides), "dtype": "bfloat16", "attention_kernel": attention}
        return model_spec.ModelSpec(
            family=self.family,
            size=self.size,
            overrides=overrides,
            dropout_rate=0.0 if self.family == "t5" else None,
        )

    def lengths(self) -> dict[str, int]:
        return {"targets": self.targets, **({"inputs": self.inputs} if self.inputs else {})}

    def optimizer(self) -> OptimizerConfig:
        """The family's own optimizer (AdamW for LLaMA, Adafactor for T5)."""
        return adafactor_defaults() if self.family == "t5" else OptimizerConfig(name="adamw")


# The tiny test sizes (every dimension distinct), bf16.
TINY = {
    "llama2": Case("llama2", "llama2_tiny", batch=4, targets=64, overrides=(("vocab_size", 512),)),
    "t5": Case("t5", "t5_tiny", batch=4, targets=32, inputs=64, overrides=(("vocab_size", 512),)),
}
# Head dimension 64 (cuDNN's fused attention takes multiples of 8 up to 256).
CUDNN = {
    name: dataclasses.replace(case, overrides=(*case.overrides, ("head_dim", 64)))
    for name, case in TINY.items()
}


def _benchmark_rows():
    """`benchmarks/accelerator_rows.py`, whose synthetic batches the GPU tests reuse (it imports
    no TensorFlow, seqio or gin either)."""
    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "accelerator_rows.py"
    if "accelerator_rows" not in sys.modules:
        spec = importlib.util.spec_from_file_location("accelerator_rows", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses resolve their module by name
        spec.loader.exec_module(module)
    return sys.modules["accelerator_rows"]


def make_batch(case: Case, *, vocab: int, packed: bool, seed: int) -> dict[str, np.ndarray]:
    """A trainer batch of random tokens, every position real; packed rows hold 2-4 documents
    (the benchmark's `synthetic_batch`: an encoder-decoder packs as many examples in its encoder
    row as in its decoder row)."""
    rng = np.random.default_rng(seed)
    return _benchmark_rows().synthetic_batch(rng, case, vocab=vocab, packed=packed)


@dataclasses.dataclass(frozen=True)
class Ran:
    """What a few train steps gave: per-step loss and gradient norm, the parameters before and
    after (on the host, float32), and the compiled step's optimised HLO."""

    losses: tuple[float, ...]
    grad_norms: tuple[float, ...]
    before: dict[str, np.ndarray]
    after: dict[str, np.ndarray]
    hlo: str


def _flat(params) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(params))
    return {jax.tree_util.keystr(path): np.asarray(leaf, np.float32) for path, leaf in leaves}


def run_steps(
    case: Case, *, devices, attention: str, packed: bool, steps_: int = 2, seed: int = 0
) -> Ran:
    """Compiles the trainer's step for `case` on a mesh over `devices` and runs `steps_` steps
    (batch `s` from seed `seed + s`), from the parameters of `jax.random.key(seed)`."""
    spec = case.spec(attention=attention)
    family = families.get(spec.family)
    wrapper = family.build(spec)
    # As `jobs.build_partitioned_model`, on the given devices rather than the default backend's.
    mesh = partitioning.build_mesh(MeshConfig(), devices=devices)
    partitioner = Partitioner(mesh=mesh, rules=family.axis_rules())
    variables = wrapper.abstract_variables()
    abstract = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        partitioning.unbox(variables["params"]),
        partitioner.params_shardings(variables),
    )
    job = jobs.compile_job(
        model=wrapper,
        partitioner=partitioner,
        abstract_params=abstract,
        components=["synthetic"],
        total_steps=100,
        batch_size=case.batch,
        seq_len=case.targets,
        feature_lengths=case.lengths(),
        eval_batch_size=None,
        optimizer=case.optimizer(),
        schedule=ScheduleConfig(name="constant", peak=LEARNING_RATE),
        step_config=steps.StepConfig(num_components=1),
    )
    losses, grad_norms = [], []
    with jax.default_device(devices[0]):  # host values (the RNG key) land on these devices
        state = job.init_state(np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32))
        before = _flat(state.params)
        for s in range(steps_):
            host = make_batch(case, vocab=wrapper.vocab_size, packed=packed, seed=seed + s)
            state, metrics = job.train_step(state, partitioner.shard_batch(host))
            metrics = jax.device_get(metrics)
            assert bool(metrics["finite"]), f"step {s + 1} on {devices[0].platform}: not finite"
            losses.append(float(metrics["loss_sum"]) / float(metrics["weight_sum"]))
            grad_norms.append(float(metrics["grad_norm"]))
        after = _flat(state.params)
    return Ran(tuple(losses), tuple(grad_norms), before, after, job.train_step.as_text())


def assert_same_training(got: Ran, want: Ran, *, largest: int = 3) -> None:
    """Losses and gradient norms to bf16 tolerance; the updates of the `largest` parameters
    point the same way (cosine) with the same size."""
    np.testing.assert_allclose(got.losses, want.losses, rtol=LOSS_RTOL)
    np.testing.assert_allclose(got.grad_norms, want.grad_norms, rtol=GRAD_NORM_RTOL)
    assert got.before.keys() == want.before.keys()
    for name, start in want.before.items():
        # the same random bits; initialisers' erf_inv may differ by a few ulps between backends
        np.testing.assert_allclose(got.before[name], start, rtol=1e-4, atol=1e-6, err_msg=name)
    names = sorted(want.before, key=lambda n: want.before[n].size, reverse=True)[:largest]
    for name in names:
        mine = (got.after[name] - got.before[name]).ravel().astype(np.float64)
        ref = (want.after[name] - want.before[name]).ravel().astype(np.float64)
        assert np.linalg.norm(ref) > 0, f"{name} was not updated"
        cosine = mine @ ref / (np.linalg.norm(mine) * np.linalg.norm(ref))
        ratio = np.linalg.norm(mine) / np.linalg.norm(ref)
        assert cosine >= UPDATE_COSINE, f"{name}: update cosine {cosine:.4f}"
        assert abs(ratio - 1) <= UPDATE_NORM_RTOL, f"{name}: update norm ratio {ratio:.4f}"


def custom_call_targets(hlo: str) -> set[str]:
    """The custom-call targets of an HLO text (cuBLAS GEMMs, cuDNN attention, ...)."""
    return set(re.findall(r'custom_call_target="([^"]+)"', hlo))


@pytest.fixture(scope="module")
def gpus():
    """This process's GPUs (the conftest has skipped every GPU test where there are none)."""
    return jax.devices("gpu")[:1]


@pytest.fixture(scope="module")
def cpus():
    return jax.devices("cpu")[:1]


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_train_step_on_the_gpu_equals_the_cpu_step(name, gpus, cpus):
    case = TINY[name]
    on_gpu = run_steps(case, devices=gpus, attention="xla", packed=False)
    on_cpu = run_steps(case, devices=cpus, attention="xla", packed=False)
    assert_same_training(on_gpu, on_cpu)


@pytest.mark.parametrize("name", sorted(CUDNN))
def test_packed_batches_reach_cudnn_with_the_xla_kernels_loss(name, gpus):
    case = CUDNN[name]
    auto = run_steps(case, devices=gpus, attention="auto", packed=True, steps_=1)
    xla = run_steps(case, devices=gpus, attention="xla", packed=True, steps_=1)
    only_auto = custom_call_targets(auto.hlo) - custom_call_targets(xla.hlo)
    assert any("cudnn" in t.lower() for t in only_auto), (
        f"no cuDNN attention in the packed step: custom calls {sorted(custom_call_targets(auto.hlo))}"
    )
    np.testing.assert_allclose(auto.losses, xla.losses, rtol=LOSS_RTOL)
    np.testing.assert_allclose(auto.grad_norms, xla.grad_norms, rtol=GRAD_NORM_RTOL)
