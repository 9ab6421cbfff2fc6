"""Rank correlation of measured series (`fitting.analyses.correlations`)."""

import math

import pytest

from fitting.analyses.correlations import spearman


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2], [1, 2]))
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5]))


def test_spearman_ties_and_non_finite_pairs():
    # Average ranks for ties; pairs with a NaN or inf are dropped before ranking.
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert spearman([1, 2, float("nan"), 3, 4], [4, 3, 9, float("inf"), 1]) == pytest.approx(-1.0)
