"""The MT paper beside `xlscale fit`'s downstream fits, its CE tables against its BLEU tables
(over every value their printed digits allow), and fits only on the scores the paper fits (never
on BLEU's parts)."""

import json
import math

import numpy as np
import pytest
from paper_runs import en_de_balanced_runs

from fitting import printed_box
from fitting.analyses import valuation
from fitting.laws import downstream_laws, synthetic
from fitting.reports import fit_all, paper_values
from fitting.reports import mt_paper_comparison as cmp
from studies import paper_check, paper_study, paper_truth

STEPS_256_512 = 256 * 512


def _reference(metric, row, dp):
    """The paper's laws written out again here: (log A + α·ln Dp)^β and E + A·Dp^−α."""
    if metric == "bleu":
        log_a, alpha, beta = row
        q = log_a + alpha * math.log(dp)
        return q**beta if q > 0 else math.nan
    e, a, alpha = row
    return e + a * dp**-alpha


def test_table6_en_ro_312m_row_is_the_papers():
    row = paper_values.MT_T5_3B_LAWS[("mix_en_100", "mt_en_ro", 312_000_000)]
    assert row["ce"] == (5.85e-5, 1.37e3, 0.88)
    assert not any(k[:3] == ("mix_en_100", "mt_en_ro", 312_000_000) and k[3] == "ce"
                   for k in paper_values.MT_T5_3B_UNUSABLE)  # fmt: skip
    # The synthetic study's law for that condition comes from Table 6 (rescaled), not from the
    # balanced mixture's stand-in.
    law = paper_truth.mt_truth("t5_3b", "mix_en_100", "mt_en_ro", 312_483_840, "loss")
    assert "Table 6" in law.source and "Table 4" not in law.source
    dp = np.asarray([3.3e9, 1.3e11])
    np.testing.assert_allclose(
        law(dp), paper_truth.CE_SCALE * (5.85e-5 + 1.37e3 * dp**-0.88), rtol=1e-12
    )


def test_manifest_grid_is_the_mt_paper_manifests():
    import tomllib
    from pathlib import Path

    manifest = tomllib.loads(
        (Path(__file__).parents[1] / "launch/manifests/mt_paper.toml").read_text()
    )
    assert tuple(manifest["axes"]["init_steps"]) == paper_values.MT_DP["grid_steps"]
    assert manifest["strategies"]["pretrain"]["budget"]["batch_size"] == paper_values.MT_DP["batch"]


def test_consistency_reproduces_the_tables_ce_against_their_bleu():
    """In tokens (our reading of the paper's unit) and with log read as natural, the BLEU tables
    give BLEU 1.6-41 over the manifest's grid while the CE tables give 2e-5 to 2e-4 nats; no unit
    makes both plausible at any value the printed digits allow."""
    grid = np.asarray(paper_values.MT_DP["grid_steps"], float) * STEPS_256_512
    table = {r["unit"]: r for r in cmp.consistency()}
    for metric, key in (("bleu", "bleu"), ("loss", "ce")):
        rows = [r[key] for r in paper_values.MT_T5_3B_LAWS.values() if r[key] is not None]
        values = [_reference(metric, row, dp) for row in rows for dp in grid]
        tok = table["tokens"][metric]
        assert tok["laws"] == len(rows)
        assert tok["printed_min"] == pytest.approx(np.nanmin(values), rel=1e-9)
        assert tok["printed_max"] == pytest.approx(np.nanmax(values), rel=1e-9)
        # Over every value the printed digits allow the range only widens.
        assert tok["min"] <= tok["printed_min"] and tok["max"] >= tok["printed_max"]
    tok = table["tokens"]
    assert 1.5 < tok["bleu"]["printed_min"] < 1.7 and 40 < tok["bleu"]["printed_max"] < 42
    assert 1.4 < tok["bleu"]["min"] and tok["bleu"]["max"] < 47
    assert tok["bleu"]["plausible_laws"] == tok["bleu"]["laws"]
    assert 2e-5 < tok["loss"]["min"] and tok["loss"]["max"] < 2e-4
    assert tok["loss"]["plausible_laws"] == tok["loss"]["possible_laws"] == 0
    # e.g. the balanced en-de 6M row at the first checkpoint: 3.21e-5 + 35.45/(25k·256·512)^0.64
    first = 3.21e-5 + 35.45 / (25_000 * STEPS_256_512) ** 0.64
    assert cmp.evaluate("loss", grid[:1])[0, 0] == pytest.approx(first)
    assert {"steps (256 × 512 tokens)", "examples (512-token sequences)", "billion tokens"} <= set(
        table
    )
    assert not any(r["both"] for r in table.values()) and cmp.ce_unit() is None
    assert {r["verdict"] for r in table.values()} == {printed_box.CONTRADICTED}
    assert cmp.unit_verdict() == printed_box.CONTRADICTED
    reason = cmp.ce_reason()
    assert "only in tokens" in reason and "nats" in reason and "natural" in reason
    section = "\n".join(cmp.consistency_section())
    assert (
        "| tokens | 1.59–40.9 (box 1.45–45.9) | 15/15 | 2.15e-05–0.000188 (box 2.15e-05–0.000189) "
        f"| 0/18 | {printed_box.CONTRADICTED} |"
    ) in section
    assert "natural logarithm (the paper does not state the base" in section


def test_a_plausible_ce_table_would_be_found(monkeypatch):
    """The check can pass: CE tables on a nats scale make tokens the unit, at every value their
    printed digits allow."""

    def scaled(printed: str) -> str:
        return f"{float(printed) * 5e4:.3g}"

    tables = {
        k: {
            **v,
            "ce": None if v["ce"] is None else (scaled(v["ce"][0]), scaled(v["ce"][1]), v["ce"][2]),
        }
        for k, v in paper_values.MT_T5_3B_PRINTED.items()
    }
    monkeypatch.setattr(cmp, "MT_T5_3B_PRINTED", tables)
    assert cmp.ce_unit() == "tokens" and cmp.ce_reason() == ""
    assert cmp.unit_verdict() == printed_box.CONSISTENT


def test_bleu_parts_are_never_fitted_nor_valued():
    dp = np.geomspace(3e9, 1.3e11, 6)
    for part in ("bleu_bp", "bleu_p1", "bleu_sys_len", "chrf"):
        with pytest.raises(ValueError, match="logged, not fitted"):
            downstream_laws.fit_series(dp, np.linspace(0.9, 1.0, 6), metric=part)
        with pytest.raises(ValueError, match="no valuation verdict"):
            valuation.assess(dp, np.linspace(20, 30, 6), metric=part)
    assert downstream_laws.FITTED == ("bleu", "rouge_l", "comet", "loss")


@pytest.fixture(scope="module")
def fitted_synthetic(tmp_path_factory):
    """The synthetic MT study (en-fr finetunes on the Table 3 law) with BLEU's parts logged and a
    zig-zag ROUGE-L no log-law can converge on."""
    root = tmp_path_factory.mktemp("mt_parts") / "runs"
    synthetic.write_study(root, sizes=(3e7, 1e8), evals=3, replay_ratios=())
    ft = sorted(root.glob("finetune_en_fr_*"), key=lambda d: int(d.name.rsplit("_", 1)[1]))
    for i, d in enumerate(ft):
        rec = json.loads((d / "metrics.jsonl").read_text())
        rec["eval/mt_en_fr/bleu_bp"] = 1.0 - 0.01 * i
        rec.update({f"eval/mt_en_fr/bleu_p{n}": 50.0 - 3 * n + (i % 2) for n in (1, 2, 3, 4)})
        rec["eval/mt_en_fr/bleu_sys_len"] = 900.0 + 37 * (i % 3)
        rec["eval/mt_en_fr/bleu_ref_len"] = 1000.0
        rec["eval/mt_en_fr/rouge_l"] = 5.0 if i % 2 == 0 else 50.0
        (d / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    return fit_all.fit_runs(root, tmp_path_factory.mktemp("fits"), law="bleu", bootstrap=0)


@pytest.mark.slow
def test_fit_covers_scores_only_and_an_unconverged_series_marks_itself(fitted_synthetic):
    res = fitted_synthetic
    assert [e["metric"] for e in res["bleu"]] == ["bleu", "rouge_l"]
    assert not any("bleu_" in k for k in res["skipped"])
    assert all("verdict" in e for e in res["bleu"])
    by_metric = {e["metric"]: e for e in res["bleu"]}
    assert by_metric["bleu"]["fit"]["converged"] and not by_metric["rouge_l"]["fit"]["converged"]
    # The zig-zag series is flagged on its own; the file's other fits stay converged.
    assert res["converged"] is True and res["warnings"] == []
    assert len(res["unconverged_series"]) == 1 and "/rouge_l:" in res["unconverged_series"][0]
    report = fit_all.render_report(res)
    assert "Downstream series whose own fit did not converge" in report
    assert "All fits converged." not in report


@pytest.mark.slow
def test_rows_say_why_a_series_is_not_comparable(fitted_synthetic):
    rows = {r["metric"]: r for r in cmp.rows(fitted_synthetic)}
    assert not rows["bleu"]["comparable"]
    # t5_770m, no Df recorded, Dp from 2.6e9 (below the manifest's first checkpoint)
    assert "the tables are T5-3B's" in rows["bleu"]["why"]
    assert "none of the printed sizes" in rows["bleu"]["why"]
    assert "the paper prints no ROUGE-L coefficients" in rows["rouge_l"]["why"]


@pytest.fixture(scope="module")
def paper_scale(tmp_path_factory):
    """mt_paper's T5-3B and T5-770M balanced en-de 6M series (best LRs), written from the
    paper's laws, fitted by `xlscale fit`."""
    root = tmp_path_factory.mktemp("mt_paper")
    keep = en_de_balanced_runs(root)
    paper_study.write_mt_runs(keep, log=lambda _: None)
    return fit_all.fit_runs(root, tmp_path_factory.mktemp("fits"), law="all", bootstrap=0)


@pytest.mark.slow
def test_paper_scale_rows_compare_t5_3b_bleu_and_refuse_ce(paper_scale):
    rows = {(r["model"], r["metric"]): r for r in cmp.rows(paper_scale)}
    bleu = rows[("t5_3b", "bleu")]
    assert bleu["comparable"], bleu["why"]
    assert bleu["source"] == "Table 3" and bleu["paper_params"]["log_A"] == -180.75
    assert bleu["max_abs_log_gap"] < 1e-3  # the runs follow Table 3 (noise σ 5e-5)
    assert not rows[("t5_770m", "bleu")]["comparable"]
    assert rows[("t5_770m", "bleu")]["why"] == "t5_770m, the tables are T5-3B's"
    ce = rows[("t5_3b", "loss")]
    assert not ce["comparable"] and "no Dp unit" in ce["why"] and ce["source"] == "Table 4"
    # The synthetic CE is on a nats scale (the printed one, ~3e-5, is not).
    assert 1.0 < ce["observed_at_max"] < 3.0
    fig5 = {r["model"]: r for r in cmp.fig5_rows(paper_scale)}
    assert fig5["t5_3b"]["comparable"] and fig5["t5_3b"]["rho"] == pytest.approx(1.0)
    report = fit_all.render_report(paper_scale)
    assert "## The MT paper beside these fits" in report
    assert "### Paper consistency" in report


@pytest.mark.slow
def test_paper_check_reports_no_ce_agreement(paper_scale):
    rows = paper_check.mt_consistency_rows()
    assert all(r.group == paper_check.CONSISTENCY for r in rows)
    claim = rows[0]
    assert claim.law == "MT Tables 4, 6 (CE) vs 3, 5 (BLEU)"
    assert claim.fitted == printed_box.CONTRADICTED
    assert not claim.ok and "no Dp unit of the 15 tried" in claim.note
    assert all(r.ok and r.paper == "-" for r in rows[1:])  # the units tried: informational
    assert "n/a" in paper_check.format_table(rows)
    # No synthetic CE law claims to be the paper's, so no CE coefficient is a recovery row.
    law = paper_truth.mt_truth("t5_3b", "mix_en_50_de_50", "mt_en_de", 6_000_000, "loss")
    assert not law.from_paper and law.source.startswith("stand-in (paper Table 4")
    lines = cmp.comparison_lines(paper_scale)
    assert lines[0].startswith("4 downstream series beside Tables 3-6: 1 comparable")
    assert any("t#_#m, the tables are T#-#B's" in line for line in lines), lines
