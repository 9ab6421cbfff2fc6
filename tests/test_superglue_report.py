"""The SuperGLUE report (MT paper App. B, Fig. 6) on hand-written run directories: per-task and
average score series against Dp with the log-law, cross-entropy with the power law, baselines,
the figure and the markdown section."""

import json
import math

import numpy as np
import pytest
from run_dir_files import write_run_dir

from fitting.laws import formulas as laws
from fitting.readers import points
from fitting.readers import run_dirs as io
from fitting.reports import superglue as sg

STEPS = (100, 200, 300, 500, 750, 1000)
TOKENS_PER_STEP = 4096
TASKS = ("super_glue_boolq", "super_glue_cb", "super_glue_rte")
# Per task: the log-law of its score and the power law of its CE (increasing / decreasing in Dp).
SCORE_LAWS = {
    "super_glue_boolq": {"log_A": -8.0, "alpha": 1.0, "beta": 1.2},
    "super_glue_cb": {"log_A": -6.0, "alpha": 0.9, "beta": 1.0},
    "super_glue_rte": {"log_A": -7.0, "alpha": 1.0, "beta": 1.1},
}
CE_LAW = {"E": 0.4, "A": 30.0, "alpha": 0.3}
BASELINE = {"super_glue_boolq": 60.0, "super_glue_cb": 50.0, "super_glue_rte": 52.0}


def _meta(strategy, task, **extra):
    return {
        "model": "t5_tiny",
        "family": "t5",
        "strategy": strategy,
        "languages": ["en"],
        "mixture_or_task": task,
        "components": [task],
        "train_steps": 300,
        **extra,
    }


def _dp():
    return np.asarray(STEPS, float) * TOKENS_PER_STEP


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sg_runs")
    recs = [{"step": s, "tokens": s * TOKENS_PER_STEP, "train/loss": 3.0} for s in STEPS]
    write_run_dir(root, "pretrain_en", _meta("pretrain", "mix_en_100"), recs)
    dp = _dp()
    for i, s in enumerate(STEPS):
        rec = {"step": 300, "tokens": 300 * 64}
        for task in TASKS:
            rec[f"eval/{task}/score"] = float(laws.log_law(dp, **SCORE_LAWS[task])[i])
            rec[f"eval/{task}/loss"] = float(laws.power_law(dp, **CE_LAW)[i])
        meta = _meta(
            "finetune",
            "super_glue",
            init_checkpoint=f"{root / 'pretrain_en'}@{s}",
            init_step=s,
        )
        write_run_dir(root, f"sg_step{s}", meta, [rec])
    base = {"step": 300, "tokens": 300 * 64}
    for task in TASKS:
        base[f"eval/{task}/score"] = BASELINE[task]
        base[f"eval/{task}/loss"] = 2.0
    write_run_dir(root, "sg_scratch", _meta("finetune_scratch", "super_glue"), [base])
    return root


@pytest.fixture(scope="module")
def runs(runs_dir):
    return io.read_runs(runs_dir)


def test_every_task_and_the_average_gets_its_law(runs):
    found = sg.entries(runs, dp_unit="target")
    keys = sorted((e.task, e.metric) for e in found)
    assert keys == sorted((t, m) for t in (*TASKS, sg.AVERAGE) for m in ("score", "loss"))
    dp = _dp()
    for e in found:
        assert e.fit is not None and e.fit.converged, (e.task, e.metric, e.note)
        assert e.series.key[0] == "mix_en_100"
        np.testing.assert_allclose(e.series.Dp, dp)
        # Points on the laws: the held-out checkpoints are predicted (log error ~ 0).
        assert e.fit.prediction_error < 1e-6, (e.task, e.metric)
    by = {(e.task, e.metric): e for e in found}
    boolq = by["super_glue_boolq", "score"].fit
    assert boolq.params["beta"] == pytest.approx(1.2, rel=1e-3)
    assert boolq.params["alpha"] == pytest.approx(1.0, rel=1e-3)
    average = by[sg.AVERAGE, "score"].series
    want = np.mean([laws.log_law(dp, **SCORE_LAWS[t]) for t in TASKS], axis=0)
    np.testing.assert_allclose(average.values, want)
    assert average.baseline == pytest.approx(np.mean(list(BASELINE.values())))
    assert by[sg.AVERAGE, "loss"].series.baseline == pytest.approx(2.0)


def test_too_few_or_zero_scores_are_drawn_without_a_law():
    def series(dp, values):
        return points.DownstreamSeries(
            key=("mix_en_100", "super_glue_cb", "300"),
            metric="score",
            Dp=np.asarray(dp, float),
            values=np.asarray(values, float),
            runs=tuple(f"r{i}" for i in range(len(dp))),
        )

    two = sg._fit("super_glue_cb", series([1e6, 2e6], [10.0, 20.0]))
    assert two.fit is None and two.note == "2 checkpoint(s): a law needs 3"
    zero = sg._fit("super_glue_cb", series([1e6, 2e6, 4e6], [0.0, 10.0, 20.0]))
    assert zero.fit is None and "positive" in zero.note
    three = sg._fit("super_glue_cb", series([1e6, 2e6, 4e6], [10.0, 20.0, 25.0]))
    assert three.fit is not None and three.fit.n_fit == 3


@pytest.mark.slow
def test_write_gives_figure_fits_and_section(runs, tmp_path):
    lines = sg.write(runs, tmp_path)
    png = tmp_path / sg.FIGURE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / sg.FITS).read_text())
    assert len(saved) == 2 * (len(TASKS) + 1)
    assert all(math.isfinite(r["fit"]["params"]["beta"]) for r in saved if r["metric"] == "score")
    text = "\n".join(lines)
    assert text.startswith("## SuperGLUE (Appendix B, Fig. 6)")
    assert "| SuperGLUE average | score | t5_tiny | mix_en_100 | 6 |" in text
    assert f"![superglue]({sg.FIGURE})" in text


def test_runs_without_superglue_give_no_section(runs, tmp_path):
    pretrain_only = [r for r in runs if r.run_id == "pretrain_en"]
    assert sg.write(pretrain_only, tmp_path) == []
    assert not (tmp_path / sg.FIGURE).exists()


def test_the_mt_study_report_carries_the_section(runs_dir, tmp_path):
    from studies import mt_report

    mt_report.write(runs_dir=runs_dir, out_dir=tmp_path, log=lambda _: None)
    text = (tmp_path / "report.md").read_text()
    assert text.count("## SuperGLUE (Appendix B, Fig. 6)") == 1
    assert (tmp_path / sg.FIGURE).exists()
