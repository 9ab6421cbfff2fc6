"""Run-level noise: σ and τ estimated from residuals grouped by run, a run's own
offset, the sandwich covariance of fits that weight correlated evaluations alike, and the
generator's per-run offsets."""

import dataclasses
import math

import numpy as np
import pytest

from fitting.design import information, paper_models, simulate
from fitting.design.noise import RunNoise, run_noise, run_offset
from fitting.design.study import Point, with_noise


def _residuals(sigma, tau, *, runs, points, seed):
    rng = np.random.default_rng(seed)
    offsets = tau * rng.standard_normal(runs)
    r = np.concatenate([u + sigma * rng.standard_normal(points) for u in offsets])
    ids = np.repeat([f"run{i}" for i in range(runs)], points)
    return r, ids


@pytest.mark.parametrize("tau", [0.0, 0.006])
def test_run_noise_recovers_sigma_and_tau(tau):
    r, ids = _residuals(0.002, tau, runs=400, points=6, seed=1)
    est = run_noise(r, ids)
    assert est.runs == 400 and est.points == 2400
    assert est.sigma == pytest.approx(0.002, rel=0.05)
    assert est.run_sigma == pytest.approx(tau, abs=0.0006)


def test_run_noise_needs_two_runs_and_a_run_with_two_points():
    assert run_noise([0.1, 0.2, 0.3], ["a", "a", "a"]) is None
    assert run_noise([0.1, 0.2], ["a", "b"]) is None
    with pytest.raises(ValueError, match="3 residuals but 2 run ids"):
        run_noise([0.1, 0.2, 0.3], ["a", "b"])


def test_run_offset_shrinks_the_runs_mean_residual():
    noise = RunNoise(sigma=0.002, run_sigma=0.004, runs=10, points=60)
    mean, sd = run_offset([0.005] * 4, noise)
    shrink = 4 * 0.004**2 / (0.002**2 + 4 * 0.004**2)  # 16/17
    assert mean == pytest.approx(shrink * 0.005)
    assert sd == pytest.approx(math.sqrt(0.004**2 * 0.002**2 / (0.002**2 + 4 * 0.004**2)))
    assert run_offset([], noise) == (0.0, 0.004)  # not started: the whole τ
    assert run_offset([0.005], None) == (0.0, 0.0)  # no estimate: the law alone


def test_sandwich_equals_the_least_squares_covariance_of_correlated_runs():
    """The frozen reference: (JᵀJ)⁻¹JᵀΣJ(JᵀJ)⁻¹ with Σ = σ²I + τ²11ᵀ per run, built densely
    (noise small enough that the weak prior, `PRIOR_SD`, does not show)."""
    sigma, tau = 2e-5, 5e-5
    model = paper_models.cpt_model(sigma=sigma)
    model = with_noise(model, {"scratch": (sigma, tau)})
    points = [
        Point("scratch", (n, f * 20 * n), run=f"r{n:g}")
        for n in np.geomspace(3e7, 3e10, 12)
        for f in (0.05, 0.2, 0.5, 1.0)
    ]
    F = information.fisher(model, points)
    assert F.shape[0] == 2  # a pair: A and the offsets' B
    theta = model.to_internal(model.prior)
    J = information.jacobian(model, "scratch", np.array([p.inputs for p in points]), theta) * sigma
    runs = np.array([p.run for p in points])
    Sigma = sigma**2 * np.eye(len(points)) + tau**2 * (runs[:, None] == runs[None, :])
    idx = [model.names.index(f"scratch.{p}") for p in ("E", "A", "B", "alpha", "beta")]
    Js = J[:, idx]
    inv = np.linalg.inv(Js.T @ Js)
    reference = inv @ Js.T @ Sigma @ Js @ inv
    cov = information.covariance(F)[np.ix_(idx, idx)]
    assert cov == pytest.approx(reference, rel=2e-3)
    # Without τ the same points are counted as independent: narrower, and F is A alone.
    plain = information.fisher(with_noise(model, {"scratch": (sigma, 0.0)}), points)
    assert plain.shape == F.shape[1:] and np.allclose(plain, F[0])
    assert np.all(np.diag(information.covariance(plain))[idx] < np.diag(cov))


def test_pair_informations_sum_over_runs_and_give_log_det_and_widths():
    model = with_noise(paper_models.cpt_model(sigma=0.002), {"scratch": (0.002, 0.006)})
    one = [Point("scratch", (n, 20 * n * f), run=f"{n:g}") for n in (1e8, 1e9) for f in (0.5, 1)]
    two = [Point("scratch", (n, 20 * n * f), run=f"{n:g}") for n in (3e8, 3e9) for f in (0.5, 1)]
    both = information.fisher(model, one + two)
    assert np.allclose(both, information.fisher(model, one) + information.fisher(model, two))
    groups = information.parameter_groups(model)
    assert information.log_det(both, groups) == pytest.approx(information.log_det(both))
    cov = information.covariance(both)
    A, B = both
    R = information.regularised(A)
    assert information.log_det(both) == pytest.approx(-np.linalg.slogdet(cov)[1], rel=1e-6)
    assert np.allclose(cov, np.linalg.inv(R) @ (R + B) @ np.linalg.inv(R))
    targets = information.parameter_targets(model)
    g = information.target_gradients(model, targets)
    dense = information.widths_from(both, dataclasses.replace(g, groups=()))
    assert information.widths_from(both, g) == pytest.approx(dense, rel=1e-9)


def test_the_generator_draws_one_offset_per_run():
    sizes = np.geomspace(5e7, 2e9, 9)
    study = simulate.cpt_study(sizes, log_points=6, periodic=0, held_out=1, run_sigma=0.01)
    assert study.model.block("scratch").run_sigma == 0.01
    means, spreads = [], []
    for seed in range(4):
        values = simulate.draw(study, seed)
        for c in study.candidates:
            truth = study.model.predict(
                c.points[0].block, study.model.prior, [p.inputs for p in c.points]
            )
            logs = np.log(values[c.key] / truth)
            means.append(logs.mean())
            spreads.append(logs.std(ddof=1))
    assert np.std(means) == pytest.approx(0.01, rel=0.25)  # the offset, shared along a run
    assert np.mean(spreads) == pytest.approx(0.005, rel=0.25)  # each evaluation's own σ
    # Without τ, a draw is the generator's independent one, number for number.
    plain = simulate.cpt_study(sizes, log_points=6, periodic=0, held_out=1)
    again = dataclasses.replace(study, model=plain.model, run_sigma={})
    a, b = simulate.draw(plain, 7), simulate.draw(again, 7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
