"""The translation study's figures: the metrics against Dp with the fitted laws (the MT paper's
Figs. 2–3 layout) and the score against cross-entropy (Fig. 5), for `studies.mt_report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fitting.analyses.task_alignment import alignment_of
from fitting.formats import fmt
from fitting.laws.saved_fits import fit_entries, fit_object
from studies.mt_findings import (
    CE,
    LABELS,
    SCORE_LABELS,
    Cell,
    count_label,
)

_DF_STYLES = (":", "--", "-")
_MIX_COLORS = ("tab:orange", "tab:red", "tab:blue", "tab:green", "tab:purple")


def _styles(cells: Sequence[Cell]) -> tuple[dict[str, str], dict[Any, str]]:
    mixtures = sorted(
        {c.mixture for c in cells}, key=lambda m: (-(alignment_of(m, "mt_en_fr") or 0), m)
    )
    dfs = sorted({c.df for c in cells if c.df is not None})
    colors = {m: _MIX_COLORS[i % len(_MIX_COLORS)] for i, m in enumerate(mixtures)}
    styles = {d: _DF_STYLES[min(i, len(_DF_STYLES) - 1)] for i, d in enumerate(dfs)}
    return colors, styles


def figures(cells: Sequence[Cell], fits: Mapping[str, Any], out_dir: Path) -> list[str]:
    """Writes the Figs. 2–3 grid per task and the Fig. 5 score-vs-CE plot; returns file names."""
    from fitting.reports import plots

    entries = fit_entries(fits)
    colors, styles = _styles(cells)
    written = []
    for task in sorted({c.task for c in cells}):
        tc = [c for c in cells if c.task == task]
        metrics = [m for m in [*SCORE_LABELS, CE] if any(m in c.values for c in tc)]
        mixtures = list(dict.fromkeys(c.mixture for c in tc))
        rows = []
        for metric in metrics:
            row = []
            for mix in mixtures:
                series = []
                for c in (c for c in tc if c.mixture == mix and metric in c.values):
                    e = entries.get((c.model, c.mixture, c.task, c.steps, metric))
                    series.append(
                        plots.SeriesStyle(
                            label=f"Df={count_label(c.df)}",
                            Dp=c.Dp,
                            values=c.values[metric],
                            fit=fit_object(e),
                            baseline=c.baseline.get(metric),
                            color=colors[c.mixture],
                            linestyle=styles.get(c.df, "--"),
                        )
                    )
                title = f"{mix} (A={fmt(alignment_of(mix, task), 2)})"
                row.append((title, LABELS[metric], series))
            rows.append(row)
        path = out_dir / f"mt_laws_{task}.png"
        plots.downstream_grid(
            rows, path, title=f"{task}: metrics vs pretraining tokens (black: no pretraining)"
        )
        written.append(path.name)
        for score in [m for m in SCORE_LABELS if any(m in c.values for c in tc)][:1]:
            series, ce = [], {}
            for c in tc:
                if score in c.values and CE in c.values:
                    s = plots.SeriesStyle(
                        label=c.label,
                        Dp=c.Dp,
                        values=c.values[score],
                        color=colors[c.mixture],
                        linestyle=styles.get(c.df, "--"),
                    )
                    series.append(s)
                    ce[c.label] = c.values[CE]
            bases = {
                (c.df, c.baseline[CE], c.baseline[score])
                for c in tc
                if CE in c.baseline and score in c.baseline
            }
            path = out_dir / f"mt_{score}_vs_ce_{task}.png"
            plots.score_vs_ce(
                series,
                path,
                ce=ce,
                baselines=[
                    (f"no pretraining, Df={count_label(d)}", x, y)
                    for d, x, y in sorted(bases, key=lambda b: b[0] or 0)
                ],
                ylabel=SCORE_LABELS[score],
                title=f"{task}: {SCORE_LABELS[score]} vs downstream CE (large marker: most Dp)",
            )
            written.append(path.name)
    return written


# ------------------------------------------------------------------------------------- report
