"""Validation of fit inputs; every error names the offending run or point.

A scaling-law fit silently absorbs a NaN, a zero token count or a truncated run into nonsense
parameters, so bad input stops the fit instead, with a message that says where to look.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class FitInputError(ValueError):
    """Input to a fit is unusable (too few points, NaN or non-positive values, mismatched lengths,
    a run directory without metrics); the message names the run or point."""


class Unidentifiable(FitInputError):
    """The data cannot determine the law's parameters (fewer points than parameters, one model
    size for a law with an N term, ...); the message names the law, the series and what is
    missing. A pipeline skips such a fit (with the message) instead of reporting nonsense."""


def require_distinct(
    *,
    law: str,
    series: str,
    what: str,
    values: Sequence[object],
    minimum: int,
    names: Sequence[str] | None = None,
) -> None:
    """Raises `Unidentifiable` unless `values` hold at least `minimum` distinct entries.

    Args:
      law: the law's name, for the message.
      series: what is being fitted (a language, a model, a run group), for the message.
      what: what the values are ("model sizes", "distinct D"), for the message.
      values: one value per point (or per run).
      minimum: distinct values the law needs.
      names: a readable name per value (e.g. the model names), listed in the message.
    """
    distinct = sorted(set(np.asarray(values, dtype=object).tolist()), key=str)
    if len(distinct) >= minimum:
        return
    if names is not None:
        shown = sorted({str(n) for n in names})
    else:
        shown = [f"{float(v):.4g}" if isinstance(v, (int, float)) else str(v) for v in distinct]
    where = f"{law}/{series}" if series else law
    listed = f" ({', '.join(shown)})" if shown else ""
    raise Unidentifiable(f"{where}: needs >= {minimum} {what}, got {len(distinct)}{listed}")


def point_label(i: int, runs: Sequence[str] | None) -> str:
    """Human-readable name of point i: its index and, when known, its run."""
    if runs is not None and i < len(runs):
        return f"point {i} (run {runs[i]!r})"
    return f"point {i}"


def as_points(
    arrays: Mapping[str, object],
    *,
    runs: Sequence[str] | None = None,
    n_params: int,
    law: str,
    positive: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Converts named 1-D inputs to float64 arrays and checks them.

    Args:
      arrays: name → values (e.g. {"N": ..., "D": ..., "L": ...}).
      runs: optional run id of each point, used in messages and for the bootstrap.
      n_params: number of fitted parameters; fewer points than that is an error.
      law: the law's name, for messages.
      positive: names that must be > 0 (default: all).

    Returns:
      name → float64 array.

    Raises:
      FitInputError: on mismatched lengths, too few points, non-finite or non-positive values.
    """
    out: dict[str, np.ndarray] = {}
    for name, values in arrays.items():
        a = np.asarray(values, dtype=np.float64)
        if a.ndim != 1:
            raise FitInputError(f"{law}: {name} must be one-dimensional, got shape {a.shape}")
        out[name] = a
    lengths = {name: len(a) for name, a in out.items()}
    if runs is not None:
        lengths["runs"] = len(runs)
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{k}={v}" for k, v in lengths.items())
        raise FitInputError(f"{law}: inputs have mismatched lengths ({desc})")
    n = next(iter(out.values())).shape[0] if out else 0
    if n < n_params:
        raise Unidentifiable(
            f"{law}: {n} points cannot determine {n_params} parameters; need at least {n_params}"
        )
    for name in positive if positive is not None else list(out):
        a = out[name]
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            i = int(bad[0])
            raise FitInputError(
                f"{law}: {point_label(i, runs)} has {name} = {float(a[i])!r} (not finite)"
            )
        bad = np.flatnonzero(a <= 0)
        if bad.size:
            i = int(bad[0])
            raise FitInputError(
                f"{law}: {point_label(i, runs)} has {name} = {float(a[i])!r}; it must be positive"
            )
    for name, a in out.items():
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            i = int(bad[0])
            raise FitInputError(
                f"{law}: {point_label(i, runs)} has {name} = {float(a[i])!r} (not finite)"
            )
    return out
