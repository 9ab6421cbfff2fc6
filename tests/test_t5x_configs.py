"""The gin files for real T5X (`t5x_configs/t5x/`) and the task module T5X imports.

CI has no T5X, so the gin files are parsed against T5X-shaped stand-ins: a module per T5X module
they import, holding only the configurables of `T5X_CONFIGURABLES` with exactly T5X's parameter
names, and stand-ins for the T5X run files they include that define exactly T5X's macros
(`T5X_RUN_MACROS`). Both lists were taken from T5X's source at `T5X_COMMIT` (names only, no T5X
code), so a misspelt configurable, parameter or macro fails here. The last test runs real T5X
(pretrain -> finetune -> infer on the fixture data) and skips where T5X is not installed.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "t5x_configs"
T5X_DIR = CONFIGS / "t5x"

# github.com/google-research/t5x, the commit the names below were read from.
T5X_COMMIT = "cc342d419ec3e3e9c4bf1df33c82330cafdc1e16"

# Configurables the gin files bind (module path -> parameter names), from `inspect.signature`.
# `t5x.train.train` and `t5x.infer.infer` are `__main__.train` / `__main__.infer` in gin.
T5X_CONFIGURABLES: dict[str, tuple[str, ...]] = {
    "t5x.adafactor.Adafactor": (
        "learning_rate",
        "factored",
        "multiply_by_parameter_scale",
        "beta1",
        "decay_rate",
        "step_offset",
        "clipping_threshold",
        "weight_decay_rate",
        "min_dim_size_to_factor",
        "epsilon1",
        "epsilon2",
        "dtype_momentum",
        "factor_map",
        "logical_factor_rules",
        "weight_decay_rate_lr_exponent",
        "global_norm_clip_threshold",
        "max_parameter_scale",
        "skip_nan_updates",
    ),
    "t5x.adafactor.standard_logical_factor_rules": (),
    "t5x.models.EncoderDecoderModel": (
        "module",
        "input_vocabulary",
        "output_vocabulary",
        "optimizer_def",
        "decode_fn",
        "feature_converter_cls",
        "label_smoothing",
        "z_loss",
        "loss_normalizing_factor",
        "default_decoder_params",
    ),
    "t5x.utils.DatasetConfig": (
        "mixture_or_task_name",
        "task_feature_lengths",
        "split",
        "batch_size",
        "shuffle",
        "seed",
        "use_cached",
        "pack",
        "use_custom_packing_ops",
        "module",
        "use_memory_cache",
        "trim_output_features",
        "runtime_preprocessors",
        "num_prefetch_threads",
        "num_workers",
    ),
    "t5x.utils.RestoreCheckpointConfig": (
        "path",
        "mode",
        "assignment_map",
        "strict",
        "fallback_to_scratch",
        "dtype",
        "restore_dataset",
        "checkpointer_cls",
        "state_transformation_fns",
        "checkpoint_manager_cls",
    ),
    "t5x.utils.SaveCheckpointConfig": (
        "dtype",
        "period",
        "checkpoint_steps",
        "keep",
        "keep_dataset_checkpoints",
        "save_dataset",
        "checkpointer_cls",
        "state_transformation_fns",
        "checkpoint_manager_cls",
    ),
    "t5x.utils.create_learning_rate_scheduler": (
        "factors",
        "base_learning_rate",
        "warmup_steps",
        "decay_factor",
        "steps_per_decay",
        "steps_per_cycle",
        "step_offset",
        "min_learning_rate",
    ),
    "t5x.train.train": (
        "model",
        "train_dataset_cfg",
        "train_eval_dataset_cfg",
        "infer_eval_dataset_cfg",
        "checkpoint_cfg",
        "partitioner",
        "trainer_cls",
        "model_dir",
        "total_steps",
        "eval_steps",
        "eval_period",
        "relative_steps",
        "stats_period",
        "random_seed",
        "use_hardware_rng",
        "summarize_config_fn",
        "inference_evaluator_cls",
        "get_dataset_fn",
        "concurrent_metrics",
        "actions",
        "train_eval_get_dataset_fn",
        "run_eval_before_training",
        "train_state_initializer_cls",
        "use_orbax",
        "verify_matching_vocabs_fn",
        "gc_period",
    ),
    "t5x.infer.infer": (
        "mode",
        "model",
        "dataset_cfg",
        "restore_checkpoint_cfg",
        "partitioner",
        "output_dir",
        "checkpoint_period",
        "shard_id",
        "num_shards",
        "merge_chunked_results",
        "write_fn",
        "checkpoint_ds_iter",
        "train_state_initializer_cls",
        "fallback_init_rng",
        "merge_fn",
        "summarize_config_fn",
        "verify_matching_vocabs_fn",
        "output_vocab_feature_name",
        "file_extension",
        "keep_aux_as_numpy",
        "use_orbax",
    ),
}

# The macros each T5X run file (`t5x/configs/runs/<kind>.gin`) defines, with T5X's values.
T5X_RUN_MACROS: dict[str, dict[str, str]] = {
    "pretrain": {
        "BATCH_SIZE": "128",
        "MIXTURE_OR_TASK_MODULE": "None",
        "MIXTURE_OR_TASK_NAME": "%gin.REQUIRED",
        "MODEL_DIR": "%gin.REQUIRED",
        "RANDOM_SEED": "None",
        "SHUFFLE_TRAIN_EXAMPLES": "True",
        "TASK_FEATURE_LENGTHS": "%gin.REQUIRED",
        "TRAIN_STEPS": "%gin.REQUIRED",
        "TRAIN_STEPS_RELATIVE": "None",
        "USE_CACHED_TASKS": "True",
        "USE_HARDWARE_RNG": "False",
    },
    "finetune": {
        "BATCH_SIZE": "128",
        "DROPOUT_RATE": "0.1",
        "EVALUATOR_NUM_EXAMPLES": "None",
        "EVALUATOR_USE_MEMORY_CACHE": "True",
        "EVAL_PERIOD": "1000",
        "EVAL_STEPS": "20",
        "INITIAL_CHECKPOINT_PATH": "%gin.REQUIRED",
        "JSON_WRITE_N_RESULTS": "None",
        "MIXTURE_OR_TASK_MODULE": "None",
        "MIXTURE_OR_TASK_NAME": "%gin.REQUIRED",
        "MODEL_DIR": "%gin.REQUIRED",
        "RANDOM_SEED": "None",
        "TASK_FEATURE_LENGTHS": "%gin.REQUIRED",
        "TRAIN_STEPS": "%gin.REQUIRED",
        "TRAIN_STEPS_RELATIVE": "None",
        "USE_CACHED_TASKS": "True",
        "USE_HARDWARE_RNG": "False",
    },
    "infer": {
        "CHECKPOINT_PATH": "%gin.REQUIRED",
        "INFER_OUTPUT_DIR": "%gin.REQUIRED",
        "MIXTURE_OR_TASK_MODULE": "None",
        "MIXTURE_OR_TASK_NAME": "%gin.REQUIRED",
        "TASK_FEATURE_LENGTHS": "%gin.REQUIRED",
    },
}
# What each run's command line gives (the macros left %gin.REQUIRED).
COMMAND_LINE: dict[str, tuple[str, ...]] = {
    "t5x/runs/span_pretrain.gin": ("MODEL_DIR = '/m'", "MIXTURE_OR_TASK_NAME = 'span_en'"),
    "t5x/runs/finetune.gin": (
        "MODEL_DIR = '/f'",
        "MIXTURE_OR_TASK_NAME = 'mt_en_fr'",
        "INITIAL_CHECKPOINT_PATH = '/m/checkpoint_10'",
    ),
    "t5x/runs/infer.gin": (
        "MIXTURE_OR_TASK_NAME = 'mt_en_fr'",
        "CHECKPOINT_PATH = '/f/checkpoint_20'",
        "INFER_OUTPUT_DIR = '/i'",
    ),
}

GIN_FILES = sorted(p.relative_to(CONFIGS).as_posix() for p in T5X_DIR.rglob("*.gin"))
SIZE_FILES = {"t5x/models/t5_770m.gin": "t5_770m", "t5x/models/t5_3b.gin": "t5_3b"}
RUN_FILES = ("t5x/runs/span_pretrain.gin", "t5x/runs/finetune.gin", "t5x/runs/infer.gin")
TINY = "t5x/models/tiny.gin"
ASSIGNED = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=", re.M)
REFERENCED = re.compile(r"%([A-Z][A-Z0-9_]*)")
# Macros set only to be recorded in T5X's config.gin for `fitting.t5x_runs` (Df and its unit) and
# for the reports (the finetuning recipe's name, the COMET model that scored the outputs).
RECORDED = {"FINETUNE_TOKENS", "FINETUNE_UNIT", "FINETUNE_RECIPE", "COMET_MODEL"}
INCLUDED = re.compile(r"^include '([^']+)'", re.M)


def _stand_in(name: str, params: tuple[str, ...]):
    """A function `name(*, p=None, ...)`: gin checks bindings against this signature."""
    namespace: dict = {}
    args = "*, " + ", ".join(f"{p}=None" for p in params) if params else ""
    exec(f"def {name}({args}):\n    return None", namespace)  # noqa: S102
    return namespace[name]


@functools.cache
def _stand_in_modules() -> dict[str, types.ModuleType]:
    """`t5x`, its submodules and `__main__`, holding T5X's configurables; built once, since gin
    keeps what it registered from them for the whole session."""
    modules: dict[str, types.ModuleType] = {"t5x": types.ModuleType("t5x")}
    main = modules["__main__"] = types.ModuleType("__main__")
    for path, params in T5X_CONFIGURABLES.items():
        module_name, attr = path.rsplit(".", 1)
        if module_name in ("t5x.train", "t5x.infer"):
            setattr(main, attr, _stand_in(attr, params))
            continue
        module = modules.setdefault(module_name, types.ModuleType(module_name))
        setattr(module, attr, _stand_in(attr, params))
        setattr(modules["t5x"], module_name.split(".")[1], module)
    return modules


@pytest.fixture
def t5x_gin(tmp_path, monkeypatch):
    """Gin with T5X stand-ins: modules `t5x.*` and `__main__` holding T5X's configurables, and
    `t5x/configs/runs/*.gin` defining T5X's macros, ahead of `t5x_configs/` on the search path."""
    import gin

    modules = _stand_in_modules()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    runs = tmp_path / "t5x" / "configs" / "runs"
    runs.mkdir(parents=True)
    for kind, macros in T5X_RUN_MACROS.items():
        lines = [f"# stand-in for T5X's runs/{kind}.gin at {T5X_COMMIT}"]
        lines += [f"{m} = {value}" for m, value in macros.items()]
        (runs / f"{kind}.gin").write_text("\n".join(lines) + "\n")
    gin.clear_config(clear_constants=True)
    gin.add_config_file_search_path(str(tmp_path))
    gin.add_config_file_search_path(str(CONFIGS))
    yield gin
    gin.clear_config(clear_constants=True)


def _macros(rel: str, pattern: re.Pattern) -> set[str]:
    """The macros `rel` (and the files it includes, T5X's by its listed macros) match."""
    text = (CONFIGS / rel).read_text()
    found = set(pattern.findall(text))
    for inc in INCLUDED.findall(text):
        if inc.startswith("t5x/configs/runs/"):
            if pattern is ASSIGNED:
                found |= set(T5X_RUN_MACROS[Path(inc).stem])
        else:
            found |= _macros(inc, pattern)
    return found


def test_every_t5x_gin_file_is_covered():
    assert set(GIN_FILES) == {*SIZE_FILES, *RUN_FILES, TINY, "t5x/models/t5.gin"}


@pytest.mark.parametrize("rel", GIN_FILES)
def test_each_file_parses_alone(t5x_gin, rel):
    t5x_gin.parse_config_files_and_bindings([rel], [], finalize_config=False)


@pytest.mark.parametrize("size_file", sorted(SIZE_FILES))
@pytest.mark.parametrize("run_file", RUN_FILES)
@pytest.mark.parametrize("tiny", [False, True], ids=["paper", "tiny"])
def test_command_lines_parse_and_build_the_model_config(t5x_gin, size_file, run_file, tiny):
    """What `python -m t5x.train|infer --gin_file=<size> --gin_file=<run> [--gin_file=tiny]`
    parses; the model's `T5Config` comes out of `t5_jax.sizes.get_config` with the run's
    dropout (an unknown `T5Config` field in a gin file fails here)."""
    from t5_jax import sizes

    files = [size_file, run_file] + ([TINY] if tiny else [])
    t5x_gin.parse_config_files_and_bindings(files, list(COMMAND_LINE[run_file]))
    config = t5x_gin.get_configurable(sizes.get_config)()
    expected = sizes.SIZES["t5_tiny" if tiny else SIZE_FILES[size_file]]
    assert (config.d_model, config.num_heads, config.d_ff) == (
        expected.d_model,
        expected.num_heads,
        expected.d_ff,
    )
    assert config.vocab_size == (512 if tiny else 250112)  # the MT paper's vocabulary, §4
    assert config.dtype == ("float32" if tiny else "bfloat16")
    dropout = {"span_pretrain.gin": 0.0, "finetune.gin": 0.1, "infer.gin": 0.0}
    assert config.dropout_rate == dropout[Path(run_file).name]


def test_the_paper_recipe_is_what_t5x_gets(t5x_gin):
    """Pretraining: batch 256, inputs 512 / targets 114, rsqrt with a 10k offset, all
    checkpoints kept; finetuning: batch 128, 512 / 512, 300 steps past the checkpoint, constant
    LR 1e-3."""
    q = t5x_gin.query_parameter
    t5x_gin.parse_config_files_and_bindings(
        ["t5x/models/t5_3b.gin", RUN_FILES[0]], list(COMMAND_LINE[RUN_FILES[0]])
    )
    assert q("%BATCH_SIZE") == 256
    assert q("%TASK_FEATURE_LENGTHS") == {"inputs": 512, "targets": 114}
    assert q("%PRETRAIN_STEPS") == 1_000_000  # TRAIN_STEPS = %PRETRAIN_STEPS
    assert q("%USE_CACHED_TASKS") is False
    assert q("%MIXTURE_OR_TASK_MODULE") == "t5x_configs.t5x_tasks"
    assert q("utils.create_learning_rate_scheduler.factors") == "constant * rsqrt_decay"
    assert (q("%BASE_LR"), q("%RSQRT_OFFSET")) == (1.0, 10000)
    assert q("utils.SaveCheckpointConfig.keep") is None
    assert q("adafactor.Adafactor.decay_rate") == 0.8
    assert q("%RANDOM_SEED") == 0  # T5X's None would draw a time-based seed
    t5x_gin.clear_config()
    t5x_gin.parse_config_files_and_bindings(
        ["t5x/models/t5_3b.gin", RUN_FILES[1]], list(COMMAND_LINE[RUN_FILES[1]])
    )
    assert q("%BATCH_SIZE") == 128
    assert q("%TASK_FEATURE_LENGTHS") == {"inputs": 512, "targets": 512}
    assert q("%FINETUNE_STEPS") == 300  # TRAIN_STEPS_RELATIVE = %FINETUNE_STEPS
    assert q("%RANDOM_SEED") == 0  # T5X's None would draw a time-based seed
    assert q("utils.create_learning_rate_scheduler.factors") == "constant"
    assert q("%PEAK_LR") == 0.001


@pytest.mark.parametrize("size_file,run_file", itertools.product(sorted(SIZE_FILES), RUN_FILES))
def test_every_macro_set_is_used_and_every_macro_used_is_set(size_file, run_file):
    """A misspelt macro assignment would silently define a new macro: every macro our files and
    the tiny overlay set is one T5X's run file defines or one a file of the stack refers to."""
    stack = [size_file, run_file]
    assigned = set().union(*(_macros(f, ASSIGNED) for f in stack))
    referenced = set().union(*(_macros(f, REFERENCED) for f in stack + [TINY]))
    t5x_macros = set(
        T5X_RUN_MACROS[{"span_pretrain": "pretrain"}.get(Path(run_file).stem, Path(run_file).stem)]
    )
    ours = set().union(*(set(ASSIGNED.findall((CONFIGS / f).read_text())) for f in stack))
    assert not (ours - referenced - t5x_macros - {"MODEL"} - RECORDED)
    assert not (referenced - assigned - {"MODEL"})  # MODEL is used by T5X's run files
    tiny = set(ASSIGNED.findall((CONFIGS / TINY).read_text()))
    all_assigned = set().union(
        *(_macros(f, ASSIGNED) for f in (*SIZE_FILES, *RUN_FILES)),
    )
    assert not (tiny - all_assigned)


def test_a_misspelt_t5x_parameter_fails(t5x_gin, tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import utils\n"
        "utils.SaveCheckpointConfig.perod = 10\n"
    )
    with pytest.raises(ValueError, match="perod"):
        t5x_gin.parse_config_files_and_bindings([str(bad)], [])


def test_task_module_needs_its_environment(monkeypatch):
    from t5x_configs import t5x_env

    monkeypatch.delenv("XLSCALE_VOCAB_PATH", raising=False)
    monkeypatch.delenv("XLSCALE_DATA_DIR", raising=False)
    with pytest.raises(RuntimeError, match="XLSCALE_VOCAB_PATH"):
        t5x_env.vocabulary()
    with pytest.raises(RuntimeError, match="XLSCALE_DATA_DIR"):
        t5x_env.data_dir()


def test_task_module_registers_tasks_and_mixtures(tiny_data, monkeypatch, seqio_registry):
    import importlib

    import seqio

    monkeypatch.setenv("XLSCALE_VOCAB_PATH", tiny_data["vocab"])
    monkeypatch.setenv("XLSCALE_DATA_DIR", tiny_data["corpora"])
    monkeypatch.delitem(sys.modules, "t5x_configs.t5x_tasks", raising=False)
    module = importlib.import_module("t5x_configs.t5x_tasks")
    for name in ("span_en", "span_fr", "mt_en_fr", "mt_fr_en"):
        assert name in module.TASKS
        assert name in seqio.TaskRegistry.names()
    assert "mix_en_50_fr_50" in module.MIXTURES
    task = seqio.get_mixture_or_task("mt_en_fr")
    assert task.output_features["targets"].vocabulary.extra_ids == 100
    assert task.output_features["targets"].vocabulary.vocab_size <= 512  # tiny.gin's embedding
    example = next(iter(task.get_dataset({"inputs": 64, "targets": 32}, split="train").take(1)))
    assert example["inputs"].shape[0] > 0
    monkeypatch.delitem(sys.modules, "t5x_configs.t5x_tasks")


def test_finetune_pairs_cut_the_translation_train_split(tiny_data, monkeypatch, seqio_registry):
    # A finetune's Df in the paper's unit reaches T5X as XLSCALE_FINETUNE_PAIRS: the translation
    # tasks' train split holds its first that many pairs; other splits and tasks are whole.
    import seqio

    from pipelines import tasks
    from t5x_configs import t5x_env

    monkeypatch.setenv(t5x_env.VOCAB_ENV, tiny_data["vocab"])
    monkeypatch.setenv(t5x_env.DATA_ENV, tiny_data["corpora"])
    from t5x_configs import t5x_tasks  # registers at import: after the environment is set

    registered = tasks.register_tasks(
        vocabulary=t5x_env.vocabulary(), corpora_dir=t5x_env.data_dir()
    )
    task = "mt_en_fr"
    whole = list(seqio.get_mixture_or_task(task).source.get_dataset("train", shuffle=False))
    assert len(whole) > 3
    assert t5x_tasks.limit_finetuning_sets(registered, None) == []
    monkeypatch.setenv(t5x_env.PAIRS_ENV, "3")
    changed = t5x_tasks.limit_finetuning_sets(registered, t5x_env.finetune_pairs())
    assert task in changed and not any(n.startswith("span_") for n in changed)
    cut = seqio.get_mixture_or_task(task)
    for _ in range(2):  # the same three pairs every time
        got = list(cut.source.get_dataset("train", shuffle=True, seed=7))
        assert [str(x) for x in got] == [str(x) for x in whole[:3]]
    assert len(list(cut.source.get_dataset("validation", shuffle=False))) == len(
        list(seqio.get_mixture_or_task("mt_fr_en").source.get_dataset("validation", shuffle=False))
    )
    monkeypatch.setenv(t5x_env.PAIRS_ENV, "-2")
    with pytest.raises(RuntimeError, match="XLSCALE_FINETUNE_PAIRS='-2'"):
        t5x_env.finetune_pairs()


@pytest.mark.slow
def test_real_t5x_pretrain_finetune_infer(tiny_data, tmp_path):
    """Real T5X on the fixture data: 10 steps of span pretraining, 10 of finetuning on
    mt_en_fr from its checkpoint (with the validation decode), then `t5x.infer` on the test split."""
    pytest.importorskip("t5x")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "XLSCALE_VOCAB_PATH": tiny_data["vocab"],
        "XLSCALE_DATA_DIR": tiny_data["corpora"],
        "JAX_PLATFORMS": "cpu",
    }
    env.pop("XLA_FLAGS", None)  # one CPU device, as on a developer's machine
    import t5x

    t5x_root = Path(t5x.__file__).resolve().parent.parent
    common = [f"--gin_search_paths={CONFIGS},{t5x_root}", "--gin_file=t5x/models/t5_770m.gin"]

    def run(entry, run_file, *bindings):
        cmd = [sys.executable, "-m", entry, *common, f"--gin_file={run_file}"]
        cmd += [f"--gin_file={TINY}", *(f"--gin.{b}" for b in bindings)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]

    pre, ft, out = tmp_path / "pre", tmp_path / "ft", tmp_path / "infer"
    module = "MIXTURE_OR_TASK_MODULE='t5x_configs.t5x_tasks'"
    run("t5x.train", RUN_FILES[0], f"MODEL_DIR='{pre}'", "MIXTURE_OR_TASK_NAME='span_en'",
        "TRAIN_STEPS=10", module)  # fmt: skip
    assert (pre / "checkpoint_10").is_dir()
    run("t5x.train", RUN_FILES[1], f"MODEL_DIR='{ft}'", "MIXTURE_OR_TASK_NAME='mt_en_fr'",
        f"INITIAL_CHECKPOINT_PATH='{pre / 'checkpoint_10'}'", module)  # fmt: skip
    assert (ft / "checkpoint_20").is_dir()
    scores = [json.loads(x) for x in (ft / "inference_eval" / "mt_en_fr-metrics.jsonl").open()]
    assert scores[-1]["step"] == 20 and {"bleu", "chrf", "rougeL"} <= set(scores[-1])
    run("t5x.infer", RUN_FILES[2], "MIXTURE_OR_TASK_NAME='mt_en_fr'",
        f"CHECKPOINT_PATH='{ft / 'checkpoint_20'}'", f"INFER_OUTPUT_DIR='{out}'", module)  # fmt: skip
    lines = (out / "mt_en_fr-predict.jsonl-00000-of-00001").read_text().splitlines()
    assert lines and all("prediction" in json.loads(x) for x in lines)
