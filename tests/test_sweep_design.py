"""`xlscale sweep design`: candidates from a manifest's runs, a designed subset within budget, and
the `[design]` manifest that expands to exactly the chosen runs with unchanged ids."""

import json
import re
import tomllib

import pytest

from fitting.design import choose
from launch import design, estimate, sweep, sweep_design
from trainer import eval_schedule
from xlscale_cli.main import main


@pytest.fixture(scope="module")
def smoke_runs():
    return sweep.expand(sweep.load_manifest("smoke"))


def test_candidates_follow_the_eval_schedule_and_dependencies(smoke_runs):
    cands = {c.key: c for c in design.candidates(smoke_runs, hardware="8xH100")}
    assert set(cands) == {r.run_id for r in smoke_runs}
    hardware = estimate.parse_hardware("8xH100")
    rate = estimate.hardware_throughput(hardware, mfu=0.5).flops_per_s
    for r in smoke_runs:
        c = cands[r.run_id]
        assert c.requires == r.depends_on
        assert c.cost == pytest.approx(r.cost / rate * 8 / 3600)
        if r.strategy == "cpt_replay":  # not part of the L(N, D) fits
            assert c.points == ()
            continue
        # smoke.toml: EVAL_PERIOD = 6, 24 steps, batch 8 x 64 tokens; the default schedule
        steps = eval_schedule.periodic_steps(total=24, period=6)
        assert sorted(steps) == [6, 12, 18, 24]
        assert [p.inputs[1] for p in c.points] == [s * 8 * 64 for s in sorted(steps)]
        # custom shapes have no nominal size: N on the exact (non-embedding) basis
        assert {p.inputs[0] for p in c.points} == {r.counts.params_non_embedding}
        assert {p.block for p in c.points} == {str(r.strategy)}
    cpt = next(r for r in smoke_runs if r.strategy == "cpt")
    assert cands[cpt.run_id].requires == (cpt.parent,)
    assert design.run_metric("cpt", cpt) == "eval/lm_zh/loss"
    assert design.run_metric("source", cpt) == "eval/lm_en/loss"


def test_paper_candidates_use_the_log_schedule_and_nominal_sizes():
    runs = sweep.expand(sweep.load_manifest("cpt_paper"))
    run = next(r for r in runs if r.strategy == "scratch" and r.size == "llama2_1393m")
    (cand,) = [c for c in design.candidates([run]) if c.key == run.run_id]
    steps = eval_schedule.eval_steps(
        type("C", (), {"enabled": True, "period": 1000, "at_start": True, "schedule": "log",
                       "log_points": 20, "log_start": 0.001})(),
        total=run.steps,
    )  # fmt: skip
    assert steps[0] == 0 and len(cand.points) == len(steps) - 1  # step 0: D = 0, no point
    assert [p.inputs[1] for p in cand.points] == [s * run.batch_size * 2048 for s in steps[1:]]
    assert {p.inputs[0] for p in cand.points} == {1393e6}
    assert cand.cost == pytest.approx(run.cost / 3.6e18)  # no hardware: PFLOP/s-hours


def test_mt_finetunes_yield_dp_points_per_series():
    runs = sweep.expand(sweep.load_manifest("mt_demo"))
    by_id = {r.run_id: r for r in runs}
    cands = design.candidates(runs)
    ft = [c for c in cands if by_id[c.key].strategy == "finetune"]
    assert ft and all(len(c.points) == 2 for c in ft)
    for c in ft:
        run = by_id[c.key]
        parent = by_id[run.parent]
        assert c.points[0].inputs == (run.coord("init_step") * parent.batch_size * 512,)
        assert c.points[0].block == f"bleu/{design.series_key(run)}"
    model = design.study_model(runs)
    assert {b.name for b in model.blocks} == {p.block for c in ft for p in c.points}


def test_design_respects_the_budget_and_writes_a_manifest_of_exactly_its_runs(tmp_path):
    runs = sweep.expand(sweep.load_manifest("smoke"))
    cands = design.candidates(runs, hardware="8xH100")
    full = sum(c.cost for c in cands)
    d = sweep_design.design_sweep(runs, budget=0.3 * full, hardware="8xH100")
    assert 0 < d.result.cost <= 0.3 * full
    assert len(d.result.keys) < len(runs)
    text = sweep_design.manifest_text(
        d, sweep.resolve_manifest_path("smoke").read_text(), source="smoke.toml", command="test"
    )
    path = tmp_path / "smoke_design.toml"
    path.write_text(text)
    designed = sweep.expand(sweep.load_manifest(path))
    assert [r.run_id for r in designed] == [r.run_id for r in runs if r.run_id in d.result.keys]
    assert sorted(tomllib.loads(text)["design"]["runs"]) == sorted(d.result.keys)


@pytest.mark.slow
def test_cli_design_prints_widths_and_plan_lists_the_chosen_runs(tmp_path, capsys):
    out = tmp_path / "cpt.toml"
    args = ["sweep", "design", "cpt_paper", "--budget", "50", "--hardware", "8xH100"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "scratch.alpha" in printed and "cpt.N_opt" in printed and "loss(largest run)" in printed
    assert main([*args, "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["cost"] <= 50 and result["full_cost"] > 40_000
    assert main(["sweep", "plan", str(out), "--no-measure", "--json"]) == 0
    planned = [r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]]
    assert sorted(planned) == sorted(result["keys"])
    full = {r.run_id for r in sweep.expand(sweep.load_manifest("cpt_paper"))}
    assert set(planned) <= full  # same ids as in the full grid
    assert "# Designed subset of cpt_paper.toml" in out.read_text()
    # With a run's own offset (τ, a seed moving the whole curve), a run's checkpoints count as
    # one run's: every sweep, the full manifest too, pins the exponents less tightly.
    assert main([*args, "--out", str(out), "--json", "--run-sigma", "0.004"]) == 0
    shared = json.loads(capsys.readouterr().out)
    for name in ("scratch.alpha", "scratch.beta", "cpt.gamma"):
        assert shared["full_widths"][name] > 1.5 * result["full_widths"][name], name
    assert "--run-sigma 0.004" in out.read_text() and "run offset tau 0.004" in out.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget", "50", "--hardware", "9xTPU"], "--hardware '9xTPU': allowed"),
        (["--budget", "0.01", "--hardware", "8xH100"], "--budget 0.01: below the cheapest"),
        (["--budget", "50", "--hardware", "8xH100", "--criterion", "x"], "--criterion 'x'"),
        (["--budget", "50"], "--hardware is required"),
        (["--budget", "50", "--hardware", "8xH100", "--run-sigma=-1"], "--run-sigma -1.0: allowed"),
    ],
)
def test_cli_design_errors_name_the_flag(tmp_path, capsys, extra, message):
    assert main(["sweep", "design", "cpt_paper", *extra, "--out", str(tmp_path / "x.toml")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists()


def test_design_table_errors(tmp_path):
    text = sweep.resolve_manifest_path("smoke").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text + '\n[design]\nruns = ["source_smoke_d16_s0-0000000000"]\n')
    with pytest.raises(ValueError, match="no run of the grid"):
        sweep.expand(sweep.load_manifest(bad))
    bad.write_text(text + "\n[design]\nrunz = []\n")
    with pytest.raises(ValueError, match="unknown keys"):
        sweep.load_manifest(bad)
    slug = tmp_path / "slug.toml"
    slug.write_text(text + '\n[design]\nruns = ["cpt_smoke_d16_zh_s0"]\n')
    runs = sweep.expand(sweep.load_manifest(slug))
    assert [r.strategy for r in runs] == ["source", "cpt"]  # the run and the run it needs


def test_greedy_design_beats_random_subsets_of_equal_cost(smoke_runs):
    cands = design.candidates(smoke_runs, hardware="8xH100")
    model = design.study_model(smoke_runs)
    budget = 0.4 * sum(c.cost for c in cands)
    best = choose.choose(model, cands, budget, criterion="d_optimal")
    for seed in range(3):
        rand = choose.random_design(model, cands, budget, seed=seed)
        assert best.log_det >= rand.log_det


@pytest.mark.parametrize("name", ["cpt_midscale", "mt_midscale"])
def test_midscale_profiles_fit_a_day_of_one_node(name):
    manifest = sweep.load_manifest(name)
    runs = sweep.expand(manifest)
    assert sorted(r.run_id for r in runs) == sorted(manifest.design_runs)
    cost = design.cost_fn("8xH100")
    assert sum(cost(r) for r in runs) <= 192
    if name == "cpt_midscale":  # the paper's runs, with the paper's ids
        full = {r.run_id for r in sweep.expand(sweep.load_manifest("cpt_paper"))}
        assert {r.run_id for r in runs} <= full
        widths = tomllib.loads(sweep.resolve_manifest_path(name).read_text())["design"]["widths"]
        assert widths["scratch.alpha"] < 0.4 / 4 and widths["cpt.beta"] < 0.2 / 4


def test_prior_from_a_json_of_study_parameters(tmp_path, smoke_runs):
    path = tmp_path / "prior.json"
    path.write_text(json.dumps({"scratch.alpha": 0.3, "cpt.beta": 0.25}))
    model = design.study_model(smoke_runs, design.read_prior(path))
    assert model.prior["scratch.alpha"] == 0.3 and model.prior["cpt.beta"] == 0.25
    assert model.prior["scratch.beta"] == design.synthetic.SCRATCH["beta"]
    path.write_text("[]")
    with pytest.raises(ValueError, match="--prior .*no parameters found"):
        design.read_prior(path)


@pytest.mark.parametrize(
    ("prior", "said"),
    [
        ({"scratch.A": 0.0}, "study prior scratch.A = 0: allowed: finite numbers, and the laws' "
         r"scales \(E, A, B, k\) above 0"),
        ({"cpt.beta": float("nan")}, "study prior cpt.beta = nan: allowed"),
        ({"scratch.alpha": "0.3"}, "no parameters found; .*these values are not numbers: "
         "{'scratch.alpha': '0.3'}"),
    ],
)  # fmt: skip
def test_a_prior_the_design_cannot_use_is_refused_naming_the_file_and_value(
    tmp_path, capsys, prior, said
):
    # A scale of 0 has no log (the design's variables): it used to end `sweep design` on "math
    # domain error"; a NaN used to write a design of NaNs.
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(prior))
    out = tmp_path / "d.toml"
    args = ["sweep", "design", "demo", "--budget", "1", "--hardware", "8xH100"]
    assert main([*args, "--prior", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.search(f"xlscale sweep: --prior {path}: {said}", err), err
    assert not out.exists()


@pytest.mark.slow
def test_a_designed_manifest_designs_again_from_its_full_grid(tmp_path, capsys):
    out = tmp_path / "again.toml"
    args = ["sweep", "design", "cpt_midscale", "--budget", "20", "--hardware", "8xH100"]
    assert main([*args, "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["full_cost"] > 40_000  # the whole cpt_paper grid, not the 190 chip-hours kept
    text = out.read_text()
    assert text.count("\n[design]\n") == 1 and text.count("# Designed subset") == 1
    original = sweep.resolve_manifest_path("cpt_paper").read_text()
    assert sweep_design.original_text(text, where="again.toml") == original
    assert sorted(r.run_id for r in sweep.expand(sweep.load_manifest(out))) == sorted(
        result["keys"]
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(original + '\n[design]\nruns = ["cpt_llama2_49m_zh_s0"]\n')
    assert main(["sweep", "design", str(bad), "--budget", "20", "--hardware", "8xH100"]) == 2
    assert "was not written by `xlscale sweep design`" in capsys.readouterr().err


def test_mt_design_keeps_its_series_baselines():
    runs = sweep.expand(sweep.load_manifest("mt_demo"))
    cands = design.candidates(runs)
    budget = 0.5 * sum(c.cost for c in cands)
    d = sweep_design.design_sweep(runs, budget=budget, hardware=None)
    chosen = d.chosen
    assert d.result.cost <= budget
    tuned = {(r.size, r.coord("finetune_tokens")) for r in chosen if r.strategy == "finetune"}
    scratch = {
        (r.size, r.coord("finetune_tokens")) for r in chosen if r.strategy == "finetune_scratch"
    }
    assert tuned and scratch == tuned
