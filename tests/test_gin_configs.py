"""Every gin file parses, layers as STYLE.md says, and resolves to the CPT paper's settings."""

from __future__ import annotations

from pathlib import Path

import gin
import pytest

from trainer import gin_entry, validation

CONFIGS = Path(__file__).resolve().parent.parent / "t5x_configs"
EXPERIMENTS = sorted(
    p.name for p in (CONFIGS / "experiments").glob("*.gin") if p.name != "tiny.gin"
)
BASE = [
    "--gin.MODEL_DIR='/tmp/run'",
    "--gin.MODEL_SIZE='llama2_49m'",
    "--gin.VOCAB_PATH='/tmp/vocab.model'",
    "--gin.INIT_CHECKPOINT='/tmp/source@100'",
]


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def resolve(name: str):
    """A macro's value, evaluating configurable references (`@fn()`) as gin would."""
    return _evaluate(gin_entry.macro_value(name))


def _evaluate(value):
    if hasattr(value, "scoped_configurable_fn"):
        return value.scoped_configurable_fn()
    if isinstance(value, dict):
        return {k: _evaluate(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_evaluate(v) for v in value)
    return value


def parse(experiment: str, *extra: str, job: str = "train"):
    files = [
        f"--gin_file={f}" for f in (experiment if isinstance(experiment, list) else [experiment])
    ]
    return gin_entry.parse([*files, *BASE, *extra], job=job)


def test_experiment_files_are_all_covered():
    assert EXPERIMENTS == ["cpt.gin", "cpt_replay.gin", "cpt_scratch.gin", "cpt_source_en.gin"]


@pytest.mark.parametrize("tiny", [False, True], ids=["paper", "tiny"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_parses_and_binds_the_train_job(experiment, tiny):
    files = [f"experiments/{experiment}"] + (["experiments/tiny.gin"] if tiny else [])
    if tiny:  # the overlay sets MODEL_SIZE itself; a command-line binding would win over it
        argv = [f"--gin_file={f}" for f in files] + [b for b in BASE if "MODEL_SIZE" not in b]
        config = gin_entry.parse([*argv, "--gin.DATA_DIR='/tmp/data'"], job="train")
    else:
        config = parse(files)
    assert "train_script.train.model_dir = %MODEL_DIR" in config.config_str
    for key in ("model", "data", "optimizer", "schedule", "checkpoint", "mesh", "evaluation"):
        assert f"train_script.train.{key} = " in config.config_str, key
    assert resolve("MODEL").family == "llama2"
    if tiny:
        assert resolve("BATCH_SIZE") == 8 and resolve("TRAIN_STEPS") == 20
        assert resolve("MODEL_SIZE") == "llama2_tiny"
    else:
        # The paper (§2.1): context 2048, 1M-token batches for sizes up to 1B, 20 tokens/param.
        assert resolve("TASK_FEATURE_LENGTHS") == {"targets": 2048}
        assert resolve("BATCH_SIZE") == 512
        assert resolve("TOKENS_PER_PARAM") == 20 and resolve("TRAIN_STEPS") is None
        assert gin.query_parameter("schedules.ScheduleConfig.name") == "cosine"
        assert gin.query_parameter("optimizers.OptimizerConfig.b2") == 0.95


def test_experiments_resolve_tasks_strategies_and_eval_languages():
    parse("experiments/cpt_source_en.gin")
    assert (resolve("MIXTURE_OR_TASK_NAME"), resolve("STRATEGY")) == ("lm_en", "source")
    gin.clear_config()
    parse("experiments/cpt_scratch.gin", "--gin.TARGET_LANG='fr'")
    assert (resolve("MIXTURE_OR_TASK_NAME"), resolve("STRATEGY")) == ("lm_fr", "scratch")
    gin.clear_config()
    parse("experiments/cpt.gin")
    assert resolve("MIXTURE_OR_TASK_NAME") == "lm_zh"
    assert resolve("EVAL_TASKS") == ["lm_zh", "lm_en"]  # target and source: forgetting
    assert resolve("INIT_CHECKPOINT") == "/tmp/source@100"
    gin.clear_config()
    parse("experiments/cpt_replay.gin", "--gin.TARGET_LANG='ru'", "--gin.REPLAY_RATIO=0.3")
    assert resolve("MIXTURE_OR_TASK_NAME") == "cpt_ru_replay_en_30"
    assert (resolve("STRATEGY"), resolve("REPLAY_RATIO")) == ("cpt_replay", 0.3)


def test_batch_size_follows_the_paper_size_bands():
    parse("experiments/cpt_source_en.gin", "--gin.MODEL_SIZE='llama2_1542m'")
    assert resolve("BATCH_SIZE") == 1024  # 2M tokens
    gin.clear_config()
    parse("experiments/cpt_source_en.gin", "--gin.MODEL_SIZE='llama2_5534m'")
    assert resolve("BATCH_SIZE") == 2048  # 4M tokens


def test_missing_required_macros_name_the_flag():
    with pytest.raises(validation.ConfigError, match=r"MODEL_DIR.*--gin\.MODEL_DIR"):
        gin_entry.parse(
            ["--gin_file=experiments/cpt_source_en.gin", "--gin.MODEL_SIZE='llama2_49m'"],
            job="train",
        )
    gin.clear_config()
    with pytest.raises(validation.ConfigError, match=r"INIT_CHECKPOINT.*--gin\.INIT_CHECKPOINT"):
        gin_entry.parse(["--gin_file=experiments/cpt.gin", *BASE[:3]], job="train")


def test_unknown_model_size_names_binding_and_sizes():
    parse("experiments/cpt_source_en.gin", "--gin.MODEL_SIZE='llama2_7b'")
    with pytest.raises(validation.ConfigError) as e:
        resolve("BATCH_SIZE")
    assert "MODEL_SIZE" in str(e.value) and "llama2_49m" in str(e.value)


@pytest.mark.parametrize("run, job", [("runs/eval.gin", "eval"), ("runs/infer.gin", "infer")])
def test_eval_and_infer_runs_parse_with_a_model_file(run, job):
    config = parse(["models/llama2.gin", run], "--gin.EVAL_TASKS=['lm_en']", job=job)
    name = "eval_script.evaluate" if job == "eval" else "infer_script.infer"
    assert f"{name}.model = %MODEL" in config.config_str


def test_includes_resolve_with_a_runs_directory_on_sys_path(tmp_path, monkeypatch):
    # `python -m trainer.train` puts the working directory on sys.path; a sweep's `runs/` output
    # directory there must not shadow `include 'runs/pretrain.gin'` (gin reads it as a package).
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse("experiments/cpt_source_en.gin")
    assert "train_script.train.model_dir = %MODEL_DIR" in config.config_str
