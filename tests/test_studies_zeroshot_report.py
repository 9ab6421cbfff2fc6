"""The demo report's zero-shot section (`studies.zeroshot_report`, `studies.cpt_zeroshot`) on a
runs directory of several target languages: one Fig. 3 group per language (zh, fr and ru do not
overwrite each other), languages from the runs, and the replay runs of their own language."""

from __future__ import annotations

from zeroshot_runs import LARGE, zeroshot_runs_dir

from fitting.readers import run_dirs as io
from studies import cpt_zeroshot, zeroshot_report


def test_each_target_language_gets_its_own_fig3_group_and_rows(tmp_path):
    runs = io.read_runs(zeroshot_runs_dir(tmp_path))
    assert cpt_zeroshot.target_langs(runs) == ["fr", "ru", "zh"]
    groups = cpt_zeroshot.fig3_groups(runs)
    assert sorted(groups) == ["fr", "ru", "zh"]
    for lang, group in groups.items():
        assert [group[s].strategy for s in cpt_zeroshot.FIG3_STRATEGIES] == [
            "source",
            "scratch",
            "cpt",
        ]
        assert group["scratch"].target_lang == lang and group["cpt"].target_lang == lang
        assert {float(r.meta["params_non_embedding"]) for r in group.values()} == {LARGE}
    # One source model, three scratch and three CPT runs: none overwritten by another language.
    chosen = cpt_zeroshot.fig3_runs(runs)
    assert sorted(r.strategy for r in chosen) == ["cpt"] * 3 + ["scratch"] * 3 + ["source"]
    # Fig. 6: zh's replay runs with zh's plain CPT run (not fr's or ru's) and the source model.
    replay = cpt_zeroshot.replay_groups(runs)
    assert list(replay) == ["zh"]
    assert {r.strategy for r in replay["zh"]} == {"source", "cpt", "cpt_replay"}
    assert all(r.target_lang == "zh" for r in replay["zh"] if r.strategy != "source")

    out = tmp_path / "report"
    out.mkdir()
    text = zeroshot_report.section(runs, out)
    assert (out / "zeroshot_by_strategy.png").is_file() and (
        out / "zeroshot_vs_replay.png"
    ).is_file()
    assert "| CPT target | language | source (en) | scratch | CPT |" in text
    for lang in ("zh", "fr", "ru"):
        assert f"| {lang} | {lang} | " in text and f"| {lang} | en | " in text
    # The replay table's columns are the languages scored, the source language first.
    assert "| run | replay | en | fr | ru | zh |" in text


def test_one_target_language_keeps_the_single_language_table(tmp_path):
    runs = [r for r in io.read_runs(zeroshot_runs_dir(tmp_path)) if r.target_lang in ("en", "zh")]
    text = zeroshot_report.section(runs, tmp_path)
    assert "| language | source (en) | scratch | CPT |" in text and "CPT target" not in text
    assert "| run | replay | en | zh |" in text
