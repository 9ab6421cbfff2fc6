"""A job that asked for an accelerator never runs on the CPU backend, and the GPU test
harness (tests/conftest.py) that runs the GPU tests where there is a GPU.

- `python -m trainer.train` with `EXPECT_PLATFORM='gpu'` (or `$XLSCALE_EXPECT_PLATFORM`) on this
  CPU-only JAX exits 69 with one stderr line and leaves no MODEL_DIR; eval and infer refuse too;
  an unknown value is a configuration error naming the setting and the allowed values.
- The SLURM launcher exports the expectation when it asks for GPUs, the TPU VM launcher always.
- `pytest -m gpu` without a GPU skips every GPU test with one reason, and collects cleanly on an
  image without TensorFlow, seqio or gin.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import textwrap

import gin
import pytest
from conftest import gpu_present, selects_gpu_tests
from launch_fakes import smoke_runs

from launch import slurm, tpu_vm
from rundir import exits
from trainer import eval as eval_lib
from trainer import infer as infer_lib
from trainer import platform, validation
from trainer import train as train_lib

pytestmark = pytest.mark.usefixtures("clean_gin")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLATFORM_CODE = exits.CLASSES["platform"].code
# Packages a JAX GPU image may lack (the H100 had none of them).
NOT_ON_GPU_IMAGE = ("tensorflow", "seqio", "gin", "tensorflow_text", "tensorflow_datasets")


@pytest.fixture
def no_expectation(monkeypatch):
    monkeypatch.delenv(platform.ENV, raising=False)


def tiny_train_flags(tiny_data, model_dir, *extra):
    return [
        "--gin_file=experiments/cpt_source_en.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        *extra,
    ]


# ---------------------------------------------------------------- the check


def test_no_expectation_runs_wherever_jax_is(no_expectation):
    assert platform.check(None) is None
    assert platform.check("any", env={platform.ENV: "gpu"}) is None  # the setting wins
    found = platform.check("cpu")
    assert found.platform == "cpu" and found.devices == 8 and found.processes == 1
    assert platform.describe() == "platform cpu: 8 x cpu (8 devices, 1 process)"


def test_a_gpu_job_on_cpu_jax_names_what_it_found_and_the_fix():
    with pytest.raises(platform.PlatformError) as e:
        platform.check(None, env={platform.ENV: "gpu", "JAX_PLATFORMS": "cpu"})
    message = str(e.value)
    assert "\n" not in message
    assert "expects the gpu platform but JAX found no gpu device;" in message
    assert "8 x cpu (8 devices, 1 process)" in message and "JAX_PLATFORMS='cpu'" in message
    assert "pip install -e '.[gpu]'" in message and "CUDA_VISIBLE_DEVICES" in message
    assert f"${platform.ENV} to 'any'" in message
    with pytest.raises(platform.PlatformError, match="expects the tpu platform.*libtpu"):
        platform.check("TPU", env={})
    assert exits.classify(e.value).code == PLATFORM_CODE == 69


def test_backends_that_fail_to_start_are_a_refusal_too(monkeypatch):
    def broken():
        raise RuntimeError("Unable to initialize backend 'cuda': no CUDA devices\nmore detail")

    monkeypatch.setattr(platform, "found", broken)
    with pytest.raises(platform.PlatformError) as e:
        platform.check("gpu", env={"CUDA_VISIBLE_DEVICES": ""})
    assert str(e.value).startswith(
        "this job expects the gpu platform but JAX could not start its backends "
        "(Unable to initialize backend 'cuda': no CUDA devices; CUDA_VISIBLE_DEVICES='')"
    )


@pytest.mark.parametrize(
    "setting, env, where",
    [("cuda", {}, r"EXPECT_PLATFORM \(train.expect_platform\) = 'cuda'"), (None, {}, None)],
)
def test_an_unknown_platform_names_the_setting_and_the_allowed_values(setting, env, where):
    env = {platform.ENV: "h100"} if setting is None else env
    where = where or rf"\${platform.ENV} = 'h100'"
    with pytest.raises(validation.ConfigError, match=rf"{where}: choose one of 'gpu', 'tpu'"):
        platform.check(setting, env=env)


# ---------------------------------------------------------------- the entry points


@pytest.mark.slow
def test_the_trainer_refuses_a_gpu_job_in_one_line_before_writing(tiny_data, tmp_path):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != platform.ENV}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.train",
            *tiny_train_flags(tiny_data, run, "--gin.EXPECT_PLATFORM='gpu'"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**env, exits.DEBUG_ENV: "", "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300,
    )
    assert proc.returncode == PLATFORM_CODE, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "python -m trainer.train: this job expects the gpu platform but JAX found no gpu device;"
    )
    assert not run.exists()


def test_the_environment_variable_refuses_the_same_job(
    tiny_data, tmp_path, monkeypatch, capsys, no_expectation
):
    monkeypatch.setenv(platform.ENV, "gpu")
    monkeypatch.setattr(train_lib, "_run", lambda *a, **k: pytest.fail("ran"))
    run = tmp_path / "run"
    code = exits.run_main(
        train_lib.main, prog="python -m trainer.train", argv=tiny_train_flags(tiny_data, run)
    )
    err = capsys.readouterr().err
    assert code == PLATFORM_CODE, err
    assert err.startswith("python -m trainer.train: this job expects the gpu platform")
    assert len(err.splitlines()) == 1 and not run.exists()
    # EXPECT_PLATFORM = 'any' overrides what the launcher exported: the job starts
    monkeypatch.setattr(train_lib, "_run", _started)
    gin.clear_config()
    with pytest.raises(Started):
        train_lib.main(tiny_train_flags(tiny_data, run, "--gin.EXPECT_PLATFORM='any'"))


class Started(Exception):
    """Raised where `_run` would have trained."""


def _started(*args, **kwargs):
    raise Started


def test_the_trainer_logs_its_platform_at_start(tiny_data, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(train_lib.jobs, "compile_plan", _started)  # right after start-up
    logger = logging.getLogger(train_lib.__name__)  # `trainer` logs do not propagate to root
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=train_lib.__name__), pytest.raises(Started):
            train_lib.main(
                tiny_train_flags(tiny_data, tmp_path / "run", "--gin.EXPECT_PLATFORM='cpu'")
            )
    finally:
        logger.removeHandler(caplog.handler)
    assert "platform cpu: 8 x cpu (8 devices, 1 process)" in caplog.messages


@pytest.mark.parametrize(
    "main, gin_file, macros",
    [
        (eval_lib.main, "runs/eval.gin", ["EVAL_TASKS=['lm_en']"]),
        (infer_lib.main, "runs/infer.gin", []),
    ],
)
def test_eval_and_infer_refuse_too(main, gin_file, macros, tmp_path, no_expectation):
    flags = [
        "--gin_file=models/llama2.gin",
        f"--gin_file={gin_file}",
        "--gin.MODEL_SIZE='llama2_tiny'",
        f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
        f"--gin.VOCAB_PATH='{tmp_path / 'v.model'}'",
        "--gin.EXPECT_PLATFORM='tpu'",
        *(f"--gin.{m}" for m in macros),
    ]
    with pytest.raises(platform.PlatformError, match="expects the tpu platform"):
        main(flags)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- the launchers


@pytest.fixture
def runs(tmp_path):
    return smoke_runs(tmp_path / "runs", data_dir="/data", vocab_path="/data/v.model")


def test_slurm_exports_the_gpu_expectation_only_when_it_asks_for_gpus(runs, tmp_path):
    def script(gpus):
        launcher = slurm.SlurmLauncher(gpus_per_node=gpus, script_dir=str(tmp_path / "s"))
        return launcher.render(runs[0])

    assert f"\nexport {platform.ENV}=gpu\n" in script(8)
    assert platform.ENV not in script(0)


def test_the_tpu_vm_command_expects_a_tpu(runs):
    launcher = tpu_vm.TpuVmLauncher(tpu="v5p-8", zone="us-east5-a")
    remote = launcher.command(runs[0])[-1]
    exports = remote.split(" && ")[1]
    assert f"{platform.ENV}=tpu" in shlex.split(exports)


# ---------------------------------------------------------------- the GPU test harness


@pytest.mark.parametrize(
    "expression, selected",
    [
        ("gpu", True),
        ("gpu and not slow", True),
        ("not gpu", False),
        ("gpu or slow", False),  # slow tests would run on the GPU backend
        ("slow", False),
        ("", False),
    ],
)
def test_only_a_gpu_selection_leaves_the_cpu_defaults(expression, selected):
    assert selects_gpu_tests(expression, ["slow", "gpu"]) is selected


# The harness's behaviour without a GPU (on a GPU machine `pytest -m gpu` runs the tests instead).
cpu_only = pytest.mark.skipif(gpu_present(), reason="checks the harness on a machine without GPU")

BLOCKER = textwrap.dedent(
    f"""
    import sys

    BLOCKED = {NOT_ON_GPU_IMAGE!r}


    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None


    sys.meta_path.insert(0, Blocker())
    """
)


def _pytest_gpu(tmp_path, *args, blocked: bool):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "JAX_PLATFORMS")}
    env.pop("XLSCALE_TEST_PLATFORMS", None)
    if blocked:
        (tmp_path / "sitecustomize.py").write_text(BLOCKER)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _skips(output: str) -> tuple[int, list[str]]:
    """(how many tests were skipped, the distinct skip reasons) of a `-ra` summary."""
    counts = re.search(r"(\d+) skipped", output)
    reasons = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", output, re.MULTILINE)
    return (int(counts.group(1)) if counts else 0), sorted(set(reasons))


@pytest.mark.slow
@cpu_only
def test_without_a_gpu_every_gpu_test_is_skipped_saying_why(tmp_path):
    proc = _pytest_gpu(
        tmp_path, "tests/test_gpu_steps.py", "tests/test_attention.py", blocked=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    skipped, reasons = _skips(out)
    assert skipped >= 10, out  # 4 here + test_attention's 6 cuDNN tests
    assert len(reasons) == 1 and reasons[0].startswith("no GPU backend: "), reasons
    assert "run `pytest -m gpu` on a machine with an NVIDIA GPU" in reasons[0]
    assert not re.search(r"\d+ (passed|failed|errors?)\b", out), out


@pytest.mark.slow
@cpu_only
def test_a_gpu_run_collects_cleanly_without_tensorflow_seqio_or_gin(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    probe = subprocess.run(
        [sys.executable, "-c", "import seqio"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert "(blocked)" in probe.stderr  # the emulated image really lacks them
    proc = _pytest_gpu(tmp_path, blocked=True)  # the whole suite, as a GPU user runs it
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    skipped, reasons = _skips(out)
    assert skipped >= 10 and len(reasons) == 1, out
    assert not re.search(r"\d+ (passed|failed|errors?)\b", out), out
    assert "ModuleNotFoundError" not in out and "ImportError" not in out, out
