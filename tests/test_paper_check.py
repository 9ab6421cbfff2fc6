"""the papers' manifests written as trainer run dirs from
the papers' laws; fitted, they give back Table 2, eqs. 8-9 and the MT laws, one series per model."""

import json

import numpy as np
import pytest
from paper_runs import en_de_balanced_runs

from fitting.laws import formulas as laws
from fitting.readers import points
from fitting.readers import run_dirs as io
from studies import paper_check, paper_study, paper_truth


@pytest.fixture(scope="module")
def en_de_study(tmp_path_factory):
    """mt_paper's en-de runs of both models with the balanced mixture (and their pretraining
    runs and baselines), written by the study writer."""
    root = tmp_path_factory.mktemp("mt")
    keep = en_de_balanced_runs(root)
    assert {r.base_size for r in keep} == {"t5_3b", "t5_770m"}
    paper_study.write_mt_runs(keep, log=lambda _: None)
    return root, keep


@pytest.mark.slow
def test_mt_runs_are_trainer_run_dirs_with_the_family_counts(en_de_study):
    root, runs = en_de_study
    finetune = next(
        r
        for r in runs
        if r.strategy == "finetune" and r.base_size == "t5_3b" and r.coord("init_step") == 25000
    )
    meta = json.loads((root / finetune.run_id / "run.json").read_text())
    for key in ("params_total", "params_non_embedding", "flops_per_token", "batch_size"):
        assert meta[key] > 0
    assert meta["params_non_embedding"] == finetune.counts.params_non_embedding
    assert meta["finetune_tokens"] == 6_000_000 and meta["train_steps"] == 2**18
    parent = paper_study.pretraining_runs(runs)[finetune.run_id]
    assert meta["init_checkpoint"] == parent.model_dir and meta["init_step"] == 25000
    assert (root / finetune.run_id / "COMPLETED").is_file()


def test_mixed_t5_770m_and_t5_3b_runs_give_one_series_per_model(en_de_study):
    root, runs = en_de_study
    read = io.read_runs(root)
    by_id = {r.run_id: r for r in runs}
    parents = paper_study.pretraining_runs(runs)
    for metric in ("bleu", "loss"):
        series = points.downstream_series(read, metric=metric)
        assert sorted(s.model for s in series) == ["t5_3b", "t5_770m"]
        for s in series:
            assert len(s.Dp) == 8 and np.all(np.diff(s.Dp) > 0)  # no zig-zag of two models
            truth = paper_truth.mt_truth(s.model, "mix_en_50_de_50", "mt_en_de", 6_000_000, metric)
            dp_paper = [paper_study.paper_dp(by_id[i], parents[i]) for i in s.runs]
            np.testing.assert_allclose(s.values, truth(dp_paper), rtol=1e-3)
            assert s.baseline is not None
        base = {s.model: s.baseline for s in series}
        assert base["t5_3b"] != base["t5_770m"]  # each model's own non-pretrained run
    # T5-3B's balanced en-de 6M law is the paper's Table 3 row; T5-770M's a stand-in below it.
    assert paper_truth.mt_truth(
        "t5_3b", "mix_en_50_de_50", "mt_en_de", 6_000_000, "bleu"
    ).from_paper
    dp = np.asarray([3.3e9, 1.3e11])
    small = paper_truth.mt_truth("t5_770m", "mix_en_50_de_50", "mt_en_de", 6_000_000, "bleu")(dp)
    big = laws.log_law(dp, log_A=-180.75, alpha=9.0, beta=0.75)
    np.testing.assert_allclose(small, 0.85 * big, rtol=1e-9)


def test_rows_fail_outside_tolerance_and_the_table_says_so():
    good = paper_check.Row("Table 2", "alpha", 0.40, 0.41, 0.03)
    bad = paper_check.Row("Table 2", "alpha", 0.40, 0.344, 0.03)  # finding 2's exact-basis alpha
    exact = paper_check.Row("fits", "N basis", "nominal", "exact", None)
    assert good.ok and not bad.ok and not exact.ok
    table = paper_check.format_table([good, bad, exact])
    assert table.count("FAIL") == 2 and "14.00%" in table


@pytest.mark.slow
def test_paper_check_recovers_the_papers_laws(tmp_path):
    rows = paper_check.run_paper_check(tmp_path, log=lambda _: None)
    table = paper_check.format_table(rows)
    failed = [r for r in rows if not r.ok]
    assert not failed, table
    names = {(r.law, r.parameter) for r in rows}
    for name in ("E", "A", "B", "alpha", "beta"):
        assert ("Table 2 scratch (zh, nominal N)", name) in names
    assert ("eq. 9 D_opt cpt", "d_coef") in names
    assert ("MT series of t5_770m", "bleu series") in names
    assert sum(r.parameter == "log_A" for r in rows) >= 8  # paper rows compared coefficient-wise
    assert json.loads((tmp_path / "fits_cpt" / "fits.json").read_text())["n_basis"] == "nominal"


def test_synthetic_runs_evaluate_on_the_manifests_schedule(en_de_study, tmp_path):
    """The paper manifests' step-0 and log-spaced evaluations reach the synthetic runs: a CPT run
    of cpt_paper gets step 0 and the dense early points `trainer.eval_schedule` gives it, with
    finite losses that fall from the uniform guess; an mt_paper finetune (EVAL_AT_START) has a
    step-0 loss above its final one."""
    from trainer import eval_schedule

    runs = paper_study.expand_manifests(["cpt_paper"], runs_dir=tmp_path)
    scratch = min((r for r in runs if r.strategy == "scratch"), key=lambda r: r.steps)
    cpt = min((r for r in runs if r.strategy == "cpt"), key=lambda r: r.steps)
    by_id = {r.run_id: r for r in runs}
    paper_study.write_cpt_runs([scratch, cpt, by_id[cpt.parent]], log=lambda _: None)
    for run in (scratch, cpt):
        steps = paper_study.eval_steps(run)
        early = sorted(
            eval_schedule.log_spaced_steps(total=run.steps, points=20, start_fraction=1e-3)
        )
        assert steps[0] == 0 and set(early) <= set(steps)
        assert sum(s < 1000 for s in steps) > 5  # dense before the first periodic point
        recs = [json.loads(line) for line in (tmp_path / run.run_id / "metrics.jsonl").open()]
        assert [r["step"] for r in recs] == steps
        target = f"eval/lm_{run.coord('target_lang')}/loss"
        losses = np.asarray([r[target] for r in recs])
        assert np.all(np.isfinite(losses)) and losses[0] <= np.log(32000) * 1.05  # LR grid, noise
        assert losses[-1] < losses[0]
    # CPT starts below scratch (the source model already knows some of the target language).
    first = {
        r.strategy: json.loads((tmp_path / r.run_id / "metrics.jsonl").open().readline())
        for r in (scratch, cpt)
    }
    key = f"eval/lm_{cpt.coord('target_lang')}/loss"
    assert first["cpt"][key] < first["scratch"][key]

    root, mt_runs = en_de_study
    finetune = next(r for r in mt_runs if r.strategy == "finetune")
    recs = [json.loads(line) for line in (root / finetune.run_id / "metrics.jsonl").open()]
    task = f"eval/{finetune.coord('task')}/loss"
    assert recs[0]["step"] == 0 and recs[0][task] > recs[-1][task]
    assert "eval/mt_en_de/bleu" not in recs[0]  # no decoding before the first update
