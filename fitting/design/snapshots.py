"""What a sweep knew at one moment: its compute spent, fitted parameters and their intervals.

A `Snapshot` is written after each refit (one JSON line: {"chip_hours": float, "params": {...},
"ci": {name: [lo, hi]}}) by the adaptive controller (`xlscale sweep run --adaptive`) and by the
design benchmark's simulations, and read by `fitting.reports.design_report`, which plots estimates
and interval widths against compute spent for a full and a designed or adaptive sweep.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A sweep's fit after `chip_hours` of compute.

    Attributes:
      chip_hours: compute spent so far (finished runs and evaluated parts of running ones).
      params: study parameter → fitted value.
      ci: study parameter → 95% interval (lo, hi); parameters without one are absent.
    """

    chip_hours: float
    params: Mapping[str, float]
    ci: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not (math.isfinite(self.chip_hours) and self.chip_hours >= 0):
            raise ValueError(f"snapshot chip_hours = {self.chip_hours}: must be finite and ≥ 0")
        unknown = sorted(set(self.ci) - set(self.params))
        if unknown:
            raise ValueError(f"snapshot ci names {unknown}, which are not among its params")

    def width(self, name: str) -> float:
        """The interval's width relative to the estimate (NaN without an interval)."""
        if name not in self.ci:
            return math.nan
        lo, hi = self.ci[name]
        value = self.params[name]
        return (hi - lo) / abs(value) if value else math.nan

    def to_json(self) -> str:
        """One JSON line (unrounded)."""
        return json.dumps(
            {
                "chip_hours": self.chip_hours,
                "params": dict(self.params),
                "ci": {k: [lo, hi] for k, (lo, hi) in self.ci.items()},
            }
        )

    @classmethod
    def from_json(cls, record: str | Mapping[str, Any]) -> Snapshot:
        """A snapshot from its JSON line (or the parsed dict).

        Raises:
          ValueError: a record without chip_hours or params, or an interval not [lo, hi].
        """
        data = json.loads(record) if isinstance(record, str) else record
        missing = [k for k in ("chip_hours", "params") if k not in data]
        if missing:
            raise ValueError(f"snapshot record lacks {missing}: {str(data)[:120]}")
        ci = {}
        for name, pair in data.get("ci", {}).items():
            if len(pair) != 2:
                raise ValueError(f"snapshot ci[{name!r}] = {pair}: must be [lo, hi]")
            ci[name] = (float(pair[0]), float(pair[1]))
        params = {k: float(v) for k, v in data["params"].items()}
        return cls(float(data["chip_hours"]), params, ci)


def read_lines(lines: Iterable[str]) -> list[Snapshot]:
    """Snapshots from JSON lines (blank lines skipped), in compute order."""
    out = [Snapshot.from_json(line) for line in lines if line.strip()]
    return sorted(out, key=lambda s: s.chip_hours)
