"""Issue 34 (CPT half): the CPT paper beside the fits of a study, every row saying whether it is
comparable and why not; and the paper's claims against its own Table 2, computed from the table."""

import numpy as np
import pytest
from fit_inputs import SMALL_GRID

from fitting.analyses import cpt_consistency
from fitting.laws import synthetic
from fitting.reports import cpt_comparison, fit_all
from fitting.reports.paper_values import CPT_SETUP, CPT_TABLE2

S, C = CPT_TABLE2["scratch"], CPT_TABLE2["cpt"]


def test_paper_setup_is_the_size_table_of_the_models():
    from llama_jax import sizes

    nominal = sorted(r.nominal_m for r in sizes.SIZES.values() if r.nominal_m)
    assert list(CPT_SETUP["sizes_m"]) == nominal and len(nominal) == 42


def test_table2_crossover_and_equal_loss_tokens_solve_the_laws():
    n = np.asarray([49e6, 1393e6, 5534e6])
    d = cpt_consistency.crossover_tokens(S, C, n)
    l_s, l_c = cpt_consistency.losses(S, C, n, d)
    np.testing.assert_allclose(l_s, l_c, rtol=1e-12)
    below = cpt_consistency.losses(S, C, n, d / 2)
    assert np.all(below[1] < below[0])  # CPT lower only with fewer tokens
    d_pt = cpt_consistency.scratch_tokens(S, C, 5534e6, 70e9)
    l_s, _ = cpt_consistency.losses(S, C, 5534e6, d_pt)
    np.testing.assert_allclose(l_s, cpt_consistency.losses(S, C, 5534e6, 70e9)[1], rtol=1e-12)
    lo, hi = cpt_consistency.saved_window(S, C, 1393e6, (0.5, 0.25))
    np.testing.assert_allclose(
        cpt_consistency.flops_saved(S, C, 1393e6, [lo, hi]), [0.5, 0.25], rtol=1e-9
    )


def test_consistency_section_reproduces_the_papers_contradictions():
    v = cpt_comparison.consistency_numbers()
    # CPT below scratch only for D < 0.23B (49M), 3.3B (1.4B), 9.9B (5.5B) tokens.
    assert [f"{x / 1e9:.2g}" for x in v["crossover"]] == ["0.23", "3.3", "9.9"]
    # At 20 x N, CPT above scratch: 1.4B 2.30 vs 2.17.
    assert (round(v["loss_end"]["cpt"][1], 2), round(v["loss_end"]["scratch"][1], 2)) == (2.3, 2.17)
    assert all(c > s for c, s in zip(v["loss_end"]["cpt"], v["loss_end"]["scratch"], strict=True))
    # The 5.5B example: 3.65e10 scratch tokens, not 1.1e11.
    assert f"{v['example_scratch_tokens']:.3g}" == "3.65e+10"
    assert all(x < 0 for x in v["flops_saved_end"])  # not 25-50% at the end of any run
    # Eq. 3: the exponents Table 2 implies are neither the printed ones nor nearly equal.
    fr = v["frontier"]
    g_s, g_c = fr[("scratch", 1e-3)]["g"], fr[("cpt", 1e-3)]["g"]
    assert g_s > 1.3 * 0.0579 and g_c > 1.3 * 0.0575 and g_s > 1.1 * g_c
    findings = cpt_comparison.consistency(v)
    verdicts = [f["consistent"] for f in findings]
    assert verdicts == [False, False, False, False, True, True]  # eqs. 8-9 follow from Table 2
    text = "\n".join(cpt_comparison.consistency_section(findings))
    for printed in ("0.23B (49M)", "3.3B (1.4B)", "9.9B (5.5B)", "3.65e+10", "2.30 vs 2.17"):
        assert printed in text, printed
    assert f"{g_s:.2g} / {g_c:.2g}" in text and text.count("**contradicts**") == 4


@pytest.fixture(scope="module")
def small_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    synthetic.write_study(root, sizes=(3e7, 1e8, 3e8), evals=5, replay_ratios=(0.2,), mt=False)
    out = tmp_path_factory.mktemp("fits")
    return out, fit_all.fit_runs(root, out, bootstrap=0, grid=SMALL_GRID)


def test_rows_of_a_small_study_say_why_they_are_not_comparable(small_study):
    out, res = small_study
    rows = {r["quantity"]: r for r in cpt_comparison.rows(res)}
    for name in ("E", "A", "B", "alpha", "beta"):
        r = rows[f"Table 2 scratch {name}"]
        assert r["paper"] == S[name] and r["ours"] == res["chinchilla"]["zh"]["fit"]["params"][name]
        assert not r["comparable"]
        assert any("N basis exact" in w for w in r["why"])
        assert any(w.startswith("fitted on 3 sizes") and "42 sizes" in w for w in r["why"])
    assert rows["Table 2 CPT γ"]["ours"] == res["cpt"]["zh"]["fit"]["params"]["gamma"]
    assert rows["eq. 9 D_opt prefactor (cpt)"]["paper"] == 0.035
    assert rows["eq. 3 frontier g (cpt)"]["paper"] == 0.0575
    forgetting = rows["§5.2 source-language loss, start … end of plain CPT"]
    assert forgetting["paper"] == (2.40, 3.68) and forgetting["ours"][1] > forgetting["ours"][0]
    assert any("1.4B" in w for w in forgetting["why"])
    text = (out / "report.md").read_text()
    assert "## The CPT paper beside our fits" in text and "## Paper consistency" in text
    assert "| zh | Table 2 scratch beta | 0.3 |" in text


def test_rows_of_the_papers_own_sizes_on_its_basis_are_comparable(tmp_path):
    root = tmp_path / "runs"
    models = [f"llama2_{m}m" for m in CPT_SETUP["sizes_m"][:5]]
    synthetic.write_study(root, models=models, evals=5, replay_ratios=(), mt=False, sigma=0.001)
    res = fit_all.fit_runs(root, tmp_path / "fits", bootstrap=0, n_basis="nominal")
    table = cpt_comparison.rows(res)
    rows = [r for r in table if r["quantity"].startswith("Table 2") and r["lang"] == "zh"]
    assert len(rows) == 8 + 4  # Table 2(a): 5 + 3 parameters; Table 2(b): a, b of both laws
    assert all(r["comparable"] and not r["why"] for r in rows), rows
    # The source language's own from-scratch fit is set beside Table 2 too, and refused.
    en = [r for r in table if r["quantity"] == "Table 2 scratch E" and r["lang"] == "en"]
    assert en and not en[0]["comparable"] and "target en vs the paper's zh" in en[0]["why"]


def test_paper_check_prints_the_papers_contradictions_apart_from_recovery():
    from studies import paper_check

    rows = paper_check.cpt_consistency_rows()
    assert {r.group for r in rows} == {paper_check.CONSISTENCY}
    assert sum(not r.ok for r in rows) == 4  # contradicted claims, not failures of the fitter
    recovered = paper_check.Row("Table 2", "alpha", 0.40, 0.401, 0.03)
    assert (recovered.group or paper_check.RECOVERY) == paper_check.RECOVERY
    table = paper_check.format_table(rows)
    assert "3.65e+10" in table and "contradicts" in table
