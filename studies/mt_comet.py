"""The MT report's COMET section and the paper's Fig. 7 analogue (Isik et al. 2024, App. C.1).

The paper scores every finetuned checkpoint by COMET as well as BLEU (its Fig. 1 panel) and shows
in Fig. 7 that COMET follows the same log-law f(Dp) = (log(A·Dp^α))^β when the pretraining data
are aligned and fluctuates when they are not: COMET (0-100) against Dp, one panel per pretraining
mixture (rows: 50/50 on top, 100% English below) and task (columns), a curve per finetuning size
Df with its fitted law, the non-pretrained model as black lines. Here the same figure and a table
of the COMET log-laws come from the runs that logged `eval/<task>/comet` (fitted by
`xlscale fit`'s translation-score step with the paper's settings: Huber δ = 0.1 on log scores, the
first four checkpoints fitted, the rest held out), with the COMET model that scored them named,
since scores of two COMET models, or of a randomly initialised test model, are not comparable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.formats import fmt
from fitting.laws.saved_fits import fit_entries, fit_object, held_out_max
from pipelines.comet.scoring import is_random_model
from studies.mt_findings import COMET, TOLERANCE, Cell, comet_models, count_label

FIGURE = "mt_comet_fig7.png"
_DF_STYLES = (":", "--", "-")  # the paper's dotted, dashed, solid for increasing Df
_MIX_COLORS = ("tab:orange", "tab:red", "tab:blue", "tab:green", "tab:purple")


def comet_cells(cells: Sequence[Cell]) -> list[Cell]:
    """The cells with at least one COMET value."""
    return [c for c in cells if COMET in c.values and np.isfinite(c.values[COMET]).any()]


def _mixtures(cells: Sequence[Cell]) -> list[str]:
    """Mixtures, most aligned first (the paper's top row is the 50/50 mixture)."""
    best = {}
    for c in cells:
        best[c.mixture] = max(best.get(c.mixture, -1.0), c.alignment or 0.0)
    return sorted(best, key=lambda m: (-best[m], m))


def figure(cells: Sequence[Cell], fits: Mapping[str, Any], out_dir: Path) -> str | None:
    """Writes the Fig. 7 analogue (`FIGURE`) when some run logged COMET; returns its file name
    (None: nothing to draw)."""
    from fitting.reports import plots

    cc = comet_cells(cells)
    if not cc:
        return None
    entries = fit_entries(fits)
    mixtures = _mixtures(cc)
    tasks = sorted({c.task for c in cc})
    dfs = sorted({c.df for c in cc if c.df is not None})
    styles = {d: _DF_STYLES[min(i, len(_DF_STYLES) - 1)] for i, d in enumerate(dfs)}
    rows = []
    for i, mix in enumerate(mixtures):
        row = []
        for task in tasks:
            series = [
                plots.SeriesStyle(
                    label=f"Df={count_label(c.df)}",
                    Dp=c.Dp,
                    values=c.values[COMET],
                    fit=fit_object(entries.get((c.model, c.mixture, c.task, c.steps, COMET))),
                    baseline=c.baseline.get(COMET),
                    color=_MIX_COLORS[i % len(_MIX_COLORS)],
                    linestyle=styles.get(c.df, "--"),
                )
                for c in cc
                if c.mixture == mix and c.task == task
            ]
            alignment = next((c.alignment for c in cc if c.mixture == mix and c.task == task), None)
            row.append((f"{task}: {mix} (A={fmt(alignment, 2)})", "COMET (0-100)", series))
        rows.append(row)
    plots.downstream_grid(
        rows,
        out_dir / FIGURE,
        title="COMET vs Dp (MT paper Fig. 7; black: no pretraining)",
    )
    return FIGURE


def _model_lines(runs: Sequence[Any]) -> list[str]:
    """Which COMET model scored which runs, and whether its scores mean anything."""
    models = comet_models(runs)
    lines = []
    for path, ids in sorted(models.items()):
        n = f"{len(ids)} run{'s' if len(ids) != 1 else ''}"
        if path == "?":
            lines.append(f"- {n}: their configs name no COMET model (COMET_MODEL unknown).")
        elif is_random_model(path):
            lines.append(
                f"- `{path}` ({n}): a **randomly initialised test model** "
                "(`pipelines/comet/random_model.py`, COMET's architecture with random weights): its "
                "scores are **not meaningful** as translation quality; this section only shows "
                "that the COMET wiring works."
            )
        else:
            where = "" if Path(path).is_file() else " (not found on this machine)"
            lines.append(f"- `{path}`{where} ({n}).")
    if len(models) > 1:
        lines.append(
            "- Several COMET models scored these runs: their values are not comparable with "
            "each other."
        )
    return lines


def section(
    cells: Sequence[Cell], runs: Sequence[Any], fits: Mapping[str, Any], png: str | None
) -> list[str]:
    """Markdown: the COMET section (model, scale, fitted log-laws, the Fig. 7 analogue), or one
    line saying that no run logged COMET."""
    cc = comet_cells(cells)
    if not cc:
        return [
            "**COMET (the paper's Fig. 7):** no run logged COMET (`eval/<task>/comet`), so there "
            "is no COMET figure or fit; to score it, build COMET's environment (`make "
            "comet-env`) and set COMET_MODEL (README, COMET).",
            "",
        ]
    entries = fit_entries(fits)
    out = [
        "## COMET (the paper's Fig. 7)",
        "",
        "The paper (App. C.1, Fig. 7): COMET follows the log-law when the pretraining data are "
        "aligned and fluctuates, sometimes worsening with more pretraining, when they are not, "
        "as BLEU does. COMET here is the system score × 100 (the paper's 0–100 scale), scored "
        "by:",
        "",
        *_model_lines(runs),
        "",
        "| pretraining data (A) | task | Df | COMET by checkpoint (least → most Dp) | no "
        "pretraining | log-law (log A, α, β) | max held-out dev. | within 5% | converged |",
        "|---|---|---|---|---:|---|---:|---|---|",
    ]
    held, total = 0, 0
    for c in cc:
        values = ", ".join(fmt(v, 4) for v in c.values[COMET])
        base = fmt(c.baseline.get(COMET), 4)
        head = f"| {c.mixture} ({fmt(c.alignment, 2)}) | {c.task} | {count_label(c.df)} | "
        e = entries.get((c.model, c.mixture, c.task, c.steps, COMET))
        if e is None:
            out.append(f"{head}{values} | {base} | not fitted | – | – | – |")
            continue
        f = e["fit"]
        dev = held_out_max(e)
        ok = math.isfinite(dev) and dev <= TOLERANCE
        total += 1
        held += ok
        params = ", ".join(fmt(f["params"][k], 4) for k in ("log_A", "alpha", "beta"))
        out.append(
            f"{head}{values} | {base} | {params} | {fmt(dev, 3)} | {'yes' if ok else 'no'} | "
            f"{'yes' if f['converged'] else '**NO**'} |"
        )
    out += [
        "",
        f"→ the COMET log-law predicts the held-out checkpoints within 5% for {held} of {total} "
        "fitted series (fitted on the 4 checkpoints with the least pretraining, Huber δ = 0.1 "
        "on log COMET, as the paper).",
        "",
    ]
    if png:
        out += [f"![{Path(png).stem}]({png})", ""]
    return out
