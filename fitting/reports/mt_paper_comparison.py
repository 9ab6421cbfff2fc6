"""The MT paper (Isik et al. 2024) beside an `xlscale fit` result, row by row, and its own tables
against each other.

`rows(result)` sets every downstream series of a `fitting.reports.fit_all.fit_runs` result beside
the paper's printed law for the same condition (Tables 3-6, Appendix C.3): the BLEU log-law
f(Dp) = (log(A·Dp^α))^β (Tables 3 and 5) and the cross-entropy power law L(Dp) = E + A/Dp^α
(Tables 4 and 6), each evaluated at the series' own Dp. A row says whether the two are comparable
(`CRITERIA`: the model, the score, the language pair, the pretraining data, the finetuning size
Df, the Dp unit and range, a usable printed row) and, when not, every reason. `fig5_rows` sets
each series' BLEU-vs-CE relation beside Fig. 5's (qualitative: the figure prints no numbers).
One series beside its law is `fitting.reports.mt_paper_series`; the printed laws, their
conditions and the Dp grid are `fitting.reports.mt_paper_laws` (both re-exported here).

`consistency()` is the paper's consistency check: its CE coefficients and its BLEU coefficients
evaluated over the same checkpoints, in every candidate Dp unit (`candidate_units`), at the
printed coefficients and over every value their printed digits allow (`fitting.printed_box`). In
tokens (§4 maps each checkpoint to "the number of pretraining tokens seen" [q:mt.s4_one_pass];
steps × 256 × 512 is our reading, `paper_values.MT_DP`), the only unit in which its BLEU laws give
BLEU everywhere (with `log` read as natural: the paper does not state the base), its CE laws give
2e-5 to 2e-4 nats, while a finetuned model's downstream CE is 1-3 nats; `ce_unit()` is the unit
in which both are plausible, or None, and then no CE row is comparable (`ce_reason()`);
`unit_verdict()` is the verdict. Everything is computed from the printed coefficients
(`fitting.reports.paper_values`; the check reads `MT_T5_3B_PRINTED` from this module, so that a
test may put other tables in its place). `section(result)` renders both for report.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fitting import printed_box
from fitting.formats import fmt, markdown_table
from fitting.laws import formulas
from fitting.printed_box import Printed
from fitting.reports.mt_paper_laws import (
    FIG5_TASKS,
    METRIC_LABELS,
    PAPER_METRICS,
    PAPER_MODEL,
    PAPER_TASKS,
    candidate_units,
    evaluate,
    grid_dp,
    paper_laws,
)
from fitting.reports.mt_paper_series import (
    CRITERIA,
    DF_MATCH,
    compare_series,
    entry_df,
    fig5_rows,
)
from fitting.reports.paper_values import MT_T5_3B_PRINTED

__all__ = [
    "BOX_SAMPLES",
    "CRITERIA",
    "DF_MATCH",
    "FIG5_COLUMNS",
    "FIG5_TASKS",
    "GAP_COLUMNS",
    "METRIC_LABELS",
    "PAPER_METRICS",
    "PAPER_MODEL",
    "PAPER_TASKS",
    "PLAUSIBLE",
    "REAL_CE_NATS",
    "SERIES_COLUMNS",
    "candidate_units",
    "ce_reason",
    "ce_short_reason",
    "ce_unit",
    "compare",
    "comparison_lines",
    "consistency",
    "consistency_section",
    "entry_df",
    "evaluate",
    "fig5_rows",
    "grid_dp",
    "paper_check_rows",
    "paper_laws",
    "paper_laws_printed",
    "rows",
    "section",
    "unit_verdict",
]

# What "plausible" means in the consistency check: BLEU inside (0.1, 100]; a finetuned model's
# per-token downstream CE, nats (real runs: 1-3; allowed wider, 0.3-10, so that a verdict of
# "implausible" is not an artefact of a tight band).
PLAUSIBLE = {"bleu": (0.1, 100.0), "loss": (0.3, 10.0)}
REAL_CE_NATS = (1.0, 3.0)
# Seeded points inside each law's box of printed digits, beside its centre and 8 corners (the
# laws are monotone in each coefficient wherever they are defined, so the corners give the range).
BOX_SAMPLES = 64


# --- the paper's own consistency ------------------------------------------------------------------


def paper_laws_printed(metric: str) -> list[tuple[tuple[str, str, int], dict[str, str]]]:
    """`paper_laws` with each coefficient as printed (its digits: `fitting.printed_box`)."""
    key, _, names = PAPER_METRICS[metric]
    return [
        (cond, dict(zip(names, row[key], strict=True)))
        for cond, row in MT_T5_3B_PRINTED.items()
        if row[key] is not None
    ]


def _over_box(metric: str, printed: Mapping[str, str], dp: np.ndarray) -> np.ndarray:
    """One printed law over every value its printed digits allow (`printed_box.points`):
    [box points, dp], the printed point first."""
    _, law, _ = PAPER_METRICS[metric]
    point = printed_box.points(printed_box.box(printed), samples=BOX_SAMPLES)
    columns = {k: v[:, None] for k, v in point.items()}  # broadcast against dp's row
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.asarray(formulas.LAWS[law].predict(dp[None, :], **columns), np.float64)


def _law_verdict(metric: str, values: np.ndarray) -> str:
    """Whether a law is plausible at every checkpoint: per checkpoint, its range over the box
    against `PLAUSIBLE` (`printed_box.verdict_of_range`), all checkpoints together."""
    return printed_box.verdict_all(
        printed_box.judge(values[:, j], PLAUSIBLE[metric])["verdict"]
        for j in range(values.shape[1])
    )


def _span(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    return (float(finite.min()), float(finite.max())) if finite.size else (math.nan, math.nan)


def consistency() -> list[dict[str, Any]]:
    """Per candidate Dp unit: what Tables 3/5 (BLEU) and 4/6 (CE) give over the manifest's grid,
    over every value their printed digits allow (min, max; printed_min, printed_max at the
    printed digits; laws plausible at every such value, laws plausible at some; values undefined
    at the printed digits), and the unit's `verdict` on "every BLEU law and every CE law is
    plausible" (`fitting.printed_box`); `both` when that is consistent. The laws are evaluated
    with natural logarithms (`fitting.laws.formulas.log_law`: the paper does not state the base)."""
    out = []
    laws = {m: paper_laws_printed(m) for m in PAPER_METRICS}
    for unit, per in candidate_units().items():
        row: dict[str, Any] = {"unit": unit, "tokens_per_unit": per}
        dp = grid_dp() / per
        verdicts = []
        for metric in PAPER_METRICS:
            boxes = [_over_box(metric, p, dp) for _, p in laws[metric]]
            law_verdicts = [_law_verdict(metric, v) for v in boxes]
            lo, hi = _span(np.concatenate([v.ravel() for v in boxes]))
            printed_point = np.stack([v[0] for v in boxes])  # the box's centre: as printed
            at_lo, at_hi = _span(printed_point)
            row[metric] = {
                "min": lo,
                "max": hi,
                "printed_min": at_lo,
                "printed_max": at_hi,
                "plausible_laws": sum(v == printed_box.CONSISTENT for v in law_verdicts),
                "possible_laws": sum(v != printed_box.CONTRADICTED for v in law_verdicts),
                "laws": len(boxes),
                "undefined": int(np.sum(~np.isfinite(printed_point))),
            }
            verdicts.append(printed_box.verdict_all(law_verdicts))
        row["verdict"] = printed_box.verdict_all(verdicts)
        row["both"] = row["verdict"] == printed_box.CONSISTENT
        out.append(row)
    return out


def unit_verdict(rows: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The verdict on "some Dp unit makes Tables 3-6 all plausible" over every unit tried
    (`printed_box.verdict_any` of the units' verdicts)."""
    rows = consistency() if rows is None else rows
    return printed_box.verdict_any(r["verdict"] for r in rows)


def ce_unit() -> str | None:
    """The Dp unit in which every printed BLEU law and every printed CE law is plausible at every
    value its digits allow (the paper's own tokens first), or None when there is none."""
    return next((r["unit"] for r in consistency() if r["both"]), None)


def ce_reason() -> str:
    """Why the printed CE laws cannot be set against measured cross-entropy (computed)."""
    rows = consistency()
    table = {r["unit"]: r for r in rows}
    tok = table["tokens"]
    e_max = max(Printed(p["E"]).value for _, p in paper_laws_printed("loss"))
    if ce_unit() is not None:
        return ""
    bleu_units = [u for u, r in table.items() if r["bleu"]["plausible_laws"] == r["bleu"]["laws"]]
    return (
        f"at the manifest's Dp grid in tokens (our reading of the paper's unit; all "
        f"{tok['bleu']['laws']} BLEU laws give a plausible BLEU, {_range(tok['bleu'], 'printed_')} "
        f"at the printed digits and {_range(tok['bleu'])} over every value they allow, with log "
        f"read as natural, only in {' and '.join(bleu_units) or 'no unit'}), Tables 4 and 6 give "
        f"a downstream CE of {fmt(tok['loss']['min'], 2)}–{fmt(tok['loss']['max'], 2)} nats, "
        "where a finetuned "
        f"model's is {REAL_CE_NATS[0]:g}–{REAL_CE_NATS[1]:g}; no Dp unit of the "
        f"{len(table)} tried makes both plausible (every row's asymptote E ≤ {fmt(e_max, 3)} "
        "nats as printed, whatever the unit): "
        + unit_verdict(rows)
        + ", so the printed CE is on a scale the paper does not state"
    )


def ce_short_reason() -> str:
    """`ce_reason` in one clause, for a table row."""
    tok = next(r for r in consistency() if r["unit"] == "tokens")["loss"]
    return (
        "no Dp unit makes the printed CE (Tables 4, 6) and BLEU (Tables 3, 5) both plausible: in "
        f"tokens the CE laws give {fmt(tok['min'], 2)}–{fmt(tok['max'], 2)} nats (see 'Paper "
        "consistency')"
    )


# --- rows beside a fit result ----------------------------------------------------------------------


def compare(
    entry: Mapping[str, Any], *, unit: str | None = "", reason: str | None = None
) -> dict[str, Any]:
    """One fits.json downstream entry beside the paper's printed law for its condition
    (`mt_paper_series.compare_series`).

    `unit` and `reason` are `ce_unit()` and `ce_short_reason()` (computed when not given; `rows`
    computes them once)."""
    unit = ce_unit() if unit == "" else unit
    reason = (ce_short_reason() if unit is None else "") if reason is None else reason
    return compare_series(entry, unit=unit, reason=reason)


def rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every downstream series of a `fit_runs` result beside the paper (`compare`)."""
    entries = [e for step in ("bleu", "ce") for e in result.get(step) or ()]
    if not entries:
        return []
    unit = ce_unit()
    reason = ce_short_reason() if unit is None else ""
    return [compare(e, unit=unit, reason=reason) for e in entries]


# --- report.md ---------------------------------------------------------------------------------


def _params(p: Mapping[str, float] | None) -> str:
    return "—" if not p else ", ".join(f"{k}={fmt(v, 3)}" for k, v in p.items())


def _range(v: Mapping[str, Any], prefix: str = "") -> str:
    lo, hi = v[f"{prefix}min"], v[f"{prefix}max"]
    return f"{fmt(lo, 3)}–{fmt(hi, 3)}" if math.isfinite(lo) else "undefined everywhere"


def _ranges(v: Mapping[str, Any]) -> str:
    """`printed range (every value the digits allow: box range)`."""
    return f"{_range(v, 'printed_')} (box {_range(v)})"


def consistency_section() -> list[str]:
    """Markdown: the paper's CE tables against its BLEU tables, per candidate Dp unit, over every
    value their printed digits allow, with the verdict."""
    lo, hi = grid_dp()[0], grid_dp()[-1]
    rows = consistency()
    lines = [
        "### Paper consistency: its CE coefficients against its BLEU coefficients",
        "",
        f"Tables 3-6 [q:mt.eq1_log_law] [q:mt.eq3_ce_law] evaluated at the mt_paper manifest's "
        f"checkpoints (Dp {fmt(lo, 3)}–{fmt(hi, 3)} tokens = 25k–1M steps × 256 × 512, our "
        "reading of Dp), with Dp read in each unit, `log` read as the natural logarithm (the "
        "paper does not state the base; in base 10 most of its BLEU laws are undefined on this "
        "grid) and the CE as nats per target token (the paper names no unit). Each law is "
        "evaluated at its printed coefficients and over every value their printed digits allow "
        "(each ± half its last digit: the box's centre, corners and "
        f"{BOX_SAMPLES} seeded points inside, `fitting.printed_box`). A law is plausible when "
        f"every value is finite and inside BLEU {PLAUSIBLE['bleu'][0]:g}–"
        f"{PLAUSIBLE['bleu'][1]:g}, CE {PLAUSIBLE['loss'][0]:g}–{PLAUSIBLE['loss'][1]:g} nats "
        f"(a finetuned model's CE is {REAL_CE_NATS[0]:g}–{REAL_CE_NATS[1]:g}); the counts are "
        "of laws plausible at every value their digits allow.",
        "",
    ]

    def row(r: Mapping[str, Any]) -> list[str]:
        b, c = r["bleu"], r["loss"]
        undefined = f" ({b['undefined']} undefined)" if b["undefined"] else ""
        return [
            r["unit"],
            f"{_ranges(b)}{undefined}",
            f"{b['plausible_laws']}/{b['laws']}",
            _ranges(c),
            f"{c['plausible_laws']}/{c['laws']}",
            r["verdict"],
        ]

    lines += markdown_table(
        (
            "Dp unit",
            "BLEU (Tables 3, 5)",
            "plausible BLEU laws",
            "CE, nats (Tables 4, 6)",
            "plausible CE laws",
            "verdict: both plausible",
        ),
        map(row, rows),
        right=("plausible BLEU laws", "plausible CE laws"),
    )
    unit = ce_unit()
    lines += [
        "",
        f"→ Both plausible in: {unit}."
        if unit
        else "→ Some unit makes both plausible: "
        + unit_verdict(rows)
        + ": "
        + ce_reason()
        + ". The CE rows are therefore not comparable; only the shapes' exponents α would be, "
        "if the printed CE were a rescaled nats value, which the paper does not say.",
        "",
    ]
    return lines


# Columns of the report's series tables: which series, and the right-aligned numbers.
SERIES_COLUMNS = ("model", "pretraining", "task", "Df")
GAP_COLUMNS = ("paper at our largest Dp", "observed there", "max abs log gap")
FIG5_COLUMNS = ("checkpoints", "ρ(BLEU, −CE)", "k", "R²")


def _series_cells(r: Mapping[str, Any]) -> list[str]:
    """The cells of `SERIES_COLUMNS` for one row of `rows` or `fig5_rows`."""
    return [r["model"], r["pretraining"], r["task"], fmt(r["df"])]


def section(result: Mapping[str, Any]) -> list[str]:
    """Markdown for report.md: every downstream series beside the paper, Fig. 5, and the
    paper-consistency table ([] when the result has no downstream series)."""
    found = rows(result)
    if not found:
        return []
    lines = [
        "## The MT paper beside these fits (Isik et al. 2024, Tables 3–6, Fig. 5)",
        "",
        "Each series against the paper's printed law for its condition, evaluated at the "
        "series' own Dp (the paper's unit: steps × 256 × 512). Comparable only when the model "
        "(T5-3B), score (BLEU: Tables 3/5; CE: Tables 4/6), language pair, pretraining data, "
        "Df (within 5%), Dp unit and Dp range all match and the printed row is usable; "
        "otherwise every reason is given. max |log gap|: the largest |log(paper law / "
        "observed)| over the series' checkpoints.",
        "",
    ]
    lines += markdown_table(
        (*SERIES_COLUMNS, "metric", "paper (source)", "ours (fitted)", *GAP_COLUMNS, "comparable"),
        (
            [
                *_series_cells(r),
                METRIC_LABELS.get(r["metric"], r["metric"]),
                f"{_params(r['paper_params'])} ({r['source']})",
                _params(r["fitted_params"]),
                fmt(r["paper_at_max"], 4),
                fmt(r["observed_at_max"], 4),
                fmt(r["max_abs_log_gap"], 3),
                "yes" if r["comparable"] else f"no: {r['why']}",
            ]
            for r in found
        ),
        right=GAP_COLUMNS,
    )
    fig5 = fig5_rows(result)
    if fig5:
        lines += [
            "",
            "Fig. 5 (BLEU against downstream CE; the figure prints no numbers, so the comparison "
            "is qualitative): ρ is Spearman's of BLEU with −CE over the checkpoints (+1: they "
            "move together); k and R² fit Gordon et al.'s BLEU = C·e^(−k·CE) in log BLEU.",
            "",
        ]
        lines += markdown_table(
            (*SERIES_COLUMNS, *FIG5_COLUMNS, "paper", "comparable"),
            (
                [
                    *_series_cells(r),
                    r["n"],
                    fmt(r["rho"], 3),
                    fmt(r["k"], 3),
                    fmt(r["r2"], 3),
                    r["paper"],
                    "qualitatively" if r["comparable"] else f"no: {r['why']}",
                ]
                for r in fig5
            ),
            right=FIG5_COLUMNS,
        )
    return [*lines, "", *consistency_section()]


def paper_check_rows() -> list[tuple[str, str, str, str, None, str]]:
    """`studies.paper_check`'s consistency rows (law, parameter, paper, fitted, tolerance, note):
    the claim that the CE and BLEU tables share a Dp unit (its verdict over every value the
    printed digits allow, `fitting.printed_box.VERDICTS`), then each candidate unit's ranges
    (informational, "-")."""
    rows = consistency()
    unit = ce_unit()
    out = [
        (
            "MT Tables 4, 6 (CE) vs 3, 5 (BLEU)",
            "one Dp unit makes both plausible",
            printed_box.CONSISTENT,
            unit_verdict(rows),
            None,
            f"both plausible with Dp in {unit}" if unit else ce_reason(),
        )
    ]
    for r in rows:
        b, c = r["bleu"], r["loss"]
        out.append(
            (
                "MT Tables 3-6 at the manifest's grid",
                f"Dp in {r['unit']}",
                "-",
                "-",
                None,
                f"BLEU {_ranges(b)} ({b['plausible_laws']}/{b['laws']} plausible); CE "
                f"{_ranges(c)} nats ({c['plausible_laws']}/{c['laws']} plausible): {r['verdict']}",
            )
        )
    return out


def comparison_lines(result: Mapping[str, Any]) -> list[str]:
    """A few lines for `make paper-check`: how many series sit beside a printed law, how many
    are comparable, their largest gap, and the commonest reasons the rest are not."""
    found = rows(result)
    if not found:
        return ["no downstream series"]
    ok = [r for r in found if r["comparable"]]
    gaps = [r["max_abs_log_gap"] for r in ok if math.isfinite(r["max_abs_log_gap"])]
    reasons: dict[str, int] = {}
    for r in found:
        for why in filter(None, r["why"].split("; ")):
            key = (
                why.split(":")[0]
                if why.startswith("no Dp unit")
                else re.sub(r"\d[\d.e+]*", "#", why)
            )
            reasons[key] = reasons.get(key, 0) + 1
    lines = [
        f"{len(found)} downstream series beside Tables 3-6: {len(ok)} comparable"
        + (f", largest |log(paper / observed)| {fmt(max(gaps), 3)}" if gaps else ""),
        "not comparable because (series):",
    ]
    lines += [f"  {n:4d}  {k}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return lines
