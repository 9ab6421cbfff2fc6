"""Binomial confidence for accuracies: Wilson score intervals and an exact test against chance.

Zero-shot accuracies of small models sit near chance; an interval and a test say whether a
difference between strategies, or from guessing, is larger than the sampling noise of n items.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(correct: int, n: int, *, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `correct` successes in `n` trials ((nan, nan) for n = 0).

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0 or n
    successes, which small evaluation sets hit.
    """
    if n <= 0:
        return math.nan, math.nan
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def chance_p_value(correct: int, n: int, chance: float) -> float:
    """Two-sided exact binomial test p-value of `correct` of `n` against success rate `chance`."""
    from scipy.stats import binomtest

    return float(binomtest(int(correct), int(n), float(chance)).pvalue)


def indistinguishable_from_chance(
    accuracy: float, n: int, chance: float, *, alpha: float = 0.05
) -> bool:
    """Whether `accuracy` over `n` items cannot be told apart from guessing at level `alpha`."""
    if n <= 0 or not 0 < chance < 1:
        return True
    return chance_p_value(round(accuracy * n), n, chance) >= alpha
