"""`xlscale fit`'s zero-shot step (CPT paper Fig. 3 and Fig. 6) on a synthetic runs directory."""

from __future__ import annotations

import json

import pytest
from zeroshot_runs import LARGE, SMALL, TASKS, zeroshot_acc, zeroshot_runs_dir

from fitting.analyses import zeroshot_figures
from fitting.checks import FitInputError
from fitting.readers import run_dirs
from fitting.reports import fit_all


@pytest.mark.slow
def test_fig3_per_language_and_fig6_relative_to_the_best(tmp_path):
    root = zeroshot_runs_dir(tmp_path)
    res = fit_all.fit_runs(root, tmp_path / "out", law="zeroshot", bootstrap=0)["zeroshot"]
    fig3 = res["fig3"]
    assert sorted(fig3) == ["fr", "ru", "zh"]
    for lang, e in fig3.items():
        assert e["size"] == LARGE and "the paper's 1.4B" in e["size_rule"]
        assert e["benchmarks"] == sorted(TASKS[lang]) == e["averaged_over"]
        # Every size present, ascending; the chosen one is among them.
        assert [b["size"] for b in e["by_size"]] == [SMALL, LARGE]
        assert e["by_size"][1]["average"] == e["average"]
        small = e["by_size"][0]
        assert small["runs"]["cpt"] == f"cpt_{lang}_{SMALL:.0e}"
        # Trained up to the scored step 50: its record's cumulative tokens (no flops logged).
        assert small["trained"]["cpt"] == {"tokens": 50_000.0, "flops": None}
        assert small["acc_norm"]["cpt"] == {
            t: zeroshot_acc("cpt", SMALL, t, 0.0) for t in small["benchmarks"]
        }
        assert set(e["runs"]) == {"source", "scratch", "cpt"}
        assert e["runs"]["source"] == f"source_en_{LARGE:.0e}"
        assert set(e["steps"].values()) == {50}
        for s, scores in e["acc_norm"].items():
            assert scores == {t: zeroshot_acc(s, LARGE, t, 0.0) for t in e["benchmarks"]}
            assert e["average"][s] == pytest.approx(sum(scores.values()) / len(scores))
    fig6 = res["fig6"]
    assert list(fig6) == ["zh"]
    e = fig6["zh"]
    assert [s["ratio"] for s in e["settings"]] == [0.0, 0.1, 0.3, 0.5]
    assert e["groups"] == {"en (source)": sorted(TASKS["en"]), "zh (target)": sorted(TASKS["zh"])}
    # The paper's denominator: the best of every training setting at 1.4B, the English-only
    # source model and the Chinese-only scratch model included.
    assert [r["setting"] for r in e["references"]] == ["source", "scratch"]
    assert e["references"][0]["run"] == f"source_en_{LARGE:.0e}"
    assert e["denominator_over"] == ["plain CPT", "replay 0.1", "replay 0.3", "replay 0.5"] + [
        "source",
        "scratch",
    ]
    every = e["settings"] + e["references"]
    for group, tasks in e["groups"].items():
        assert max(s["group_relative"][group] for s in every) == pytest.approx(1.0)
        for t in tasks:
            best = max(s["acc_norm"][t] for s in every)
            assert e["denominator"][t]["value"] == best
            for s in every:
                assert s["relative"][t] == pytest.approx(s["acc_norm"][t] / best)
    # English is best in the English-only model (above every replay ratio, which a denominator
    # over the replay runs alone would have set to 1); Chinese in plain CPT.
    assert e["denominator"]["en (source)"]["setting"] == "source"
    assert max(s["group_relative"]["en (source)"] for s in e["settings"]) < 1.0
    assert e["settings"][-1]["group_relative"]["en (source)"] == max(
        s["group_relative"]["en (source)"] for s in e["settings"]
    )
    assert e["denominator"]["zh (target)"]["setting"] == "plain CPT"
    assert e["settings"][0]["group_relative"]["zh (target)"] == pytest.approx(1.0)
    out = tmp_path / "out"
    saved = json.loads((out / "fits.json").read_text())
    assert saved["zeroshot"]["fig3"]["zh"]["size"] == LARGE
    for name in (
        "zeroshot_fig3_zh.png",
        "zeroshot_fig3_fr.png",
        "zeroshot_fig3_ru.png",
        "zeroshot_fig6_zh.png",
        "zeroshot_fig3_zh_sizes.png",
    ):
        assert (out / name).stat().st_size > 0 and name in saved["plots"]
    report = (out / "report.md").read_text()
    assert "Fig. 3, ru" in report and "Fig. 6, zh" in report
    assert "Fig. 3, zh at every size present" in report
    assert "best: en (source): source; zh (target): plain CPT" in report
    assert "| scratch | scratch_zh_1e+09 |" in report


def test_zeroshot_size_picks_the_closest_complete_size(tmp_path):
    runs = run_dirs.read_runs(zeroshot_runs_dir(tmp_path))
    fig3, _ = zeroshot_figures.fig3(runs, size=2e8)
    assert {e["size"] for e in fig3.values()} == {SMALL}
    assert "closest to 2e+08" in fig3["zh"]["size_rule"]
    # Replay runs exist at the large size only: Fig. 6 stays there.
    fig6, _ = zeroshot_figures.fig6(runs, size=2e8)
    assert fig6["zh"]["size"] == LARGE


@pytest.mark.slow
def test_runs_without_zeroshot_results_skip_the_step(tmp_path):
    root = zeroshot_runs_dir(tmp_path, scored=False)
    with pytest.raises(FitInputError, match="zeroshot: no run has zero-shot results"):
        fit_all.fit_runs(root, tmp_path / "out", law="zeroshot", bootstrap=0)
    res = fit_all.fit_runs(root, tmp_path / "all", law="compute", bootstrap=0)
    assert "zeroshot" not in res
    grid = {"a": [5.0], "b": [5.0], "e": [0.5], "alpha": [0.3], "beta": [0.3]}
    skipped = fit_all.fit_runs(root, tmp_path / "o2", law="all", bootstrap=0, grid=grid)["skipped"]
    assert skipped["zeroshot"].startswith("no run has zero-shot results")


@pytest.mark.slow
def test_cli_passes_the_zeroshot_size(tmp_path):
    import argparse

    from xlscale_cli import fit as fit_cli

    parser = argparse.ArgumentParser()
    fit_cli.add_arguments(parser)
    root = zeroshot_runs_dir(tmp_path)
    args = parser.parse_args(
        ["--runs", str(root), "--out", str(tmp_path / "o"), "--law", "zeroshot"]
        + ["--zeroshot-size", "1e8", "--bootstrap", "0"]
    )
    assert fit_cli.run(args) == 0
    saved = json.loads((tmp_path / "o" / "fits.json").read_text())
    assert {e["size"] for e in saved["zeroshot"]["fig3"].values()} == {SMALL}
