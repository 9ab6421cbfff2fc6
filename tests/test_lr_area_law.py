"""The schedule-aware law (`fitting.laws.lr_area`): its areas against hand values, its fit
recovering a known law from curves on a cosine schedule, and the logged-learning-rate reader."""

import dataclasses
import math

import numpy as np
import pytest
from etils import epath

from fitting.checks import FitInputError, Unidentifiable
from fitting.laws import lr_area
from fitting.readers import points
from fitting.readers.run_data import RunData


def _cosine(total: int, *, warmup: int = 8, final: float = 0.1, peak: float = 3e-3):
    """A warm-up + cosine schedule like the trainer's (`trainer.schedules.cosine`), by hand."""
    out = []
    for k in range(total):
        if k < warmup:
            out.append(peak * k / warmup)
        else:
            d = (k - warmup) / (total - warmup)
            out.append(peak * (final + (1 - final) * 0.5 * (1 + math.cos(math.pi * d))))
    return np.asarray(out)


def test_areas_of_a_constant_schedule_grow_by_one_per_step_and_never_anneal():
    s1, s2 = lr_area.areas([2e-4] * 5, decay=0.9)
    np.testing.assert_allclose(s1, [0, 1, 2, 3, 4, 5])
    np.testing.assert_allclose(s2, np.zeros(6))


@pytest.mark.parametrize("decay", [0.0, 0.5])
def test_a_step_decay_anneals_with_the_momentum_by_hand(decay):
    # Peak 1 for 3 steps, then 0.5: one drop of 0.5 at step 4, remembered with momentum λ.
    s1, s2 = lr_area.areas([1.0, 1.0, 1.0, 0.5, 0.5, 0.5], decay=decay)
    np.testing.assert_allclose(s1, [0, 1, 2, 3, 3.5, 4, 4.5])
    m = [0, 0, 0, 0.5, 0.5 * decay, 0.5 * decay**2]
    np.testing.assert_allclose(s2, np.concatenate([[0], np.cumsum(m)]))
    # Units of the peak: a rescaled schedule has the same areas.
    np.testing.assert_allclose(lr_area.areas([3.0, 3.0, 3.0, 1.5, 1.5, 1.5], decay=decay)[1], s2)


@pytest.mark.parametrize(
    "lrs, decay, match",
    [
        ([], 0.9, "non-empty"),
        ([1.0, float("nan")], 0.9, "finite"),
        ([0.0, 0.0], 0.9, "all zero"),
        ([1.0], 1.0, r"decay must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_schedules_are_errors_that_say_what(lrs, decay, match):
    with pytest.raises(FitInputError, match=match):
        lr_area.areas(lrs, decay=decay)


TRUE = dict(E=1.9, A=0.8, alpha=0.35, B=1.1, beta=0.45, C=0.05, gamma=-0.2)


def _study(sizes, *, decay=0.95, total=160, every=20, noise=0.0, seed=0):
    """Evaluations every `every` steps of one cosine run per size, from the law `TRUE`
    (reference scales N₀ = 1e5, S₀ = 100), with relative Gaussian noise."""
    s1, s2 = lr_area.areas(_cosine(total), decay=decay)
    steps = np.arange(every, total + 1, every)
    rng = np.random.default_rng(seed)
    N = np.repeat(np.asarray(sizes, float), len(steps))
    S1, S2 = np.tile(s1[steps], len(sizes)), np.tile(s2[steps], len(sizes))
    L = lr_area.formula(N, S1, S2, **TRUE, n_ref=1e5, s_ref=100.0)
    return N, S1, S2, L * (1 + noise * rng.standard_normal(L.shape))


def test_the_fit_recovers_a_known_law_and_predicts_a_held_out_size():
    N, S1, S2, L = _study([5e4, 1e5, 3e5])
    fit = lr_area.fit(N, S1, S2, L, decay=0.95)
    assert fit.converged and fit.rms < 1e-6 and fit.n_runs == 3 and fit.n_points == 24
    # The held-out larger model's whole curve, an extrapolation in N.
    N4, S14, S24, L4 = _study([1e6])
    np.testing.assert_allclose(fit.predict(N4, S14, S24), L4, rtol=1e-4)
    # The fitted reference scales differ from the generator's; the exponents do not.
    for k in ("alpha", "beta", "gamma"):
        assert fit.params[k] == pytest.approx(TRUE[k], abs=1e-3), k
    assert fit.to_dict()["decay"] == 0.95 and fit.law == "lr_area"


def test_noisy_curves_recover_the_size_factor_and_leave_only_the_noise():
    # 0.2% relative noise on 24 evaluations: gamma is still told apart from 0 (the additive law).
    N, S1, S2, L = _study([5e4, 1e5, 3e5], noise=0.002, seed=3)
    fit = lr_area.fit(N, S1, S2, L, decay=0.95)
    assert fit.params["gamma"] == pytest.approx(TRUE["gamma"], abs=0.1)
    assert 0.001 < fit.rms < 0.003  # the noise, not misfit


def test_too_few_sizes_or_points_are_unidentifiable():
    N, S1, S2, L = _study([5e4, 1e5])
    with pytest.raises(Unidentifiable, match="model sizes"):
        lr_area.fit(N, S1, S2, L, decay=0.95, series="scratch")
    N, S1, S2, L = _study([5e4, 1e5, 3e5], every=80)
    with pytest.raises(Unidentifiable, match="6 points for 7 parameters"):
        lr_area.fit(N, S1, S2, L, decay=0.95)
    with pytest.raises(FitInputError, match="differ in length"):
        lr_area.fit(N, S1[:-1], S2, L, decay=0.95)


def _run(records):
    meta = {"model": "m", "strategy": "scratch", "target_lang": "zh", "languages": ["zh"]}
    return RunData(run_id="r", path=epath.Path("/nonexistent"), meta=meta, records=tuple(records))


def test_learning_rates_are_read_from_the_logs_and_interpolated():
    recs = [{"step": 2, "learning_rate": 1.0}, {"step": 4, "learning_rate": 3.0}, {"step": 5}]
    recs.append({"step": 6, "learning_rate": 2.0, "train/loss": 5.0})
    np.testing.assert_allclose(points.learning_rates(_run(recs)), [1, 1, 2, 3, 2.5, 2])
    with pytest.raises(FitInputError, match="'r': its metrics log no learning_rate"):
        points.learning_rates(_run([{"step": 1, "train/loss": 5.0}]))


def _curves(sizes, *, decay, total=160, every=20):
    """One `RunCurve` per size from the law `TRUE` on the cosine schedule, areas under `decay`."""
    lrs = _cosine(total)
    s1, s2 = lr_area.areas(lrs, decay=decay)
    steps = np.arange(every, total + 1, every)
    return [
        lr_area.RunCurve(
            f"run{n:g}", n, lrs, steps, lr_area.formula(n, s1[steps], s2[steps], **TRUE, n_ref=1e5)
        )
        for n in sizes
    ]


@pytest.mark.parametrize("true_decay", [0.0, 0.9, 0.99])
def test_the_decay_is_chosen_from_the_fitted_runs_by_forecasting_their_ends(true_decay):
    curves = _curves([5e4, 1e5, 3e5], decay=true_decay)
    choice = lr_area.choose_decay(curves, decays=(0.0, 0.9, 0.99), series="scratch")
    assert choice.decay == true_decay and choice.holdout == 0.25
    assert (
        choice.errors[true_decay]
        < 1e-4
        < min(e for d, e in choice.errors.items() if d != true_decay)
    )
    fit = lr_area.fit_curves(curves, decay=choice.decay)
    assert fit.rms < 1e-6 and fit.n_runs == 3 and fit.n_points == 24


def test_choosing_the_decay_says_what_is_wrong():
    curves = _curves([5e4, 1e5, 3e5], decay=0.9)
    with pytest.raises(FitInputError, match="holdout must be in"):
        lr_area.choose_decay(curves, holdout=1.0)
    late = dataclasses.replace(curves[0], steps=np.array([200]), loss=np.array([5.0]))
    with pytest.raises(
        FitInputError, match="'run50000': evaluated at step 200, its schedule has 160"
    ):
        lr_area.fit_curves([late, *curves[1:]], decay=0.9)


@pytest.mark.slow
def test_xlscale_fit_fits_the_schedule_aware_law_by_name_only(tmp_path):
    from fitting.laws import synthetic
    from fitting.reports import fit_all

    root = synthetic.write_study(
        tmp_path / "runs", sizes=(3e7, 1e8, 3e8), evals=6, replay_ratios=(), mt=False
    )
    res = fit_all.fit_runs(root, tmp_path / "fit", law="lr_area", bootstrap=0)
    zh = res["lr_area"]["zh"]
    assert set(zh) == {"from_scratch", "cpt"} and set(res["lr_area"]["en"]) == {"from_scratch"}
    for entry in (zh["from_scratch"], zh["cpt"], res["lr_area"]["en"]["from_scratch"]):
        assert entry["fit"]["converged"] and entry["fit"]["n_runs"] == 3
        # The synthetic runs follow L(N, D) laws with 0.5% noise, on a constant schedule (S2 = 0).
        assert max(abs(f["error"]) for f in entry["finals"]) < 0.02
        assert entry["fit"]["rms"] < 0.01
    report = (tmp_path / "fit" / "report.md").read_text()
    assert "## Schedule-aware law" in report and "### zh, from scratch" in report
    assert "lr_area" in fit_all.LAWS and not fit_all.STEPS["lr_area"].in_all


@pytest.mark.slow
def test_xlscale_fit_lr_area_takes_a_given_decay_and_the_point_rule(tmp_path, capsys):
    from fitting.laws import synthetic
    from fitting.readers.points import PointRule
    from fitting.reports import fit_all
    from xlscale_cli.main import main

    root = synthetic.write_study(
        tmp_path / "runs", sizes=(3e7, 1e8, 3e8), evals=10, replay_ratios=(), mt=False
    )
    res = fit_all.fit_runs(
        root,
        tmp_path / "fit",
        law="lr_area",
        bootstrap=0,
        point_rule=PointRule(min_fraction=0.5),
        lr_decay=0.9,
    )
    whole = fit_all.fit_runs(root, tmp_path / "all", law="lr_area", bootstrap=0)
    given, chosen = res["lr_area"]["zh"]["cpt"], whole["lr_area"]["zh"]["cpt"]
    assert given["decay"] == 0.9 and given["decay_rule"] == "given"
    assert given["decay_forecast_errors"] == {} and given["point_rule"]["min_fraction"] == 0.5
    assert chosen["decay_rule"] == "chosen" and chosen["decay_forecast_errors"]
    # The second half of each run's evaluations: fewer points, every run's last one among them.
    assert 0 < given["fit"]["n_points"] < chosen["fit"]["n_points"]
    assert [f["step"] for f in given["finals"]] == [f["step"] for f in chosen["finals"]]
    assert "λ 0.9 (given)" in (tmp_path / "fit" / "report.md").read_text()
    with pytest.raises(ValueError, match="lr_decay = 1.0"):
        fit_all.fit_runs(root, tmp_path / "bad", law="lr_area", lr_decay=1.0)

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["fit", "--runs", str(root), "--out", str(tmp_path / "o"), "--lr-decay", "1.5"])
    assert e.value.code == 2
    assert "--lr-decay: '1.5': allowed: auto, or a number 0 <= λ < 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_parametric_bootstrap_gives_intervals_that_hold_the_true_law():
    # Four noisy realisations of one study; each fit's 95% intervals (20 simulated refits) hold
    # each true exponent in at least three of them.
    curves = _curves((1e5, 3e5, 1e6, 3e6), decay=0.9)
    N, S1, S2, L, runs = lr_area.pooled(curves, 0.9)
    held = dict.fromkeys(("alpha", "beta", "gamma"), 0)
    for seed in range(4):
        noisy = L * np.exp(0.002 * np.random.default_rng(seed).standard_normal(L.shape))
        fitted = lr_area.fit(N, S1, S2, noisy, decay=0.9, runs=runs, n_ref=1e5)
        assert "samples" not in fitted.to_dict() and "ci" not in fitted.to_dict()
        boot = lr_area.parametric_bootstrap(
            fitted, N, S1, S2, runs, sigma=0.002, run_sigma=0.0, n=20, seed=1
        )
        assert len(boot.samples) >= 18 and boot.params == fitted.params
        assert set(boot.to_dict()["ci"]) == set(lr_area.PARAMS)
        for name in held:
            lo, hi = boot.ci[name]
            held[name] += lo < TRUE[name] < hi
            assert lo < fitted.params[name] < hi and hi - lo < 0.5, name
    assert min(held.values()) >= 3, held
    again = lr_area.parametric_bootstrap(
        fitted, N, S1, S2, runs, sigma=0.002, run_sigma=0.0, n=0, seed=1
    )
    assert again is fitted
