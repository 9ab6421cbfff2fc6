"""The translation study's report: the downstream fits plus an honest comparison with the MT paper.

`fitting.reports.fit_all.fit_runs` fits the log-law to every translation score and the power law to the
downstream cross-entropy of each (pretraining data, finetuning size) series and writes fits.json;
this module reads the same runs and answers, with the numbers behind each answer, the questions
the paper (Isik et al. 2024) raises:

  - is the aligned mixture (en 50 / fr 50, alignment 1.0) better than English only (0.7)?
  - does pretraining help more when the finetuning set Df is small, and little when it is large?
  - does the log-law describe BLEU and the power law the cross-entropy (held-out error)?
  - do BLEU and cross-entropy move together along pretraining, or not (its §3.4, Fig. 5)?

plus the alignment score of each mixture and the §3.5 valuation verdict of each (mixture, Df). The
answers are `studies.mt_comparison`'s, the figures `studies.mt_figures`'.
Figures: the metrics against Dp with the fitted laws (Figs. 2–3 layout), BLEU against
cross-entropy (Fig. 5), and COMET against Dp (Fig. 7, `studies.mt_comet`) where runs logged it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.checks import FitInputError
from fitting.formats import fmt, json_safe, num
from fitting.laws.downstream_laws import SCORES
from fitting.laws.saved_fits import fit_entries, held_out_max
from fitting.readers.points import finetune_tokens, paper_tokens_at
from fitting.reports import superglue
from fitting.reports.paper_values import ERROR_DEFINITIONS, MT_EN_FR
from rundir import storage
from rundir.run_record import Strategy
from studies import mt_comet
from studies.mt_comparison import DEBIAN_NOTE, caveats, comparison
from studies.mt_figures import figures
from studies.mt_findings import (
    CE,
    LABELS,
    SCORE_LABELS,
    Cell,
    bleu_noise,
    brevity_penalty,
    collect,
    count_label,
    score_metrics,
    verdicts,
)


def _paper_dp(run: Any) -> float | None:
    """A pretraining run's last Dp in the unit its finetunes' Dp is in (the MT paper's)."""
    try:
        return paper_tokens_at(run, None)
    except FitInputError:
        return None


def runs_table(runs: Sequence[Any], cells: Sequence[Cell]) -> list[str]:
    """Markdown: every run with what it is and what it scored."""
    dp = {rid: (float(d), c) for c in cells for rid, d in zip(c.runs, c.Dp, strict=True)}
    metrics = score_metrics(runs)
    head = "| run | strategy | pretraining data | init step | Dp | Df | steps | CE |"
    head += "".join(f" {SCORE_LABELS[m]} |" for m in metrics)
    lines = [head, "|" + "---|" * (8 + len(metrics))]
    rank = {Strategy.PRETRAIN: 0, Strategy.FINETUNE_SCRATCH: 1, Strategy.FINETUNE: 2}

    def order(r):
        mix = dp[r.run_id][1].mixture if r.run_id in dp else ""
        init = int(r.info.init_step or 0)
        return (rank.get(r.strategy, 3), mix, finetune_tokens(r.info) or 0, init, r.run_id)

    for r in sorted(runs, key=order):
        info = r.info
        task = str(info.mixture_or_task)
        last = r.records[-1] if r.records else {}
        if r.strategy == Strategy.PRETRAIN:
            ce = last.get("train/loss")
            row = [r.run_id, "pretrain", task, "–", count_label(_paper_dp(r)), "–"]
        else:
            mix = dp[r.run_id][1].mixture if r.run_id in dp else "none (random init)"
            d = dp.get(r.run_id, (math.nan,))[0]
            init = info.init_step
            row = [
                r.run_id,
                r.strategy,
                mix,
                fmt(init),
                count_label(d),
                count_label(finetune_tokens(info)),
            ]
            ce = _last(r, f"eval/{task}/loss")
        row += [fmt(info.train_steps), fmt(num(ce))]
        row += [fmt(num(_last(r, f"eval/{task}/{m}"))) for m in metrics]
        lines.append("| " + " | ".join(str(x) for x in row) + " |")
    lines += [
        "",
        "CE: downstream cross-entropy on the held-out translations (nats per target token); for "
        "the pretraining runs, their last span-corruption training loss.",
    ]
    return lines


def _last(run: Any, key: str) -> Any:
    for rec in reversed(run.records):
        if key in rec:
            return rec[key]
    return None


def fits_table(cells: Sequence[Cell], fits: Mapping[str, Any]) -> list[str]:
    """Markdown: the fitted law of every (cell, metric) with its held-out error."""
    entries = fit_entries(fits)
    lines = [
        "| pretraining data (A) | Df | metric | law | parameters | held-out Huber "
        "(ours) | max held-out dev. | converged |",
        "|---|---|---|---|---|---:|---:|---|",
    ]
    skipped = fits.get("skipped") or {}
    for c in cells:
        for metric in [m for m in SCORES if m in c.values] + [CE]:
            e = entries.get((c.model, c.mixture, c.task, c.steps, metric))
            label = LABELS.get(metric, metric)
            head = f"| {c.mixture} ({fmt(c.alignment, 2)}) | {count_label(c.df)} | {label} |"
            if e is None:
                why = next(
                    (
                        v
                        for k, v in skipped.items()
                        if k.endswith(f"/{c.model}/{c.mixture}/{c.task}/{c.steps}/{metric}")
                    ),
                    "no fit",
                )
                lines.append(f"{head} – | not fitted: {why} | – | – | – |")
                continue
            f = e["fit"]
            law = "(log A + α·log Dp)^β" if f["law"] == "log_law" else "E + A/Dp^α"
            params = ", ".join(f"{k}={fmt(v, 4)}" for k, v in f["params"].items())
            lines.append(
                f"{head} {law} | {params} | {fmt(f['prediction_error'], 3)} | "
                f"{fmt(held_out_max(e), 3)} | {'yes' if f['converged'] else '**NO**'} |"
            )
    lines += [
        "",
        f"Laws are fitted to {', '.join(LABELS[m] for m in SCORES)} and the cross-entropy only, "
        "as the paper; chrF++ and BLEU's parts (brevity penalty, precisions, lengths) are "
        "logged, not fitted. "
        "Each law is fitted on the 4 checkpoints with the least pretraining and scored on the "
        "rest (filled and hollow markers in the figures). Held-out Huber (ours): the Huber "
        "loss of the held-out log residuals, summed (δ = 0.1 for scores, 1e-3 for CE); max "
        "held-out dev.: the largest |log(observed / predicted)| among them (0.05 ≈ 5%). "
        "Neither is the paper's 'prediction error', which is not set against them. "
        + ERROR_DEFINITIONS["mt"],
        "",
        "For reference, the paper's en-fr BLEU log-laws (T5-3B, Tables 3 and 5: Df, log A, α, "
        "β): "
        + "; ".join(
            f"{mix}: "
            + ", ".join(
                f"Df={count_label(df)}: {la:.3g}, {a:.3g}, {b:.3g}" for df, la, a, b, _ in rows
            )
            for mix, rows in MT_EN_FR["en_fr_bleu"].items()
        )
        + ". Its coefficients are extreme (|log A| up to 6e7) because a log-law over 1.6 decades "
        "is nearly flat: compare whether the laws predict the held-out checkpoints (question "
        "3), not coefficients.",
    ]
    return lines


def remark2_line(runs: Sequence[Any]) -> str:
    """Markdown: whether the runs' BLEU brevity penalty is 1, as the paper's Remark 2 observes
    in all its experiments, and if not, by how much."""
    bp = brevity_penalty(runs)
    head = "**Brevity penalty (Remark 2: the paper observes BP = 1 in all its experiments).** "
    if not bp["n"]:
        return head + "The runs logged no BLEU brevity penalty (`eval/<task>/bleu_bp`)."
    if bp["at_one"] == bp["n"]:
        return head + f"BP = 1 in all {bp['n']} finetuning runs, as in the paper."
    ratio = (
        f", its translations {fmt(bp['ratio'], 3)}× the reference length"
        if math.isfinite(bp["ratio"])
        else ""
    )
    return head + (
        f"BP = 1 in {bp['at_one']} of {bp['n']} finetuning runs; the smallest is "
        f"{fmt(bp['min_bp'], 3)} (`{bp['min_run']}`{ratio}: its BLEU is "
        f"{fmt(100 * (1 - bp['min_bp']), 3)}% below what its n-gram precisions alone give); "
        f"median {fmt(bp['median_bp'], 3)}. Unlike the paper's, these "
        "BLEU changes can come from length as well as from the n-gram precisions."
    )


def verdict_table(cells: Sequence[Cell], found: Mapping[tuple, Any]) -> list[str]:
    """Markdown: the §3.5 verdict per (mixture, Df) with its explanation."""
    lines = ["| pretraining data (A) | Df | verdict | explanation |", "|---|---|---|---|"]
    for c in cells:
        v = found.get((c.model, c.mixture, c.task, c.df))
        if v is None:
            continue
        text = v.explanation.replace("|", "/")
        lines.append(
            f"| {c.mixture} ({fmt(c.alignment, 2)}) | {count_label(c.df)} | **{v.kind}** | {text} |"
        )
    return lines


def write(
    *,
    runs_dir: Path,
    out_dir: Path,
    data_note: str = DEBIAN_NOTE,
    log: Callable[[str], None] = print,
) -> Path:
    """Fits the runs (fits.json and the fitting report) and writes the study's report.md on top.

    Args:
      runs_dir: the sweep's run directories.
      out_dir: where report.md, fits.json, verdicts.json and the figures go.
      data_note: what the corpora are, for the caveats.
      log: progress sink.

    Returns:
      The path of fits.json.
    """
    from fitting.readers import run_dirs as io
    from fitting.reports import fit_all as pipeline

    out_dir = storage.as_path(out_dir, name="--out")
    log(f"[demo-mt] fitting the downstream laws on {runs_dir} ...")
    fits = pipeline.fit_runs(runs_dir, out_dir, law="all", bootstrap=0)
    runs = io.read_runs(runs_dir)
    cells = collect(runs)
    found = verdicts(cells)
    pngs = figures(cells, fits, out_dir)
    comet_png = mt_comet.figure(cells, fits, out_dir)
    noise = bleu_noise(runs)
    body = (out_dir / "report.md").read_text()
    mixtures = sorted({c.mixture: c.alignment for c in cells}.items(), key=lambda kv: -(kv[1] or 0))
    lines = [
        "# xlscale demo: a small translation scaling study (MT paper, Isik et al. 2024)",
        "",
        f"{len(runs)} runs from `{runs_dir}`: a T5 encoder–decoder pretrained with span "
        "corruption on each mixture, its checkpoints finetuned on translation at each Df, and "
        "the same finetuning from random initialisation. Every number below is measured on them.",
        "",
        "**Alignment scores** (eq. 2, for "
        + ", ".join(sorted({c.task for c in cells}))
        + "): "
        + "; ".join(f"{m}: {fmt(a, 3)}" for m, a in mixtures)
        + ".",
        "",
        comparison(cells, fits, found, noise={k: w for k, (_, w) in noise.items()}),
        remark2_line(runs),
        "",
        "## Valuation verdicts (§3.5, on BLEU)",
        "",
        *verdict_table(cells, found),
        "",
        "## Fitted laws",
        "",
        *fits_table(cells, fits),
        "",
        "## Figures",
        "",
        *[f"![{Path(p).stem}]({p})" for p in pngs],
        "",
        *mt_comet.section(cells, runs, fits, comet_png),
        *superglue.write(runs, out_dir),  # App. B, Fig. 6: only where runs scored SuperGLUE
        caveats(cells, runs, data_note=data_note),
        "## Runs",
        "",
        *runs_table(runs, cells),
        "",
    ]
    if noise:
        widths = [w for _, w in noise.values() if math.isfinite(w)]
        lines += [
            f"BLEU resampling noise (sacreBLEU bootstrap over the held-out sentences, 95% "
            f"half-width): median ±{fmt(float(np.median(widths)), 3)}, largest "
            f"±{fmt(max(widths), 3)} BLEU over {len(noise)} runs with saved predictions.",
            "",
        ]
    lines += ["---", "", body.replace("# xlscale fit report", "# Appendix: the fitting report", 1)]
    storage.write_text_atomic(out_dir / "report.md", "\n".join(lines))
    table = [
        {"model": k[0], "mixture": k[1], "task": k[2], "df": k[3], **v.to_dict()}
        for k, v in found.items()
    ]
    storage.write_text_atomic(
        out_dir / "verdicts.json", json.dumps(json_safe(table), indent=1, allow_nan=False)
    )
    if not fits.get("converged", True) or fits.get("unconverged_series"):
        log("[demo-mt] WARNING: some fits did not converge; see report.md")
    return out_dir / "fits.json"
