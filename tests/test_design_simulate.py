"""fitting.design.simulate(_mt): studies simulated from their true laws, designs checked against
the full sweep's fits; the snapshot record and the design report."""

import json
import math

import numpy as np
import pytest

from fitting.design import choose, information, simulate, simulate_mt
from fitting.design.snapshots import Snapshot, read_lines
from fitting.laws import synthetic
from fitting.reports import design_report

INIT_STEPS = (25_000, 50_000, 100_000, 200_000, 300_000, 500_000, 750_000, 1_000_000)


def _mt(n_fit=None, sigma=0.002):
    bleu2 = {**synthetic.BLEU, "beta": 0.7}
    ce2 = {**synthetic.CE, "E": 1.1}
    series = [
        simulate_mt.Series("m/a/t/1", "m/a", synthetic.BLEU, synthetic.CE),
        simulate_mt.Series("m/a/t/2", "m/a", bleu2, ce2),
        simulate_mt.Series("m/b/t/1", "m/b", synthetic.BLEU, ce2),
    ]
    pretrained = {
        "m/a": simulate_mt.Pretrained(7e8, 1_000_000),
        "m/b": simulate_mt.Pretrained(7e8, 510_000),
    }
    return simulate_mt.mt_study(
        series, pretrained, init_steps=INIT_STEPS, bleu_sigma=sigma, ce_sigma=sigma, n_fit=n_fit
    )


def _small_cpt():
    return simulate.cpt_study(np.geomspace(5e7, 2e9, 9), log_points=5, periodic=0, held_out=1)


# --- studies and draws -----------------------------------------------------------------------


def test_cpt_study_is_shaped_like_the_paper_manifest():
    sizes = simulate.paper_sizes()
    assert (
        len(sizes) == 42 and sizes[0] == pytest.approx(49e6) and sizes[-1] == pytest.approx(5534e6)
    )
    study = simulate.cpt_study(sizes)
    assert len(study.candidates) == 3 * 42
    big = study.candidate(f"scratch_{sizes[-1]:.4g}")
    assert big.cost / study.candidate(f"scratch_{sizes[0]:.4g}").cost == pytest.approx(
        (sizes[-1] / sizes[0]) ** 2
    )
    assert max(p.inputs[1] for p in big.points) == pytest.approx(20 * sizes[-1])
    assert len(big.points) >= 20
    assert study.candidate(f"cpt_{sizes[3]:.4g}").requires == (f"source_{sizes[3]:.4g}",)
    assert set(study.held_out) == {
        f"{b}_{n:.4g}" for n in sizes[-2:] for b in ("source", "scratch", "cpt")
    }
    with pytest.raises(ValueError, match="held_out = 0"):
        simulate.cpt_study(sizes, held_out=0)


def test_draw_is_reproducible_with_the_generators_noise():
    study = _small_cpt()
    a, b, c = simulate.draw(study, 1), simulate.draw(study, 1), simulate.draw(study, 2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["scratch_5e+07"], c["scratch_5e+07"])
    logs = []
    for cand in study.candidates:
        for p, v in zip(cand.points, a[cand.key], strict=True):
            logs.append(
                math.log(v / study.model.predict(p.block, study.model.prior, [p.inputs])[0])
            )
    assert np.std(logs) == pytest.approx(0.005, rel=0.15)


def test_mt_study_pays_pretraining_once_up_to_the_checkpoint():
    study = _mt()
    by_key = {c.key: c for c in study.candidates}
    ft = by_key["finetune/m/a/t/1@200000"]
    assert ft.requires == ("pretrain/m/a@200000",)
    need = choose.closure(ft.key, by_key, set())
    assert need == [f"pretrain/m/a@{s}" for s in INIT_STEPS[:4]] + [ft.key]
    steps = sum(by_key[k].cost for k in need if k.startswith("pretrain"))
    whole = sum(c.cost for c in study.candidates if c.key.startswith("pretrain/m/a@"))
    assert steps / whole == pytest.approx(0.2)
    # ro-like: 510k steps, so no checkpoint past it; its last segment is the tail to 510k
    assert "finetune/m/b/t/1@750000" not in by_key and "pretrain/m/b@510000" in by_key
    assert study.held_out == (
        "finetune/m/a/t/1@1000000",
        "finetune/m/a/t/2@1000000",
        "finetune/m/b/t/1@500000",
    )
    with pytest.raises(ValueError, match="no pretrained model 'm/c'"):
        simulate_mt.mt_study(
            [simulate_mt.Series("m/c/t/1", "m/c", synthetic.BLEU, synthetic.CE)],
            {},
            init_steps=INIT_STEPS,
        )


def test_check_refuses_held_out_runs_and_missing_parents():
    study = _mt()
    with pytest.raises(ValueError, match=r"held-out runs \['finetune/m/a/t/1@1000000'\]"):
        simulate.check(study, ["finetune/m/a/t/1@1000000"], bootstrap=0)
    with pytest.raises(ValueError, match="needs .*pretrain/m/a@25000"):
        simulate.check(study, ["pretrain/m/a@50000", "finetune/m/a/t/1@50000"], bootstrap=0)


# --- the project's MT convention, and designs against random subsets ------------------------


def test_first_checkpoints_reproduce_the_projects_fits_exactly():
    study = _mt(n_fit=4)
    keys = simulate_mt.first_checkpoints(study, 4)
    assert max(int(k.rsplit("@", 1)[1]) for k in keys) == 200_000
    result = simulate.check(study, keys, seed=0, bootstrap=0)
    assert all(p.design == p.full for p in result.params)
    assert result.fraction < 0.3  # a fifth of the pretraining, half the (short) finetunes
    assert {h.block.split("/")[0] for h in result.held_out} == {"bleu", "ce"}
    assert len(result.held_out) == 6


def _error(study, fit, full_widths):
    """Σ over parameters of ((fit − truth) / the full study's predicted half-width)²."""
    total = 0.0
    for name, log in zip(study.model.names, study.model.log_scaled, strict=True):
        truth, value = study.model.prior[name], fit.params[name]
        if not math.isfinite(value):
            return math.inf
        err = math.log(value / truth) if log else value - truth
        total += (err / full_widths[name]) ** 2
    return total


def _full_widths(study):
    """The full study's predicted 95% half-widths (relative for scales, as `_error` measures)."""
    info = information.candidate_information(study.model, study.candidates)
    targets = information.parameter_targets(study.model)
    return information.half_widths(study.model, sum(info.values()), targets)


@pytest.mark.slow
def test_design_beats_random_subsets_in_simulated_mt_fits():
    study = _mt()
    budget = 0.3 * study.full_cost
    design = choose.choose(
        study.model, study.candidates, budget, criterion="d_optimal", exclude=study.held_out
    )
    widths = _full_widths(study)
    ours, theirs = [], []
    for seed in range(3):
        values = simulate.draw(study, seed)
        ours.append(_error(study, simulate.fit(study, values, design.keys), widths))
        for r in range(2):
            rnd = choose.random_design(
                study.model, study.candidates, budget, seed=10 * seed + r, exclude=study.held_out
            )
            assert rnd.cost <= budget
            theirs.append(_error(study, simulate.fit(study, values, rnd.keys), widths))
    assert np.all(np.isfinite(ours))
    assert np.median(ours) < np.median(theirs)


@pytest.mark.slow
def test_cpt_design_recovers_the_full_sweep_and_beats_random():
    study = _small_cpt()
    budget = 0.3 * study.full_cost
    design = choose.choose(
        study.model, study.candidates, budget, targets=study.targets, exclude=study.held_out
    )
    values = simulate.draw(study, 0)
    everything = [c.key for c in study.candidates]
    full = simulate.fit(study, values, everything, bootstrap=30, seed=0)
    ours = simulate.check(study, design.keys, values=values, full=full)
    assert ours.fraction <= 0.3
    assert ours.held_out_pass
    rnd = choose.random_design(
        study.model, study.candidates, budget, seed=1, exclude=study.held_out
    )
    theirs = simulate.check(study, rnd.keys, values=values, full=full)
    assert ours.n_inside >= theirs.n_inside
    widths = _full_widths(study)
    assert _error(study, ours.design, widths) < _error(study, theirs.design, widths)


# --- snapshots and the report ----------------------------------------------------------------


def _snapshots():
    full = [
        Snapshot(10.0, {"E": 1.6, "alpha": 0.5}, {"E": (1.4, 1.8), "alpha": (0.3, 0.7)}),
        Snapshot(100.0, {"E": 1.55, "alpha": 0.41}, {"E": (1.53, 1.57), "alpha": (0.38, 0.44)}),
    ]
    designed = [
        Snapshot(5.0, {"E": 1.5, "alpha": 0.6}, {"E": (1.2, 1.9)}),
        Snapshot(25.0, {"E": 1.56, "alpha": 0.47}, {"E": (1.5, 1.6), "alpha": (0.4, 0.5)}),
    ]
    return {"full": full, "designed": designed}


def test_snapshot_round_trips_its_json_line():
    s = _snapshots()["full"][1]
    line = s.to_json()
    assert json.loads(line) == {
        "chip_hours": 100.0,
        "params": {"E": 1.55, "alpha": 0.41},
        "ci": {"E": [1.53, 1.57], "alpha": [0.38, 0.44]},
    }
    assert Snapshot.from_json(line) == s
    assert (
        read_lines([_snapshots()["full"][1].to_json(), "", _snapshots()["full"][0].to_json()])
        == _snapshots()["full"]
    )
    assert s.width("E") == pytest.approx(0.04 / 1.55)
    with pytest.raises(ValueError, match=r"lacks \['params'\]"):
        Snapshot.from_json('{"chip_hours": 1}')
    with pytest.raises(ValueError, match="must be \\[lo, hi\\]"):
        Snapshot.from_json('{"chip_hours": 1, "params": {"E": 1}, "ci": {"E": [1]}}')
    with pytest.raises(ValueError, match="chip_hours = -1"):
        Snapshot(-1.0, {})
    with pytest.raises(ValueError, match=r"\['B'\]"):
        Snapshot(1.0, {"E": 1.0}, {"B": (0.0, 1.0)})


def test_report_section_and_plot(tmp_path):
    sweeps = _snapshots()
    md = design_report.section(sweeps, plot_path="design.png")
    assert "designed 25.0% of full" in md
    assert "| E | 1.55 [1.53, 1.57] | 1.56 [1.5, 1.6] | yes |" in md
    assert "| alpha | 0.41 [0.38, 0.44] | 0.47 [0.4, 0.5] | NO |" in md
    assert "![estimates and interval widths against compute](design.png)" in md
    png = design_report.plot(sweeps, tmp_path / "d.png", title="t")
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match=r"unknown parameters \['B'\]"):
        design_report.section(sweeps, params=["B"])
    with pytest.raises(ValueError, match="empty: \\['designed'\\]"):
        design_report.section({"full": sweeps["full"], "designed": []})
