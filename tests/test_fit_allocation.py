"""Compute-optimal allocation against hand-computed values and the CPT paper's eqs. 8–9."""

import math

import numpy as np
import pytest
from fit_inputs import given_fit

from fitting.analyses.allocation import allocation_cis, compute_optimal, isoloss_grid
from fitting.laws import formulas

SCRATCH = {"E": 1.55, "A": 420.0, "B": 719.5, "alpha": 0.40, "beta": 0.30}
CPT = {"E": 1.55, "A": 420.0, "alpha": 0.40, "B": 433.3, "beta": 0.20, "gamma": 0.08}


def test_chinchilla_allocation_by_hand_and_paper_eq8():
    al = compute_optimal(SCRATCH)
    G = (0.4 * 420.0 / (0.3 * 719.5)) ** (1 / 0.7)
    assert al.law == "chinchilla" and al.valid
    assert al.G == pytest.approx(G, rel=1e-12)
    assert al.a == pytest.approx(0.3 / 0.7, rel=1e-12)
    assert al.b == pytest.approx(0.4 / 0.7, rel=1e-12)
    assert al.n_coef == pytest.approx(G * 6 ** -(0.3 / 0.7), rel=1e-12)
    assert al.d_coef == pytest.approx(6 ** -(0.4 / 0.7) / G, rel=1e-12)
    # the paper's eq. 8: N_opt = 0.324·C^0.429, D_opt = 0.514·C^0.571
    assert (round(al.n_coef, 3), round(al.a, 3)) == (0.324, 0.429)
    assert (round(al.d_coef, 3), round(al.b, 3)) == (0.514, 0.571)


def test_cpt_allocation_by_hand_and_paper_eq9():
    al = compute_optimal(CPT)
    denom = 0.4 + 0.2 - 0.08
    G = (0.4 * 420.0 / ((0.2 - 0.08) * 433.3)) ** (1 / denom)
    assert al.law == "cpt"
    assert al.G == pytest.approx(G, rel=1e-12)
    assert al.a == pytest.approx(0.2 / denom, rel=1e-12)
    assert al.b == pytest.approx((0.4 - 0.08) / denom, rel=1e-12)
    # the paper's eq. 9: N_opt = 4.79·C^0.385, D_opt = 0.035·C^0.615
    assert (round(al.n_coef, 2), round(al.a, 3)) == (4.79, 0.385)
    assert (round(al.d_coef, 3), round(al.b, 3)) == (0.035, 0.615)


@pytest.mark.parametrize("params", [SCRATCH, CPT])
def test_optimum_spends_the_budget_and_minimises_loss_on_the_isoflop_line(params):
    al = compute_optimal(params)
    for C in (1e19, 1e21, 1e23):
        n, d = float(al.n_opt(C)), float(al.d_opt(C))
        assert 6 * n * d == pytest.approx(C, rel=1e-10)
        best = float(al.loss(C))
        for factor in (0.8, 1.25):
            other = formulas.predict(al.law, params, n * factor, C / (6 * n * factor))
            assert other > best


def test_no_interior_optimum_is_reported_not_invented():
    al = compute_optimal({**CPT, "gamma": 0.25})  # β' < γ
    assert not al.valid and math.isnan(al.G) and "no interior optimum" in al.note


def test_fit_result_input_ci_from_bootstrap_samples_and_isoloss_grid():
    samples = tuple({**SCRATCH, "beta": b} for b in np.linspace(0.28, 0.32, 21))
    res = given_fit("chinchilla", SCRATCH, samples, n_points=10, n_runs=3)
    assert compute_optimal(res).G == compute_optimal(SCRATCH).G
    ci = allocation_cis(res, budgets=[1e21])
    a_vals = [compute_optimal(s).a for s in samples]
    assert ci["a"][0] == pytest.approx(np.percentile(a_vals, 2.5))
    assert ci["a"][1] == pytest.approx(np.percentile(a_vals, 97.5))
    assert ci["N_opt@1e+21"][0] < compute_optimal(res).n_opt(1e21) < ci["N_opt@1e+21"][1]
    cc, nn, ll = isoloss_grid("cpt", CPT, compute=(1e18, 1e22), n_params=(1e7, 1e10), num=30)
    assert cc.shape == nn.shape == ll.shape == (30, 30)
    np.testing.assert_allclose(ll[3, 4], formulas.cpt(nn[3, 4], cc[3, 4] / (6 * nn[3, 4]), **CPT))
