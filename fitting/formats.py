"""Numbers for people and for strict JSON: one formatter and one JSON sanitiser for every report.

Reports round (`fmt`, 4 significant digits by default); `fits.json` and other records keep full
precision but replace non-finite floats by null (`json_safe`), so `json.dumps(allow_nan=False)`
never fails and readers never meet `NaN` tokens.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

MISSING = "–"


def fmt(x: Any, digits: int = 4) -> str:
    """`x` rounded to `digits` significant digits for a table cell; `MISSING` for None, NaN or
    inf; integers and strings as they are."""
    if x is None:
        return MISSING
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        return f"{x:.{digits}g}" if math.isfinite(x) else MISSING
    return str(x)


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Collection[str] = ()
) -> list[str]:
    """A markdown table of ready-made cells (each written as `str` writes it): the header, its
    rule (the columns named in `right` right-aligned, for numbers), then one line per row."""
    rule = "|" + "".join("---:|" if h in right else "---|" for h in header)
    lines = (" | ".join(map(str, row)) for row in rows)
    return ["| " + " | ".join(header) + " |", rule, *(f"| {line} |" for line in lines)]


def num(v: Any) -> float:
    """A JSON value as float: None and non-numbers become NaN (for checks to catch)."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def json_safe(obj: Any) -> Any:
    """`obj` with non-finite floats replaced by None and numpy scalars by Python ones,
    recursively through dicts (keys as strings), lists and tuples (strict JSON)."""
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj
