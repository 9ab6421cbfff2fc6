"""The `t5x` runner: a manifest's runs as real T5X jobs (`python -m t5x.train`, the command form
agreed with `t5x_configs/t5x/`), through the same launchers; no T5X needed for any of this."""

import io
import json
import shlex
import tomllib

import pytest
from launch_fakes import DATA_SECTIONS

from launch import status, sweep, t5x_runner, tpu_vm, xm_launch
from launch.manifest import parse_manifest
from rundir.run_record import FINETUNES
from xlscale_cli.main import main

MANIFEST = (
    """
[sweep]
name = "t5x_small"
family = "t5"
runs_dir = "RUNS"
seq_len = 512
runner = "t5x"

"""
    + DATA_SECTIONS
    + """
[axes]
seeds = [0]
init_steps = [200]

[strategies.pretrain]
budget = { steps = 400, batch_size = 256 }

[strategies.finetune]
budget = { steps = 300, batch_size = 128 }
gin = { FINETUNE_UNIT = "paper" }

[strategies.finetune_scratch]
budget = { steps = 300, batch_size = 128 }
gin = { FINETUNE_UNIT = "paper" }

[[grid]]
strategies = ["pretrain"]
sizes = ["t5_770m"]
mixtures = ["mix_en_100"]

[[grid]]
strategies = ["finetune", "finetune_scratch"]
sizes = ["t5_770m"]
mixtures = ["mix_en_100"]
tasks = ["mt_en_de"]
finetune_tokens = [6_000_000]
gin_axes = { PEAK_LR = [0.001] }
"""
)
PATHS = t5x_runner.T5xPaths(t5x_dir="/opt/t5x", repo_dir="/src/xlscale")
VARS = {"DATA_DIR": "/data/corpora", "VOCAB_PATH": "/data/spm.model"}


def mt_paper_runs():
    """The runs of `mt_paper.toml` under the t5x runner."""
    text = sweep.resolve_manifest_path("mt_paper").read_text()
    manifest = parse_manifest(
        tomllib.loads(text), path="mt_paper.toml", variables=VARS, runner="t5x", t5x_paths=PATHS
    )
    return sweep.expand(manifest)


def expand(text=MANIFEST, *, paths=PATHS, runner=None):
    manifest = parse_manifest(
        tomllib.loads(text), path="t5x_small.toml", variables=VARS, runner=runner, t5x_paths=paths
    )
    return {r.strategy: r for r in sweep.expand(manifest)}


def test_t5x_command_lines_are_the_agreed_form():
    runs = expand()
    pre, ft, scratch = runs["pretrain"], runs["finetune"], runs["finetune_scratch"]
    assert pre.argv("python") == [
        "python",
        "-m",
        "t5x.train",
        "--gin_search_paths=/src/xlscale/t5x_configs,/opt/t5x",
        "--gin_file=t5x/models/t5_770m.gin",
        "--gin_file=t5x/runs/span_pretrain.gin",
        f"--gin.MODEL_DIR='{pre.model_dir}'",
        "--gin.MIXTURE_OR_TASK_NAME='mix_en_100'",
        "--gin.TRAIN_STEPS=400",
        "--gin.MIXTURE_OR_TASK_MODULE='t5x_configs.t5x_tasks'",
        "--gin.RANDOM_SEED=0",
    ]
    assert ft.argv("python")[3:] == [
        "--gin_search_paths=/src/xlscale/t5x_configs,/opt/t5x",
        "--gin_file=t5x/models/t5_770m.gin",
        "--gin_file=t5x/runs/finetune.gin",
        f"--gin.MODEL_DIR='{ft.model_dir}'",
        "--gin.MIXTURE_OR_TASK_NAME='mt_en_de'",
        "--gin.TRAIN_STEPS=500",  # T5X counts on from the restored step 200
        "--gin.MIXTURE_OR_TASK_MODULE='t5x_configs.t5x_tasks'",
        "--gin.RANDOM_SEED=0",
        f"--gin.INITIAL_CHECKPOINT_PATH='{pre.model_dir}/checkpoint_200'",
        "--gin.FINETUNE_STEPS=300",
        "--gin.FINETUNE_TOKENS=6000000",
        "--gin.PEAK_LR=0.001",
    ]
    assert ft.parent == pre.run_id and ft.depends_on == (pre.run_id,)
    assert "--gin.TRAIN_STEPS=300" in scratch.argv("python")
    assert "--gin.INITIAL_CHECKPOINT_PATH=None" in scratch.argv("python")
    assert "--gin.FINETUNE_STEPS=300" in scratch.argv("python")
    assert ft.environment() == {
        "XLSCALE_VOCAB_PATH": "/data/spm.model",
        "XLSCALE_DATA_DIR": "/data/corpora",
        "XLSCALE_FINETUNE_PAIRS": "11719",  # Df 6,000,000 / 512, the paper's unit
    }


def test_the_sweeps_seed_reaches_t5x():
    # T5X's RANDOM_SEED = None drew a time-based seed per run.
    runs = expand(MANIFEST.replace("seeds = [0]", "seeds = [7]"))
    for run in runs.values():
        assert "--gin.RANDOM_SEED=7" in run.argv("python"), run.run_id


def test_runner_flag_overrides_the_manifest_and_changes_only_t5x_ids():
    xl = expand(MANIFEST.replace('runner = "t5x"\n', ""))
    again = expand(MANIFEST.replace('runner = "t5x"\n', ""), runner="xlscale")
    t5x = expand(MANIFEST.replace('runner = "t5x"\n', ""), runner="t5x")
    assert xl["pretrain"].argv("python")[2] == "trainer.train"
    assert xl["pretrain"].run_id == again["pretrain"].run_id != t5x["pretrain"].run_id
    assert t5x["pretrain"].module == "t5x.train"
    with pytest.raises(ValueError, match=r"t5x_small.toml \[sweep\] runner: unknown runner 'nope'"):
        expand(runner="nope")


def test_tiny_is_an_overlay_after_the_run_file():
    runs = expand(MANIFEST.replace('sizes = ["t5_770m"]', 'sizes = ["t5_tiny"]'))
    files = [a for a in runs["finetune"].argv("python") if a.startswith("--gin_file=")]
    assert files == [
        "--gin_file=t5x/models/t5_770m.gin",
        "--gin_file=t5x/runs/finetune.gin",
        "--gin_file=t5x/models/tiny.gin",
    ]


def test_unsupported_size_names_manifest_run_and_allowed_values():
    text = MANIFEST.replace('sizes = ["t5_770m"]', 'sizes = ["t5_base"]')
    with pytest.raises(ValueError) as err:
        expand(text)
    msg = str(err.value)
    assert "t5x_small.toml run pretrain_t5_base" in msg and "size 't5_base'" in msg
    assert "allowed: t5_770m, t5_3b, t5_tiny" in msg


def test_missing_t5x_dir_and_vocab_macros_are_clear_errors():
    runs = expand(paths=t5x_runner.T5xPaths(t5x_dir="", repo_dir="/src/xlscale"))
    dry = runs["pretrain"].argv("python", allow_missing=True)
    assert dry[3] == "--gin_search_paths=/src/xlscale/t5x_configs,${T5X_DIR}"
    with pytest.raises(ValueError, match="pass --t5x-dir DIR or set T5X_DIR"):
        runs["pretrain"].argv("python")
    text = MANIFEST.replace('VOCAB_PATH = "${VOCAB_PATH}"\n', "")
    with pytest.raises(ValueError, match="t5x_small.toml run .*missing: VOCAB_PATH"):
        expand(text)["pretrain"].environment()


def test_tpu_vm_and_xmanager_dry_runs_start_t5x_train():
    runs = list(expand().values())
    launcher = tpu_vm.TpuVmLauncher(tpu="t", zone="z")
    remote = launcher.remote_command(runs[0])
    assert (
        "export PYTHONUNBUFFERED=1 XLSCALE_EXPECT_PLATFORM=tpu XLSCALE_VOCAB_PATH=/data/spm.model"
        in (remote)
    )
    assert remote.endswith(shlex.join(runs[0].argv(".venv/bin/python")))
    stream = io.StringIO()
    report = xm_launch.XManagerLauncher(title="t").launch(
        runs, dry_run=True, progress=status.Progress(runs, stream=stream)
    )
    assert "container python -m t5x.train from" in stream.getvalue()
    units = [json.loads(line) for line in report.commands if line.startswith("  {")]
    assert {u["module"] for u in units} == {"t5x.train"}
    for unit in units:
        run = next(r for r in runs if r.run_id == unit["work_unit"])
        assert unit["args"] == run.gin_args() and unit["env_vars"] == run.environment()


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["tpu_vm", "xmanager"])
def test_cli_dry_run_of_the_mt_paper_under_t5x(launcher, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("T5X_DIR", "/opt/t5x")
    args = ["sweep", "run", "mt_paper", "--runner", "t5x", "--launcher", launcher, "--dry-run"]
    args += [
        "--runs-dir",
        str(tmp_path),
        "--only",
        "*t5_770m_mix_en_100*mt_en_de_df6M_*peak_lr0.001*",
    ]
    args += ["--tpu", "t", "--zone", "z"] if launcher == "tpu_vm" else []
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "t5x.train" in out and "trainer.train" not in out
    assert "t5x/models/t5_770m.gin" in out and "t5x/runs/finetune.gin" in out
    assert "t5x/runs/span_pretrain.gin" in out and "INITIAL_CHECKPOINT_PATH" in out
    assert "/opt/t5x" in out and not any(tmp_path.iterdir())


def test_t5x_runs_finish_at_their_last_checkpoint_and_select_on_their_summaries(tmp_path):
    from t5x_run_dirs import write_t5x_run

    from launch import run_selection

    text = MANIFEST.replace('runs_dir = "RUNS"', f'runs_dir = "{tmp_path}"')
    runs = expand(text)
    pre, ft = runs["pretrain"], runs["finetune"]
    assert ft.done_marker == "checkpoint_500" and pre.done_marker == "checkpoint_400"
    assert not status.is_completed(pre)
    write_t5x_run(
        tmp_path, pre.run_id, task="mix_en_100", steps=400, ckpts=[200, 400], ce={400: 2.25}
    )
    assert status.is_completed(pre)
    assert status.run_status(pre).state == "done"
    assert run_selection.final_value(pre.model_dir, "train/loss") == (pytest.approx(2.25), 400)
    assert run_selection.final_value(pre.model_dir, "eval/nope/loss") == (None, None)


def test_a_recipe_and_a_budget_that_disagree_are_refused():
    text = MANIFEST.replace(
        "[strategies.finetune]\nbudget = { steps = 300, batch_size = 128 }\n"
        'gin = { FINETUNE_UNIT = "paper" }',
        "[strategies.finetune]\nbudget = { steps = 300, batch_size = 128 }\n"
        'gin = { FINETUNE_UNIT = "paper", FINETUNE_RECIPE = "raffel_2^18" }',
    )
    assert text != MANIFEST
    with pytest.raises(ValueError, match="FINETUNE_RECIPE 'raffel_2\\^18' trains 262144 steps"):
        expand(text)
    text = text.replace(
        'steps = 300, batch_size = 128 }\ngin = { FINETUNE_UNIT = "paper", F',
        'steps = 262144, batch_size = 128 }\ngin = { FINETUNE_UNIT = "paper", F',
    )
    assert "--gin.FINETUNE_RECIPE='raffel_2^18'" in expand(text)["finetune"].gin_args()
    with pytest.raises(ValueError, match="FINETUNE_RECIPE = 'raffel'.*'paper_300'"):
        expand(text.replace("raffel_2^18", "raffel"))


def test_a_token_budget_df_has_no_t5x_form():
    # FINETUNE_UNIT 'target' (a token budget) is the xlscale trainer's; the t5x runner refuses it
    # naming the run and the allowed unit, instead of finetuning on the whole split.
    text = MANIFEST.replace('gin = { FINETUNE_UNIT = "paper" }\n', "", 1)
    runs = expand(text)
    with pytest.raises(ValueError, match="t5x_small.toml run .*allowed under the t5x runner"):
        runs["finetune"].environment()
    assert "XLSCALE_FINETUNE_PAIRS" not in runs["pretrain"].environment()


@pytest.mark.slow
def test_the_mt_papers_vocabulary_reaches_t5x_and_unpassable_overrides_are_refused():
    # mt_paper.toml's MODEL_OVERRIDES vocab_size = 250112 must reach T5X's embedding (t5.gin's
    # VOCAB_SIZE, bound to sizes.get_config's vocab_size), not T5's default 32,128 rows.
    runs = mt_paper_runs()
    assert runs and all("--gin.VOCAB_SIZE=250112" in r.gin_args(allow_missing=True) for r in runs)
    # The finetuning recipe reaches T5X by name (config.gin) with its steps.
    finetune = next(r for r in runs if r.strategy == "finetune")
    args = finetune.gin_args(allow_missing=True)
    assert "--gin.FINETUNE_RECIPE='raffel_2^18'" in args and "--gin.FINETUNE_STEPS=262144" in args
    # Every passable field's macro is one t5x/models/t5.gin defines and hands to the same keyword.
    gin_text = (t5x_runner.REPO_ROOT / "t5x_configs/t5x/models/t5.gin").read_text()
    for field, macro in t5x_runner.OVERRIDE_MACROS.items():
        assert f"\n{macro} = " in gin_text and f"  {field} = %{macro}\n" in gin_text
    text = MANIFEST.replace(
        'VOCAB_PATH = "${VOCAB_PATH}"\n',
        'VOCAB_PATH = "${VOCAB_PATH}"\nMODEL_OVERRIDES = { vocab_size = 512, num_encoder_layers = 2 }\n',
        1,
    )
    with pytest.raises(
        ValueError, match="t5x_small.toml run .*cannot pass MODEL_OVERRIDES num_encoder_layers"
    ):
        expand(text)


@pytest.mark.slow
def test_the_step_0_evaluation_reaches_t5x_and_a_log_schedule_is_refused():
    # mt_paper.toml evaluates every finetune before its first update (EVAL_AT_START); under T5X
    # that is run_eval_before_training, bound to the same macro in both run files.
    finetunes = [r for r in mt_paper_runs() if r.strategy in FINETUNES]
    assert finetunes
    assert all("--gin.EVAL_AT_START=True" in r.gin_args(allow_missing=True) for r in finetunes)
    for run_file in ("finetune.gin", "span_pretrain.gin"):
        text = (t5x_runner.REPO_ROOT / "t5x_configs/t5x/runs" / run_file).read_text()
        # (every setting labelled as test_gin_labels checks)
        assert "\nEVAL_AT_START = False  # ours: T5X's default\n" in text
        assert "run_eval_before_training = %EVAL_AT_START\n" in text
    # Without the macro nothing is passed (T5X's default: no evaluation before training).
    assert not any("EVAL_AT_START" in a for a in expand()["finetune"].gin_args(allow_missing=True))
    # A log-spaced schedule cannot run under T5X: refused, naming the value and the allowed one.
    text = MANIFEST.replace(
        'VOCAB_PATH = "${VOCAB_PATH}"\n', 'VOCAB_PATH = "${VOCAB_PATH}"\nEVAL_SCHEDULE = "log"\n', 1
    )
    with pytest.raises(ValueError, match="t5x_small.toml run .*EVAL_SCHEDULE = 'log'.*'periodic'"):
        expand(text)


COMET_SETTINGS = """
[settings]
COMET_MODEL = "${COMET_MODEL}"
COMET_PYTHON = "/envs/comet/bin/python"
"""


def _with_comet(runner=None, *, model="/m/wmt22-comet-da/checkpoints/model.ckpt", text=MANIFEST):
    text = text.replace("[vars]\n", '[vars]\nCOMET_MODEL = "none"\n', 1) + COMET_SETTINGS
    manifest = parse_manifest(
        tomllib.loads(text),
        path="t5x_small.toml",
        variables={**VARS, "COMET_MODEL": model},
        runner=runner,
        t5x_paths=PATHS,
    )
    return {r.strategy: r for r in sweep.expand(manifest)}


@pytest.mark.slow
def test_comet_settings_reach_both_runners_and_keep_the_run_ids():
    model = "/m/wmt22-comet-da/checkpoints/model.ckpt"
    # xlscale's trainer: gin macros of the finetunes (the runs that decode), not of the pretraining.
    xl, plain = _with_comet("xlscale"), expand(runner="xlscale")
    assert {s: r.run_id for s, r in xl.items()} == {s: r.run_id for s, r in plain.items()}
    for strategy in FINETUNES:
        args = xl[strategy].gin_args()
        assert f"--gin.COMET_MODEL={model!r}" in args
        assert "--gin.COMET_PYTHON='/envs/comet/bin/python'" in args
    assert not any("COMET" in a for a in xl["pretrain"].gin_args())
    # Real T5X: the finetunes run the COMET wrapper with the model and interpreter in their
    # environment and the model recorded in config.gin; the pretraining runs t5x.train as before.
    t5x, plain = _with_comet(), expand()
    assert {s: r.run_id for s, r in t5x.items()} == {s: r.run_id for s, r in plain.items()}
    ft = t5x["finetune"]
    assert ft.module == t5x_runner.COMET_MODULE and ft.argv("python")[2] == "launch.t5x_comet"
    flag = f"--gin.COMET_MODEL={model!r}"
    assert [a for a in ft.argv("python")[3:] if a != flag] == plain["finetune"].argv("python")[3:]
    assert flag in ft.argv("python")
    env = ft.environment()
    assert env["XLSCALE_COMET_MODEL"] == model and env["COMET_PYTHON"] == "/envs/comet/bin/python"
    assert t5x["pretrain"].module == "t5x.train"
    assert "XLSCALE_COMET_MODEL" not in t5x["pretrain"].environment()
    # "none" turns COMET off: the agreed t5x.train form, no COMET flag.
    off = _with_comet(model="none")
    assert off["finetune"].argv("python") == plain["finetune"].argv("python")
    assert "XLSCALE_COMET_MODEL" not in off["finetune"].environment()
    # mt_paper declares both, off by default.
    text = sweep.resolve_manifest_path("mt_paper").read_text()
    assert '[settings]\nCOMET_MODEL = "${COMET_MODEL}"\nCOMET_PYTHON = "${COMET_PYTHON}"\n' in text
    assert all(r.module == "t5x.train" for r in mt_paper_runs())


def test_unknown_settings_and_values_are_refused_naming_the_key_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"unknown setting 'COMET_MODE'; allowed: COMET_MODEL"):
        expand(MANIFEST + '[settings]\nCOMET_MODE = "none"\n')
    with pytest.raises(ValueError, match=r"COMET_MODEL = '/m/model.bin': allowed: 'none'.*\.ckpt"):
        _with_comet(model="/m/model.bin")
    with pytest.raises(ValueError, match=r"\[settings\] COMET_PYTHON = 3: give a string"):
        expand(MANIFEST + "[settings]\nCOMET_PYTHON = 3\n")


def test_a_finetune_recipe_axis_sets_each_runs_steps_and_reaches_t5x_once():
    text = MANIFEST.replace(
        "gin_axes = { PEAK_LR = [0.001] }",
        'gin_axes = { PEAK_LR = [0.001], FINETUNE_RECIPE = ["raffel_2^18", "paper_300"] }',
    )
    manifest = parse_manifest(
        tomllib.loads(text), path="t5x_small.toml", variables=VARS, t5x_paths=PATHS
    )
    runs = [r for r in sweep.expand(manifest) if r.strategy == "finetune"]
    steps = {r.coord("FINETUNE_RECIPE"): r.steps for r in runs}
    assert steps == {"raffel_2^18": 2**18, "paper_300": 300}  # the budget's 300 yields
    for run in runs:
        recipe = run.coord("FINETUNE_RECIPE")
        args = run.gin_args()
        assert [a for a in args if a.startswith("--gin.FINETUNE_RECIPE=")] == [
            f"--gin.FINETUNE_RECIPE={recipe!r}"
        ]
        assert f"--gin.FINETUNE_STEPS={steps[recipe]}" in args
        assert f"--gin.TRAIN_STEPS={steps[recipe] + 200}" in args  # from the checkpoint's step
    assert len({r.run_id for r in runs}) == 2
    with pytest.raises(ValueError, match=r"t5x_small.toml run finetune.*FINETUNE_RECIPE = 'p'"):
        sweep.expand(
            parse_manifest(
                tomllib.loads(text.replace('"paper_300"', '"p"')),
                path="t5x_small.toml",
                variables=VARS,
                t5x_paths=PATHS,
            )
        )


@pytest.mark.slow
def test_mt_papers_finetunes_evaluate_at_several_steps_under_t5x():
    # T5X evaluates (validation loss and decoding, hence COMET) every EVAL_PERIOD steps: 16
    # points of 'raffel_2^18', 6 of 'paper_300', among which the best step is chosen.
    periods = {"raffel_2^18": 16384, "paper_300": 50}
    finetunes = [r for r in mt_paper_runs() if r.strategy in FINETUNES]
    assert {r.coord("FINETUNE_RECIPE") for r in finetunes} == set(periods)
    for run in finetunes:
        period = periods[run.coord("FINETUNE_RECIPE")]
        assert f"--gin.EVAL_PERIOD={period}" in run.gin_args(allow_missing=True)
        assert not any("DECODE_PERIOD" in a for a in run.gin_args(allow_missing=True))
