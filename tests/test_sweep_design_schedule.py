"""`xlscale sweep design --law lr_area`: a CPT manifest's runs as candidates of the schedule-aware
law, their learning rates read from their gin as the trainer builds them and as the law's fits
read them back from metrics.jsonl, and a design within budget from a pilot fit of the law."""

import json
import tomllib

import numpy as np
import pytest
from etils import epath

from fitting.design import choose
from fitting.design.study import Candidate, Point
from fitting.laws import lr_area
from fitting.readers import points
from fitting.readers.run_data import RunData
from launch import design, design_schedule, sweep, sweep_design
from trainer import schedules
from xlscale_cli.main import main

# A pilot fit as `xlscale fit RUNS --law lr_area` writes it (the demo's seed-0 and seed-1 runs,
# rounded): per language and group, the fitted law with its λ, reference scales and residual RMS.
PILOT = {
    "en": {"from_scratch": (0.8, 2.59e5, 88.56, 0.011, (1e-11, 3.43, 0.097, 1.53, 0.25, 0.05, -0.05))},
    "zh": {
        "from_scratch": (0.8, 2.59e5, 88.56, 0.010, (3e-11, 5.23, 0.073, 0.39, 0.48, 0.56, -0.23)),
        "cpt": (0.8, 2.59e5, 88.56, 0.008, (4.05, 0.49, 0.43, 0.76, 0.47, 0.28, 0.047)),
    },
}  # fmt: skip


def _pilot(path, *, n_basis="exact", langs=PILOT):
    entries = {
        lang: {
            group: {
                "fit": {
                    "params": dict(zip(lr_area.PARAMS, params, strict=True)),
                    "decay": decay,
                    "n_ref": n_ref,
                    "s_ref": s_ref,
                    "rms": rms,
                }
            }
            for group, (decay, n_ref, s_ref, rms, params) in groups.items()
        }
        for lang, groups in langs.items()
    }
    path.write_text(json.dumps({"n_basis": n_basis, "lr_area": entries}))
    return path


@pytest.fixture(scope="module")
def demo_runs():
    return sweep.expand(sweep.load_manifest("demo"))


def test_rates_are_the_trainers_schedule_as_the_fits_will_read_them_from_the_records(demo_runs):
    run = next(r for r in demo_runs if r.strategy == "scratch")
    # demo.toml: PEAK_LR 3e-3 over 160 steps, cpt_paper.gin's cosine (5% warm-up, to 10%)
    exact = design_schedule.learning_rates(run)
    built = schedules.cosine(peak=3e-3, total_steps=160, warmup_fraction=0.05, final_fraction=0.1)
    np.testing.assert_allclose(exact, np.asarray(built(np.arange(160))), rtol=1e-6)
    # LOG_EVERY 5 and EVAL_PERIOD 20: a record every 5 steps, each with its step's update's rate
    logged = design_schedule.logged_steps(run)
    assert logged.tolist() == list(range(5, 161, 5))
    records = [{"step": int(s), "learning_rate": float(exact[s - 1])} for s in logged]
    meta = {"model": run.size, "strategy": "scratch", "target_lang": "zh", "languages": ["zh"]}
    read = points.learning_rates(RunData(run.run_id, epath.Path("/nonexistent"), meta, records))
    np.testing.assert_allclose(design_schedule.logged_learning_rates(run), read, rtol=1e-12)
    # the reader holds the first logged rate over the 8-step warm-up's first 4 steps
    assert read[0] == exact[4] > exact[0] == 0.0
    assert design_schedule.block_language(run) == "zh"
    source = next(r for r in demo_runs if r.strategy == "source")
    assert design_schedule.block_language(source) == "en"


def test_candidates_are_points_of_the_schedule_aware_law_on_the_pilots_scales(demo_runs, tmp_path):
    prior = design_schedule.read_prior(_pilot(tmp_path / "fits.json"), demo_runs)
    assert set(prior.scales) == {"source", "scratch", "cpt"}
    assert prior.params["cpt.E"] == 4.05 and prior.scales["cpt"].sigma == 0.008
    cands = {c.key: c for c in design_schedule.candidates(demo_runs, prior, hardware="8xH100")}
    paper = {c.key: c for c in design.candidates(demo_runs, hardware="8xH100")}
    for r in demo_runs:
        c = cands[r.run_id]
        assert c.cost == paper[r.run_id].cost and c.requires == paper[r.run_id].requires
        if r.strategy == "cpt_replay":
            assert c.points == ()
            continue
        # one point per evaluation, as the paper laws' candidates, on N/N0, S1/S0, S2
        assert len(c.points) == len(paper[r.run_id].points) == 8
        n = r.counts.params_non_embedding / 2.59e5
        s1, s2 = lr_area.areas(design_schedule.logged_learning_rates(r), decay=0.8)
        steps = range(20, 161, 20)
        assert [p.inputs for p in c.points] == [(n, s1[s] / 88.56, s2[s]) for s in steps]
        assert [p.progress for p in c.points] == [s / 160 for s in steps]
        assert {p.block for p in c.points} == {str(r.strategy)} and c.points[0].run == r.run_id
    model = design_schedule.study_model(prior)
    point = cands[next(r.run_id for r in demo_runs if r.strategy == "cpt")].points[-1]
    true = dict(zip(lr_area.PARAMS, PILOT["zh"]["cpt"][4], strict=True))
    want = lr_area.formula(*point.inputs, **true)
    assert model.predict("cpt", model.prior, np.asarray([point.inputs]))[0] == pytest.approx(want)
    names = [t.name for t in design_schedule.targets(model, list(cands.values()))]
    assert names == [f"{b}.loss(largest run)" for b in ("source", "scratch", "cpt")]


def test_the_design_respects_the_budget_beats_random_subsets_and_writes_its_law(
    demo_runs, tmp_path, capsys
):
    pilot = _pilot(tmp_path / "fits.json")
    d = sweep_design.design_sweep(
        demo_runs, budget=1.0, hardware=None, prior_path=str(pilot), law="lr_area"
    )
    full = d.result.full_cost
    budget = 0.5 * full
    d = sweep_design.design_sweep(
        demo_runs, budget=budget, hardware=None, prior_path=str(pilot), law="lr_area"
    )
    assert 0 < d.result.cost <= budget and {b.law for b in d.model.blocks} == {"lr_area"}
    assert "cpt.gamma" in d.result.widths and "cpt.loss(largest run)" in d.result.widths
    for seed in range(3):
        rand = choose.random_design(d.model, d.candidates, budget, seed=seed)
        assert d.result.log_det >= rand.log_det
    # the CLI writes a manifest that records the law and expands to exactly the chosen runs
    out = tmp_path / "demo_design.toml"
    args = ["sweep", "design", "demo", "--law", "lr_area", "--prior", str(pilot)]
    args += ["--budget", f"{budget * 8:g}", "--hardware", "8xH100", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert (
        "; law lr_area" in printed and "scratch.C" in printed and "--law lr_area" in out.read_text()
    )
    table = tomllib.loads(out.read_text())["design"]
    assert table["law"] == "lr_area" and "cpt.beta" in table["widths"]
    designed = sweep.expand(sweep.load_manifest(out))
    assert sorted(r.run_id for r in designed) == sorted(table["runs"])
    # An adaptive sweep of the designed manifest refits the law it was designed for, so it
    # needs that law's pilot fit: refused before anything starts.
    assert sweep.load_manifest(out).design_law == "lr_area"
    assert sweep.load_manifest("demo").design_law is None
    runs_dir = tmp_path / "runs"
    run = ["sweep", "run", str(out), "--runs-dir", str(runs_dir), "--adaptive"]
    run += ["--var", f"DATA_DIR={tmp_path}", "--var", f"VOCAB_PATH={tmp_path}/v.model"]
    assert main(run) == 2
    assert f"--adaptive-law lr_area (the law {out} was designed for) needs --adaptive-prior" in (
        capsys.readouterr().err
    )
    assert not runs_dir.exists()


@pytest.mark.parametrize(
    ("manifest", "prior", "message"),
    [
        ("demo", None, "--law lr_area needs --prior: the fits.json of `xlscale fit"),
        ("demo", {"scratch.alpha": 0.3}, "holds no lr_area fits; make one from pilot runs"),
        ("demo", {"en": PILOT["en"]}, "no lr_area fit of zh/from_scratch for the scratch runs"),
        ("cpt_paper", PILOT, "fitted on the exact N basis; the manifest's runs are on the nominal"),
        ("mt_demo", PILOT, "--law lr_area: a law of CPT studies' losses; this manifest is an MT"),
    ],
)
def test_cli_errors_name_the_flag_and_what_the_prior_holds(
    tmp_path, capsys, manifest, prior, message
):
    args = ["sweep", "design", manifest, "--law", "lr_area", "--budget", "50"]
    args += ["--hardware", "8xH100", "--out", str(tmp_path / "x.toml")]
    if isinstance(prior, dict) and "scratch.alpha" in prior:
        (tmp_path / "p.json").write_text(json.dumps(prior))
        args += ["--prior", str(tmp_path / "p.json")]
    elif prior is not None:
        args += ["--prior", str(_pilot(tmp_path / "p.json", langs=prior))]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()


def test_a_paper_design_given_a_schedule_aware_fit_says_which_law_it_holds(tmp_path, capsys):
    args = ["sweep", "design", "demo", "--budget", "50", "--hardware", "8xH100"]
    args += ["--prior", str(_pilot(tmp_path / "p.json")), "--out", str(tmp_path / "x.toml")]
    assert main(args) == 2
    assert "it holds lr_area fits: add --law lr_area" in capsys.readouterr().err
    assert main([*args[:-2], "--law", "nd", "--out", str(tmp_path / "x.toml")]) == 2
    assert "--law 'nd': allowed: paper, lr_area" in capsys.readouterr().err


@pytest.mark.slow
def test_an_adaptive_refit_fits_the_schedule_aware_law_on_the_pilots_scales(tmp_path):
    from fitting.laws import synthetic
    from fitting.readers import run_dirs
    from fitting.reports import fit_all
    from launch import adaptive_fit

    # The paper-law generator's CPT study at four sizes, on a constant schedule (S2 = 0, S1 the
    # step: the law holds L(N, D) exactly); the pilot is the law fitted on every size.
    root = tmp_path / "runs"
    synthetic.write_study(root, sizes=(3e7, 1.2e8, 5e8, 2e9), evals=5, mt=False, seed=3)
    pilot = fit_all.fit_runs(root, tmp_path / "fit", law="lr_area", bootstrap=0, lr_decay=0.9)
    where = {
        "source": ("en", "from_scratch"),
        "scratch": ("zh", "from_scratch"),
        "cpt": ("zh", "cpt"),
    }
    params, scales = {}, {}
    for block, (lang, group) in where.items():
        fit = pilot["lr_area"][lang][group]["fit"]
        params.update({f"{block}.{p}": max(v, 1e-12) for p, v in fit["params"].items()})
        scales[block] = design_schedule.BlockScales(0.9, fit["n_ref"], fit["s_ref"], fit["rms"])
    model = design_schedule.study_model(design_schedule.Prior(params, scales, "pilot"))
    # The adaptive sweep has the three smaller sizes' runs; the largest scratch run is pending.
    data = {r.run_id: r for r in run_dirs.read_runs(root)}
    seen = {k: v for k, v in data.items() if not k.startswith("replay_") and "2e+09" not in k}
    obs_seen = adaptive_fit.Observation({k: "done" for k in seen}, {}, seen, digest="3 sizes")
    state = adaptive_fit.refit(
        model, obs_seen, run_blocks={}, basis=pilot["n_basis"], bootstrap=0, seed=0, chip_hours=1.0,
        scales=scales,
    )  # fmt: skip
    assert set(state.fits) == {"source", "scratch", "cpt"} and not state.why_not
    assert state.record.n_points == 3 * 3 * 5  # blocks x sizes x evaluations
    scratch = state.fits["scratch"]
    assert (scratch.n_ref, scratch.s_ref, scratch.decay) == (
        scales["scratch"].n_ref, scales["scratch"].s_ref, 0.9,
    )  # fmt: skip
    assert all(p.inputs[2] == 0.0 for p in state.observed)  # a constant schedule never anneals
    assert set(state.noise) == {"source", "scratch", "cpt"}
    # The pending run, priced and predicted on the refitted law: within 2% of what it logged.
    run = data["scratch_03_2e+09"]
    steps = [int(r["step"]) for r in run.records]
    s_ref = scales["scratch"].s_ref
    n = 2e9 / scales["scratch"].n_ref
    points = tuple(
        Point("scratch", (n, s / s_ref, 0.0), run=run.run_id, progress=s / steps[-1]) for s in steps
    )
    cands = {run.run_id: Candidate(run.run_id, 10.0, points)}
    pending = type("R", (), {"run_id": run.run_id, "steps": steps[-1]})()
    obs = adaptive_fit.Observation({run.run_id: "pending"}, {}, {}, digest="x")
    (assessed,) = adaptive_fit.assess(model, cands, [pending], obs, state).values()
    assert assessed.identifiable and assessed.gain > 0 and assessed.points_left == 5
    final = run.records[-1]["eval/lm_zh/loss"]
    assert assessed.predicted == pytest.approx(final, rel=0.02)
    assert assessed.interval is None  # no bootstrap: priced, never "predicted within tolerance"
    # With a bootstrap (the law plus the noise its residuals show, refitted), an interval that
    # holds what the run logged, and each fitted parameter's interval in the record.
    boot = adaptive_fit.refit(
        model, obs_seen, run_blocks={}, basis=pilot["n_basis"], bootstrap=12, seed=0,
        chip_hours=1.0, scales=scales,
    )  # fmt: skip
    assert len(boot.fits["scratch"].samples) >= 10 and "scratch.beta" in boot.record.ci
    (assessed,) = adaptive_fit.assess(model, cands, [pending], obs, boot).values()
    lo, hi = assessed.interval
    assert lo < final < hi and assessed.half_width < 0.05


def test_an_adaptive_sweep_refits_the_law_and_prior_it_is_given(demo_runs, tmp_path):
    from launch import adaptive, adaptive_loop

    policy = adaptive.Policy(min_gain=0.0, tolerance=0.02)
    pilot = str(_pilot(tmp_path / "fits.json"))
    runs_dir = str(tmp_path / "runs")
    sweep_ = adaptive_loop.AdaptiveSweep.for_runs(
        demo_runs, runs_dir, policy, law="lr_area", prior_path=pilot
    )
    assert {b.law for b in sweep_.model.blocks} == {"lr_area"}
    assert sweep_.scales["cpt"] == design_schedule.BlockScales(0.8, 2.59e5, 88.56, 0.008)
    some = next(c for c in sweep_.cands.values() if c.points)
    assert len(some.points[0].inputs) == 3 and some.points[-1].progress == 1.0
    session = adaptive.read_session(runs_dir)
    assert session["law"] == "lr_area" and "scratch=zh/from_scratch" in session["prior"]
    # `sweep status` names the law the sweep refits (the runs themselves are not read here)
    (line,) = adaptive_loop.summary_lines([], runs_dir)
    assert line.startswith("# adaptive (--min-gain 0, --tolerance 0.02, --adaptive-law lr_area):")
    with pytest.raises(ValueError, match="--law lr_area needs --prior"):
        adaptive_loop.AdaptiveSweep.for_runs(demo_runs, runs_dir, policy, law="lr_area")
    with pytest.raises(ValueError, match="--law 'nd': allowed: paper, lr_area"):
        adaptive_loop.AdaptiveSweep.for_runs(demo_runs, runs_dir, policy, law="nd")
