"""The memory model (`modeling.memory`, `llama_jax.memory`, `t5_jax.memory`) against what JAX
saves and what XLA plans, the planner, and the refusal of a step that cannot fit.

- Each LLaMA and T5 block term equals the residuals JAX saves for the block
  (`saved_residuals`), per remat policy and dtype.
- The estimate is within ±15% of `memory_analysis()` of the trainer's compiled CPU step for tiny
  and small LLaMA (every remat policy) and T5, and of a TPU ahead-of-time compile of a paper size
  where libtpu is installed.
- The planner picks the cheapest policy, then the fewest microbatches; `check_memory` refuses
  before compiling in one line, and passes a generous limit.
"""

import importlib.util
import json
import math
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from llama_jax import memory as llama_memory
from llama_jax import model as llama_model
from llama_jax import sizes as llama_sizes
from modeling import family as family_lib
from modeling import memory
from t5_jax import memory as t5_memory
from t5_jax import model as t5_model
from t5_jax import sizes as t5_sizes
from trainer import jobs, memory_check, partitioning
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig, Partitioner
from trainer.validation import ConfigError

PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "memory_model.py"
_spec = importlib.util.spec_from_file_location("memory_model_benchmark", PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # its dataclasses look their module up
_spec.loader.exec_module(bench)

TOLERANCE = 0.15
POLICIES = memory.POLICY_ORDER


def _saved_bytes(apply, params, x) -> int:
    """Bytes of the residuals JAX saves for the backward of `apply(params, x)`: every one but
    the parameters (arguments `p`), scalars and constants."""
    total = 0
    for aval, why in saved_residuals(apply, params, x):
        if "argument p" in why or aval.ndim == 0 or "constant" in why:
            continue
        total += math.prod(aval.shape) * aval.dtype.itemsize
    return total


def _block_residual_bytes(cfg, *, seq_len: int) -> int:
    """Bytes of what JAX saves for one LLaMA block of one sequence: every residual except the
    weights (arguments of the block), the block input included."""
    layer = llama_model._layer_class(cfg, decode=False)(cfg)
    x = jnp.zeros((1, seq_len, cfg.d_model), cfg.compute_dtype)
    seg = jnp.ones((1, seq_len), jnp.int32)
    pos = jnp.zeros((1, seq_len), jnp.int32)
    params = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, seg, pos))
    return _saved_bytes(lambda p, x: layer.apply(p, x, seg, pos)[0], params, x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("policy", POLICIES)
def test_llama_block_terms_are_what_jax_saves(policy, dtype):
    cfg = llama_sizes.get_config(
        "llama2_cpu_d128", dtype=dtype, remat_policy=policy, attention_kernel="xla"
    )
    per_seq, per_layer = llama_memory.layer_saved(
        cfg, policy=policy, seq_len=128, kernel="xla", packed=True
    )
    traced = _block_residual_bytes(cfg, seq_len=128)
    assert per_seq + per_layer == pytest.approx(traced, rel=0.05), (per_seq, per_layer, traced)


def x_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name."""
    return jnp.dtype(dtype).itemsize


def _t5_block_residual_bytes(cfg, *, decoder: bool, sq: int, sk: int) -> int:
    """Bytes of what JAX saves for one T5 block of one example (weights, the encoder output
    and the shared bias excluded; the block input included)."""
    x = jnp.zeros((1, sq, cfg.d_model), cfg.activation_dtype)
    seg = jnp.ones((1, sq), jnp.int32)
    bias = jnp.zeros((1, cfg.num_heads, sq, sq), cfg.activation_dtype)
    if decoder:
        encoded = jnp.zeros((1, sk, cfg.d_model), cfg.activation_dtype)
        cross = (seg, jnp.ones((1, sk), jnp.int32))
        layer = t5_model._maybe_remat(cfg, t5_model.DecoderLayer, (6, 7))(config=cfg)
        args = (encoded, seg, cross, bias, True, False)
    else:
        layer = t5_model._maybe_remat(cfg, t5_model.EncoderLayer, (4,))(config=cfg)
        args = (seg, bias, True)
    params = jax.eval_shape(lambda: layer.init(jax.random.key(0), x, *args))
    return _saved_bytes(lambda p, x: layer.apply(p, x, *args), params, x)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("policy", POLICIES)
def test_t5_block_terms_are_what_jax_saves(policy, dtype):
    cfg = t5_sizes.get_config(
        "t5_tiny", dtype=dtype, remat_policy=policy, attention_kernel="xla", dropout_rate=0.0
    )
    for decoder, (sq, sk) in ((False, (64, None)), (True, (64, 48))):
        block = t5_memory.Block(sq=sq, sk=sk, kernel="xla", packed=True)
        estimate = t5_memory.layer_saved(cfg, block, policy=policy)
        if policy == "none":
            estimate += t5_memory._layer_weights(cfg, decoder=decoder)
        traced = _t5_block_residual_bytes(cfg, decoder=decoder, sq=sq, sk=sk or sq)
        if decoder and policy == "none":
            # The encoder output is a constant here, so JAX does not keep the cross-attention's
            # key/value weights (cast, viewed by heads), which a training step keeps for the
            # encoder's gradient.
            traced += 2 * cfg.d_model * cfg.num_heads * cfg.head_dim * x_bytes(cfg.dtype)
        assert estimate == pytest.approx(traced, rel=0.02), (decoder, estimate, traced)


def test_t5_cross_attention_runs_the_kernel_asked_for():
    """Self-attention's relative-position bias sends it to `xla` on TPU (splash takes no bias);
    cross-attention has none, so splash runs there and keeps no `[H, Sq, Sk]` arrays (a TPU
    ahead-of-time compile of T5-770M keeps float32 logits and weights for its 48
    self-attentions only: 9.0 GiB of 16.8 GiB live across the loss; estimate/XLA 1.16 -> 0.92)."""
    family = family_lib.get("t5")
    cfg = family.get_config("t5_770m", dtype="bfloat16", float32_attention_logits=True)
    shape = memory.StepShape(
        batch_size=32,
        seq_len=512,
        inputs_len=512,
        data_parallel=4,
        param_shards=4,
        optimizer="adafactor",
        platform="tpu",
    )
    auto = family.memory_estimate(cfg, shape=shape)
    xla = family.memory_estimate(cfg, shape=shape.replace(attention_kernel="xla"))
    assert auto.kernel == xla.kernel == "xla"  # the self-attention kernel
    h, s, a = cfg.num_heads, 512, cfg.num_heads * cfg.head_dim
    # per decoder layer and example: float32 logits (float32_attention_logits), the
    # attention output, the weights (bf16)
    cross = 4 * h * s * s + 2 * s * a + 2 * h * s * s
    assert xla.activations - auto.activations == 8 * cfg.num_decoder_layers * cross


def _llama(size, policy, **kw):
    return bench._case("llama2", size, policy, **kw)


# (case, why it is here). CPU compiles of the trainer's own step; LLaMA scans its layers (as
# paper runs do): unscanned, XLA:CPU schedules the recomputation early and remat saves nothing.
CPU_CASES = [
    _llama("llama2_tiny", "none", batch=8, seq_len=64),
    _llama("llama2_tiny", "full", batch=8, seq_len=64),
    *(_llama("llama2_cpu_d128", p, batch=8, seq_len=256) for p in POLICIES),
    _llama("llama2_cpu_d128", "dots_saveable", batch=8, seq_len=256, microbatches=2),
    _llama("llama2_cpu_d128", "none", batch=8, seq_len=128, devices=4, fsdp=4),
    bench._case("t5", "t5_small", seq_len=128, inputs_len=96, optimizer="adafactor"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"{c.label()}-mb{c.microbatches}")
def test_estimate_within_15_percent_of_xla_cpu(case):
    row = bench.compare(case, platform="cpu")
    assert abs(row["ratio"] - 1) <= TOLERANCE, row


# `make test` installs libtpu off the import path (`$(VENV)/libtpu-aot`, so no other process
# loads it or prints its TPU start-up warnings) and names it here; an installed `jax[tpu]` works too.
LIBTPU_ENV = "XLSCALE_LIBTPU"
LIBTPU = os.environ.get(LIBTPU_ENV, "")


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None and not os.path.isfile(LIBTPU),
    reason=f"needs libtpu for a TPU ahead-of-time compile: `make test` sets {LIBTPU_ENV}, or "
    "pip install 'jax[tpu]==0.10.2'",
)
def test_estimate_within_15_percent_of_tpu_aot_compile(monkeypatch):
    from jax.experimental import topologies

    if os.path.isfile(LIBTPU):
        monkeypatch.setenv("TPU_LIBRARY_PATH", LIBTPU)
    # Compile-only: another process (a second pytest, a benchmark) may hold libtpu's lock.
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    devices = topologies.get_topology_desc("v5p:2x2x1", platform="tpu").devices
    case = _llama(
        "llama2_1085m",
        "full",
        batch=16,
        seq_len=2048,
        devices=len(devices),
        fsdp=len(devices),
        attention_kernel="auto",
        overrides={"dtype": "bfloat16"},
    )
    row = bench.compare(case, devices=devices, platform="tpu")
    assert row["kernel"] == "splash"
    assert abs(row["ratio"] - 1) <= TOLERANCE, row


def _estimator(family, size):
    fam = family_lib.get(family)
    base = fam.get_config(size, scan_layers=True)

    def estimate(policy, shape):
        return fam.memory_estimate(base.replace(remat_policy=policy), shape=shape)

    return estimate


SHAPE = memory.StepShape(batch_size=8, seq_len=2048, platform="gpu", attention_kernel="auto")


def test_planner_prefers_the_cheapest_policy_then_fewest_microbatches():
    estimate = _estimator("llama2", "llama2_1085m")
    generous = memory.plan(estimate, shape=SHAPE, limit=10**15)
    assert (generous.fits, generous.remat_policy, generous.num_microbatches) == (True, "none", 1)
    sizes = {p: estimate(p, SHAPE).total for p in POLICIES}
    assert sizes["full"] < sizes["dots_with_no_batch_dims_saveable"] < sizes["none"]
    # Between `none` with one microbatch and `full`: `none` with more microbatches fits first.
    tight = memory.plan(estimate, shape=SHAPE, limit=sizes["none"] - 1)
    assert tight.fits and tight.remat_policy == "none" and tight.num_microbatches > 1
    assert tight.estimate.total <= sizes["none"] - 1
    nothing = memory.plan(estimate, shape=SHAPE, limit=2**30)
    assert not nothing.fits and nothing.remat_policy == "full"
    assert "nothing fits" in memory.advice(nothing, current_policy="none", current_microbatches=1)


def test_scanned_layers_are_planned_to_keep_only_the_weight_matmuls_outputs():
    # A scan's backward pass reads every kept intermediate back from stacked buffers, so for
    # scanned layers the planner tries the policy that keeps only the weight matmuls' outputs
    # first; unrolled layers keep everything when it fits.
    from modeling import step_memory

    fam = family_lib.get("llama2")
    scanned = fam.get_config("llama2_1085m", scan_layers=True)
    unrolled = scanned.replace(scan_layers=False)
    generous = {
        name: step_memory.plan(fam, config, shape=SHAPE, limit=10**15)
        for name, config in (("scanned", scanned), ("unrolled", unrolled))
    }
    assert generous["scanned"].remat_policy == "dots_with_no_batch_dims_saveable"
    assert generous["unrolled"].remat_policy == "none"
    assert generous["scanned"].num_microbatches == generous["unrolled"].num_microbatches == 1
    # Too tight for it at one microbatch: the same policy with more microbatches, not `none`.
    one = step_memory.estimate(
        fam, scanned.replace(remat_policy="dots_with_no_batch_dims_saveable"), SHAPE
    )
    tight = step_memory.plan(fam, scanned, shape=SHAPE, limit=one.total - 1)
    assert tight.fits and tight.remat_policy == "dots_with_no_batch_dims_saveable"
    assert tight.num_microbatches > 1
    # An explicit order still wins.
    only_full = step_memory.plan(fam, scanned, shape=SHAPE, limit=10**15, policies=("full",))
    assert only_full.remat_policy == "full"


def test_microbatches_and_shards_shrink_the_estimate():
    estimate = _estimator("llama2", "llama2_1085m")
    one = estimate("none", SHAPE)
    four = estimate("none", SHAPE.replace(num_microbatches=4))
    # a quarter of the per-sequence residuals; the per-layer weight copies (none here: f32
    # compute, projections unstacked on a GPU) stay
    assert one.activations / 4 <= four.activations < one.activations / 3
    assert four.gradients == 2 * one.gradients  # an accumulating tree beside each microbatch's
    fsdp = estimate("none", SHAPE.replace(param_shards=8, data_parallel=8, batch_size=64))
    assert fsdp.params == one.params // 8 and fsdp.optimizer_state == one.optimizer_state // 8
    assert fsdp.activations == one.activations


def test_chip_table_and_bad_name():
    assert memory.get_chip("v5e").usable < 16 * 2**30 < memory.get_chip("v5p").usable
    assert memory.get_chip("h200").memory == 143_771 * 2**20  # nvidia-smi MiB of an H200
    with pytest.raises(ValueError, match=r"--hardware 'h1000': allowed h100-80g, h200"):
        memory.get_chip("h1000")


def _check(limit_gib):
    family = family_lib.get("llama2")
    from trainer import model_spec

    wrapper = family.build(
        model_spec.ModelSpec(
            family="llama2", size="llama2_cpu_d128", overrides={"scan_layers": True}
        )
    )
    mesh_config = MeshConfig(data=1, num_devices=1, device_memory_gib=limit_gib)
    partitioner = Partitioner(
        mesh=partitioning.build_mesh(mesh_config, jax.devices()[:1]), rules=family.axis_rules()
    )
    shape = memory_check.step_shape(
        model=wrapper,
        partitioner=partitioner,
        batch_size=8,
        seq_len=256,
        feature_lengths={"targets": 256},
        optimizer=OptimizerConfig(),
        num_microbatches=1,
    )
    return memory_check.check_memory(
        model=wrapper, shape=shape, limit=memory_check.device_memory_limit(mesh_config, partitioner)
    )


def test_a_step_that_cannot_fit_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        _check(0.6)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("llama2_cpu_d128: the train step needs an estimated 0.8 GiB")
    assert "the device has 0.6 GiB (partitioning.MeshConfig.device_memory_gib)" in message
    # Its layers are scanned: the planner's fix keeps only the weight matmuls' outputs; the
    # fix under the run's own policy follows it.
    assert (
        "set MODEL_OVERRIDES remat_policy='dots_with_no_batch_dims_saveable' and "
        "NUM_MICROBATCHES=2 (est. 0.4 GiB) or NUM_MICROBATCHES=2 (est. 0.4 GiB)"
    ) in message
    with pytest.raises(ConfigError, match="nothing fits"):
        _check(0.1)


def test_a_generous_or_unknown_limit_passes():
    assert _check(64).total < 64 * 2**30
    assert _check(None) is None  # CPU: the device reports no limit, nothing is checked


def test_refusal_comes_from_build_job_before_compiling(monkeypatch):
    """`build_job` asks `check_memory` with the mesh's limit before `compile_job` runs."""
    calls = []
    monkeypatch.setattr(jobs, "compile_job", lambda **kw: calls.append("compile"))

    def refuse(**kw):
        calls.append(("check", kw["limit"]))
        raise ConfigError("refused")

    monkeypatch.setattr(memory_check, "check_memory", refuse)
    monkeypatch.setattr(jobs.job_checks, "check_tasks", lambda **kw: None)  # no task registered
    monkeypatch.setattr(jobs.data_lib, "components", lambda name, data=None: ["lm"])
    from trainer import model_spec
    from trainer.data import DataConfig, EvalConfig
    from trainer.schedules import ScheduleConfig

    with pytest.raises(ConfigError, match="refused"):
        jobs.build_job(
            model=model_spec.ModelSpec(family="llama2", size="llama2_tiny"),
            data=DataConfig(mixture_or_task="lm_en", task_feature_lengths={"targets": 64}),
            evaluation=EvalConfig(),
            optimizer=OptimizerConfig(),
            schedule=ScheduleConfig(),
            mesh=MeshConfig(num_devices=1, device_memory_gib=0.5),
            train_steps=4,
            register=False,
        )
    assert calls == [("check", 2**29)]


def test_adafactor_state_is_factored():
    shapes = [(1024, 2816), (2816, 1024), (1024,), (64, 100)]
    state = memory.OPTIMIZER_STATE["adafactor"](shapes, 4)
    assert state == 4 * ((1024 + 2816 + 1) * 2 + (1024 + 2) + (64 * 100 + 2))
    assert memory.OPTIMIZER_STATE["adamw"](shapes, 4) == 8 * sum(np.prod(s) for s in shapes)


def test_sizes_memory_shows_parts_and_the_plan_per_size(capsys):
    from xlscale_cli.main import main

    argv = ["sizes", "--memory", "--hardware", "v5e", "--chips", "16", "--json"]
    assert main([*argv, "llama2_49m", "llama2_5534m"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows] == ["llama2_49m", "llama2_5534m"]
    small, big = rows
    # The recipe scans its layers: the first policy tried keeps the weight matmuls' outputs.
    assert small["remat_policy"] == "dots_with_no_batch_dims_saveable"
    assert big["remat_policy"] == "full"
    assert all(r["fits"] and r["total"] <= 16 * 0.95 for r in rows)
    assert small["batch"] == 512 and big["batch"] == 2048  # 1M and 4M tokens of 2048
    assert big["kernel"] == "splash"
    assert main(["sizes", "--memory", "--hardware", "a100-80g", "llama2_1085m"]) == 0
    out = capsys.readouterr().out
    assert "remat" in out.splitlines()[0] and "8 x a100-80g" in out
    assert main(["sizes", "--memory", "--hardware", "h1000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "xlscale sizes: --hardware 'h1000': allowed h100-80g, h200, a100-80g, a100-40g, v5p, "
        "v5e, v4, v6e"
    )


def test_sweep_plan_on_hardware_gives_each_run_a_policy_that_fits(capsys):
    from launch import estimate, sweep
    from xlscale_cli.main import main

    assert main(["sweep", "plan", "cpt_paper", "--hardware", "v5e-16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    assert all(r["fits"] and r["gib_per_chip"] <= 16 * 0.95 for r in rows)
    policies = {r["remat_policy"] for r in rows}
    assert "none" in policies and len(policies) > 1  # the large sizes need remat on 16 GiB
    runs = sweep.expand(sweep.load_manifest("cpt_paper"))
    big = next(r for r in runs if r.size == "llama2_5534m")
    plan = estimate.memory_plan(big, estimate.parse_hardware("v5e-16"))
    planned = estimate.with_memory_plan(big, plan)
    bindings = dict(planned.bindings)
    assert f"'remat_policy': '{plan.remat_policy}'" in bindings["MODEL_OVERRIDES"]
    assert bindings["NUM_MICROBATCHES"] == str(plan.num_microbatches)
    assert planned.run_id == big.run_id  # the plan is how a step runs, not which run it is
    assert main(["sweep", "plan", "cpt_paper", "--hardware", "v5p-128"]) == 0
    out = capsys.readouterr().out
    assert "remat  micro  GiB/chip  fits" in out and "fits one v5p" in out


def test_a_manifest_planned_for_a_chip_launches_runs_with_its_policy(tmp_path, capsys):
    from launch import sweep
    from xlscale_cli.main import main

    text = (pathlib.Path(sweep.__file__).parent / "manifests" / "smoke.toml").read_text()
    manifest = tmp_path / "planned.toml"
    manifest.write_text(text.replace("[sweep]\n", '[sweep]\nhardware = "v5e-4"\n', 1))
    assert sweep.load_manifest(str(manifest)).hardware == "v5e-4"
    argv = ["sweep", "run", str(manifest), "--dry-run", "--runs-dir", str(tmp_path / "runs")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "--gin.NUM_MICROBATCHES=1" in out and "remat_policy" in out
