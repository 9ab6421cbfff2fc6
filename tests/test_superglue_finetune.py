"""The SuperGLUE finetuning recipe (experiments/superglue.gin over mt_finetune.gin): what it
resolves to, and one tiny non-pretrained finetune on the `super_glue` mixture through the gin
files, decoded and scored with the official metrics per task."""

from __future__ import annotations

import json
import os
import shutil

import gin
import pytest

from rundir import records as rundir_records
from trainer import gin_entry
from trainer import train as train_lib

pytestmark = pytest.mark.usefixtures("clean_gin")

SUPERGLUE = os.path.join(os.path.dirname(__file__), "fixtures", "superglue", "hf")
E2E_TASKS = ("super_glue_cb", "super_glue_record")


def _resolve(name):
    value = gin_entry.macro_value(name)
    return value.scoped_configurable_fn() if hasattr(value, "scoped_configurable_fn") else value


def _parse_paper(*extra):
    recipe = ["--gin_file=experiments/mt_finetune.gin", "--gin_file=experiments/superglue.gin"]
    paper = ["--gin.MODEL_DIR='/xl/run'", "--gin.MODEL_SIZE='t5_3b'"]
    return gin_entry.parse([*recipe, *paper, "--gin.VOCAB_PATH='/xl/v.model'", *extra], job="train")


def test_recipe_resolves_to_appendix_b():
    _parse_paper("--gin.TASK='super_glue_boolq'", "--gin.INIT_CHECKPOINT='/xl/pre@100000'")
    assert _resolve("MIXTURE_OR_TASK_NAME") == "super_glue_boolq"
    assert _resolve("EVAL_TASKS") == _resolve("DECODE_TASKS") == ["super_glue_boolq"]
    # App. B: batch 128, sequence length 512, 300 steps; scored on validation (test is unlabelled).
    assert _resolve("BATCH_SIZE") == 128 and _resolve("TRAIN_STEPS") == 300
    assert _resolve("TASK_FEATURE_LENGTHS") == {"inputs": 512, "targets": 512}
    assert (_resolve("DECODE_METHOD"), _resolve("DECODE_SPLIT")) == ("greedy", "validation")
    assert gin.query_parameter("downstream.DecodeConfig.max_decode_len") == 32
    # The mixture evaluates and decodes every task.
    gin.clear_config()
    _parse_paper("--gin.TASK='super_glue'")
    tasks = _resolve("EVAL_TASKS")
    assert len(tasks) == 8 and _resolve("DECODE_TASKS") == tasks and "super_glue_wsc" in tasks


@pytest.mark.slow
def test_tiny_finetune_on_the_mixture_scores_every_task(tiny_data, tmp_path, seqio_state):
    corpora = tmp_path / "corpora"
    shutil.copytree(tiny_data["corpora"], corpora)
    for task in E2E_TASKS:
        config = task.removeprefix("super_glue_")
        shutil.copytree(
            os.path.join(SUPERGLUE, "aps", "super_glue", config), corpora / "super_glue" / config
        )
    model_dir = tmp_path / "sg"
    saved = seqio_state.snapshot()
    try:
        config = gin_entry.parse(
            [
                "--gin_file=experiments/mt_finetune.gin",
                "--gin_file=experiments/superglue.gin",
                "--gin_file=experiments/t5_tiny.gin",
                f"--gin.MODEL_DIR='{model_dir}'",
                f"--gin.DATA_DIR='{corpora}'",
                f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
                "--gin.TASK='super_glue'",
                "--gin.STRATEGY='finetune_scratch'",
                f"--gin.EVAL_TASKS={list(E2E_TASKS)}",
                f"--gin.DECODE_TASKS={list(E2E_TASKS)}",
                "--gin.TRAIN_STEPS=2",
                "--gin.partitioning.MeshConfig.num_devices=1",
            ],
            job="train",
        )
        result = gin_entry.call(train_lib.train, config)
    finally:
        seqio_state.restore(saved)
    assert result.completed
    last = rundir_records.read_metrics(model_dir)[-1]
    assert last["step"] == 2
    assert set(last["tokens_by_task"]) == set(E2E_TASKS)
    expected = {
        "super_glue_cb": ("accuracy", "f1", "score"),
        "super_glue_record": ("f1", "em", "score"),
    }
    for task, metrics in expected.items():
        assert last[f"eval/{task}/loss"] > 0
        for metric in metrics:
            assert 0.0 <= last[f"eval/{task}/{metric}"] <= 100.0, (task, metric)
        assert f"eval/{task}/bleu" not in last
    assert last["eval/super_glue_cb/decoded"] == 3  # CB's three validation records
    assert last["eval/super_glue_record/decoded"] == 3  # two queries, one pair per answer
    lines = (model_dir / "predictions" / "super_glue_cb_2.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["inputs"].startswith("cb hypothesis: ")
