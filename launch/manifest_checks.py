"""Errors of sweep manifest tables: each names the manifest, the table and the offending key.

The manifest parser, its budget rules and its `[[select]]` tables all report through these two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def require(ok: bool, where: str, message: str) -> None:
    """Raises `ValueError("<where>: <message>")` unless `ok`."""
    if not ok:
        raise ValueError(f"{where}: {message}")


def check_keys(table: Mapping, allowed: Iterable[str], where: str) -> None:
    """Raises unless every key of `table` is one of `allowed` (the error lists the valid ones)."""
    unknown = sorted(set(table) - set(allowed))
    require(not unknown, where, f"unknown keys {unknown}; valid: {sorted(allowed)}")
