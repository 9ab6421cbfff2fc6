"""Downstream fits read back from fits.json: entries by key, `DownstreamFit` objects for plots,
held-out deviations (the reports work from the saved file, not from a refit)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

# fits.json sections holding downstream fits (`fitting.reports.fit_all.fit_runs(law="all")`).
DOWNSTREAM_SECTIONS = ("bleu", "ce")


def fit_entries(
    fits: Mapping[str, Any],
) -> dict[tuple[str, str, str, str, str], Mapping[str, Any]]:
    """fits.json's downstream entries keyed by (model, pretraining, task, finetuning steps,
    metric): two models' fits of the same mixture and task are two entries ("?" for the model
    of an entry written before fits named it)."""
    out = {}
    for name in DOWNSTREAM_SECTIONS:
        for e in fits.get(name) or []:
            key = (e.get("model", "?"), e["pretraining"], e["task"], str(e["finetune_steps"]))
            out[(*key, e["metric"])] = e
    return out


def fit_object(entry: Mapping[str, Any] | None):
    """A `DownstreamFit` rebuilt from its fits.json entry (for plotting the fitted law), or None
    for no entry; nulls (non-finite values in strict JSON) come back as NaN."""
    if not entry:
        return None
    from fitting.laws.downstream_laws import DownstreamFit

    d = entry["fit"]

    def arr(key):
        return np.asarray([math.nan if v is None else v for v in d[key]], float)

    err = d.get("prediction_error")
    return DownstreamFit(
        law=d["law"],
        params=dict(d["params"]),
        objective=float(d["objective"]),
        converged=bool(d["converged"]),
        grad_norm=float(d["grad_norm"]),
        n_starts=int(d["n_starts"]),
        n_at_best=int(d["n_at_best"]),
        n_fit=int(d["n_fit"]),
        delta=float(d["delta"]),
        Dp=arr("Dp"),
        observed=arr("observed"),
        predicted=arr("predicted"),
        residuals=arr("residuals"),
        fitted=np.asarray(d["fitted"], bool),
        prediction_error=math.nan if err is None else float(err),
    )


def held_out_max(entry: Mapping[str, Any] | None) -> float:
    """The largest |log residual| among the held-out (not fitted) points of a fits.json entry;
    NaN when there is no entry or no held-out residual."""
    if not entry:
        return math.nan
    fit = entry["fit"]
    res = [abs(r) for r, f in zip(fit["residuals"], fit["fitted"], strict=True) if not f and r]
    return max(res) if res else math.nan
