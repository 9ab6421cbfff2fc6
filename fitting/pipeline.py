"""Everything `xlscale fit` produces, as one library call: fits, fits.json, report.md and plots.

`fit_runs(runs_dir, out_dir, law="all")` reads a directory of runs and, per target language, fits
the from-scratch Chinchilla law (source and scratch runs), the CPT law's second stage on the CPT
runs, both loss–compute frontiers, the transfer measures, the replay curves, and the MT paper's
downstream laws with the data-valuation verdicts. Steps live in a dict registry; a step without
suitable runs is skipped (and recorded) under law="all" and is an error when asked for by name.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting import alignment, downstream, frontier, io, plots, points, report, transfer, valuation
from fitting.allocation import allocation_cis, compute_optimal
from fitting.checks import FitInputError
from fitting.fit import FitResult, fit_chinchilla, fit_cpt

FROM_SCRATCH = ("source", "scratch")


@dataclasses.dataclass
class _Study:
    """Shared state of one `fit_runs` call: the runs, settings, fit cache and outputs."""

    runs: list[io.Run]
    out: Path
    bootstrap: int
    seed: int
    grid: Mapping[str, Sequence[float]] | None
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    plots: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    cache: dict[tuple[str, str], FitResult | None] = dataclasses.field(default_factory=dict)

    def languages(self, strategies: Sequence[str]) -> list[str]:
        """Target languages of the runs with one of `strategies`."""
        return sorted({r.target_lang for r in self.runs if r.strategy in strategies})

    def check(self, name: str, fit: Any) -> None:
        """Records a warning for a fit that did not converge (it is never silently reported)."""
        if fit is not None and not fit.converged:
            self.warnings.append(f"{name}: fit did NOT converge (gradient {fit.grad_norm:.3g})")

    def scratch_fit(self, lang: str) -> FitResult | None:
        """The from-scratch Chinchilla fit of a language (source + scratch runs), cached."""
        key = ("chinchilla", lang)
        if key not in self.cache:
            pts = points.pool(points.curves(self.runs, strategies=FROM_SCRATCH, language=lang))
            self.cache[key] = (
                fit_chinchilla(
                    pts.N,
                    pts.D,
                    pts.L,
                    runs=pts.runs,
                    grid=self.grid,
                    bootstrap=self.bootstrap,
                    seed=self.seed,
                )
                if len(pts)
                else None
            )
        return self.cache[key]

    def cpt_fit(self, lang: str) -> FitResult | None:
        """The CPT law's second-stage fit of a language on its cpt runs, cached."""
        key = ("cpt", lang)
        if key not in self.cache:
            base = self.scratch_fit(lang)
            pts = points.pool(points.curves(self.runs, strategies=("cpt",), language=lang))
            self.cache[key] = (
                fit_cpt(
                    pts.N,
                    pts.D,
                    pts.L,
                    base=base,
                    runs=pts.runs,
                    bootstrap=self.bootstrap,
                    seed=self.seed + 1,
                )
                if len(pts) and base is not None
                else None
            )
        return self.cache[key]

    def figure(self, path: Path) -> None:
        """Records a written plot (relative to the output directory)."""
        self.plots.append(str(path.relative_to(self.out)))


def _budgets(pts: points.Points) -> list[float]:
    top = float(np.max(pts.C)) if len(pts) else 1e20
    return [top, 10 * top, 100 * top]


def _chinchilla(study: _Study) -> None:
    out = {}
    for lang in study.languages(FROM_SCRATCH):
        fit = study.scratch_fit(lang)
        if fit is None:
            continue
        study.check(f"chinchilla/{lang}", fit)
        pts = points.pool(points.curves(study.runs, strategies=FROM_SCRATCH, language=lang))
        alloc = compute_optimal(fit)
        out[lang] = {
            "fit": fit.to_dict(),
            "allocation": alloc.to_dict(),
            "allocation_ci": _ci_json(allocation_cis(fit, budgets=_budgets(pts))),
        }
    if not out:
        raise _Skip("no source or scratch runs")
    study.results["chinchilla"] = out


def _cpt(study: _Study) -> None:
    out = {}
    for lang in study.languages(("cpt",)):
        fit = study.cpt_fit(lang)
        if fit is None:
            study.skipped[f"cpt/{lang}"] = (
                "no from-scratch runs of this language for the first stage"
            )
            continue
        study.check(f"cpt/{lang}", fit)
        base = study.scratch_fit(lang)
        pts = points.pool(points.curves(study.runs, strategies=("cpt",), language=lang))
        chin = fit_chinchilla(pts.N, pts.D, pts.L, runs=pts.runs, grid=study.grid)
        study.check(f"cpt/{lang} (Chinchilla law on CPT runs)", chin)
        out[lang] = {
            "fit": fit.to_dict(),
            "allocation": compute_optimal(fit).to_dict(),
            "allocation_ci": _ci_json(allocation_cis(fit, budgets=_budgets(pts))),
            # CPT paper Appendix B: mean Huber per point of both laws on the CPT runs.
            "appendix_b": {
                "chinchilla_fit": chin.to_dict(),
                "mean_huber_chinchilla": chin.objective / chin.n_points,
                "mean_huber_cpt": fit.objective / fit.n_points,
            },
        }
        path = study.out / f"isoloss_{lang}.png"
        lo = float(np.min(pts.C))
        plots.isoloss(
            {"scratch": base, "cpt": fit},
            path,
            compute=(lo, 1e4 * float(np.max(pts.C))),
            title=lang,
        )
        study.figure(path)
    if not out:
        raise _Skip("no cpt runs with from-scratch runs of the same language")
    study.results["cpt"] = out


def _compute(study: _Study) -> None:
    out = {}
    groups = {"scratch": FROM_SCRATCH, "cpt": ("cpt",)}
    for lang in study.languages(FROM_SCRATCH + ("cpt",)):
        curves, fronts = {}, {}
        for name, strategies in groups.items():
            cs = points.curves(study.runs, strategies=strategies, language=lang)
            pts = points.pool(cs)
            if not len(pts):
                continue
            fr = frontier.fit_frontier(
                pts.C, pts.L, pts.runs, bootstrap=study.bootstrap, seed=study.seed + 2
            )
            study.check(f"compute/{lang}/{name} (E'+A'/C^γ)", fr.loss_compute)
            study.check(f"compute/{lang}/{name} (k·C^-g)", fr.power)
            curves[name], fronts[name] = cs, fr
        if fronts:
            out[lang] = {k: v.to_dict() for k, v in fronts.items()}
            path = study.out / f"loss_compute_{lang}.png"
            plots.loss_compute(curves, fronts, path, title=f"{lang}: loss vs compute")
            study.figure(path)
    if not out:
        raise _Skip("no runs with target-language evaluations")
    study.results["compute"] = out


def _transfer(study: _Study) -> None:
    out = {}
    for lang in study.languages(("cpt",)):
        cpt_c = points.curves(study.runs, strategies=("cpt",), language=lang)
        ref_c = points.curves(study.runs, strategies=FROM_SCRATCH, language=lang)
        pairs = transfer.transfer_pairs(cpt_c, ref_c)
        if not pairs:
            continue
        entry: dict[str, Any] = {"curves": [p.to_dict() for p in pairs]}
        base, cpt = study.scratch_fit(lang), study.cpt_fit(lang)
        if base is not None and cpt is not None:
            law = []
            for c in cpt_c:
                d = c.tokens[c.tokens > 0]
                lt = transfer.law_transfer(base, cpt, np.full(len(d), c.n_params), d)
                law.append(
                    {
                        "run_id": c.run_id,
                        "n_params": c.n_params,
                        "tokens": d.tolist(),
                        "tokens_pt": _clean(lt.tokens_pt),
                        "flops_saved": _clean(lt.flops_saved),
                        "transferred": _clean(lt.transferred),
                        "ci": {k: [_clean(lo), _clean(hi)] for k, (lo, hi) in lt.ci.items()},
                    }
                )
            entry["law"] = law
        out[lang] = entry
        path = study.out / f"transfer_{lang}.png"
        plots.transfer(pairs, path, title=f"{lang}: CPT vs from scratch at equal loss")
        study.figure(path)
    if not out:
        raise _Skip("no cpt run with a from-scratch run of the same size and language")
    study.results["transfer"] = out


def _replay(study: _Study) -> None:
    out = {}
    for lang in study.languages(("cpt_replay",)):
        curves = []
        replay_runs = [
            r for r in study.runs if r.strategy == "cpt_replay" and r.target_lang == lang
        ]
        sizes = {float(r.meta.get("params_non_embedding", math.nan)) for r in replay_runs}
        plain = [
            r
            for r in study.runs
            if r.strategy == "cpt"
            and r.target_lang == lang
            and float(r.meta.get("params_non_embedding", math.nan)) in sizes
        ]
        for run in replay_runs + plain:
            src = run.meta.get("source_lang")
            if not src:
                continue
            s = points.curve(run, task=f"lm_{src}")
            t = points.curve(run, task=f"lm_{lang}")
            if len(s.loss) and len(t.loss):
                rc = transfer.replay_curve(s, t)
                study.check(f"replay/{lang}/{run.run_id} (forgetting tail)", rc.tail_fit)
                curves.append(rc)
        if curves:
            curves.sort(key=lambda c: (c.replay_ratio, c.run_id))
            out[lang] = [c.to_dict() for c in curves]
            path = study.out / f"replay_{lang}.png"
            plots.replay(curves, path, title=f"{lang}: replay of the source language")
            study.figure(path)
    if not out:
        raise _Skip("no cpt_replay runs with source-language evaluations")
    study.results["replay"] = out


_MT_TASK = re.compile(r"^mt_([a-z]{2})_([a-z]{2})$")


def _downstream(study: _Study, metrics: Sequence[str], name: str) -> None:
    entries, figures = [], {}
    for metric in metrics:
        for s in points.downstream_series(study.runs, metric=metric):
            if len(s.Dp) < 3:
                study.skipped[f"{name}/{'/'.join(s.key)}/{metric}"] = f"{len(s.Dp)} points (< 3)"
                continue
            n_fit = min(4, len(s.Dp))
            try:
                fit = downstream.fit_series(s.Dp, s.values, metric=metric, n_fit=n_fit)
            except FitInputError as why:  # e.g. a BLEU of 0: no log-law; the other series go on
                study.skipped[f"{name}/{'/'.join(s.key)}/{metric}"] = str(why)
                continue
            study.check(f"{name}/{'/'.join(s.key)}/{metric}", fit)
            entry: dict[str, Any] = {
                "pretraining": s.key[0],
                "task": s.key[1],
                "finetune_steps": s.key[2],
                "metric": metric,
                "runs": list(s.runs),
                "baseline": s.baseline,
                "fit": fit.to_dict(),
            }
            m = _MT_TASK.match(s.key[1])
            if m:
                try:
                    entry["alignment"] = alignment.score(s.key[0], m.group(1), m.group(2))
                except ValueError:
                    entry["alignment"] = None
            if metric != "loss":
                entry["verdict"] = valuation.assess(s.Dp, s.values, baseline=s.baseline).to_dict()
            entries.append(entry)
            figures.setdefault((metric, s.key[1]), []).append(
                (
                    f"{s.key[0]} ({s.key[2]}{' steps' if s.key[2].isdigit() else ''})",
                    fit,
                    s.baseline,
                )
            )
    if not entries:
        raise _Skip(f"no finetuning runs with {'/'.join(metrics)} results")
    for (metric, task), series in figures.items():
        path = study.out / f"{name}_{metric}_{task}.png"
        label = "downstream cross-entropy" if metric == "loss" else metric.upper()
        plots.downstream(series, path, ylabel=label, title=f"{task}: {label} vs pretraining tokens")
        study.figure(path)
    study.results[name] = entries


def _bleu(study: _Study) -> None:
    present = {
        k.rsplit("/", 1)[-1]
        for r in study.runs
        if r.strategy in ("finetune", "finetune_scratch")
        for rec in r.records
        for k in rec
        if k.startswith("eval/") and k.count("/") == 2
    } - {"loss", "tokens", "decoded"}  # decoded: how many examples were scored
    # BLEU first, as the paper; then every other translation score the runs report.
    metrics = sorted(present, key=lambda m: (m != "bleu", m)) or ["bleu"]
    _downstream(study, metrics, "bleu")


def _ce(study: _Study) -> None:
    _downstream(study, ["loss"], "ce")


class _Skip(Exception):
    """A step found no suitable runs."""


STEPS: dict[str, Callable[[_Study], None]] = {
    "chinchilla": _chinchilla,
    "cpt": _cpt,
    "compute": _compute,
    "transfer": _transfer,
    "replay": _replay,
    "bleu": _bleu,
    "ce": _ce,
}
LAWS = tuple(STEPS) + ("all",)


def fit_runs(
    runs_dir: str | Path,
    out_dir: str | Path,
    *,
    law: str = "all",
    bootstrap: int = 100,
    seed: int = 0,
    grid: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """Fits the papers' laws to a directory of runs and writes fits.json, report.md and PNGs.

    Args:
      runs_dir: a directory of run directories (run.json + metrics.jsonl each).
      out_dir: where fits.json, report.md and the plots go (created).
      law: one of `LAWS`; "all" runs every step that has suitable runs.
      bootstrap: resamples of whole runs for the intervals (0: none).
      seed: bootstrap seed.
      grid: start values for the Chinchilla fits (default: the 4,500-start Hoffmann grid).

    Returns:
      The dict written to fits.json.

    Raises:
      FitInputError: unreadable runs, bad values (naming the run or point), or — for a law asked
        for by name — no suitable runs.
    """
    if law not in LAWS:
        raise ValueError(f"unknown law {law!r}; choose one of {', '.join(LAWS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    study = _Study(io.read_runs(runs_dir), out, int(bootstrap), int(seed), grid)
    for name in STEPS if law == "all" else (law,):
        try:
            STEPS[name](study)
        except _Skip as why:
            if law != "all":
                raise FitInputError(f"{name}: {why}") from None
            study.skipped[name] = str(why)
    result = {
        "runs_dir": str(runs_dir),
        "n_runs": len(study.runs),
        "law": law,
        "bootstrap": study.bootstrap,
        "seed": study.seed,
        "converged": not study.warnings,
        "warnings": study.warnings,
        "skipped": study.skipped,
        "plots": study.plots,
        **study.results,
    }
    (out / "fits.json").write_text(json.dumps(_json_safe(result), indent=1, allow_nan=False))
    (out / "report.md").write_text(report.render(result))
    return result


def _clean(a) -> list[float | None]:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, float)]


def _ci_json(ci: Mapping[str, tuple[float, float]]) -> dict[str, list[float]]:
    return {k: [lo, hi] for k, (lo, hi) in ci.items()}


def _json_safe(obj: Any) -> Any:
    """Replaces non-finite floats by None (strict JSON), recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj
