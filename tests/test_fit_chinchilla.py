"""Chinchilla and CPT fits: recovery of known parameters, noisy data, bootstrap, convergence flags."""

import dataclasses
import json
import math

import numpy as np
import pytest
from fit_inputs import SMALL_GRID, given_fit

from fitting.checks import FitInputError
from fitting.laws import formulas, lse, optim, robust_fit, synthetic

TRUTH = synthetic.SCRATCH
CPT_TRUTH = synthetic.CPT


@pytest.fixture(scope="module")
def clean_fit():
    N, D, _ = synthetic.chinchilla_points(200, seed=1, sigma=0.0)
    L = formulas.chinchilla(N, D, **TRUTH)
    return N, D, robust_fit.fit_chinchilla(N, D, L)  # the full default (Hoffmann) grid


@pytest.mark.slow
def test_noise_free_recovery_with_the_full_default_grid(clean_fit):
    _, _, res = clean_fit
    assert res.n_starts == 4500 and res.n_finite == 4500
    assert res.converged, res.status
    for k, v in TRUTH.items():
        assert res.params[k] == pytest.approx(v, rel=1e-3), k
    assert 1 <= res.n_at_best <= res.n_starts
    assert res.law == "chinchilla" and res.n_points == 200


@pytest.mark.slow
def test_result_is_frozen_exports_unrounded_json_and_predicts(clean_fit):
    N, D, res = clean_fit
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.objective = 0.0
    d = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert d["params"] == res.params  # bit-identical floats
    assert d["converged"] is True and d["n_starts"] == 4500
    np.testing.assert_allclose(res.predict(N, D), formulas.chinchilla(N, D, **TRUTH), rtol=1e-6)
    assert res.log_params["a"] == pytest.approx(math.log(res.params["A"]))


def test_noisy_data_pin_exponents_and_predicted_loss():
    # Noise cannot pin A and α apart (they trade off), so test what the data determine.
    N, D, L = synthetic.chinchilla_points(200, seed=3, sigma=0.005)
    res = robust_fit.fit_chinchilla(N, D, L, grid=SMALL_GRID)
    assert res.converged
    assert res.params["beta"] == pytest.approx(TRUTH["beta"], abs=0.02)
    assert res.params["alpha"] == pytest.approx(TRUTH["alpha"], abs=0.08)
    np.testing.assert_allclose(res.predict(N, D), formulas.chinchilla(N, D, **TRUTH), rtol=0.01)


def test_two_stage_cpt_fit_recovers_the_cpt_law(clean_fit):
    _, _, base = clean_fit
    N, D, _ = synthetic.chinchilla_points(70, seed=2, sigma=0.0)
    L = formulas.cpt(N, D, **CPT_TRUTH)
    res = robust_fit.fit_cpt(N, D, L, base=base)
    assert res.converged and res.law == "cpt"
    assert res.fixed == ("E", "A", "alpha")
    for k in ("E", "A", "alpha"):
        assert res.params[k] == base.params[k]  # stage one's values, untouched
    for k in ("B", "beta", "gamma"):
        assert res.params[k] == pytest.approx(CPT_TRUTH[k], rel=1e-3), k
    with pytest.raises(FitInputError, match="chinchilla"):
        robust_fit.fit_cpt(N, D, L, base=dataclasses.replace(base, law="cpt"))


def test_cpt_stage_two_takes_a_stage_one_that_fitted_the_size_term_away():
    # Early curves where the sizes' losses do not differ yet: stage one's optimum drops A·N^-α
    # (a → -∞, A underflows to 0). Stage two holds stage one's own variables, not log(A), so it
    # fits instead of failing on "math domain error" (as the adaptive sweep's refit once did).
    sizes = np.array([2e4, 8e4, 3e5])
    N = np.repeat(sizes, 3)
    D = np.concatenate([20 * n * np.geomspace(0.05, 1, 3) for n in sizes])
    L = 1.5 + 700 / D**0.3
    runs = [f"run{i}" for i in np.repeat(np.arange(3), 3)]
    base = robust_fit.fit_chinchilla(N, D, L, runs=runs, bootstrap=8, seed=0)
    assert base.params["A"] == 0.0 and math.isfinite(base.log_params["a"])
    Lc = 1.5 + 433.3 / (D**0.2 * N**0.08)
    res = robust_fit.fit_cpt(N, D, Lc, base=base, runs=runs, bootstrap=8, seed=1)
    assert res.law == "cpt" and all(res.params[k] == base.params[k] for k in ("E", "A", "alpha"))
    assert math.isfinite(res.params["beta"]) and res.n_bootstrap == 8


@pytest.mark.slow
def test_bootstrap_resamples_runs_and_covers_the_truth():
    # 20 runs (model sizes) × 10 evaluations along training, as the CPT paper fits curves
    # (200 points: the compiled screen is shared with the full-grid test).
    rng = np.random.default_rng(7)
    sizes = np.geomspace(5e7, 5e9, 20)
    N = np.repeat(sizes, 10)
    D = np.concatenate([20 * n * np.geomspace(0.05, 1, 10) for n in sizes])
    L = formulas.chinchilla(N, D, **TRUTH) * np.exp(0.004 * rng.standard_normal(len(N)))
    runs = [f"run{int(i)}" for i in np.repeat(np.arange(20), 10)]
    res = robust_fit.fit_chinchilla(N, D, L, grid=SMALL_GRID, bootstrap=40, seed=0, runs=runs)
    assert res.n_runs == 20 and res.n_bootstrap == 40
    assert res.n_bootstrap_converged >= 30
    assert len(res.samples) == res.n_bootstrap_converged
    for k in ("E", "B", "beta"):
        lo, hi = res.ci[k]
        assert lo <= TRUTH[k] <= hi, (k, lo, hi)
        assert lo <= res.params[k] <= hi
    lo, hi = res.ci["alpha"]
    assert lo <= TRUTH["alpha"] <= hi


def test_non_finite_starts_are_masked_and_never_chosen():
    N, D, _ = synthetic.chinchilla_points(60, seed=4, sigma=0.0)
    L = formulas.chinchilla(N, D, **TRUTH)
    grid = dict(SMALL_GRID, alpha=[0.5, float("nan")])
    res = robust_fit.fit_chinchilla(N, D, L, grid=grid)
    assert res.n_starts == 36 and res.n_finite == 18
    assert all(np.isfinite(v) for v in res.params.values())
    assert res.converged


def test_convergence_flag_follows_the_polished_gradient():
    N, D, L = synthetic.chinchilla_points(80, seed=5, sigma=0.005)
    problem = lse.LseProblem(
        terms=formulas.fit_spec("chinchilla").terms,
        features=formulas.fit_spec("chinchilla").features(N, D),
        target=np.log(L),
        weights=np.ones(len(L)),
        delta=1e-3,
    )
    std, r = lse.standardise(problem)
    starts = robust_fit._starts(formulas.fit_spec("chinchilla"), SMALL_GRID, {}) @ r.T
    ok = optim.multistart(std, starts, iters=40)
    assert ok.converged
    # No float gradient is exactly zero: an impossible tolerance must report non-convergence.
    strict = optim.multistart(std, starts, iters=40, grad_rtol=0.0)
    assert not strict.converged
    res = given_fit("chinchilla", {}, objective=1.0, converged=False, grad_norm=0.5)
    assert "NOT CONVERGED" in res.status


def test_loss_compute_and_power_fits_recover_the_frontier_laws():
    C = np.geomspace(1e18, 1e22, 15)
    pw = robust_fit.fit_power(C, formulas.power(C, k=33.69907, g=0.0579))
    assert pw.converged
    assert pw.params["k"] == pytest.approx(33.69907, rel=1e-6)
    assert pw.params["g"] == pytest.approx(0.0579, rel=1e-6)
    lc = robust_fit.fit_loss_compute(C, formulas.loss_compute(C, E=1.6, A=3000.0, gamma=0.17))
    assert lc.converged
    assert lc.params == pytest.approx({"E": 1.6, "A": 3000.0, "gamma": 0.17}, rel=1e-4)


@pytest.mark.parametrize(
    "N, D, L, runs, match",
    [
        ([1e8, 2e8], [1e9, 2e9], [3.0, 2.9], None, "2 points cannot determine 5"),
        ([1e8] * 6, [1e9] * 5, [3.0] * 6, None, "mismatched lengths"),
        (
            [1e8] * 6,
            [1e9] * 6,
            [3.0, 2.9, float("nan"), 2.7, 2.6, 2.5],
            list("abcdef"),
            r"point 2 \(run 'c'\) has L = nan",
        ),
        (
            [1e8] * 6,
            [1e9, 0.0, 1e9, 1e9, 1e9, 1e9],
            [3.0] * 6,
            list("abcdef"),
            r"point 1 \(run 'b'\) has D = 0.0; it must be positive",
        ),
        ([1e8] * 6, [1e9] * 6, [3.0, 2.9, -1.0, 2.7, 2.6, 2.5], None, r"point 2 has L = -1.0"),
        ([1e8] * 6, [1e9] * 6, [3.0] * 6, ["a"] * 5, "mismatched lengths"),
    ],
)
def test_bad_inputs_name_the_point_or_run(N, D, L, runs, match):
    with pytest.raises(FitInputError, match=match):
        robust_fit.fit_chinchilla(N, D, L, runs=runs, grid=SMALL_GRID)
