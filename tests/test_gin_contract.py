"""Typos never pass silently: every gin macro and binding set on the command line, in a gin file
or in a sweep manifest must mean something, and the errors name the flag, the file and the
allowed values."""

from __future__ import annotations

import logging
import textwrap

import pytest
from gin_values import BASE, resolve

from launch import sweep
from trainer import data, gin_entry, validation

pytestmark = pytest.mark.usefixtures("clean_gin")


def parse(*extra: str, files=("experiments/cpt_source_en.gin",), job: str = "train"):
    return gin_entry.parse([*(f"--gin_file={f}" for f in files), *BASE, *extra], job=job)


def test_a_misspelt_macro_on_the_command_line_is_an_error_with_the_nearest_name():
    with pytest.raises(validation.ConfigError) as e:
        parse("--gin.TRAIN_STEP=3")
    assert str(e.value) == (
        "gin macro TRAIN_STEP (set by --gin.TRAIN_STEP=3) is used by nothing in the "
        "configuration; did you mean TRAIN_STEPS?"
    )


def test_a_macro_no_file_reads_is_an_error_naming_the_file_line(tmp_path):
    (tmp_path / "mine.gin").write_text("include 'experiments/cpt_source_en.gin'\nEVAL_PERIDO = 5\n")
    with pytest.raises(validation.ConfigError, match=r"EVAL_PERIDO \(set in .*mine.gin:2\)") as e:
        gin_entry.parse(
            ["--gin_file=mine.gin", f"--gin_search_paths={tmp_path}", *BASE], job="train"
        )
    assert "did you mean EVAL_PERIOD?" in str(e.value)


def test_macros_only_another_job_reads_are_logged_not_refused(caplog):
    # runs/infer.gin reads no EVAL_TASKS, runs/eval.gin does: a shared command line stays valid.
    with caplog.at_level(logging.WARNING, logger="trainer.gin_checks"):
        parse(
            "--gin.EVAL_TASKS=['lm_en']", files=("models/llama2.gin", "runs/infer.gin"), job="infer"
        )
    assert "EVAL_TASKS (set by --gin.EVAL_TASKS=['lm_en']) is not read" in caplog.text


@pytest.mark.parametrize(
    "flag, expected",
    [
        (
            "--gin.partitioning.MeshConfig.fsdpp=8",
            r"partitioning.MeshConfig.fsdpp \(set by --gin.partitioning.MeshConfig.fsdpp=8\).*"
            r"did you mean fsdp\? \(allowed: data, fsdp, model, num_devices, device_memory_gib, num_slices\)",
        ),
        (
            "--gin.partitioning.MeshConfg.fsdp=8",
            r"no configurable 'partitioning.MeshConfg'; did you mean partitioning.MeshConfig ",
        ),
        (
            "--gin.MIXTURE_OR_TASK_NAME=@recipes.lm_tsk()",
            r"recipes.lm_tsk \(set by --gin.MIXTURE_OR_TASK_NAME=@recipes.lm_tsk\(\)\).*"
            r"did you mean recipes.lm_task ",
        ),
        (
            "--gin.EVAL_PERIOD=%CHECKPOINT_PERIODD",
            r"CHECKPOINT_PERIODD \(read by --gin.EVAL_PERIOD=%CHECKPOINT_PERIODD\) is set nowhere; "
            r"did you mean CHECKPOINT_PERIOD ",
        ),
    ],
)
def test_unknown_configurables_parameters_and_macros_name_the_flag(flag, expected):
    with pytest.raises(validation.ConfigError, match=expected):
        parse(flag)


MANIFEST = """
[sweep]
name = "t"
seq_len = 128
gin_files = ["experiments/tiny.gin", "mine.gin"]
gin_search_paths = ["{user}"]

[gin]
EVAL_PERIOD = 10
MY_SETTING = 1

[axes]
sizes = ["llama2_cpu_d64"]
strategies = ["source"]

[budget]
steps = 5
batch_size = 8
"""


def test_manifest_gin_keys_are_checked_before_any_job(tmp_path):
    user = tmp_path / "gin"
    user.mkdir()
    (user / "mine.gin").write_text("include 'common/extra.gin'\n")
    (user / "common").mkdir()
    (user / "common" / "extra.gin").write_text("train_script.RunInfo.strategy = %MY_SETTING\n")
    path = tmp_path / "m.toml"
    path.write_text(textwrap.dedent(MANIFEST.format(user=user)))
    assert sweep.expand(sweep.load_manifest(path))  # MY_SETTING: read by a user file's include
    path.write_text(path.read_text().replace("EVAL_PERIOD", "EVAL_PERIDO"))
    with pytest.raises(validation.ConfigError) as e:
        sweep.load_manifest(path)
    assert f"EVAL_PERIDO (set in {path} [gin])" in str(e.value)
    assert "did you mean EVAL_PERIOD?" in str(e.value)
    path.write_text(
        path.read_text().replace("EVAL_PERIDO", "EVAL_PERIOD")
        + "\n[strategies.source]\ngin = { PEAK_RL = 1e-3 }\n"
    )
    with pytest.raises(validation.ConfigError, match=r"\[strategies.source\] gin.*PEAK_LR"):
        sweep.load_manifest(path)


def test_a_manifest_cannot_set_a_coordinate_through_a_strategys_gin(tmp_path):
    # REPLAY_RATIO on plain CPT would be recorded, never applied.
    user = tmp_path / "gin"
    user.mkdir()
    (user / "mine.gin").write_text("train_script.RunInfo.strategy = %MY_SETTING\n")
    path = tmp_path / "m.toml"
    path.write_text(
        textwrap.dedent(MANIFEST.format(user=user))
        + "\n[strategies.source]\ngin = { REPLAY_RATIO = 0.3 }\n"
    )
    with pytest.raises(ValueError, match=r"\[strategies.source\] gin: REPLAY_RATIO is a sweep"):
        sweep.load_manifest(path)


def test_an_unregistered_replay_ratio_names_the_macro_and_the_allowed_values():
    parse("--gin.REPLAY_RATIO=0.15", files=("experiments/cpt_replay.gin",))
    with pytest.raises(validation.ConfigError) as e:
        resolve("MIXTURE_OR_TASK_NAME")
    assert "REPLAY_RATIO = 0.15" in str(e.value)
    assert "allowed: 0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8" in str(e.value)


def test_a_missing_vocabulary_names_the_macro_and_the_path(tmp_path):
    missing = tmp_path / "nothing.model"
    with pytest.raises(validation.ConfigError) as e:
        data.register(data.DataConfig(vocab_path=str(missing)))
    assert f"VOCAB_PATH (data.DataConfig.vocab_path) = '{missing}'" in str(e.value)
