"""A downstream series of a fit beside the MT paper's printed law for the same condition.

`compare_series` sets one fits.json downstream entry (a BLEU or CE series over Dp) beside the
paper's printed law for its condition (Tables 3-6, Appendix C.3, `fitting.reports.mt_paper_laws`)
evaluated at the series' own Dp, and says whether the two are comparable (`CRITERIA`: the model,
the score, the language pair, the pretraining data, the finetuning size Df, the Dp unit and range,
a usable printed row) and, when not, every reason. `fig5_rows` sets each series' BLEU-vs-CE
relation beside Fig. 5's (qualitative: the figure prints no numbers).

Whether the printed CE laws can be read at all is the paper's consistency check
(`fitting.reports.mt_paper_comparison.ce_unit`): its unit and reason are passed in, so that the
check runs once per report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from fitting.analyses.correlations import spearman
from fitting.formats import fmt
from fitting.laws import formulas
from fitting.reports.mt_paper_laws import (
    FIG5_TASKS,
    METRIC_LABELS,
    PAPER_METRICS,
    PAPER_MODEL,
    PAPER_TASKS,
    candidate_units,
    grid_dp,
)
from fitting.reports.paper_values import MT_DP, MT_T5_3B_LAWS, MT_T5_3B_UNUSABLE

CRITERIA = ("model", "score", "language pair", "pretraining data", "Df", "Dp unit", "Dp range")
DF_MATCH = 0.05  # a Df matches a printed size within 5% (the manifest gives pairs × 512 exactly)
_DF = re.compile(r"Df (\d+)")


def _printed(mixture: str, task: str, df: int | None) -> tuple[int, Mapping[str, Any]] | None:
    for (m, t, printed), row in MT_T5_3B_LAWS.items():
        if (m, t) == (mixture, task) and df and abs(df / printed - 1) < DF_MATCH:
            return printed, row
    return None


def entry_df(entry: Mapping[str, Any]) -> int | None:
    """A fits.json downstream entry's Df (its `finetune_steps` group names it), or None."""
    m = _DF.search(str(entry.get("finetune_steps", "")))
    return int(m.group(1)) if m else None


def _table(metric: str, mixture: str) -> str:
    balanced = mixture != "mix_en_100"
    return {
        ("bleu", True): "Table 3",
        ("bleu", False): "Table 5",
        ("loss", True): "Table 4",
        ("loss", False): "Table 6",
    }.get((metric, balanced), "Tables 3-6")


def _checks(entry: Mapping[str, Any], df: int | None, printed) -> list[tuple[str, bool, str]]:
    """(criterion, met, why not) for each of `CRITERIA`."""
    metric, task, mixture = entry["metric"], entry["task"], entry["pretraining"]
    model = str(entry.get("model", "?"))
    dp = np.asarray(entry["fit"]["Dp"], float)
    lo, hi = float(grid_dp()[0]), float(MT_DP["max_steps"] * MT_DP["batch"] * MT_DP["length"])
    label = METRIC_LABELS.get(metric, metric)
    unit = entry.get("dp_unit", "paper")
    known = any((mixture, task) == k[:2] for k in MT_T5_3B_LAWS)
    return [
        ("model", model.endswith(PAPER_MODEL), f"{model}, the tables are T5-3B's"),
        (
            "score",
            metric in PAPER_METRICS,
            f"the paper prints no {label} coefficients (Figs. 1 and 7 only)",
        ),
        ("language pair", task in PAPER_TASKS, f"{task} is none of the paper's WMT pairs"),
        (
            "pretraining data",
            known,
            f"the tables print no {mixture} row for {task}",
        ),
        (
            "Df",
            printed is not None or not known,  # (no row for the data: said once, above)
            f"Df {fmt(df)} is none of the printed sizes for {task} (within {DF_MATCH:.0%})",
        ),
        ("Dp unit", unit == "paper", f"Dp in {unit} tokens, not the paper's steps × 256 × 512"),
        (
            "Dp range",
            bool(dp.size) and dp.min() >= lo * (1 - 1e-9) and dp.max() <= hi * (1 + 1e-9),
            f"Dp {fmt(float(dp.min()), 3)}–{fmt(float(dp.max()), 3)} lies outside "
            f"{fmt(lo, 3)}–{fmt(hi, 3)} (the manifest's 25k-step first checkpoint to the "
            "paper's 1M steps; the paper lists no checkpoints)",
        ),
    ]


def compare_series(entry: Mapping[str, Any], *, unit: str | None, reason: str) -> dict[str, Any]:
    """One fits.json downstream entry beside the paper's printed law for its condition.

    `unit` and `reason` are `mt_paper_comparison.ce_unit()` and `ce_short_reason()`: the Dp unit
    in which the printed CE laws are plausible (None: none is) and, then, why no CE row is
    comparable."""
    metric, task, mixture = entry["metric"], entry["task"], entry["pretraining"]
    fit = entry["fit"]
    df = entry_df(entry)
    found = _printed(mixture, task, df)
    why = [w for _, ok, w in _checks(entry, df, found) if not ok]
    row: dict[str, Any] = {
        "model": entry.get("model", "?"),
        "pretraining": mixture,
        "task": task,
        "df": df,
        "metric": metric,
        "source": _table(metric, mixture) if metric in PAPER_METRICS else "—",
        "fitted_params": dict(fit["params"]),
        "paper_params": None,
    }
    dp = np.asarray(fit["Dp"], float)
    obs = np.asarray(fit["observed"], float)
    paper_law = None
    if metric in PAPER_METRICS and found is not None:
        key, law, names = PAPER_METRICS[metric]
        printed = found[1][key]
        if printed is None:
            why.append(MT_T5_3B_UNUSABLE.get((mixture, task, found[0], key), "no usable row"))
        else:
            row["paper_params"] = dict(zip(names, printed, strict=True))
            paper_law = law
    if metric == "loss" and unit is None:
        why.append(reason)
    # BLEU: Dp in tokens, the paper's stated unit; CE: in the unit where its laws are plausible.
    per = candidate_units()[unit] if metric == "loss" and unit else 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        paper_at = (
            formulas.predict(paper_law, row["paper_params"], dp / per)
            if paper_law
            else np.full(dp.shape, np.nan)
        )
        gap = np.log(paper_at / obs)
    row.update(
        dp_min=float(dp.min()) if dp.size else math.nan,
        dp_max=float(dp.max()) if dp.size else math.nan,
        observed_at_max=float(obs[-1]) if obs.size else math.nan,
        fitted_at_max=float(np.asarray(fit["predicted"], float)[-1]) if obs.size else math.nan,
        paper_at_max=float(paper_at[-1]) if dp.size else math.nan,
        max_abs_log_gap=float(np.max(np.abs(gap)))
        if np.all(np.isfinite(gap)) and dp.size
        else math.nan,
        comparable=not why,
        why="; ".join(why),
    )
    return row


def fig5_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Fig. 5 per series with both BLEU and CE: Spearman ρ(BLEU, −CE) over the checkpoints and
    Gordon et al.'s exponential relation BLEU = C·e^(−k·CE) fitted in log BLEU (k, R²), beside
    the figure's finding (en-de: consistently correlated; en-fr: in some cases arbitrary)."""
    by_key: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for e in [*(result.get("bleu") or ()), *(result.get("ce") or ())]:
        if e["metric"] in PAPER_METRICS:
            key = (e.get("model"), e["pretraining"], e["task"], e.get("finetune_steps"))
            by_key.setdefault(key, {})[e["metric"]] = e
    out = []
    for (model, mixture, task, _steps), pair in by_key.items():
        if set(pair) != set(PAPER_METRICS):
            continue
        values = {
            m: dict(zip(e["runs"], e["fit"]["observed"], strict=True)) for m, e in pair.items()
        }
        common = [r for r in pair["bleu"]["runs"] if r in values["loss"]]
        bleu = np.asarray([values["bleu"][r] for r in common], float)
        ce = np.asarray([values["loss"][r] for r in common], float)
        k = r2 = math.nan
        if len(common) >= 3 and np.ptp(ce) > 0:
            slope, icpt = np.polyfit(ce, np.log(bleu), 1)
            resid = np.log(bleu) - (slope * ce + icpt)
            total = np.sum((np.log(bleu) - np.log(bleu).mean()) ** 2)
            k, r2 = float(-slope), float(1 - np.sum(resid**2) / total) if total > 0 else math.nan
        paper = {
            "mt_en_de": "consistently correlated (Fig. 5 left)",  # [q:mt.fig5_caption]
            "mt_en_fr": "in some cases arbitrary: BLEU and CE rise together (Fig. 5 right)",
        }.get(task, "—")
        out.append(
            {
                "model": model,
                "pretraining": mixture,
                "task": task,
                "df": entry_df(pair["bleu"]),
                "n": len(common),
                "rho": spearman(bleu, -ce),
                "k": k,
                "r2": r2,
                "paper": paper,
                "comparable": task in FIG5_TASKS,
                "why": ""
                if task in FIG5_TASKS
                else f"Fig. 5 shows en-de and en-fr only, not {task}",
            }
        )
    return out
