"""Everything `xlscale fit` produces, as one library call: fits, fits.json, report.md and plots.

`fit_runs(runs_dir, out_dir, law="all")` reads a directory of runs and, per target language, fits
the from-scratch Chinchilla law (source and scratch runs), the CPT law's second stage on the CPT
runs, both loss–compute frontiers, the transfer measures, the replay curves, and the MT paper's
downstream laws with the data-valuation verdicts, and the CPT paper's zero-shot Fig. 3 and
Fig. 6 tables from the runs' zero-shot results (`fitting.analyses.zeroshot_figures`).

`STEPS` holds one `Step` record per `xlscale fit --law NAME`: the laws of `fitting.laws.formulas.LAWS` it
fits, the function that fits them, its report section and its plot, so a new law is one `Law`
entry plus one `Step` entry. A step without suitable runs is skipped (and recorded) under
law="all" and is an error when asked for by name.

A fit the data cannot identify (`fitting.checks.Unidentifiable`: one model size for a language's
Chinchilla law, fewer points than parameters) is skipped with a message naming the law, the
language or series and what is missing; it is never reported, let alone as converged.
Downstream series are one model's each (family + size; `fitting.readers.points.downstream_series`), and
every row names its model. N is on the basis `n_basis` names (`fitting.readers.model_keys.N_BASES`:
"exact" non-embedding counts, or the paper's "nominal" sizes, the basis we read the CPT paper's
Table 2 and eqs. 8-9 as fitted on); fits.json and report.md record it. Which evaluations of a run are points
of the L(N, D) laws (Chinchilla, CPT, Appendix B) is `point_rule` (`fitting.readers.points.PointRule`;
default every evaluation after the first token); fits.json (`fit_points`, and `points_per_run`
per fit) and report.md state it. The loss–compute frontier is an envelope over whole training
curves and always takes every evaluation.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fitting.checks import FitInputError
from fitting.formats import json_safe
from fitting.laws import formulas
from fitting.readers import model_keys, points, run_dirs
from fitting.reports import fit_steps, markdown, plots, schedule_fit
from fitting.reports.fit_steps import Skip, Step, Study
from rundir import storage


def _register(*steps: Step) -> dict[str, Step]:
    unknown = {law for s in steps for law in s.laws} - set(formulas.LAWS)
    if unknown:
        raise ValueError(f"steps name unknown laws {sorted(unknown)}")
    return {s.name: s for s in steps}


# One entry per `xlscale fit --law` name, in report order.
STEPS: Mapping[str, Step] = _register(
    Step("chinchilla", ("chinchilla",), fit_steps.chinchilla_step, markdown.chinchilla),
    Step("cpt", ("chinchilla", "cpt"), fit_steps.cpt_step, markdown.cpt, plots.isoloss),
    Step(
        "compute",
        ("loss_compute", "power"),
        fit_steps.compute_step,
        markdown.compute,
        plots.loss_compute,
    ),
    Step(
        "transfer",
        ("chinchilla", "cpt"),
        fit_steps.transfer_step,
        markdown.transfer,
        plots.transfer,
    ),
    Step("replay", ("power",), fit_steps.replay_step, markdown.replay, plots.replay),
    Step(
        "bleu",
        ("log_law",),
        fit_steps.bleu_step,
        functools.partial(markdown.downstream, title="Downstream translation scores (log-law)"),
        plots.downstream,
    ),
    Step(
        "ce",
        ("power_law",),
        fit_steps.ce_step,
        functools.partial(markdown.downstream, title="Downstream cross-entropy (power law)"),
        plots.downstream,
    ),
    Step("zeroshot", (), fit_steps.zeroshot_step, markdown.zeroshot, plots.zeroshot_strategies),
    Step("lr_area", (), schedule_fit.schedule_step, markdown.schedule, in_all=False),
)
LAWS = (*STEPS, "all")


def render_report(result: Mapping[str, Any]) -> str:
    """report.md for a `fit_runs` result, one section per step that has results."""
    return markdown.render(result, sections={n: s.section for n, s in STEPS.items()})


def fit_runs(
    runs_dir: str | Path,
    out_dir: str | Path,
    *,
    law: str = "all",
    bootstrap: int = 100,
    seed: int = 0,
    grid: Mapping[str, Sequence[float]] | None = None,
    n_basis: str = model_keys.DEFAULT_BASIS,
    point_rule: points.PointRule | None = None,
    zeroshot_size: float | None = None,
    lr_decay: float | None = None,
) -> dict[str, Any]:
    """Fits the papers' laws to a directory of runs and writes fits.json, report.md and PNGs.

    Args:
      runs_dir: a directory of run directories (run.json + metrics.jsonl each, or real T5X
        MODEL_DIRs, `fitting.readers.t5x_runs`).
      out_dir: where fits.json, report.md and the plots go (created).
      law: one of `LAWS`; "all" runs every step that has suitable runs (but `lr_area`, the
        schedule-aware law, `fitting.reports.schedule_fit`, which is only run by name).
      bootstrap: resamples of whole runs for the intervals (0: none).
      seed: bootstrap seed.
      grid: start values for the Chinchilla fits (default: the 4,500-start Hoffmann grid).
      n_basis: N of the upstream fits (`fitting.readers.model_keys.N_BASES`): "exact" non-embedding
        counts, or "nominal", the paper's sizes (CPT paper Table 4), the basis we read its Table 2
        and eqs. 8-9 as fitted on (`fitting.reports.paper_values.CPT_TABLE2`); C = 6·N·D follows
        it.
      point_rule: which evaluations of each run are fit points (default
        `fitting.readers.points.PointRule()`: every one after the first token).
      zeroshot_size: non-embedding N near which the zero-shot figures compare models
        (`fitting.analyses.zeroshot_figures`; default None: per language, the largest size at which
        every compared model has scores; the paper's figures are at 1.4B).
      lr_decay: the schedule-aware law's annealing momentum λ, in [0, 1) (default None: chosen
        from the runs, `fitting.laws.lr_area.choose_decay`).

    Returns:
      The dict written to fits.json. Its `input_warnings` name each run skipped and what a read
      run lost (`fitting.readers.run_dirs.scan_runs`: a torn last line of metrics.jsonl, an empty
      run.json); they do not make the fits unconverged.

    Raises:
      FitInputError: unreadable runs, bad values (naming the run or point), `out_dir` naming a
        file, or — for a law asked for by name — no suitable runs. A refusal leaves no `out_dir`
        behind that it created.
      ValueError: an unknown `law`, or `lr_decay` outside [0, 1).
    """
    if law not in LAWS:
        raise ValueError(f"unknown law {law!r}; choose one of {', '.join(LAWS)}")
    if lr_decay is not None and not 0.0 <= lr_decay < 1.0:
        raise ValueError(f"lr_decay = {lr_decay}: allowed: None (chosen) or 0 <= λ < 1")
    model_keys.check_basis(n_basis)
    out = storage.as_path(out_dir, name="--out")
    if out.exists() and not out.is_dir():
        raise FitInputError(f"--out {out} is a file, not a directory: name a directory")
    rule = point_rule if point_rule is not None else points.PointRule()
    scan = run_dirs.scan_runs(runs_dir)
    created = out  # the topmost directory this call creates, removed again on a refusal
    while not created.parent.exists() and created.parent != created:
        created = created.parent
    created = None if created.exists() else created
    out.mkdir(parents=True, exist_ok=True)
    study = Study(list(scan.runs), out, int(bootstrap), int(seed), grid, n_basis, rule)
    study.zeroshot_size = zeroshot_size
    study.lr_decay = lr_decay
    try:
        for name in [n for n, s in STEPS.items() if s.in_all] if law == "all" else (law,):
            try:
                study.results[name] = STEPS[name].run(study, STEPS[name])
            except Skip as why:
                if law != "all":
                    raise FitInputError(f"{name}: {why}") from None
                study.skipped[name] = str(why)
    except FitInputError:
        if created is not None:
            created.rmtree()
        raise
    result = {
        "runs_dir": str(runs_dir),
        "n_runs": len(study.runs),
        "law": law,
        "bootstrap": study.bootstrap,
        "seed": study.seed,
        "n_basis": study.n_basis,
        "fit_points": rule.to_dict(),
        "converged": not study.warnings,
        "warnings": study.warnings,
        "input_warnings": list(scan.warnings),  # runs skipped, records dropped: not convergence
        "unconverged_series": study.unconverged_series,  # each flagged in its own entry
        "skipped": study.skipped,
        "plots": study.plots,
        **study.results,
    }
    storage.write_text_atomic(
        out / "fits.json", json.dumps(json_safe(result), indent=1, allow_nan=False)
    )
    storage.write_text_atomic(out / "report.md", render_report(result))
    return result
