"""The SuperGLUE finetunes as runs of mt_paper.toml (MT App. B): the shipped manifest expands to
every task × checkpoint × LR with the recipe's gin."""

from __future__ import annotations

import collections
from pathlib import Path

from launch import sweep
from pipelines import superglue_text

# App. B's seven tasks: every SuperGLUE task the pipelines convert but WSC, which App. B does not
# name (fitting.paper_quotes QUOTES["mt.appB_tasks"]).
TASKS = sorted(set(superglue_text.TASK_CONFIGS) - {"super_glue_wsc"})
INIT_STEPS = 8  # mt_paper.toml's kept checkpoints
LRS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5)  # App. B's grid


def _manifest(tmp_path) -> Path:
    del tmp_path
    return sweep.MANIFESTS_DIR / "mt_paper.toml"


def test_superglue_finetunes_expand_with_the_recipe(tmp_path):
    runs = sweep.expand(sweep.load_manifest(str(_manifest(tmp_path))))
    sg = [r for r in runs if str(r.coord("task") or "").startswith("super_glue_")]
    counts = collections.Counter((r.strategy.value, r.coord("task")) for r in sg)
    for task in TASKS:
        assert counts["finetune", task] == INIT_STEPS * len(LRS), task
        assert counts["finetune_scratch", task] == len(LRS), task
    assert len(sg) == len(TASKS) * len(LRS) * (INIT_STEPS + 1) and len(TASKS) == 7
    for run in sg:
        assert run.gin_files == ("experiments/mt_finetune.gin", "experiments/superglue.gin")
        assert (run.steps, run.batch_size) == (300, 128)  # App. B: 300 steps of 128
        argv = run.argv(allow_missing=True)
        assert f"--gin.TASK='{run.coord('task')}'" in argv
        assert "--gin.FINETUNE_RECIPE='paper_300'" in argv and "--gin.EVAL_PERIOD=50" in argv
        assert float(run.coord("PEAK_LR")) in LRS
        if run.strategy.value == "finetune":
            assert run.coord("mixture") == "mix_en_100"
    # The translation finetunes keep their gin files.
    mt = [r for r in runs if str(r.coord("task") or "").startswith("mt_")]
    assert mt and all("experiments/superglue.gin" not in r.gin_files for r in mt)
