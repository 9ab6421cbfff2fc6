"""fitting.design: Fisher information against a hand-computed Jacobian, and the budgeted design
(budget, dependencies paid once, required and excluded runs, errors, better than random)."""

import dataclasses
import math

import numpy as np
import pytest

from fitting.design import choose, information, paper_models
from fitting.design.study import Block, Candidate, Point, StudyModel
from fitting.laws import synthetic

SIZES = np.geomspace(5e7, 3e9, 8)


def _candidates(points: int = 5) -> list[Candidate]:
    """Source, scratch and CPT runs (CPT needs its source run), cost ∝ N²."""
    out = []
    for n in SIZES:
        cost = float((n / 1e8) ** 2)
        for block in ("source", "scratch", "cpt"):
            pts = tuple(Point(block, (n, d)) for d in np.geomspace(0.01, 1, points) * 20 * n)
            needs = (f"source_{n:.3g}",) if block == "cpt" else ()
            out.append(Candidate(f"{block}_{n:.3g}", cost, pts, needs))
    return out


@pytest.fixture(scope="module")
def model():
    return paper_models.cpt_model()


def _info(model, candidates, keys):
    n = len(model.names)
    info = information.candidate_information(model, candidates)
    return sum((info[k] for k in keys), np.zeros((n, n)))


# --- information -----------------------------------------------------------------------------


def _chinchilla_jacobian(p, N, D, sigma):
    """The frozen reference: ∂ log L / ∂ (log E, log A, log B, α, β) of L = E + A/N^α + B/D^β."""
    a_term, b_term = p["A"] * N ** -p["alpha"], p["B"] * D ** -p["beta"]
    L = p["E"] + a_term + b_term
    cols = [np.full_like(N, p["E"]), a_term, b_term, -a_term * np.log(N), -b_term * np.log(D)]
    return np.stack(cols, axis=1) / L[:, None] / sigma


def test_fisher_matches_the_hand_computed_jacobian():
    sigma = 0.02
    block = Block("scratch", "chinchilla", {k: f"s.{k}" for k in synthetic.SCRATCH}, sigma)
    model = StudyModel((block,), {f"s.{k}": v for k, v in synthetic.SCRATCH.items()})
    N = np.array([1e8, 4e8, 2e9])
    D = np.array([3e9, 1e10, 4e10])
    points = [Point("scratch", (n, d)) for n, d in zip(N, D, strict=True)]
    assert model.names == tuple(f"s.{k}" for k in ("E", "A", "B", "alpha", "beta"))
    J = _chinchilla_jacobian(synthetic.SCRATCH, N, D, sigma)
    F = information.fisher(model, points)
    np.testing.assert_allclose(F, J.T @ J, rtol=1e-6)
    # rank 3 from 3 points: only the weak prior makes it invertible
    assert np.linalg.matrix_rank(F, tol=1e-8 * np.abs(F).max()) == 3


def test_grouped_inverse_equals_the_dense_one(model):
    # CPT study: scratch+cpt share E, A, α; source is its own group.
    groups = information.parameter_groups(model)
    assert sorted(len(g) for g in groups) == [5, 8]
    cands = _candidates()
    F = _info(model, cands, [c.key for c in cands][:10])
    targets = [
        *information.parameter_targets(model),
        paper_models.allocation_target(model, "scratch", 1e21),
    ]
    g = information.target_gradients(model, targets)
    dense = information.widths_from(F, dataclasses.replace(g, groups=()))
    assert information.widths_from(F, g) == pytest.approx(dense, rel=1e-9)
    assert information.log_det(F, groups) == pytest.approx(information.log_det(F), rel=1e-9)


def test_parameter_targets_have_exact_gradients(model):
    targets = information.parameter_targets(model)
    exact = information.target_gradients(model, targets)
    numeric = information.target_gradients(
        model, [dataclasses.replace(t, param=None) for t in targets]
    )
    np.testing.assert_allclose(exact.grads, numeric.grads, rtol=1e-6, atol=1e-9)


def test_more_runs_narrow_every_interval(model):
    cands = _candidates()
    targets = information.parameter_targets(model)
    few = information.half_widths(model, _info(model, cands, [c.key for c in cands[:9]]), targets)
    all_ = information.half_widths(model, _info(model, cands, [c.key for c in cands]), targets)
    assert all(all_[k] <= few[k] * (1 + 1e-9) for k in few)
    assert sum(all_.values()) < 0.5 * sum(few.values())


# --- choose ----------------------------------------------------------------------------------


def _check_closed(design, cands):
    by_key = {c.key: c for c in cands}
    seen = set()
    for k in design.keys:
        assert set(by_key[k].requires) <= seen, f"{k} before what it needs"
        seen.add(k)
    assert len(seen) == len(design.keys), "a run chosen twice"


@pytest.mark.parametrize("criterion", sorted(choose.CRITERIA))
def test_design_respects_the_budget_and_pays_dependencies_once(model, criterion):
    cands = _candidates()
    full = sum(c.cost for c in cands)
    d = choose.choose(model, cands, 0.3 * full, criterion=criterion)
    by_key = {c.key: c for c in cands}
    assert d.cost == pytest.approx(sum(by_key[k].cost for k in d.keys))
    assert d.cost <= 0.3 * full
    assert d.fraction == pytest.approx(d.cost / full)
    _check_closed(d, cands)
    cpts = [k for k in d.keys if k.startswith("cpt_")]
    assert cpts, "the CPT law needs CPT runs"
    # a shared source run is paid once even when its source law is also wanted
    assert sum(k.startswith("source_") for k in d.keys) == len(
        {k for k in d.keys if k.startswith("source_")}
    )
    # nothing more fits: every unchosen run (with what it needs) would go over the budget
    have = set(d.keys)
    for c in cands:
        if c.key not in have:
            extra = sum(by_key[k].cost for k in choose.closure(c.key, by_key, have))
            assert d.cost + extra > 0.3 * full


def test_required_runs_come_first_with_what_they_need(model):
    cands = _candidates()
    big = f"cpt_{SIZES[-1]:.3g}"
    d = choose.choose(model, cands, 0.6 * sum(c.cost for c in cands), required=[big])
    assert d.keys[:2] == (f"source_{SIZES[-1]:.3g}", big)
    _check_closed(d, cands)


def test_excluded_runs_and_their_dependents_stay_out(model):
    cands = _candidates()
    src = f"source_{SIZES[-1]:.3g}"
    budget = 0.5 * sum(c.cost for c in cands)
    d = choose.choose(model, cands, budget, exclude=[src])
    assert src not in d.keys and f"cpt_{SIZES[-1]:.3g}" not in d.keys
    r = choose.random_design(model, cands, budget, seed=3, exclude=[src])
    assert src not in r.keys and f"cpt_{SIZES[-1]:.3g}" not in r.keys


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"criterion": "e_optimal"}, "'e_optimal'; choose from d_optimal, targets, matched"),
        ({"budget": 0.0}, "--budget 0.0: must be a positive"),
        ({"budget": 1.0, "required": ["cpt_3e+09"]}, "over --budget 1.0"),
        ({"exclude": ["cpt_7b"]}, "exclude: ['cpt_7b'] are not candidates"),
        (
            {"required": ["cpt_3e+09"], "exclude": ["source_3e+09"]},
            "['cpt_3e+09'] are both required and excluded",
        ),
        ({"required": ["cpt_7b"]}, "'cpt_7b'"),
    ],
)
def test_errors_name_the_bad_value(model, kwargs, message):
    cands = _candidates()
    args = {"budget": 0.3 * sum(c.cost for c in cands), **kwargs}
    with pytest.raises((ValueError, KeyError)) as err:
        choose.choose(model, cands, **args)
    assert message in str(err.value)


def test_duplicate_candidates_and_bad_blocks_are_refused(model):
    c = _candidates()[0]
    with pytest.raises(ValueError, match="distinct"):
        choose.choose(model, [c, c], 1.0)
    with pytest.raises(ValueError, match="unknown law 'chinchila'"):
        Block("x", "chinchila", {}, 0.01)
    with pytest.raises(ValueError, match="sigma = 0"):
        Block("x", "power_law", {"E": "E", "A": "A", "alpha": "a"}, 0)


@pytest.mark.parametrize("criterion", sorted(choose.CRITERIA))
def test_design_beats_random_subsets_of_equal_cost(model, criterion):
    cands = _candidates()
    n = len(model.names)
    budget = 0.25 * sum(c.cost for c in cands)
    targets = [paper_models.allocation_target(model, "scratch", 1e21)]
    full = _info(model, cands, [c.key for c in cands])
    all_targets = [*information.parameter_targets(model), *targets]
    score = choose.CRITERIA[criterion](model, all_targets, full)
    d = choose.choose(model, cands, budget, targets=targets, criterion=criterion)
    best = score(_info(model, cands, d.keys))
    randoms = []
    for seed in range(8):
        r = choose.random_design(model, cands, budget, seed=seed, targets=targets)
        assert r.cost <= budget
        randoms.append(score(_info(model, cands, r.keys)))
        assert randoms[-1] <= best + 1e-9 * abs(best), f"random seed {seed} beat the design"
    assert sum(r < best - 1e-6 * abs(best) for r in randoms) >= 6
    # and on what the study reports: the worst predicted width relative to the full study's
    worst = max(d.widths[k] / d.full_widths[k] for k in d.widths)
    assert worst < 3.0
    assert np.isfinite(d.log_det) and d.log_det > information.log_det(np.zeros((n, n)))


def test_design_is_deterministic(model):
    cands = _candidates()
    budget = 0.25 * sum(c.cost for c in cands)
    a = choose.choose(model, cands, budget, criterion="matched")
    b = choose.choose(model, list(cands), budget, criterion="matched")
    assert a == b
    assert math.isclose(a.to_dict()["fraction"], a.fraction)
