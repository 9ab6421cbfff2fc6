"""The laws as pure functions, against values computed by hand from the papers' formulas."""

import math

import numpy as np
import pytest

from fitting.laws import formulas


def test_chinchilla_and_cpt_match_hand_values():
    N, D = 1.4e9, 2.8e10
    want = 1.55 + 420.0 / N**0.4 + 719.5 / D**0.3
    assert formulas.chinchilla(
        N, D, E=1.55, A=420.0, B=719.5, alpha=0.4, beta=0.3
    ) == pytest.approx(want)
    want_cpt = 1.55 + 420.0 / N**0.4 + 433.3 / (D**0.2 * N**0.08)
    got = formulas.cpt(N, D, E=1.55, A=420.0, alpha=0.4, B=433.3, beta=0.2, gamma=0.08)
    assert got == pytest.approx(want_cpt)
    # gamma = 0 and equal exponents reduce the CPT law to Chinchilla
    assert formulas.cpt(N, D, E=1.5, A=400, alpha=0.3, B=700, beta=0.3, gamma=0.0) == pytest.approx(
        formulas.chinchilla(N, D, E=1.5, A=400, B=700, alpha=0.3, beta=0.3)
    )


def test_compute_laws_and_paper_frontier():
    C = np.array([1e19, 1e21])
    np.testing.assert_allclose(formulas.power(C, k=33.69907, g=0.0579), 33.69907 * C**-0.0579)
    np.testing.assert_allclose(
        formulas.loss_compute(C, E=1.7, A=900.0, gamma=0.15), 1.7 + 900 * C**-0.15
    )


def test_log_law_uses_log_A_and_is_nan_where_undefined():
    Dp = np.array([1e7, 1e9, 1e11])
    got = formulas.log_law(Dp, log_A=-180.75, alpha=9.0, beta=0.75)
    q = -180.75 + 9.0 * np.log(Dp)
    assert math.isnan(got[0])  # log(A·Dp^α) < 0 at 1e7 tokens
    np.testing.assert_allclose(got[1:], q[1:] ** 0.75)
    np.testing.assert_allclose(formulas.power_law(Dp, E=2.0, A=50.0, alpha=0.3), 2 + 50 * Dp**-0.3)


def test_predict_dispatches_by_name_and_rejects_unknown_laws():
    p = {"E": 1.55, "A": 420.0, "B": 719.5, "alpha": 0.4, "beta": 0.3, "extra": 1.0}
    assert formulas.predict("chinchilla", p, 1e9, 1e10) == formulas.chinchilla(
        1e9, 1e10, **{k: p[k] for k in formulas.LAWS["chinchilla"].params}
    )
    with pytest.raises(ValueError, match="unknown law"):
        formulas.predict("kaplan", p, 1.0)


def test_every_law_record_is_consistent_and_fitted_by_a_step():
    import inspect

    from fitting.reports import fit_all

    for name, law in formulas.LAWS.items():
        assert law.name == name
        kw = [
            p.name
            for p in inspect.signature(law.predict).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        ]
        assert sorted(kw) == sorted(law.params), name
        if law.spec is not None:
            assert law.spec.law == name
            mid = {v: 0.5 for v in law.spec.names}
            assert tuple(law.spec.to_params(mid)) == law.params, name
    fitted = {law for step in fit_all.STEPS.values() for law in step.laws}
    assert fitted == set(formulas.LAWS)
    with pytest.raises(ValueError, match="no fit spec"):
        formulas.fit_spec("log_law")
