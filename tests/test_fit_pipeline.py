"""`fitting.reports.fit_all.fit_runs` and `xlscale fit` end to end on synthetic run directories."""

import json
import re
import shutil

import numpy as np
import pytest
from fit_inputs import SMALL_GRID, given_fit

from fitting.checks import FitInputError
from fitting.laws import robust_fit, synthetic
from fitting.readers import points, run_dirs
from fitting.reports import fit_all
from xlscale_cli.main import main


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    synthetic.write_study(root, sizes=(3e7, 1e8, 3e8, 1e9), evals=6, replay_ratios=(0.05, 0.5))
    return root


@pytest.fixture(scope="module")
def result(study, tmp_path_factory):
    out = tmp_path_factory.mktemp("fits")
    return out, fit_all.fit_runs(study, out, bootstrap=5, grid=SMALL_GRID)


@pytest.mark.slow
def test_fit_runs_writes_every_output(result):
    out, res = result
    # The synthetic study has no zero-shot results (tests/test_fit_zeroshot.py has).
    assert res["skipped"] == {
        "zeroshot": "no run has zero-shot results (MODEL_DIR/zeroshot/<step>.json)"
    }
    assert {"chinchilla", "cpt", "compute", "transfer", "replay", "bleu", "ce"} <= set(res)
    saved = json.loads((out / "fits.json").read_text())
    assert saved["converged"] == (not saved["warnings"])
    for name in saved["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {
        "loss_compute_zh.png",
        "transfer_zh.png",
        "replay_zh.png",
        "isoloss_zh.png",
        "bleu_bleu_mt_en_fr.png",
        "ce_loss_mt_en_fr.png",
    } <= set(saved["plots"])
    text = (out / "report.md").read_text()
    for heading in (
        "From-scratch Chinchilla",
        "CPT law",
        "Loss–compute frontier",
        "Transfer",
        "Forgetting under replay",
        "Downstream translation scores",
        "cross-entropy",
    ):
        assert heading in text


def _significant_digits(text: str) -> list[int]:
    """Significant digits of every decimal number in `text` (mantissas like 3.490240591455167)."""
    return [len(m.replace(".", "").lstrip("0")) for m in re.findall(r"\d*\.\d+", text)]


@pytest.mark.slow
def test_report_rounds_numbers_for_people(result):
    out, _ = result
    text = (out / "report.md").read_text()
    cells = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    assert _significant_digits(cells) and max(_significant_digits(cells)) <= 4
    assert max(_significant_digits(text)) < 10  # never a 16-digit repr (fits.json has those)
    assert max(_significant_digits((out / "fits.json").read_text())) > 10  # unrounded there
    # The check itself fails on a report that prints a float's full repr.
    assert max(_significant_digits("| E | 3.490240591455167 |")) > 4


def test_cli_law_choices_are_the_pipeline_steps():
    import argparse

    from xlscale_cli import fit as fit_cli

    parser = argparse.ArgumentParser()
    fit_cli.add_arguments(parser)
    law = next(a for a in parser._actions if a.dest == "law")
    assert tuple(law.choices) == fit_all.LAWS
    assert fit_all.LAWS == (
        "chinchilla",
        "cpt",
        "compute",
        "transfer",
        "replay",
        "bleu",
        "ce",
        "zeroshot",
        "lr_area",
        "all",
    )


def test_fits_json_is_unrounded_and_matches_a_direct_fit(study, result):
    out, _ = result
    saved = json.loads((out / "fits.json").read_text())
    zh = saved["chinchilla"]["zh"]["fit"]
    runs = run_dirs.read_runs(study)
    pts = points.pool(points.curves(runs, strategies=("source", "scratch"), language="zh"))
    direct = robust_fit.fit_chinchilla(pts.N, pts.D, pts.L, runs=pts.runs, grid=SMALL_GRID)
    assert zh["params"] == direct.params  # exact floats survive the export
    assert zh["converged"] is True and zh["n_bootstrap"] == 5 and len(zh["ci"]) == 5
    cpt = saved["cpt"]["zh"]
    assert cpt["fit"]["fixed"] == ["E", "A", "alpha"]
    assert cpt["fit"]["params"]["gamma"] == pytest.approx(synthetic.CPT["gamma"], abs=0.03)
    assert cpt["allocation"]["valid"] is True
    assert cpt["appendix_b"]["mean_huber_cpt"] <= cpt["appendix_b"]["mean_huber_chinchilla"] * 1.01
    bleu = saved["bleu"][0]
    assert bleu["alignment"] == pytest.approx(1.0)  # 50/50 en–fr for en→fr
    assert bleu["verdict"]["kind"] == "law_fits"
    saved_transfer = saved["transfer"]["zh"]
    assert len(saved_transfer["curves"]) == 4 and len(saved_transfer["law"]) == 4


def test_report_flags_non_converged_fits():
    bad = given_fit(
        "chinchilla",
        {"E": 1.0, "A": 2.0, "B": 3.0, "alpha": 0.3, "beta": 0.2},
        objective=1.0,
        converged=False,
        grad_norm=0.25,
        n_points=10,
        n_runs=2,
    )
    res = {
        "runs_dir": "x",
        "n_runs": 2,
        "law": "chinchilla",
        "bootstrap": 0,
        "seed": 0,
        "warnings": ["chinchilla/zh: fit did NOT converge (gradient 0.25)"],
        "skipped": {},
        "plots": [],
        "chinchilla": {
            "zh": {
                "fit": bad.to_dict(),
                "allocation": {"valid": False, "note": "n/a"},
                "allocation_ci": {},
            }
        },
    }
    text = fit_all.render_report(res)
    assert "did not converge" in text and "**NOT CONVERGED** (gradient 0.25)" in text


def test_cli_fit_runs_and_reports(study, tmp_path, capsys):
    code = main(
        [
            "fit",
            "--runs",
            str(study),
            "--law",
            "compute",
            "--out",
            str(tmp_path / "o"),
            "--bootstrap",
            "0",
        ]
    )
    assert code in (0, 3)
    saved = json.loads((tmp_path / "o" / "fits.json").read_text())
    assert set(saved["compute"]) == {"en", "zh"} and "chinchilla" not in saved
    assert "wrote" in capsys.readouterr().out


def test_cli_bad_input_names_the_run(study, tmp_path, capsys):
    broken = tmp_path / "runs"
    broken.mkdir()
    (broken / "stalled_run").mkdir()
    (broken / "stalled_run" / "run.json").write_text("{}")
    code = main(["fit", "--runs", str(broken), "--out", str(tmp_path / "o"), "--bootstrap", "0"])
    assert code == 1
    assert "stalled_run" in capsys.readouterr().err
    only_scratch = tmp_path / "scratch_only"
    only_scratch.mkdir()
    for d in study.glob("scratch_*"):
        (only_scratch / d.name).mkdir()
        for f in d.iterdir():
            (only_scratch / d.name / f.name).write_bytes(f.read_bytes())
    with pytest.raises(FitInputError, match="replay: no cpt_replay runs"):
        fit_all.fit_runs(only_scratch, tmp_path / "o2", law="replay", bootstrap=0)
    with pytest.raises(ValueError, match="unknown law"):
        fit_all.fit_runs(only_scratch, tmp_path / "o3", law="kaplan")
    assert np.isfinite(json.loads(json.dumps(1.0)))


@pytest.mark.slow
def test_a_zero_score_skips_only_its_series(tmp_path):
    """A BLEU of 0 cannot be fitted by the log-law: that series is skipped, with the reason,
    and the other scores and the cross-entropy are still fitted."""
    root = tmp_path / "runs"
    synthetic.write_study(root, sizes=(3e7, 1e8), evals=3, replay_ratios=())
    first = sorted(root.glob("finetune_en_fr_*"), key=lambda d: int(d.name.rsplit("_", 1)[1]))[0]
    rec = json.loads((first / "metrics.jsonl").read_text())
    rec["eval/mt_en_fr/bleu"] = 0.0
    rec["eval/mt_en_fr/rouge_l"] = 20.0 + 10 * np.log10(float(first.name.rsplit("_", 1)[1]))
    (first / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    for d in root.glob("finetune_en_fr_*"):
        if d != first:
            r = json.loads((d / "metrics.jsonl").read_text())
            r["eval/mt_en_fr/rouge_l"] = 20.0 + 10 * np.log10(float(d.name.rsplit("_", 1)[1]))
            (d / "metrics.jsonl").write_text(json.dumps(r) + "\n")
    res = fit_all.fit_runs(root, tmp_path / "out", law="all", bootstrap=0)
    reason = res["skipped"]["bleu/t5_770m/mix_en_50_fr_50/mt_en_fr/300/bleu"]
    assert "score = 0.0; it must be positive" in reason
    assert [e["metric"] for e in res["bleu"]] == ["rouge_l"]
    assert [e["metric"] for e in res["ce"]] == ["loss"]


def test_mt_figures_draw_fits_baselines_and_zero_scores(tmp_path):
    from fitting.laws import downstream_laws
    from fitting.reports import plots

    dp = np.geomspace(1e6, 3e7, 6)
    bleu = np.array([2.0, 2.6, 3.1, 3.3, 3.6, 3.8])
    ce = np.array([3.0, 2.8, 2.7, 2.65, 2.6, 2.58])
    fitted = plots.SeriesStyle("Df=40k", dp, bleu, downstream_laws.fit_bleu_law(dp, bleu), 1.5)
    raw = plots.SeriesStyle("no fit", dp, np.array([0.0, 1, 0, 2, 1, 1]), color="C1", linestyle=":")
    grid = plots.downstream_grid(
        [[("mix A", "BLEU", [fitted, raw])], [("mix A", "CE", [plots.SeriesStyle("ce", dp, ce)])]],
        tmp_path / "grid.png",
        title="t",
    )
    both = plots.score_vs_ce(
        [fitted, raw],
        tmp_path / "fig5.png",
        ce={"Df=40k": ce, "no fit": ce},
        baselines=[("no pretraining", 3.5, 1.5), ("zero", 3.6, 0.0)],
        title="t",
    )
    for path in (grid, both):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_short_log_axes_get_compact_labels_and_titles_count_unconverged_laws(tmp_path):
    import dataclasses
    from unittest import mock

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from fitting.laws import downstream_laws
    from fitting.reports import plots

    values = (250_000, 46_000.0, 1.5e6, 4.62, 3e9)
    assert [plots.compact_number(v) for v in values] == ["250k", "46k", "1.5M", "4.62", "3G"]
    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([4.6e4, 2.8e5], [4.4, 5.2])
    ax.set_xscale("log")
    plots._short_log_ticks(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all(len(text) <= 5 for text in labels), labels

    dp = np.geomspace(1e6, 3e7, 6)
    fit = downstream_laws.fit_bleu_law(dp, np.array([2.0, 2.6, 3.1, 3.3, 3.6, 3.8]))
    stalled = dataclasses.replace(fit, converged=False)
    series = [
        plots.SeriesStyle("a", dp, fit.observed, fit),
        plots.SeriesStyle("b", dp, fit.observed, stalled),
    ]
    axes = []
    add_subplot = Figure.add_subplot

    def spy(self, *args, **kwargs):
        axes.append(add_subplot(self, *args, **kwargs))
        return axes[-1]

    with mock.patch.object(Figure, "add_subplot", spy):
        plots.downstream_grid([[("mix A", "BLEU", series)]], tmp_path / "g.png", title="t")
    assert axes[0].get_title() == "mix A [1 of 2 fits NOT CONVERGED]"


def test_fits_json_and_report_state_the_fit_point_rule(result):
    out, res = result
    saved = json.loads((out / "fits.json").read_text())
    assert saved["fit_points"] == {
        "min_tokens": 0.0,
        "min_fraction": 0.0,
        "per_run": None,
        "text": "every evaluation of a run after its first token",
    }
    per_run = saved["chinchilla"]["zh"]["points_per_run"]
    assert sum(per_run.values()) == saved["chinchilla"]["zh"]["fit"]["n_points"]
    text = (out / "report.md").read_text()
    assert "Fit points of the L(N, D) laws (Chinchilla, CPT, Appendix B): every evaluation" in text
    assert "Fit points per run: " in text
    assert "EVAL_SCHEDULE 'log'" in text  # how the early, log-spaced evaluations are weighed


def test_cli_passes_the_fit_point_rule(study, tmp_path, monkeypatch, capsys):
    seen = {}

    def fake(runs, out, **kw):
        seen.update(kw)
        return {"warnings": [], "skipped": {}, "plots": [], "n_basis": "exact", "converged": True}

    monkeypatch.setattr(fit_all, "fit_runs", fake)
    args = ["fit", "--runs", str(study), "--out", str(tmp_path / "o")]
    assert main([*args, "--points-per-run", "1", "--points-min-fraction", "0.25"]) == 0
    assert seen["point_rule"] == points.PointRule(per_run=1, min_fraction=0.25)
    assert main([*args, "--points-per-run", "0"]) == 2
    assert "per_run = 0" in capsys.readouterr().err


def test_too_few_finetuning_points_say_so_when_the_law_is_asked_for(tmp_path):
    # one finetune with a loss used to read "no finetuning runs with loss
    # results"; it has a loss, and one point is fewer than the 3 a fit needs.
    root = tmp_path / "runs"
    synthetic.write_study(root, sizes=(3e7, 1e8), evals=3, replay_ratios=())
    finetunes = sorted(root.glob("finetune_en_fr_*"))
    for d in finetunes[1:]:
        shutil.rmtree(d)
    with pytest.raises(FitInputError) as e:
        fit_all.fit_runs(root, tmp_path / "out", law="ce", bootstrap=0)
    message = str(e.value)
    assert "1 point; a fit needs at least 3" in message and "mt_en_fr" in message, message
    assert "no finetuning runs" not in message


def test_report_sets_the_cpt_papers_headline_numbers_beside_the_fitted_ones(result):
    from fitting.formats import fmt
    from fitting.reports import paper_headlines

    out, res = result
    rows = {(r["lang"], r["quantity"]): r for r in paper_headlines.rows(res)}
    power = res["compute"]["zh"]["scratch"]["power"]["params"]
    k = rows[("zh", "eq. 3 frontier k (scratch)")]
    assert (k["paper"], k["ours"]) == (33.69907, power["k"])
    g = rows[("zh", "eq. 3 frontier g (cpt)")]
    assert (g["paper"], g["ours"]) == (0.0575, res["compute"]["zh"]["cpt"]["power"]["params"]["g"])
    saved = rows[("zh", "FLOPs saved")]
    fractions = [v for c in res["transfer"]["zh"]["curves"] for v in c["flops_saved"] if v]
    assert saved["paper"] == (0.25, 0.5) and saved["ours"] == (min(fractions), max(fractions))
    example = rows[("zh", "scratch tokens ≡ 70B CPT tokens (5.5B)")]
    assert example["paper"] == 110e9 and example["ours"] > 0
    assert example["note"] == "example_5p5b_exact"  # the synthetic fits are on exact N
    # Appendix B, both columns: γ and the error ratio of the extended law over Chinchilla's.
    pre = res["cpt"]["zh"]["appendix_b_pretraining"]
    gamma = rows[("zh", "Appendix B γ (pretraining runs)")]
    assert (gamma["paper"], gamma["ours"]) == (-0.005, pre["gamma"])
    ratio = rows[("zh", "Appendix B error ratio (CPT runs)")]
    assert ratio["paper"] == pytest.approx(0.0093 / 0.0108) and ratio["ours"] > 0
    text = (out / "report.md").read_text()
    assert "## The CPT paper's headline numbers beside ours" in text
    assert f"| zh | eq. 3 frontier k (scratch) | 33.7 | {fmt(power['k'])} |" in text


def test_dropped_records_and_skipped_runs_are_warnings_in_fits_json_and_report(tmp_path):
    # a torn last line used to drop a run's final evaluation silently; a refused
    # attempt (run.json, LEASE, config.gin, empty checkpoints/) failed the whole fit.
    root = tmp_path / "runs"
    synthetic.write_study(root, sizes=(3e7, 1e8, 3e8), evals=4, replay_ratios=(), mt=False)
    metrics = root / "scratch_02_3e+08" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    last = json.loads(lines[-1])
    assert any(k.startswith("eval/") for k in last)
    metrics.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:-3])  # cut mid-value
    refused = root / "refused"
    (refused / "checkpoints").mkdir(parents=True)
    (refused / "run.json").write_text(json.dumps({"strategy": "scratch", "target_lang": "zh"}))
    (refused / "LEASE").write_text("{}")
    (refused / "config.gin").write_text("")
    bare = root / "bare"
    (bare / "checkpoints").mkdir(parents=True)
    (bare / "LEASE").write_text("{}")
    orphan = root / "orphan"
    orphan.mkdir()
    (orphan / "metrics.jsonl").write_text(lines[0] + "\n")
    empty = root / "empty_record"
    empty.mkdir()
    (empty / "run.json").write_text("{}")
    (empty / "metrics.jsonl").write_text(lines[0] + "\n")
    out = tmp_path / "o"
    res = fit_all.fit_runs(root, out, law="chinchilla", bootstrap=0, grid=SMALL_GRID)
    warnings = json.loads((out / "fits.json").read_text())["input_warnings"]
    assert warnings == res["input_warnings"]
    by_run = {re.match(r"run '([^']+)'", w).group(1): w for w in warnings}
    assert sorted(by_run) == ["bare", "empty_record", "orphan", "refused", "scratch_02_3e+08"]
    assert f"step {last['step']} with evaluation values" in by_run["scratch_02_3e+08"]
    assert "no metrics.jsonl and no TensorBoard event files" in by_run["refused"]
    assert "only LEASE, checkpoints" in by_run["bare"]
    assert "metrics.jsonl but no run.json" in by_run["orphan"]
    assert "run.json is empty" in by_run["empty_record"]
    report = (out / "report.md").read_text()
    assert all(f"- {w}" in report for w in warnings)
    assert res["n_runs"] == 10  # the study's 9 and empty_record (read, used by no law)
    assert res["converged"]  # input warnings are not convergence warnings
