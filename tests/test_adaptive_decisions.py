"""The adaptive sweep's decisions (`launch.adaptive`) on synthetic state, their log and its
replay, and the refit and assessment (`launch.adaptive_fit`) on synthetic run directories from
the paper-law generator (`fitting.laws.synthetic.write_study`)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fitting.design import paper_models
from fitting.design.noise import RunNoise
from fitting.design.study import Candidate, Point
from fitting.laws import synthetic
from fitting.readers import run_dirs
from launch import adaptive, adaptive_fit, adaptive_loop
from launch.adaptive import RUN, SKIP, STOP, Policy, RunState
from rundir import names

POLICY = Policy(min_gain=1.0, tolerance=0.02)


def state(**fields) -> RunState:
    base = dict(
        run_id="r",
        status="pending",
        identifiable=True,
        points=4,
        points_left=4,
        gain=10.0,
        cost=2.0,
        predicted=3.0,
        interval=(2.7, 3.3),
    )
    return RunState(**{**base, **fields})


def test_worth_running_runs():
    decision, reason = adaptive.decide(state(), POLICY)  # 5 nats/chip-hour, ±10%
    assert decision == RUN and "5 nats per chip-hour" in reason and "±10.00%" in reason


@pytest.mark.parametrize(("status", "dropped"), [("pending", SKIP), ("running", STOP)])
def test_a_run_predicted_within_tolerance_is_skipped_or_stopped(status, dropped):
    decision, reason = adaptive.decide(state(status=status, interval=(2.97, 3.03)), POLICY)
    assert decision == dropped and "within ±1.00%" in reason


@pytest.mark.parametrize(("status", "dropped"), [("pending", SKIP), ("running", STOP)])
def test_a_run_with_little_information_per_chip_hour_is_skipped_or_stopped(status, dropped):
    decision, reason = adaptive.decide(state(status=status, gain=1.0, cost=4.0), POLICY)
    assert decision == dropped and "0.25 nats per chip-hour" in reason and "--min-gain 1" in reason


def test_zero_thresholds_never_drop_a_run():
    off = Policy(min_gain=0.0, tolerance=0.0)
    assert adaptive.decide(state(gain=0.0, interval=(3.0, 3.0)), off)[0] == RUN


def test_guards_come_before_the_thresholds():
    cheap = dict(gain=0.0, interval=(3.0, 3.0))  # both thresholds would drop it
    assert adaptive.decide(state(needed_by=("cpt_a",), **cheap), POLICY) == (
        RUN,
        "needed by cpt_a",
    )
    decision, reason = adaptive.decide(
        state(identifiable=False, why_not="scratch: 2 model sizes", **cheap), POLICY
    )
    assert decision == RUN and "not identifiable" in reason and "2 model sizes" in reason
    decision, reason = adaptive.decide(state(points=0, points_left=0, **cheap), POLICY)
    assert decision == RUN and "no point" in reason


def test_a_source_run_stays_while_a_pending_dependent_runs():
    cheap = dict(gain=0.0, cost=1.0, interval=(3.0, 3.0))
    states = {
        "src": state(run_id="src", **cheap),
        "cpt": state(run_id="cpt"),  # worth running, and needs src
        "src2": state(run_id="src2", **cheap),
        "cpt2": state(run_id="cpt2", **cheap),  # skipped: src2 is needed by nobody
    }
    deps = {"src": ("cpt",), "src2": ("cpt2",)}
    decided = adaptive.decide_all(states, deps, POLICY)
    assert {k: v[1] for k, v in decided.items()} == {
        "src": RUN,
        "cpt": RUN,
        "src2": SKIP,
        "cpt2": SKIP,
    }
    assert decided["src"][0].needed_by == ("cpt",) and decided["src"][2] == "needed by cpt"


def test_policy_refuses_bad_thresholds():
    with pytest.raises(ValueError, match="--min-gain -1"):
        Policy(min_gain=-1.0)
    with pytest.raises(ValueError, match="--tolerance 1.5"):
        Policy(tolerance=1.5)


def _fit_record() -> adaptive.FitRecord:
    return adaptive.FitRecord(
        digest="abc", n_points=12, params={"scratch.alpha": 0.4}, ci={}, chip_hours=1.5
    )


def test_logged_decisions_reproduce_and_a_changed_line_does_not(tmp_path):
    runs_dir = str(tmp_path)
    states = [
        state(run_id="a"),
        state(run_id="b", status="running", interval=(2.99, 3.01)),
        state(run_id="c", gain=0.1, cost=3.0),
        state(run_id="d", identifiable=False, gain=None, predicted=None, interval=None),
        state(run_id="e", gain=0.0, cost=0.0),  # free: inf rate, logged as null
    ]
    records = [
        adaptive.decision_record(s, *adaptive.decide(s, POLICY), POLICY, _fit_record())
        for s in states
    ]
    adaptive.log_decisions(runs_dir, records)
    result = adaptive.replay(runs_dir)
    assert result.checked == 5 and result.ok
    logged = adaptive.read_lines(runs_dir, names.ADAPTIVE_DECISIONS_FILE)
    assert [line["decision"] for line in logged] == [RUN, STOP, SKIP, RUN, RUN]
    first = logged[0]
    for key in ("time", "run_id", "reason", "gain", "cost", "rate", "predicted", "interval"):
        assert key in first, key
    assert first["min_gain"] == 1.0 and first["tolerance"] == 0.02
    assert first["fit"] == {"digest": "abc", "n_points": 12, "params": {"scratch.alpha": 0.4}}
    # A line whose threshold was changed after the fact no longer reproduces.
    path = adaptive.adaptive_dir(runs_dir) / names.ADAPTIVE_DECISIONS_FILE
    lines = path.read_text().splitlines()
    changed = json.loads(lines[2]) | {"min_gain": 0.01}
    path.write_text("\n".join([*lines[:2], json.dumps(changed), *lines[3:]]) + "\n")
    again = adaptive.replay(runs_dir)
    assert not again.ok and [m[0] for m in again.mismatches] == [3]
    assert again.mismatches[0][1][0] == SKIP and again.mismatches[0][2][0] == RUN


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory):
    """The paper-law generator's CPT study at four sizes (no MT runs), read as fitting reads it."""
    root = tmp_path_factory.mktemp("synthetic")
    synthetic.write_study(root, sizes=(3e7, 1.2e8, 5e8, 2e9), evals=5, mt=False, seed=3)
    return {r.run_id: r for r in run_dirs.read_runs(root)}


def _observe(data, ids) -> adaptive_fit.Observation:
    chosen = {k: v for k, v in data.items() if k in ids}
    return adaptive_fit.Observation(
        states={k: "done" for k in chosen}, steps={}, data=chosen, digest=",".join(sorted(ids))
    )


def _refit(model, obs, *, bootstrap, chip_hours=1.0, run_blocks=None):
    return adaptive_fit.refit(
        model, obs, run_blocks=run_blocks or {}, basis="exact", bootstrap=bootstrap, seed=0,
        chip_hours=chip_hours,
    )  # fmt: skip


@pytest.mark.slow
def test_refit_identifies_the_laws_only_with_enough_sizes(synthetic_runs):
    model = paper_models.cpt_model()
    scratch = sorted(k for k in synthetic_runs if k.startswith("scratch_"))
    two = _refit(model, _observe(synthetic_runs, scratch[:2]), bootstrap=0)
    assert "scratch" not in two.fits and "model sizes" in two.why_not["scratch"]
    assert two.params == dict(model.prior)  # nothing fitted: the prior stands
    ids = [k for k in synthetic_runs if not k.startswith("replay_")]
    full = _refit(model, _observe(synthetic_runs, ids), bootstrap=12, chip_hours=2.0)
    assert set(full.fits) == {"scratch", "cpt", "source"}
    # The well-determined exponents come back (α is poorly pinned by four sizes).
    for name, truth in [("scratch.beta", 0.30), ("cpt.beta", 0.20), ("cpt.gamma", 0.08)]:
        assert full.params[name] == pytest.approx(truth, rel=0.15), name
    lo, hi = full.record.ci["scratch.alpha"]
    assert lo < full.params["scratch.alpha"] < hi
    assert full.record.n_points == 3 * 4 * 5  # source, scratch, cpt x 4 sizes x 5 evaluations
    assert np.all(np.isfinite(full.info)) and full.record.to_json()["chip_hours"] == 2.0
    # Each law's residuals, grouped by run, give its noise (the generator's σ = 0.005 per
    # evaluation, no per-run offset: four runs estimate τ only roughly), logged in fits.jsonl.
    noise = full.record.to_json()["noise"]
    assert set(noise) == {"scratch", "cpt", "source"}
    for block in noise.values():
        assert block["runs"] == 4 and block["points"] == 20
        assert block["sigma"] == pytest.approx(0.005, rel=0.5) and block["run_sigma"] < 0.01


@pytest.mark.slow
def test_assess_prices_remaining_points_and_predicts_the_final_loss(synthetic_runs):
    model = paper_models.cpt_model()
    known = [k for k in synthetic_runs if not k.startswith(("replay_", "cpt_"))]
    fit = _refit(model, _observe(synthetic_runs, known), bootstrap=20)
    # A scratch run at a fifth size, half done, and one not started; each yields 4 points.
    n, d = 8e9, 1.6e11
    points = tuple(Point("scratch", (n, d * f)) for f in (0.25, 0.5, 0.75, 1.0))
    cands = {k: Candidate(k, 10.0, points) for k in ("half", "new")}
    runs = [_FakeRun(k, 100) for k in cands]
    obs = adaptive_fit.Observation(
        states={"half": "running", "new": "pending"}, steps={"half": 50}, data={}, digest="x"
    )
    states = adaptive_fit.assess(model, cands, runs, obs, fit)
    half, new = states["half"], states["new"]
    assert (half.status, new.status) == ("running", "pending")
    assert (half.points_left, new.points_left) == (2, 4) and (half.cost, new.cost) == (5.0, 10.0)
    assert 0 < half.gain < new.gain  # fewer points left, less information
    truth = float(synthetic.formulas.chinchilla(n, d, **synthetic.SCRATCH))
    assert half.predicted == pytest.approx(truth, rel=0.02)
    lo, hi = half.interval
    assert lo <= half.predicted <= hi and half.half_width < 0.05
    # With runs whose curves sit apart (τ), the half-done run's evaluations so far, 1% above
    # the law, move its prediction up by their shrunk mean; the run not started keeps the law's
    # prediction but its interval takes in a whole run's offset (against the law's alone).
    law_only = adaptive_fit.assess(model, cands, runs, obs, dataclasses.replace(fit, noise={}))
    noise = RunNoise(sigma=0.002, run_sigma=0.004, runs=8, points=40)
    offsets = dataclasses.replace(
        fit, noise={"scratch": noise}, residuals={("scratch", "half"): np.full(2, 0.01)}
    )
    moved = adaptive_fit.assess(model, cands, runs, obs, offsets)
    shrink = 2 * 0.004**2 / (0.002**2 + 2 * 0.004**2)
    assert moved["half"].predicted == pytest.approx(half.predicted * np.exp(0.01 * shrink))
    assert moved["new"].predicted == pytest.approx(law_only["new"].predicted)
    assert moved["new"].half_width > max(law_only["new"].half_width, 1.96 * 0.004)
    assert moved["half"].half_width < moved["new"].half_width


def _flat_early_curves(root) -> dict:
    """A study at three sizes (source, scratch, CPT) whose scratch runs' first evaluations do
    not depend on the model's size yet (as a tiny sweep's runs early on, when the larger model
    has not pulled ahead): noiseless losses 1.5 + 700/D^0.3 at every size."""
    synthetic.write_study(root, sizes=(2e4, 8e4, 3e5), evals=3, mt=False, seed=0)
    for path in root.glob("scratch_*/metrics.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records:
            for key in [k for k in record if k.startswith("eval/") and k.endswith("/loss")]:
                record[key] = 1.5 + 700 / record["tokens"] ** 0.3
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return {r.run_id: r for r in run_dirs.read_runs(root) if not r.run_id.startswith("replay_")}


@pytest.mark.slow
def test_a_degenerate_fit_keeps_the_prior_and_names_why(tmp_path):
    # The fit of curves that ignore N converges with A·N^-α gone: A underflows to 0 (a scale
    # the design's log-parameters cannot hold; steering an xmanager adaptive sweep met it and
    # stopped on "math domain error"), or, under other XLA:CPU code, α lands at 0 and A joins E
    # (a law that ignores N). Either way the block waits for more points.
    # The CPT block's second stage holds the scratch fit's E, A and α, so it waits too.
    data = _flat_early_curves(tmp_path)
    model = paper_models.cpt_model()
    fit = _refit(model, _observe(data, list(data)), bootstrap=10)
    assert set(fit.fits) == {"source"}
    why = fit.why_not["scratch"]
    assert why in (
        "the fit is degenerate (scratch.A = 0): needs more points",
        "the fit is degenerate (scratch's law ignores N): needs more points",
    )
    assert fit.why_not["cpt"] == why
    waiting = {k: v for k, v in fit.params.items() if not k.startswith("source.")}
    assert waiting == {k: v for k, v in model.prior.items() if not k.startswith("source.")}
    assert np.all(np.isfinite(fit.info))
    points = tuple(Point("scratch", (1e6, 3e8 * f)) for f in (0.5, 1.0))
    cands = {"next": Candidate("next", 1.0, points)}
    obs = adaptive_fit.Observation(states={"next": "pending"}, steps={}, data={}, digest="z")
    (state,) = adaptive_fit.assess(model, cands, [_FakeRun("next", 10)], obs, fit).values()
    assert not state.identifiable and why.removesuffix(": needs more points") in state.why_not
    assert adaptive.decide_all({"next": state}, {}, POLICY)["next"][1] == RUN


def test_unusable_names_non_finite_values_and_scales_at_or_below_zero():
    model = paper_models.cpt_model()
    good = {"scratch.E": 1.5, "scratch.A": 1e-200, "scratch.alpha": -3.0, "cpt.gamma": -0.1}
    assert model.unusable(good) == ""
    bad = {**good, "scratch.E": 0.0, "cpt.B": float("inf"), "cpt.beta": float("nan")}
    assert model.unusable(bad) == "scratch.E = 0, cpt.B = inf, cpt.beta = nan"
    assert model.unusable({"source.A": -1.0, "not.a.parameter": 0.0}) == "source.A = -1"


def test_a_law_that_ignores_an_input_is_named_and_a_real_effect_is_not():
    model = paper_models.cpt_model()
    inputs = np.array([[n, d] for n in (2e4, 8e4, 3e5) for d in (1e6, 4e6)])
    law = {"scratch.E": 0.9, "scratch.A": 0.6, "scratch.B": 700.0, "scratch.beta": 0.3}
    assert model.ignored_inputs("scratch", {**law, "scratch.alpha": -6.7e-13}, inputs) == ("N",)
    assert model.ignored_inputs("scratch", {**law, "scratch.alpha": 0.03}, inputs) == ()
    flat_d = {**law, "scratch.alpha": 0.3, "scratch.B": 1e-300}
    assert model.ignored_inputs("scratch", flat_d, inputs) == ("D",)
    assert model.ignored_inputs("scratch", {**law, "scratch.alpha": 0.3}, inputs[:0]) == ()


def test_steering_that_fails_leaves_the_launch_alone_and_its_traceback_on_disk(tmp_path):
    # An error of the polling thread is a bug of the steering, not of the runs: the launch goes
    # on, and `run` raises one SteeringError once it returned, naming the file that holds the
    # traceback.
    runs = [_Dep("a", ())]
    noted = []

    class Failing(adaptive_loop.AdaptiveSweep):
        def poll(self) -> bool:
            raise ValueError("math domain error")

    model = paper_models.cpt_model()
    sweep = Failing(runs, str(tmp_path), model, {}, POLICY, note=noted.append)
    launched = []
    with pytest.raises(adaptive_loop.SteeringError) as raised:
        adaptive_loop.run(sweep, lambda: launched.append("ran") or [], poll_s=0.01)
    assert launched == ["ran"]
    path = tmp_path / names.ADAPTIVE_SUBDIR / names.ADAPTIVE_ERROR_FILE
    assert str(raised.value) == (
        "adaptive steering stopped mid-sweep (ValueError: math domain error); its traceback is "
        f"in {path}; the launch goes on as planned"
    )
    assert "Traceback" in path.read_text() and "in poll" in path.read_text()
    assert noted == [
        "adaptive: steering stopped (ValueError: math domain error); the launch goes on as planned"
    ]


@pytest.mark.slow
def test_refit_fits_the_mt_laws_of_a_series_of_finetunes(tmp_path):
    synthetic.write_study(tmp_path, sizes=(3e7, 1e8, 3e8), evals=3, mt=True, seed=1)
    data = {r.run_id: r for r in run_dirs.read_runs(tmp_path)}
    finetunes = sorted(k for k, r in data.items() if r.strategy == "finetune")
    assert len(finetunes) == 8
    model = paper_models.mt_model({"S": {"bleu": synthetic.BLEU, "ce": synthetic.CE}})
    blocks = {k: ["bleu/S", "ce/S"] for k in finetunes}
    pretrain = [k for k, r in data.items() if r.strategy == "pretrain"]
    few = _refit(model, _observe(data, [*pretrain, *finetunes[:2]]), bootstrap=0, run_blocks=blocks)
    assert not few.fits and "distinct Dp" in few.why_not["bleu/S"]
    every = [
        *pretrain,
        *finetunes,
        *(k for k, r in data.items() if r.strategy == "finetune_scratch"),
    ]
    fit = _refit(model, _observe(data, every), bootstrap=0, run_blocks=blocks)
    assert set(fit.fits) == {"bleu/S", "ce/S"} and fit.record.n_points == 16
    assert fit.params["ce/S.alpha"] == pytest.approx(synthetic.CE["alpha"], rel=0.1)
    assert fit.params["bleu/S.beta"] == pytest.approx(synthetic.BLEU["beta"], rel=0.2)
    # With a bootstrap, the MT blocks' parameters get intervals and an unfinished finetune's
    # final BLEU a prediction interval, so `--tolerance` can decide MT runs too.
    boot = _refit(model, _observe(data, every), bootstrap=20, run_blocks=blocks)
    assert boot.params == fit.params
    lo, hi = boot.record.ci["ce/S.alpha"]
    assert lo < boot.params["ce/S.alpha"] < hi
    dp = 2 * float(max(boot.fits["bleu/S"].Dp))  # a finetune beyond the last checkpoint
    cands = {"next": Candidate("next", 1.0, (Point("bleu/S", (dp,)),))}
    obs = adaptive_fit.Observation(states={"next": "pending"}, steps={}, data={}, digest="y")
    (state,) = adaptive_fit.assess(model, cands, [_FakeRun("next", 10)], obs, boot).values()
    lo, hi = state.interval
    assert lo < state.predicted < hi and 0 < state.half_width < 0.2
    no_boot = adaptive_fit.assess(model, cands, [_FakeRun("next", 10)], obs, fit)
    assert no_boot["next"].interval is None


@dataclasses.dataclass(frozen=True)
class _FakeRun:
    """What `assess` reads of a run: its id and length (a `launch.runs.Run` has both)."""

    run_id: str
    steps: int


def test_finished_counts_runs_blocked_behind_a_stopped_one():
    runs = [_Dep("src", ()), _Dep("cpt", ("src",)), _Dep("other", ())]
    obs = adaptive_fit.Observation(
        states={"src": "stopped", "cpt": "pending", "other": "running"}, steps={}, data={},
        digest="",
    )  # fmt: skip
    assert not adaptive_loop.finished(runs, obs)
    done = dataclasses.replace(obs, states={**obs.states, "other": "done"})
    assert adaptive_loop.finished(runs, done)
    assert adaptive_loop.dependents_of(runs) == {"src": ("cpt",)}


@dataclasses.dataclass(frozen=True)
class _Dep:
    run_id: str
    depends_on: tuple[str, ...]


def test_status_reads_a_stop_request_as_stopped_even_with_fresh_metrics(tmp_path):
    from launch import status
    from launch.sweep import expand, load_manifest
    from rundir import records, stop_request

    run = expand(load_manifest("smoke", runs_dir=str(tmp_path)))[0]
    records.append_metrics(run.model_dir, {"step": 3, "train/loss": 5.0})
    assert status.run_status(run).state == "running"  # metrics written just now
    stop_request.request(run.model_dir, reason="SKIP: test")
    got = status.run_status(run)
    assert got.state == "stopped" and got.message == "stop requested: SKIP: test"
    assert status.count_states([got]) == {
        "done": 0, "running": 0, "interrupted": 0, "failed": 0, "pending": 0, "stopped": 1
    }  # fmt: skip


def test_status_lines_show_compute_the_fit_and_decision_counts(tmp_path):
    from launch.sweep import expand, load_manifest
    from rundir import records, stop_request

    runs = expand(load_manifest("smoke", runs_dir=str(tmp_path)))
    runs_dir = str(tmp_path)
    assert adaptive_loop.summary_lines(runs, runs_dir) == []  # no adaptive sweep here
    sweep = adaptive_loop.AdaptiveSweep.for_runs(runs, runs_dir, POLICY)
    total = sum(c.cost for c in sweep.cands.values())
    done, skipped = runs[0], runs[1]
    records.append_metrics(done.model_dir, {"step": done.steps, "train/loss": 5.0})
    (tmp_path / done.run_id / names.COMPLETED_FILE).write_text("{}")
    stop_request.request(skipped.model_dir, reason="SKIP: test")
    adaptive.log_fit(
        runs_dir,
        dataclasses.replace(
            _fit_record(),
            params={"scratch.alpha": 0.4, "scratch.E": 1.5, "cpt.gamma": 0.1},
            ci={"scratch.alpha": (0.3, 0.5)},
            fitted=("scratch",),
        ),
    )
    records_ = [
        adaptive.decision_record(state(run_id=r, **kw), d, "why", POLICY, _fit_record())
        for r, d, kw in [("x", RUN, {}), ("y", SKIP, {}), ("x", STOP, {"status": "running"})]
    ]
    adaptive.log_decisions(runs_dir, records_)
    lines = adaptive_loop.summary_lines(runs, runs_dir)
    spent = sweep.cands[done.run_id].cost
    saved = sweep.cands[skipped.run_id].cost
    assert lines[0] == (
        f"# adaptive (--min-gain 1, --tolerance 0.02): spent {spent:.4g} PFLOP/s-hours, "
        f"saved {saved:.4g} (skipped or stopped) of {total:.4g}"
    )
    assert lines[1] == "# adaptive fit 1 on 12 points (identified: scratch):"
    assert lines[2:4] == ["#   scratch.E = 1.5", "#   scratch.alpha = 0.4  [0.3, 0.5]"]
    assert lines[4] == "# adaptive decisions: 3 logged; latest per run: RUN 0, SKIP 1, STOP 1"


def test_an_adaptive_sweep_refuses_runs_of_several_target_languages(tmp_path):
    from launch.sweep import expand, load_manifest

    runs = expand(load_manifest("cpt_languages", runs_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"target languages \['fr', 'ru'\].*--only"):
        adaptive_loop.AdaptiveSweep.for_runs(runs, str(tmp_path), POLICY)
    assert not adaptive.adaptive_dir(str(tmp_path)).exists()


def test_queued_runs_are_cancelled_before_a_running_one_is_stopped(tmp_path, monkeypatch):
    # A stopped job frees its allocation at once; were a queued run of the same refit cancelled
    # after that, the scheduler could start it in between (SLURM under load).
    from types import SimpleNamespace

    from launch.sweep import expand, load_manifest
    from rundir import stop_request

    runs = expand(load_manifest("smoke", runs_dir=str(tmp_path)))
    running, queued_a, queued_b = (r.run_id for r in runs[:3])
    events = []
    monkeypatch.setattr(
        stop_request, "request", lambda model_dir, **kw: events.append(("stop", model_dir))
    )
    sweep = adaptive_loop.AdaptiveSweep.for_runs(
        runs,
        str(tmp_path),
        POLICY,
        note=lambda line: None,
        cancel_queued=lambda run: events.append(("cancel", run.model_dir)) or "cancelled",
    )
    sweep.fit = SimpleNamespace(record=_fit_record())
    decided = {
        running: (state(run_id=running, status="running"), STOP, "known"),
        queued_a: (state(run_id=queued_a), SKIP, "known"),
        queued_b: (state(run_id=queued_b), SKIP, "known"),
    }
    monkeypatch.setattr(adaptive_fit, "assess", lambda *args: None)
    monkeypatch.setattr(adaptive, "decide_all", lambda *args: decided)
    obs = adaptive_fit.Observation(
        states={running: "running", queued_a: "pending", queued_b: "pending"},
        steps={},
        data={},
        digest="",
    )
    sweep._decide(obs)
    dirs = {r.run_id: r.model_dir for r in runs}
    assert events == [
        ("stop", dirs[queued_a]),
        ("cancel", dirs[queued_a]),
        ("stop", dirs[queued_b]),
        ("cancel", dirs[queued_b]),
        ("stop", dirs[running]),
    ]
    # The log keeps the decisions in the refit's order.
    logged = adaptive.read_lines(str(tmp_path), names.ADAPTIVE_DECISIONS_FILE)
    assert [d["run_id"] for d in logged] == [running, queued_a, queued_b]
