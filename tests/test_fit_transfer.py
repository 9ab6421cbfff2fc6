"""Loss–compute frontier, FLOPs saved / transferred data at equal loss, and replay curves."""

import numpy as np
import pytest
from fit_inputs import given_fit

from fitting.analyses import frontier, transfer
from fitting.checks import FitInputError
from fitting.laws import formulas
from fitting.readers.points import Curve

SCRATCH = {"E": 1.55, "A": 420.0, "B": 719.5, "alpha": 0.40, "beta": 0.30}
CPT = {"E": 1.55, "A": 420.0, "alpha": 0.40, "B": 433.3, "beta": 0.20, "gamma": 0.08}


def _curve(run_id, strategy, n, tokens, loss, fraction=None):
    tokens = np.asarray(tokens, float)
    return Curve(
        run_id,
        strategy,
        "zh",
        0.0,
        n,
        "lm_zh",
        np.arange(len(tokens)),
        tokens,
        6 * n * tokens,
        np.asarray(loss, float),
        np.ones(len(tokens)) if fraction is None else np.asarray(fraction, float),
    )


def test_frontier_keeps_the_lowest_loss_per_compute_bin_and_drops_dominated_points():
    C = np.array([1e18, 1.1e18, 1e19, 1.2e19, 1e20, 1e21])
    L = np.array([3.0, 2.9, 2.5, 2.6, 2.7, 2.2])  # the 1e20 point is worse than a cheaper one
    fc, fl, fr = frontier.frontier_points(C, L, list("abcdef"), bins_per_decade=1)
    np.testing.assert_array_equal(fc, [1.1e18, 1e19, 1e21])
    np.testing.assert_array_equal(fl, [2.9, 2.5, 2.2])
    assert fr == ("b", "c", "f")


def test_frontier_fits_recover_the_frontier_law_with_bootstrap():
    rng = np.random.default_rng(0)
    runs, C, L = [], [], []
    for r in range(6):  # run r0 lies on the law, the others above it: the envelope is the law
        c = np.geomspace(1e18, 1e22, 40)
        C.append(c)
        noise = 1 + (0.005 + 0.02 * rng.random(40)) * (r > 0)
        L.append(formulas.loss_compute(c, E=1.6, A=3000.0, gamma=0.17) * noise)
        runs += [f"r{r}"] * 40
    fr = frontier.fit_frontier(np.concatenate(C), np.concatenate(L), runs, bootstrap=10)
    assert set(fr.runs) == {"r0"}
    assert fr.loss_compute.converged and fr.power.converged
    assert fr.loss_compute.params == pytest.approx({"E": 1.6, "A": 3000.0, "gamma": 0.17}, rel=1e-6)
    assert fr.loss_compute.n_bootstrap == 10 and fr.loss_compute.n_bootstrap_converged >= 8
    lo, hi = fr.power.ci["g"]
    assert lo <= fr.power.params["g"] <= hi
    with pytest.raises(FitInputError, match="mismatched lengths"):
        frontier.fit_frontier([1e18, 1e19], [3.0], ["a", "b"])


def test_equal_loss_transfer_matches_the_laws():
    n = 4e8
    d = np.geomspace(1e8, 8e9, 60)
    scratch = _curve("scratch", "scratch", n, d, formulas.chinchilla(n, d, **SCRATCH))
    cpt_tokens = np.geomspace(2e8, 2e9, 8)
    cpt = _curve("cpt", "cpt", n, cpt_tokens, formulas.cpt(n, cpt_tokens, **CPT))
    t = transfer.equal_loss_transfer(cpt, scratch)
    ok = np.isfinite(t.flops_saved)
    assert ok.sum() >= 5
    law = transfer.law_transfer(
        given_fit("chinchilla", SCRATCH), given_fit("cpt", CPT), np.full(8, n), cpt_tokens
    )
    np.testing.assert_allclose(t.tokens_pt[ok], law.tokens_pt[ok], rtol=0.01)
    np.testing.assert_allclose(t.flops_saved[ok], (t.flops_pt[ok] - t.flops[ok]) / t.flops_pt[ok])
    np.testing.assert_allclose(t.transferred[ok], t.tokens_pt[ok] - cpt_tokens[ok])
    # CPT saves compute early and the saving shrinks along training (CPT paper Fig. 2, top)
    assert t.flops_saved[ok][0] > 0.3 and np.all(np.diff(t.flops_saved[ok]) < 0)
    # the law's D_PT gives the scratch law the CPT law's loss
    np.testing.assert_allclose(
        formulas.chinchilla(n, law.tokens_pt, **SCRATCH),
        formulas.cpt(n, cpt_tokens, **CPT),
        rtol=1e-10,
    )
    with pytest.raises(FitInputError, match="differ in size"):
        transfer.equal_loss_transfer(cpt, _curve("s2", "scratch", 2 * n, d, scratch.loss))


def test_law_transfer_bands_come_from_paired_bootstrap_samples():
    s_samples = tuple({**SCRATCH, "B": b} for b in (700.0, 719.5, 740.0))
    c_samples = tuple({**CPT, "B": b} for b in (420.0, 433.3, 450.0))
    lt = transfer.law_transfer(
        given_fit("chinchilla", SCRATCH, s_samples),
        given_fit("cpt", CPT, c_samples),
        [4e8, 4e8],
        [1e9, 2e9],
    )
    lo, hi = lt.ci["flops_saved"]
    assert np.all(lo <= lt.flops_saved + 1e-12) and np.all(lt.flops_saved <= hi + 1e-12)


def test_replay_curve_uses_per_language_compute():
    n = 4e8
    tokens = np.geomspace(1e8, 8e9, 6)
    src_loss = np.array([2.5, 2.9, 2.8, 2.7, 2.6, 2.55])
    source = _curve("replay_5", "cpt_replay", n, tokens * 0.05, src_loss, fraction=np.full(6, 0.05))
    source = Curve(**{**source.__dict__, "flops": 6 * n * tokens, "replay_ratio": 0.05})
    target = _curve(
        "replay_5", "cpt_replay", n, tokens * 0.95, np.linspace(4, 3, 6), fraction=np.full(6, 0.95)
    )
    target = Curve(**{**target.__dict__, "flops": 6 * n * tokens})
    rc = transfer.replay_curve(source, target)
    np.testing.assert_allclose(rc.source_compute, 0.05 * 6 * n * tokens)
    np.testing.assert_allclose(rc.target_compute, 0.95 * 6 * n * tokens)
    assert (rc.source_start, rc.source_peak, rc.source_final) == (2.5, 2.9, 2.55)
    assert rc.tail_fit is not None and rc.tail_fit.params["g"] > 0  # forgetting recovers
