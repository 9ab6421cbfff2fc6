"""Durations as the project's progress lines print them (`1h02m`, `3m05s`, `12s`): one format for
the trainer's step line, the data-preparation job, corpus rendering and the sweep's status."""

from __future__ import annotations

import math


def format_duration(seconds: float | None) -> str:
    """`1h02m`, `3m05s` or `12s` (rounded to whole seconds); `?` when unknown (None, NaN, inf),
    as an ETA is before the first rate is measured."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
