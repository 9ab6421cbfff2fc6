"""Rank correlations of measured series, with an explicit answer when there is none to give."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation of the finite pairs of `x` and `y` (ties get average ranks).

    NaN for fewer than 3 finite pairs or a constant input: too few points, or no ordering, say
    nothing about whether two metrics move together, and NaN makes tables show that.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(stats.spearmanr(x, y).statistic)
