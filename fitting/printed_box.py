"""The values a printed number allows, and a claim's verdict over all of them.

A paper prints each fitted value to a few digits: "0.30" stands for any value in [0.295, 0.305],
half a unit of its last printed digit either side; "8.98e2" for [897.5, 898.5]. A claim checked
only at the printed values is checked at one point of the box those intervals span, and where a
claim depends steeply on the values (the CPT paper's crossover goes as the power 1/(β' − β) ≈ −10
of its Table 2), a verdict at that point says nothing about the values the paper actually had.
So every check of a paper against itself evaluates over the whole box:

- `Printed`: one printed number (its text as printed), its value and interval.
- `box`: name -> interval for several printed numbers (or intervals already known).
- `points`: the points a function is evaluated at: the printed point (the box's centre), every
  corner (where a function monotone in each value, as most of the papers' closed forms are over
  these small boxes, takes its extremes) and `SAMPLES` seeded uniform points inside (for those
  that are not); a function of k values costs 1 + 2^k + `SAMPLES` evaluations, and its range is
  the min and max over them.
- `verdict_of_range`: a quantity continuous over the (connected) box takes every value between
  the ends of its range, so "it lies in the accepted set" is `CONSISTENT` when the range lies
  inside the set, `CONTRADICTED` when it misses the set, `UNDETERMINED` otherwise (the printed
  digits do not decide it); `judge` gives the range and that verdict.
- `verdict_all` / `verdict_any`: a claim made of parts that must all hold (every size) or of
  alternatives one of which must (some unit), from its parts' verdicts. A claim is called
  contradicted only where one of its parts misses the accepted set over its whole range; parts
  that can each hold are called undetermined together (they might not hold at the same values),
  never consistent unless each holds everywhere.

The verdict is about the paper, not about a fit of ours: "contradicted at every value the table
allows" means no value the paper could have had before rounding makes the claim true.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

CONTRADICTED = "contradicted at every value the table allows"
UNDETERMINED = "not determined by the printed digits"
CONSISTENT = "consistent"
VERDICTS = (CONTRADICTED, UNDETERMINED, CONSISTENT)
SAMPLES = 4096  # seeded uniform points inside the box, beside its centre and corners
_NUMBER = re.compile(r"^\s*([+-]?)(\d+)(?:\.(\d*))?(?:[eE]([+-]?\d+))?\s*$")


@dataclasses.dataclass(frozen=True)
class Printed:
    """A number as a paper prints it.

    Attributes:
      text: the printed digits, in Python's float syntax ("0.30", "420.0", "8.98e2", "-1.68e3"):
        a trailing zero is a printed digit, so keep it.
    """

    text: str

    def __post_init__(self):
        if not _NUMBER.match(self.text):
            raise ValueError(f"printed number {self.text!r}: not digits[.digits][e±exponent]")

    @property
    def value(self) -> float:
        """The printed value."""
        return float(self.text)

    @property
    def half(self) -> float:
        """Half a unit of the last printed digit: how far the unrounded value may lie off."""
        _, _, decimals, exponent = _NUMBER.match(self.text).groups()
        return 0.5 * 10.0 ** (int(exponent or 0) - len(decimals or ""))

    @property
    def interval(self) -> tuple[float, float]:
        """(lo, hi): every value that prints as `text`."""
        return (self.value - self.half, self.value + self.half)


def interval(text: str) -> tuple[float, float]:
    """The interval of values a printed number stands for (`Printed(text).interval`)."""
    return Printed(text).interval


def box(
    values: Mapping[str, str | Printed | tuple[float, float]],
) -> dict[str, tuple[float, float]]:
    """name -> (lo, hi) for each printed number (its text or a `Printed`) or interval given."""
    out = {}
    for name, v in values.items():
        if isinstance(v, str):
            v = Printed(v)
        out[name] = v.interval if isinstance(v, Printed) else (float(v[0]), float(v[1]))
    return out


def points(
    bounds: Mapping[str, tuple[float, float]], *, samples: int = SAMPLES, seed: int = 0
) -> dict[str, np.ndarray]:
    """name -> values at the box's points: its centre first (the printed point), then every
    corner, then `samples` seeded uniform points inside."""
    names = list(bounds)
    lo = np.asarray([bounds[n][0] for n in names], np.float64)
    hi = np.asarray([bounds[n][1] for n in names], np.float64)
    corners = np.asarray(list(itertools.product((0.0, 1.0), repeat=len(names))), np.float64)
    inside = np.random.default_rng(seed).random((samples, len(names)))
    unit = np.vstack([np.full((1, len(names)), 0.5), corners.reshape(-1, len(names)), inside])
    grid = lo + (hi - lo) * unit
    return {n: grid[:, i] for i, n in enumerate(names)}


def span(values) -> tuple[float, float]:
    """(min, max) of the finite values (NaN, NaN when none is)."""
    v = np.asarray(values, np.float64).ravel()
    v = v[np.isfinite(v)]
    return (float(v.min()), float(v.max())) if v.size else (float("nan"), float("nan"))


def verdict_of_range(found: tuple[float, float], accepted: tuple[float, float]) -> str:
    """The verdict on "the quantity lies in `accepted`" for a quantity continuous over the box
    (so that it takes every value between the ends of its range `found`): `CONSISTENT` when the
    range lies inside `accepted`, `CONTRADICTED` when it misses it, else `UNDETERMINED`. A range
    with a NaN end (the quantity undefined somewhere) is never `CONSISTENT`."""
    lo, hi = found
    a, b = accepted
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return UNDETERMINED if np.isfinite(lo) or np.isfinite(hi) else CONTRADICTED
    if a <= lo and hi <= b:
        return CONSISTENT
    return CONTRADICTED if hi < a or lo > b else UNDETERMINED


def verdict_all(verdicts) -> str:
    """The verdict on a claim that needs every part to hold at the same values: `CONTRADICTED`
    if one part is (no value can make the claim true), `CONSISTENT` if every part is, else
    `UNDETERMINED` (conservative: parts that each can hold might not hold together)."""
    verdicts = list(verdicts)
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return CONSISTENT if verdicts and all(v == CONSISTENT for v in verdicts) else UNDETERMINED


def verdict_any(verdicts) -> str:
    """The verdict on a claim that needs one of its alternatives to hold: `CONSISTENT` if one
    is, `CONTRADICTED` if every one is, else `UNDETERMINED`."""
    verdicts = list(verdicts)
    if CONSISTENT in verdicts:
        return CONSISTENT
    return CONTRADICTED if verdicts and all(v == CONTRADICTED for v in verdicts) else UNDETERMINED


def judge(values, accepted: tuple[float, float]) -> dict[str, Any]:
    """A quantity's values over the box's points against the set the claim accepts: {"range":
    its (min, max), "verdict": `verdict_of_range` of them}. A NaN among the values (the
    quantity undefined at some values) makes the verdict at best `UNDETERMINED`."""
    v = np.asarray(values, np.float64).ravel()
    found = span(v)
    out = verdict_of_range(found, accepted)
    if out == CONSISTENT and not np.all(np.isfinite(v)):
        out = UNDETERMINED
    return {"range": found, "verdict": out}


def over_box(
    fn: Callable[..., Any],
    values: Mapping[str, str | Printed | tuple[float, float]],
    *,
    samples: int = SAMPLES,
    seed: int = 0,
) -> np.ndarray:
    """`fn(**point)` vectorised over the box of `values` (`points`): one result per point, the
    printed point first."""
    return np.asarray(fn(**points(box(values), samples=samples, seed=seed)), np.float64)
