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
"exact" non-embedding counts, or the paper's "nominal" sizes, the basis of the CPT paper's
Table 2 and eqs. 8-9); fits.json and report.md record it. Which evaluations of a run are points
of the L(N, D) laws (Chinchilla, CPT, Appendix B) is `point_rule` (`fitting.readers.points.PointRule`;
default every evaluation after the first token); fits.json (`fit_points`, and `points_per_run`
per fit) and report.md state it. The loss–compute frontier is an envelope over whole training
curves and always takes every evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.analyses import alignment, frontier, transfer, valuation, zeroshot_figures
from fitting.analyses.allocation import allocation_cis, compute_optimal
from fitting.checks import FitInputError, Unidentifiable, require_distinct
from fitting.formats import json_safe
from fitting.laws import downstream_laws, formulas
from fitting.laws.robust_fit import FitResult, fit_chinchilla, fit_cpt
from fitting.readers import model_keys, points, run_dirs
from fitting.readers.run_data import RunData
from fitting.reports import markdown, plots
from pipelines.names import mt_pair
from rundir import run_record, storage
from rundir.run_record import Strategy

FROM_SCRATCH = run_record.FROM_SCRATCH


@dataclasses.dataclass
class Study:
    """Shared state of one `fit_runs` call: the runs, settings, fit cache and outputs."""

    runs: list[RunData]
    out: Path
    bootstrap: int
    seed: int
    grid: Mapping[str, Sequence[float]] | None
    n_basis: str = model_keys.DEFAULT_BASIS
    point_rule: points.PointRule = points.PointRule()
    zeroshot_size: float | None = None
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    plots: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    cache: dict[tuple[str, str], FitResult | Unidentifiable | None] = dataclasses.field(
        default_factory=dict
    )

    def languages(self, strategies: Sequence[str]) -> list[str]:
        """Target languages of the runs with one of `strategies`."""
        return sorted({r.target_lang for r in self.runs if r.strategy in strategies})

    def curves(
        self, strategies: Sequence[str], lang: str, *, task: str | None = None
    ) -> list[points.Curve]:
        """`fitting.readers.points.curves` of a language's runs, N on the study's basis."""
        return points.curves(
            self.runs, strategies=strategies, language=lang, task=task, n_basis=self.n_basis
        )

    def pooled(self, law: str, strategies: Sequence[str], lang: str) -> points.Points:
        """The language's points for `law`, refused (`Unidentifiable`, naming the law, the
        language and the models) when they hold fewer model sizes than the law needs; the
        evaluations of each run that are points are the study's `point_rule`."""
        pts = points.pool(self.curves(strategies, lang), rule=self.point_rule)
        if len(pts):
            require_distinct(
                law=law,
                series=lang,
                what="model sizes",
                values=pts.N,
                minimum=formulas.LAWS[law].min_distinct[0],
                names=pts.models,
            )
        return pts

    def _cached(self, key: tuple[str, str], make: Callable[[], FitResult | None]):
        """A cached fit; an unidentifiable one is remembered and raised again."""
        if key not in self.cache:
            try:
                self.cache[key] = make()
            except Unidentifiable as why:
                self.cache[key] = why
        got = self.cache[key]
        if isinstance(got, Unidentifiable):
            raise got
        return got

    def check(self, name: str, fit: Any) -> None:
        """Records a warning for a fit that did not converge (it is never silently reported)."""
        if fit is not None and not fit.converged:
            self.warnings.append(f"{name}: fit did NOT converge (gradient {fit.grad_norm:.3g})")

    def scratch_fit(self, lang: str) -> FitResult | None:
        """The from-scratch Chinchilla fit of a language (source + scratch runs), cached.

        Raises:
          Unidentifiable: the runs cannot determine the law (e.g. one model size).
        """

        def make() -> FitResult | None:
            pts = self.pooled("chinchilla", FROM_SCRATCH, lang)
            if not len(pts):
                return None
            return fit_chinchilla(
                pts.N,
                pts.D,
                pts.L,
                runs=pts.runs,
                grid=self.grid,
                bootstrap=self.bootstrap,
                seed=self.seed,
                series=lang,
            )

        return self._cached(("chinchilla", lang), make)

    def cpt_fit(self, lang: str) -> FitResult | None:
        """The CPT law's second-stage fit of a language on its cpt runs, cached.

        Raises:
          Unidentifiable: the cpt runs, or the from-scratch runs of its first stage, cannot
            determine their law.
        """

        def make() -> FitResult | None:
            base = self.scratch_fit(lang)
            pts = self.pooled("cpt", (Strategy.CPT,), lang)
            if not len(pts) or base is None:
                return None
            return fit_cpt(
                pts.N,
                pts.D,
                pts.L,
                base=base,
                runs=pts.runs,
                bootstrap=self.bootstrap,
                seed=self.seed + 1,
                series=lang,
            )

        return self._cached(("cpt", lang), make)

    def draw(self, plot: Callable[..., Path], name: str, *args: Any, **kwargs: Any) -> None:
        """Draws `plot(*args, out/name, **kwargs)` (a `fitting.reports.plots` figure) and records it."""
        plot(*args, self.out / name, **kwargs)
        self.plots.append(name)


def _budgets(pts: points.Points) -> list[float]:
    top = float(np.max(pts.C)) if len(pts) else 1e20
    return [top, 10 * top, 100 * top]


def _chinchilla(study: Study, step: Step) -> dict[str, Any]:
    out = {}
    for lang in study.languages(FROM_SCRATCH):
        try:
            fit = study.scratch_fit(lang)
        except Unidentifiable as why:
            study.skipped[f"chinchilla/{lang}"] = str(why)
            continue
        if fit is None:
            continue
        study.check(f"chinchilla/{lang}", fit)
        pts = points.pool(study.curves(FROM_SCRATCH, lang), rule=study.point_rule)
        alloc = compute_optimal(fit)
        out[lang] = {
            "models": sorted(set(pts.models)),
            "points_per_run": _per_run(pts),
            "fit": fit.to_dict(),
            "allocation": alloc.to_dict(),
            "allocation_ci": _ci_json(allocation_cis(fit, budgets=_budgets(pts))),
        }
    if not out:
        raise Skip(_why_none("no source or scratch runs", study, "chinchilla/"))
    return out


def _cpt(study: Study, step: Step) -> dict[str, Any]:
    out = {}
    for lang in study.languages((Strategy.CPT,)):
        try:
            fit = study.cpt_fit(lang)
        except Unidentifiable as why:
            study.skipped[f"cpt/{lang}"] = str(why)
            continue
        if fit is None:
            study.skipped[f"cpt/{lang}"] = (
                "no from-scratch runs of this language for the first stage"
            )
            continue
        study.check(f"cpt/{lang}", fit)
        base = study.scratch_fit(lang)
        pts = points.pool(study.curves((Strategy.CPT,), lang), rule=study.point_rule)
        out[lang] = {
            "models": sorted(set(pts.models)),
            "points_per_run": _per_run(pts),
            "fit": fit.to_dict(),
            "allocation": compute_optimal(fit).to_dict(),
            "allocation_ci": _ci_json(allocation_cis(fit, budgets=_budgets(pts))),
        }
        try:
            study.pooled("chinchilla", (Strategy.CPT,), lang)
            chin = fit_chinchilla(pts.N, pts.D, pts.L, runs=pts.runs, grid=study.grid, series=lang)
        except Unidentifiable as why:
            study.skipped[f"cpt/{lang} (Chinchilla law on CPT runs)"] = str(why)
        else:
            study.check(f"cpt/{lang} (Chinchilla law on CPT runs)", chin)
            # CPT paper Appendix B: mean Huber per point of both laws on the CPT runs.
            out[lang]["appendix_b"] = {
                "chinchilla_fit": chin.to_dict(),
                "mean_huber_chinchilla": chin.objective / chin.n_points,
                "mean_huber_cpt": fit.objective / fit.n_points,
            }
        # Appendix B's "pretraining" column: the extended law's second stage fitted on the
        # from-scratch runs themselves (the paper: γ ≈ −0.005, no better than Chinchilla there).
        try:
            scratch_pts = study.pooled("chinchilla", FROM_SCRATCH, lang)
            ext = fit_cpt(
                scratch_pts.N,
                scratch_pts.D,
                scratch_pts.L,
                base=base,
                runs=scratch_pts.runs,
                seed=study.seed + 3,
                series=f"{lang}/pretraining",
            )
        except Unidentifiable as why:
            study.skipped[f"cpt/{lang} (CPT law on from-scratch runs)"] = str(why)
        else:
            study.check(f"cpt/{lang} (CPT law on from-scratch runs)", ext)
            out[lang]["appendix_b_pretraining"] = {
                "cpt_law_fit": ext.to_dict(),
                "gamma": ext.params["gamma"],
                "mean_huber_chinchilla": base.objective / base.n_points,
                "mean_huber_cpt": ext.objective / ext.n_points,
            }
        study.draw(
            step.plot,
            f"isoloss_{lang}.png",
            {"scratch": base, "cpt": fit},
            compute=(float(np.min(pts.C)), 1e4 * float(np.max(pts.C))),
            title=lang,
        )
    if not out:
        raise Skip(
            _why_none("no cpt runs with from-scratch runs of the same language", study, "cpt/")
        )
    return out


def _compute(study: Study, step: Step) -> dict[str, Any]:
    out = {}
    groups = {"scratch": FROM_SCRATCH, "cpt": (Strategy.CPT,)}
    for lang in study.languages(FROM_SCRATCH + (Strategy.CPT,)):
        curves, fronts = {}, {}
        for name, strategies in groups.items():
            cs = study.curves(strategies, lang)
            pts = points.pool(cs)
            if not len(pts):
                continue
            try:
                fr = frontier.fit_frontier(
                    pts.C, pts.L, pts.runs, bootstrap=study.bootstrap, seed=study.seed + 2
                )
            except Unidentifiable as why:
                study.skipped[f"compute/{lang}/{name}"] = str(why)
                continue
            study.check(f"compute/{lang}/{name} (E'+A'/C^γ)", fr.loss_compute)
            study.check(f"compute/{lang}/{name} (k·C^-g)", fr.power)
            curves[name], fronts[name] = cs, fr
        if fronts:
            out[lang] = {k: v.to_dict() for k, v in fronts.items()}
            study.draw(
                step.plot,
                f"loss_compute_{lang}.png",
                curves,
                fronts,
                title=f"{lang}: loss vs compute",
            )
    if not out:
        raise Skip("no runs with target-language evaluations")
    return out


def _transfer(study: Study, step: Step) -> dict[str, Any]:
    out = {}
    for lang in study.languages((Strategy.CPT,)):
        cpt_c = study.curves((Strategy.CPT,), lang)
        ref_c = study.curves(FROM_SCRATCH, lang)
        pairs = transfer.transfer_pairs(cpt_c, ref_c)
        if not pairs:
            continue
        entry: dict[str, Any] = {"curves": [p.to_dict() for p in pairs]}
        try:
            base, cpt = study.scratch_fit(lang), study.cpt_fit(lang)
        except Unidentifiable as why:  # the curves stand; the law-based measures need the laws
            study.skipped[f"transfer/{lang} (law)"] = str(why)
            base = cpt = None
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
        study.draw(
            step.plot,
            f"transfer_{lang}.png",
            pairs,
            title=f"{lang}: CPT vs from scratch at equal loss",
        )
    if not out:
        raise Skip("no cpt run with a from-scratch run of the same size and language")
    return out


def _replay(study: Study, step: Step) -> dict[str, Any]:
    out = {}
    for lang in study.languages((Strategy.CPT_REPLAY,)):
        curves = []
        replay_runs = [
            r for r in study.runs if r.strategy == Strategy.CPT_REPLAY and r.target_lang == lang
        ]
        sizes = {r.info.n_non_embedding for r in replay_runs}
        plain = [
            r
            for r in study.runs
            if r.strategy == Strategy.CPT
            and r.target_lang == lang
            and r.info.n_non_embedding in sizes
        ]
        for run in replay_runs + plain:
            src = run.info.source_lang
            if not src:
                continue
            s = points.curve(run, task=f"lm_{src}", n_basis=study.n_basis)
            t = points.curve(run, task=f"lm_{lang}", n_basis=study.n_basis)
            if len(s.loss) and len(t.loss):
                rc = transfer.replay_curve(s, t)
                study.check(f"replay/{lang}/{run.run_id} (forgetting tail)", rc.tail_fit)
                curves.append(rc)
        if curves:
            curves.sort(key=lambda c: (c.replay_ratio, c.run_id))
            out[lang] = [c.to_dict() for c in curves]
            study.draw(
                step.plot,
                f"replay_{lang}.png",
                curves,
                title=f"{lang}: replay of the source language",
            )
    if not out:
        raise Skip("no cpt_replay runs with source-language evaluations")
    return out


def _downstream(study: Study, step: Step, metrics: Sequence[str]) -> list[dict[str, Any]]:
    name = step.name
    entries, figures = [], {}
    for metric in metrics:
        for s in points.downstream_series(study.runs, metric=metric):
            where = f"{name}/{s.label}/{metric}"
            if len(s.Dp) < 3:
                n = len(s.Dp)
                study.skipped[where] = f"{n} point{'' if n == 1 else 's'}; a fit needs at least 3"
                continue
            n_fit = min(4, len(s.Dp))
            try:
                fit = downstream_laws.fit_series(s.Dp, s.values, metric=metric, n_fit=n_fit)
            except FitInputError as why:  # e.g. a BLEU of 0: no log-law; the other series go on
                study.skipped[where] = str(why)
                continue
            study.check(where, fit)
            entry: dict[str, Any] = {
                "model": s.model,
                "pretraining": s.key[0],
                "task": s.key[1],
                "finetune_steps": s.key[2],
                "metric": metric,
                "runs": list(s.runs),
                "baseline": s.baseline,
                "fit": fit.to_dict(),
            }
            pair = mt_pair(s.key[1])
            if pair:
                try:
                    entry["alignment"] = alignment.score(s.key[0], *pair)
                except ValueError:
                    entry["alignment"] = None
            if metric != "loss":
                entry["verdict"] = valuation.assess(s.Dp, s.values, baseline=s.baseline).to_dict()
            entries.append(entry)
            figures.setdefault((metric, s.key[1]), []).append(
                (
                    f"{s.model}: {s.key[0]} ({s.key[2]}{' steps' if s.key[2].isdigit() else ''})",
                    fit,
                    s.baseline,
                )
            )
    if not entries:  # say why where runs had results: too few points, unfittable values
        raise Skip(
            _why_none(f"no finetuning runs with {'/'.join(metrics)} results", study, f"{name}/")
        )
    for (metric, task), series in figures.items():
        label = "downstream cross-entropy" if metric == "loss" else metric.upper()
        study.draw(
            step.plot,
            f"{name}_{metric}_{task}.png",
            series,
            ylabel=label,
            title=f"{task}: {label} vs pretraining tokens",
        )
    return entries


def _bleu(study: Study, step: Step) -> list[dict[str, Any]]:
    present = {
        k.rsplit("/", 1)[-1]
        for r in study.runs
        if r.strategy in run_record.FINETUNES
        for rec in r.records
        for k in rec
        if k.startswith("eval/") and k.count("/") == 2
    } - {"loss", "tokens", "decoded"}  # decoded: how many examples were scored
    # BLEU first, as the paper; then every other translation score the runs report.
    metrics = sorted(present, key=lambda m: (m != "bleu", m)) or ["bleu"]
    return _downstream(study, step, metrics)


def _ce(study: Study, step: Step) -> list[dict[str, Any]]:
    return _downstream(study, step, ["loss"])


def _zeroshot(study: Study, step: Step) -> dict[str, Any]:
    if not zeroshot_figures.has_scores(study.runs):
        raise Skip("no run has zero-shot results (MODEL_DIR/zeroshot/<step>.json)")
    res = zeroshot_figures.figures(study.runs, size=study.zeroshot_size)
    study.skipped.update({f"zeroshot/{k}": v for k, v in res.pop("skipped").items()})
    if not res["fig3"] and not res["fig6"]:
        raise Skip(_why_none("no language with models to compare", study, "zeroshot/"))
    for lang, entry in res["fig3"].items():
        title = f"{lang}: zero-shot, N = {plots.compact_number(entry['size'])}"
        study.draw(step.plot, f"zeroshot_fig3_{lang}.png", entry, title=title)
    for lang, entry in res["fig6"].items():
        title = f"{lang}, N = {plots.compact_number(entry['size'])}"
        study.draw(plots.zeroshot_replay, f"zeroshot_fig6_{lang}.png", entry, title=title)
    return res


class Skip(Exception):
    """A step found no suitable runs."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One `xlscale fit --law NAME`: which laws it fits, how, and how it is reported and drawn.

    Attributes:
      name: the CLI name and the key of its results in fits.json.
      laws: the `fitting.laws.formulas.LAWS` entries it fits (the record of each law's formula and fit).
      run: fits them to a `Study`'s runs; returns the JSON-ready results (raises `Skip` when no
        run suits it).
      section: the results → report.md lines (`fitting.reports.markdown`).
      plot: the `fitting.reports.plots` figure it draws (None: no figure).
    """

    name: str
    laws: tuple[str, ...]
    run: Callable[[Study, Step], Any]
    section: Callable[[Any], list[str]]
    plot: Callable[..., Path] | None = None


def _register(*steps: Step) -> dict[str, Step]:
    unknown = {law for s in steps for law in s.laws} - set(formulas.LAWS)
    if unknown:
        raise ValueError(f"steps name unknown laws {sorted(unknown)}")
    return {s.name: s for s in steps}


# One entry per `xlscale fit --law` name, in report order.
STEPS: Mapping[str, Step] = _register(
    Step("chinchilla", ("chinchilla",), _chinchilla, markdown.chinchilla),
    Step("cpt", ("chinchilla", "cpt"), _cpt, markdown.cpt, plots.isoloss),
    Step("compute", ("loss_compute", "power"), _compute, markdown.compute, plots.loss_compute),
    Step("transfer", ("chinchilla", "cpt"), _transfer, markdown.transfer, plots.transfer),
    Step("replay", ("power",), _replay, markdown.replay, plots.replay),
    Step(
        "bleu",
        ("log_law",),
        _bleu,
        functools.partial(markdown.downstream, title="Downstream translation scores (log-law)"),
        plots.downstream,
    ),
    Step(
        "ce",
        ("power_law",),
        _ce,
        functools.partial(markdown.downstream, title="Downstream cross-entropy (power law)"),
        plots.downstream,
    ),
    Step("zeroshot", (), _zeroshot, markdown.zeroshot, plots.zeroshot_strategies),
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
) -> dict[str, Any]:
    """Fits the papers' laws to a directory of runs and writes fits.json, report.md and PNGs.

    Args:
      runs_dir: a directory of run directories (run.json + metrics.jsonl each, or real T5X
        MODEL_DIRs, `fitting.readers.t5x_runs`).
      out_dir: where fits.json, report.md and the plots go (created).
      law: one of `LAWS`; "all" runs every step that has suitable runs.
      bootstrap: resamples of whole runs for the intervals (0: none).
      seed: bootstrap seed.
      grid: start values for the Chinchilla fits (default: the 4,500-start Hoffmann grid).
      n_basis: N of the upstream fits (`fitting.readers.model_keys.N_BASES`): "exact" non-embedding
        counts, or "nominal", the paper's sizes (CPT paper Table 4), the basis its Table 2 and
        eqs. 8-9 were fitted on; C = 6·N·D follows it.
      point_rule: which evaluations of each run are points of the L(N, D) laws (default
        `fitting.readers.points.PointRule()`: every one after the first token).
      zeroshot_size: non-embedding N near which the zero-shot figures compare models
        (`fitting.analyses.zeroshot_figures`; default None: per language, the largest size at which
        every compared model has scores; the paper's figures are at 1.4B).

    Returns:
      The dict written to fits.json.

    Raises:
      FitInputError: unreadable runs, bad values (naming the run or point), or — for a law asked
        for by name — no suitable runs.
    """
    if law not in LAWS:
        raise ValueError(f"unknown law {law!r}; choose one of {', '.join(LAWS)}")
    model_keys.check_basis(n_basis)
    out = storage.as_path(out_dir, name="--out")
    out.mkdir(parents=True, exist_ok=True)
    rule = point_rule if point_rule is not None else points.PointRule()
    study = Study(run_dirs.read_runs(runs_dir), out, int(bootstrap), int(seed), grid, n_basis, rule)
    study.zeroshot_size = zeroshot_size
    for name in STEPS if law == "all" else (law,):
        try:
            study.results[name] = STEPS[name].run(study, STEPS[name])
        except Skip as why:
            if law != "all":
                raise FitInputError(f"{name}: {why}") from None
            study.skipped[name] = str(why)
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
        "skipped": study.skipped,
        "plots": study.plots,
        **study.results,
    }
    storage.write_text_atomic(
        out / "fits.json", json.dumps(json_safe(result), indent=1, allow_nan=False)
    )
    storage.write_text_atomic(out / "report.md", render_report(result))
    return result


def _why_none(default: str, study: Study, prefix: str) -> str:
    """Why a step has no result: the fits it refused (unidentifiable), else `default`."""
    refused = [f"{k}: {v}" for k, v in study.skipped.items() if k.startswith(prefix)]
    return "; ".join(refused) if refused else default


def _per_run(pts: points.Points) -> dict[str, int]:
    """How many fit points each run gave (report.md states the spread)."""
    counts: dict[str, int] = {}
    for run in pts.runs:
        counts[run] = counts.get(run, 0) + 1
    return counts


def _clean(a) -> list[float | None]:
    return json_safe(np.asarray(a, float).tolist())


def _ci_json(ci: Mapping[str, tuple[float, float]]) -> dict[str, list[float]]:
    return {k: [lo, hi] for k, (lo, hi) in ci.items()}
