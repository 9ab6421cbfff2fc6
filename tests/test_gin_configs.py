"""Every gin file parses, layers as docs/conventions.md says, and resolves to the papers' settings."""

from __future__ import annotations

import re
from pathlib import Path

import gin
import pytest
from gin_values import BASE, MT_BASE, parse_mt, resolve

from trainer import gin_entry, validation

pytestmark = pytest.mark.usefixtures("clean_gin")

CONFIGS = Path(__file__).resolve().parent.parent / "t5x_configs"
OVERLAYS = ("tiny.gin", "t5_tiny.gin", "superglue.gin")
ALL_EXPERIMENTS = sorted(
    p.name for p in (CONFIGS / "experiments").glob("*.gin") if p.name not in OVERLAYS
)
EXPERIMENTS = [name for name in ALL_EXPERIMENTS if name.startswith("cpt")]
MT_EXPERIMENTS = [name for name in ALL_EXPERIMENTS if name.startswith("mt_")]


def parse(experiment: str, *extra: str, job: str = "train"):
    files = [
        f"--gin_file={f}" for f in (experiment if isinstance(experiment, list) else [experiment])
    ]
    return gin_entry.parse([*files, *BASE, *extra], job=job)


def test_experiment_files_are_all_covered():
    assert EXPERIMENTS == ["cpt.gin", "cpt_replay.gin", "cpt_scratch.gin", "cpt_source_en.gin"]
    assert MT_EXPERIMENTS == ["mt_finetune.gin", "mt_pretrain.gin"]
    assert ALL_EXPERIMENTS == sorted(EXPERIMENTS + MT_EXPERIMENTS)


@pytest.mark.parametrize("tiny", [False, True], ids=["paper", "tiny"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_parses_and_binds_the_train_job(experiment, tiny):
    files = [f"experiments/{experiment}"] + (["experiments/tiny.gin"] if tiny else [])
    if tiny:  # the overlay sets MODEL_SIZE itself; a command-line binding would win over it
        argv = [f"--gin_file={f}" for f in files] + [b for b in BASE if "MODEL_SIZE" not in b]
        config = gin_entry.parse([*argv, "--gin.DATA_DIR='/xl/data'"], job="train")
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
    assert resolve("INIT_CHECKPOINT") == "/xl/source@100"
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


RUNS = sorted(p.name for p in (CONFIGS / "runs").glob("*.gin"))
MACRO = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=", re.MULTILINE)


def includes(path: Path) -> list[str]:
    """The `include` targets of a gin file, as written."""
    return re.findall(r"^include\s+'([^']+)'", path.read_text(), re.MULTILINE)


def include_closure(name: str) -> list[Path]:
    """A gin file under t5x_configs/ and every file it includes, recursively."""
    path = CONFIGS / name
    return [path] + [p for inc in includes(path) for p in include_closure(inc)]


def test_run_files_stand_alone():
    # A run file reads top to bottom (docs/conventions.md, "Gin files"): it may include shared fragments
    # (runs/common/*.gin) but never another run file it would then override.
    assert {"pretrain.gin", "cpt.gin", "span_pretrain.gin", "finetune.gin"} <= set(RUNS)
    for run in RUNS:
        text = (CONFIGS / "runs" / run).read_text()
        assert "# Required to be set:" in text.split("\nfrom ", 1)[0], run
        for path in include_closure(f"runs/{run}"):
            for inc in includes(path):
                assert inc.startswith("runs/common/"), f"{path.name} includes {inc}"


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("model", ["models/llama2.gin", "models/t5.gin"])
def test_no_macro_is_set_twice_between_model_and_run_files(model, run):
    # No include-order tricks: within a model file plus a run file and its fragments, each macro
    # is set in one place, so the result does not depend on which file gin reads last.
    where: dict[str, list[str]] = {}
    for path in [CONFIGS / model, *include_closure(f"runs/{run}")]:
        for macro in MACRO.findall(path.read_text()):
            where.setdefault(macro, []).append(path.relative_to(CONFIGS).as_posix())
    assert {m: files for m, files in where.items() if len(files) > 1} == {}


def test_includes_are_resolved_on_the_search_path_and_checked(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "exp.gin").write_text(
        "include 'models/llama2.gin'\ninclude 'runs/pretrain.gin'\nMIXTURE_OR_TASK_NAME = 'lm_fr'\n"
    )
    parse("exp.gin", f"--gin_search_paths={user}")
    assert resolve("MIXTURE_OR_TASK_NAME") == "lm_fr"
    gin.clear_config()
    (user / "late.gin").write_text("SEED = 1\ninclude 'runs/pretrain.gin'\n")
    with pytest.raises(validation.ConfigError, match="late.gin:2: put includes before"):
        parse(str(user / "late.gin"))
    gin.clear_config()
    (user / "loop.gin").write_text(f"include '{user / 'loop.gin'}'\n")
    with pytest.raises(validation.ConfigError, match="include cycle"):
        parse(str(user / "loop.gin"))
    gin.clear_config()
    with pytest.raises(validation.ConfigError, match="'runs/nothing.gin' not found"):
        parse("runs/nothing.gin")


def test_mt_pretrain_resolves_to_the_paper_and_t5x_settings():
    config = parse_mt("mt_pretrain.gin", "--gin.MIXTURE='mix_en_50_fr_50'")
    assert "train_script.train.model_dir = %MODEL_DIR" in config.config_str
    model = resolve("MODEL")
    assert (model.family, model.size, model.dropout_rate) == ("t5", "t5_3b", 0.0)
    assert resolve("MIXTURE_OR_TASK_NAME") == "mix_en_50_fr_50"
    assert resolve("STRATEGY") == "pretrain"
    # Paper §4: batch 256, 1M steps, inverse square root with k = 1e4, Adafactor; T5X's span
    # corruption lengths (inputs 512, targets 114).
    assert resolve("BATCH_SIZE") == 256 and resolve("TRAIN_STEPS") == 1_000_000
    assert resolve("TASK_FEATURE_LENGTHS") == {"inputs": 512, "targets": 114}
    assert gin.query_parameter("schedules.ScheduleConfig.name") == "rsqrt"
    assert resolve("RSQRT_OFFSET") == 10_000 and resolve("BASE_LR") == 1.0
    assert gin.query_parameter("optimizers.OptimizerConfig.name") == "adafactor"
    assert gin.query_parameter("optimizers.OptimizerConfig.grad_clip_norm") is None
    assert resolve("EXTRA_IDS") == 100
    assert resolve("CHECKPOINT_PERIOD") == resolve("KEEP_EVERY") == 25_000


def test_mt_finetune_resolves_steps_from_the_finetuning_budget():
    parse_mt(
        "mt_finetune.gin",
        "--gin.TASK='mt_en_de'",
        "--gin.INIT_CHECKPOINT='/xl/pre@25000'",
        "--gin.FINETUNE_TOKENS=6000000",
    )
    model = resolve("MODEL")
    assert (model.family, model.dropout_rate) == ("t5", 0.1)
    assert resolve("MIXTURE_OR_TASK_NAME") == "mt_en_de" and resolve("STRATEGY") == "finetune"
    assert resolve("BATCH_SIZE") == 128
    assert resolve("TASK_FEATURE_LENGTHS") == {"inputs": 512, "targets": 512}
    assert resolve("TRAIN_STEPS") == 92  # ceil(6M / (128 x 512))
    assert gin.query_parameter("schedules.ScheduleConfig.name") == "constant"
    assert resolve("PEAK_LR") == 1e-3
    assert resolve("EVAL_TASKS") == ["mt_en_de"] and resolve("DECODE_TASKS") == ["mt_en_de"]
    assert (resolve("DECODE_METHOD"), resolve("DECODE_SPLIT")) == ("beam", "test")
    gin.clear_config()
    parse_mt("mt_finetune.gin", "--gin.TASK='mt_en_ro'", "--gin.STRATEGY='finetune_scratch'")
    assert resolve("TRAIN_STEPS") == 300 and resolve("INIT_CHECKPOINT") is None  # the paper's
    gin.clear_config()
    parse_mt("mt_finetune.gin", "--gin.TASK='mt_en_fr'", "--gin.TRAIN_STEPS=7")
    assert resolve("TRAIN_STEPS") == 7  # an explicit step count wins


def test_mt_finetune_without_a_task_names_the_flag():
    with pytest.raises(validation.ConfigError, match=r"TASK.*--gin\.TASK"):
        parse_mt("mt_finetune.gin")


@pytest.mark.parametrize("experiment", MT_EXPERIMENTS)
def test_t5_tiny_overlay_makes_mt_runs_small(experiment):
    parse_mt(experiment, "--gin.MIXTURE='mix_en_100'", "--gin.TASK='mt_en_fr'", tiny=True)
    assert resolve("MODEL_SIZE") == "t5_tiny" and resolve("BATCH_SIZE") == 8
    assert resolve("TASK_FEATURE_LENGTHS") == {"inputs": 64, "targets": 32}
    assert resolve("TRAIN_STEPS") == (40 if experiment == "mt_pretrain.gin" else 20)


@pytest.mark.slow
def test_mt_paper_manifest_runs_parse_with_the_mt_gin_files():
    from launch import sweep

    runs = sweep.expand(sweep.load_manifest("mt_paper"))
    seen = {}
    for run in runs:  # one run of each strategy and model size
        seen.setdefault((run.strategy, run.size), run)
    assert {s for s, _ in seen} == {"pretrain", "finetune", "finetune_scratch"}
    for run in seen.values():
        gin.clear_config()
        gin_entry.parse(run.gin_args(allow_missing=True), job="train")
        assert resolve("MODEL").family == "t5" and resolve("MODEL").size == run.size
        assert resolve("STRATEGY") == run.strategy
        assert resolve("TRAIN_STEPS") == run.steps and resolve("BATCH_SIZE") == run.batch_size
        if run.strategy == "pretrain":
            assert resolve("MIXTURE_OR_TASK_NAME") == run.coord("mixture")
            assert resolve("KEEP_EVERY") == 25_000
        else:
            assert resolve("MIXTURE_OR_TASK_NAME") == run.coord("task")
            assert resolve("FINETUNE_TOKENS") == run.coord("finetune_tokens")
        if run.strategy == "finetune":
            assert resolve("INIT_CHECKPOINT").endswith(f"@{run.coord('init_step')}")
        else:
            assert resolve("INIT_CHECKPOINT") is None


def test_t5_eval_and_infer_runs_parse_with_the_t5_model_file():
    config = gin_entry.parse(
        [
            "--gin_file=models/t5.gin",
            "--gin_file=runs/infer.gin",
            *MT_BASE,
            "--gin.TASK='mt_en_fr'",
        ],
        job="infer",
    )
    assert "infer_script.InferSource.task = %TASK" in config.config_str
    gin.clear_config()
    gin_entry.parse(
        ["--gin_file=models/t5.gin", "--gin_file=runs/eval.gin", *MT_BASE]
        + ["--gin.EVAL_TASKS=['mt_en_fr']", "--gin.DECODE_TASKS=['mt_en_fr']"],
        job="eval",
    )
    assert resolve("MODEL").family == "t5" and resolve("DECODE_TASKS") == ["mt_en_fr"]
