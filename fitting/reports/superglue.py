"""The MT paper's Appendix B: SuperGLUE scores against pretraining size Dp, beside cross-entropy.

Fig. 6 of Isik et al. (2024) finetunes checkpoints of T5-3B pretrained on English mC4 on SuperGLUE
(batch 128, length 512, 300 steps, constant LR) and fits the log-law f(Dp) = (log(A·Dp^α))^β of
its eq. 1 to each task's metric. Here the same comes from finetuning runs that logged SuperGLUE's
official metrics (`pipelines.superglue_metrics`, `eval/super_glue_<task>/score` and
`eval/super_glue_<task>/loss`):

- per task and for the SuperGLUE average (the mean of the tasks' scores over the checkpoints that
  scored every task of the series), the score series against Dp of each (model, pretraining
  mixture, finetuning recipe), fitted with the log-law (`fitting.laws.downstream_laws`: Huber
  δ = 0.1 on log scores, the first four checkpoints by Dp fitted, the rest held out);
- beside it the downstream cross-entropy of the same checkpoints with the power law
  L(Dp) = E + A/Dp^α (its eq. 3; the average CE is the mean over the tasks);
- the non-pretrained model (finetune_scratch) as a black line.

A series with fewer than three checkpoints, or a non-positive score (a log-law cannot reach 0),
is drawn without a law and the table says why. `write` adds `superglue_fig6.png`,
`superglue_fits.json` and returns the markdown section; runs without SuperGLUE metrics give none.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.checks import FitInputError
from fitting.formats import fmt, json_safe
from fitting.laws.downstream_laws import DownstreamFit, fit_bleu_law, fit_ce_law
from fitting.readers.points import DownstreamSeries, downstream_series
from pipelines.superglue_metrics import SCORE, SCORERS
from rundir import storage

TASKS: tuple[str, ...] = tuple(sorted(SCORERS))
AVERAGE = "average"
CE = "loss"
METRICS = (SCORE, CE)
FIGURE = "superglue_fig6.png"
FITS = "superglue_fits.json"
N_FIT = 4  # the paper's: three coefficients and one spare
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One (task, metric) series of one model, mixture and finetuning recipe, with its law.

    Attributes:
      task: a `super_glue_<task>` name or `AVERAGE`.
      metric: `"score"` (the task's SuperGLUE score, 0-100) or `"loss"` (cross-entropy, nats).
      series: the points (Dp in the MT paper's unit), runs and baseline.
      fit: the law fitted to it, or None.
      note: why there is no law ("" when there is one).
    """

    task: str
    metric: str
    series: DownstreamSeries
    fit: DownstreamFit | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record: keys, points, baseline, and the fit's parameters and errors."""
        s = self.series
        out = {
            "task": self.task,
            "metric": self.metric,
            "model": s.model,
            "mixture": s.key[0],
            "finetuning": s.key[2],
            "Dp": s.Dp.tolist(),
            "values": s.values.tolist(),
            "runs": list(s.runs),
            "baseline": s.baseline,
            "note": self.note,
        }
        if self.fit is not None:
            out["fit"] = self.fit.to_dict()
        return out


def _average(per_task: Sequence[DownstreamSeries]) -> list[DownstreamSeries]:
    """The mean over tasks per (model, mixture, recipe) and checkpoint (Dp), over the Dp every
    task of that series scored; the baseline likewise when every task has one."""
    groups: dict[tuple, list[DownstreamSeries]] = {}
    for s in per_task:
        groups.setdefault((s.model, s.key[0], s.key[2], s.metric), []).append(s)
    out = []
    for (model, mixture, recipe, metric), members in sorted(groups.items()):
        common = set(members[0].Dp.tolist())
        for s in members[1:]:
            common &= set(s.Dp.tolist())
        dp = np.asarray(sorted(common), float)
        if not len(dp):
            continue
        values = np.mean(
            [[dict(zip(s.Dp, s.values, strict=True))[d] for d in dp] for s in members], axis=0
        )
        run_at = dict(zip(members[0].Dp, members[0].runs, strict=True))
        baselines = [s.baseline for s in members]
        out.append(
            DownstreamSeries(
                key=(mixture, AVERAGE, recipe),
                metric=metric,
                Dp=dp,
                values=np.asarray(values, float),
                runs=tuple(run_at[d] for d in dp),
                baseline=None if None in baselines else float(np.mean(baselines)),
                model=model,
                dp_unit=members[0].dp_unit,
            )
        )
    return out


def _fit(task: str, s: DownstreamSeries) -> Entry:
    n = len(s.Dp)
    if n < 3:
        return Entry(task, s.metric, s, None, f"{n} checkpoint(s): a law needs 3")
    fitter = fit_ce_law if s.metric == CE else fit_bleu_law
    try:
        return Entry(task, s.metric, s, fitter(s.Dp, s.values, n_fit=min(N_FIT, n)))
    except FitInputError as e:
        return Entry(task, s.metric, s, None, str(e))


def entries(runs: Sequence[Any], *, dp_unit: str = "paper") -> list[Entry]:
    """Every SuperGLUE series of `runs` (fitting.readers `RunData`) with its fitted law: per task
    that some run scored, then the average, each for the score and the cross-entropy."""
    out: list[Entry] = []
    for metric in METRICS:
        per_task = []
        for task in TASKS:
            found = downstream_series(runs, metric=metric, dp_unit=dp_unit, eval_task=task)
            per_task += found
            out += [_fit(task, s) for s in found]
        if len({s.key[1] for s in per_task}) > 1:
            out += [_fit(AVERAGE, s) for s in _average(per_task)]
    return out


def _label(task: str) -> str:
    return "SuperGLUE average" if task == AVERAGE else task.removeprefix("super_glue_")


def figure(found: Sequence[Entry], path: Path) -> Path:
    """The Fig. 6 analogue: a row per task (and the average), the score against Dp on the left
    and the cross-entropy on the right; one colour per pretraining mixture, the fitted law drawn
    through the fitted (filled) points, held-out points hollow, baselines black."""
    from fitting.reports import plots

    mixtures = sorted({e.series.key[0] for e in found})
    colors = {m: _COLORS[i % len(_COLORS)] for i, m in enumerate(mixtures)}
    tasks = [t for t in (*TASKS, AVERAGE) if any(e.task == t for e in found)]
    rows = []
    for task in tasks:
        row = []
        for metric, ylabel in ((SCORE, "score (0-100)"), (CE, "cross-entropy (nats)")):
            styles = [
                plots.SeriesStyle(
                    label=f"{e.series.model} {e.series.key[0]}",
                    Dp=e.series.Dp,
                    values=e.series.values,
                    fit=e.fit,
                    baseline=e.series.baseline,
                    color=colors[e.series.key[0]],
                )
                for e in found
                if e.task == task and e.metric == metric
            ]
            row.append((f"{_label(task)}: {ylabel.split(' (')[0]}", ylabel, styles))
        rows.append(row)
    return plots.downstream_grid(
        rows, path, title="SuperGLUE vs pretraining size Dp (MT paper Fig. 6), with cross-entropy"
    )


def section(found: Sequence[Entry], png: str | None) -> list[str]:
    """The report's markdown: the fitted laws per task, mixture and metric, and the figure."""
    if not found:
        return []
    lines = [
        "## SuperGLUE (Appendix B, Fig. 6)",
        "",
        "Finetuned checkpoints scored on SuperGLUE's validation sets with the official metrics "
        "(a task's score is the mean of its metrics; the average is the mean of the tasks'), "
        "fitted with the log-law f(Dp) = (log(A·Dp^α))^β; the cross-entropy beside them with "
        "L(Dp) = E + A/Dp^α. The first four checkpoints by Dp are fitted, the rest held out.",
        "",
        "| task | metric | model | mixture | points | last value | baseline | law | held-out error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in found:
        s = e.series
        if e.fit is None:
            law = f"none: {e.note}"
            err = ""
        else:
            params = ", ".join(f"{k} {fmt(v, 4)}" for k, v in e.fit.params.items())
            law = params + ("" if e.fit.converged else " (NOT CONVERGED)")
            err = fmt(e.fit.prediction_error, 3)
        base = "" if s.baseline is None else fmt(s.baseline, 4)
        lines.append(
            f"| {_label(e.task)} | {e.metric} | {s.model} | {s.key[0]} | {len(s.Dp)} | "
            f"{fmt(float(s.values[-1]), 4)} | {base} | {law} | {err} |"
        )
    lines.append("")
    if png:
        lines += [f"![superglue]({png})", ""]
    return lines


def write(runs: Sequence[Any], out_dir: str | Path) -> list[str]:
    """Fits the SuperGLUE series of `runs`, writes `FIGURE` and `FITS` into `out_dir`, and
    returns the markdown section ([] and no files when no run scored SuperGLUE)."""
    found = entries(runs)
    if not found:
        return []
    out = storage.as_path(out_dir, name="--out")
    out.mkdir(parents=True, exist_ok=True)
    figure(found, out / FIGURE)
    storage.write_text_atomic(
        out / FITS,
        json.dumps(json_safe([e.to_dict() for e in found]), indent=1, allow_nan=False),
    )
    return section(found, FIGURE)
