"""The steps of `xlscale fit` (`fitting.reports.fit_all.STEPS`): what each fits to a `Study`'s
runs, per target language, and the JSON-ready results it returns.

A `Study` holds one `fit_runs` call's runs and settings, caches the from-scratch and CPT fits
that several steps share, and collects the plots drawn, the warnings (fits that did not
converge) and the fits skipped with their reasons (`fitting.checks.Unidentifiable`). A step that
finds no suitable runs raises `Skip`.
"""

from __future__ import annotations

import dataclasses
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
from fitting.readers import model_keys, points
from fitting.readers.run_data import RunData
from fitting.reports import plots, zeroshot_plots
from pipelines.names import mt_pair
from rundir import run_record
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
    # lr_area's annealing momentum λ (`fitting.reports.schedule_fit`); None: chosen from the runs.
    lr_decay: float | None = None
    results: dict[str, Any] = dataclasses.field(default_factory=dict)
    plots: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    # Downstream series whose own fit did not converge: flagged in their entry (fit.converged)
    # and listed here, without marking the whole result unconverged (`warnings`).
    unconverged_series: list[str] = dataclasses.field(default_factory=list)
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
            return _fit_nd(
                fit_chinchilla,
                pts,
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
            return _fit_nd(
                fit_cpt, pts, base=base, bootstrap=self.bootstrap, seed=self.seed + 1, series=lang
            )

        return self._cached(("cpt", lang), make)

    def draw(self, plot: Callable[..., Path], name: str, *args: Any, **kwargs: Any) -> None:
        """Draws `plot(*args, out/name, **kwargs)` (a `fitting.reports.plots` figure) and records it."""
        plot(*args, self.out / name, **kwargs)
        self.plots.append(name)


def _fit_nd(fit: Callable[..., FitResult], pts: points.Points, **options: Any) -> FitResult:
    """`fit` (`fit_chinchilla` or `fit_cpt`) on pooled points: their N, D and loss, a bootstrap
    resampling whole runs."""
    return fit(pts.N, pts.D, pts.L, runs=pts.runs, **options)


def _budgets(pts: points.Points) -> list[float]:
    top = float(np.max(pts.C)) if len(pts) else 1e20
    return [top, 10 * top, 100 * top]


def _by_language(
    study: Study,
    strategies: Sequence[str],
    entry: Callable[[str], Any],
    *,
    none: str,
    refused: str | None = None,
) -> dict[str, Any]:
    """`entry(lang)` of every target language of the runs with `strategies`, where not None.

    Raises:
      Skip: no language has an entry; the message is `none`, or with `refused` (a key prefix of
        `study.skipped`) the fits refused under it, where there are any.
    """
    out = {}
    for lang in study.languages(strategies):
        got = entry(lang)
        if got is not None:
            out[lang] = got
    if not out:
        raise Skip(_why_none(none, study, refused) if refused else none)
    return out


def _attempt(study: Study, key: str, fit: Callable[[], Any]) -> Any:
    """`fit()` (None: nothing to fit), or None with the reason recorded under `key` when the data
    cannot identify it; a fit that did not converge is warned about under `key`."""
    try:
        got = fit()
    except Unidentifiable as why:
        study.skipped[key] = str(why)
        return None
    study.check(key, got)
    return got


def _law_entry(fit: FitResult, pts: points.Points) -> dict[str, Any]:
    """A language's fit of an L(N, D) law with its points and compute-optimal allocation."""
    return {
        "models": sorted(set(pts.models)),
        "points_per_run": _per_run(pts),
        # What the fit covered (N on the study's basis): what a comparison with a paper's fit,
        # made on its own sizes and tokens, must set beside it.
        "span": {
            "n_sizes": len(np.unique(pts.N)),
            "N": [float(np.min(pts.N)), float(np.max(pts.N))],
            "D": [float(np.min(pts.D)), float(np.max(pts.D))],
        },
        "fit": fit.to_dict(),
        "allocation": compute_optimal(fit).to_dict(),
        "allocation_ci": _ci_json(allocation_cis(fit, budgets=_budgets(pts))),
    }


def chinchilla_step(study: Study, step: Step) -> dict[str, Any]:
    def entry(lang: str) -> dict[str, Any] | None:
        fit = _attempt(study, f"chinchilla/{lang}", lambda: study.scratch_fit(lang))
        if fit is None:
            return None
        pts = points.pool(study.curves(FROM_SCRATCH, lang), rule=study.point_rule)
        return _law_entry(fit, pts)

    return _by_language(
        study, FROM_SCRATCH, entry, none="no source or scratch runs", refused="chinchilla/"
    )


def cpt_step(study: Study, step: Step) -> dict[str, Any]:
    def entry(lang: str) -> dict[str, Any] | None:
        fit = _attempt(study, f"cpt/{lang}", lambda: study.cpt_fit(lang))
        if fit is None:  # unidentifiable (the reason is recorded), or no first stage
            study.skipped.setdefault(
                f"cpt/{lang}", "no from-scratch runs of this language for the first stage"
            )
            return None
        base = study.scratch_fit(lang)
        pts = points.pool(study.curves((Strategy.CPT,), lang), rule=study.point_rule)
        out = _law_entry(fit, pts)

        def chinchilla_on_cpt() -> FitResult:
            study.pooled("chinchilla", (Strategy.CPT,), lang)
            return _fit_nd(fit_chinchilla, pts, grid=study.grid, series=lang)

        chin = _attempt(study, f"cpt/{lang} (Chinchilla law on CPT runs)", chinchilla_on_cpt)
        if chin is not None:
            # CPT paper Appendix B: mean Huber per point of both laws on the CPT runs.
            out["appendix_b"] = {
                "chinchilla_fit": chin.to_dict(),
                "mean_huber_chinchilla": chin.objective / chin.n_points,
                "mean_huber_cpt": fit.objective / fit.n_points,
            }

        # Appendix B's "pretraining" column: the extended law's second stage fitted on the
        # from-scratch runs themselves (the paper: γ ≈ −0.005, no better than Chinchilla there,
        # [q:cpt.appB_table3]).
        def cpt_on_scratch() -> FitResult:
            scratch = study.pooled("chinchilla", FROM_SCRATCH, lang)
            return _fit_nd(
                fit_cpt, scratch, base=base, seed=study.seed + 3, series=f"{lang}/pretraining"
            )

        ext = _attempt(study, f"cpt/{lang} (CPT law on from-scratch runs)", cpt_on_scratch)
        if ext is not None:
            out["appendix_b_pretraining"] = {
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
        return out

    return _by_language(
        study,
        (Strategy.CPT,),
        entry,
        none="no cpt runs with from-scratch runs of the same language",
        refused="cpt/",
    )


def compute_step(study: Study, step: Step) -> dict[str, Any]:
    groups = {"scratch": FROM_SCRATCH, "cpt": (Strategy.CPT,)}

    def entry(lang: str) -> dict[str, Any] | None:
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
        if not fronts:
            return None
        study.draw(
            step.plot, f"loss_compute_{lang}.png", curves, fronts, title=f"{lang}: loss vs compute"
        )
        return {k: v.to_dict() for k, v in fronts.items()}

    return _by_language(
        study,
        FROM_SCRATCH + (Strategy.CPT,),
        entry,
        none="no runs with target-language evaluations",
    )


def transfer_step(study: Study, step: Step) -> dict[str, Any]:
    def entry(lang: str) -> dict[str, Any] | None:
        cpt_c = study.curves((Strategy.CPT,), lang)
        pairs = transfer.transfer_pairs(cpt_c, study.curves(FROM_SCRATCH, lang))
        if not pairs:
            return None
        out: dict[str, Any] = {"curves": [p.to_dict() for p in pairs]}
        try:
            base, cpt = study.scratch_fit(lang), study.cpt_fit(lang)
        except Unidentifiable as why:  # the curves stand; the law-based measures need the laws
            study.skipped[f"transfer/{lang} (law)"] = str(why)
            base = cpt = None
        if base is not None and cpt is not None:
            out["law"] = [_law_transfer(base, cpt, c) for c in cpt_c]
        title = f"{lang}: CPT vs from scratch at equal loss"
        study.draw(step.plot, f"transfer_{lang}.png", pairs, title=title)
        return out

    return _by_language(
        study,
        (Strategy.CPT,),
        entry,
        none="no cpt run with a from-scratch run of the same size and language",
    )


def _law_transfer(base: FitResult, cpt: FitResult, c: points.Curve) -> dict[str, Any]:
    """The laws' transfer measures along one cpt run's tokens."""
    d = c.tokens[c.tokens > 0]
    lt = transfer.law_transfer(base, cpt, np.full(len(d), c.n_params), d)
    return {
        "run_id": c.run_id,
        "n_params": c.n_params,
        "tokens": d.tolist(),
        "tokens_pt": _clean(lt.tokens_pt),
        "flops_saved": _clean(lt.flops_saved),
        "transferred": _clean(lt.transferred),
        "ci": {k: [_clean(lo), _clean(hi)] for k, (lo, hi) in lt.ci.items()},
    }


def replay_step(study: Study, step: Step) -> dict[str, Any]:
    def entry(lang: str) -> list[dict[str, Any]] | None:
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
        if not curves:
            return None
        curves.sort(key=lambda c: (c.replay_ratio, c.run_id))
        title = f"{lang}: replay of the source language"
        study.draw(step.plot, f"replay_{lang}.png", curves, title=title)
        return [c.to_dict() for c in curves]

    return _by_language(
        study,
        (Strategy.CPT_REPLAY,),
        entry,
        none="no cpt_replay runs with source-language evaluations",
    )


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
            if not fit.converged:  # marks its own series (entry), not the whole result
                study.unconverged_series.append(
                    f"{where}: fit did NOT converge (gradient {fit.grad_norm:.3g})"
                )
            entry: dict[str, Any] = {
                "model": s.model,
                "pretraining": s.key[0],
                "task": s.key[1],
                "finetune_steps": s.key[2],
                "metric": metric,
                "dp_unit": s.dp_unit,
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
            if metric in downstream_laws.SCORES:
                verdict = valuation.assess(s.Dp, s.values, baseline=s.baseline, metric=metric)
                entry["verdict"] = verdict.to_dict()
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


def bleu_step(study: Study, step: Step) -> list[dict[str, Any]]:
    present = {
        k.rsplit("/", 1)[-1]
        for r in study.runs
        if r.strategy in run_record.FINETUNES
        for rec in r.records
        for k in rec
        if k.startswith("eval/") and k.count("/") == 2
    }
    # The paper's translation scores the runs report, BLEU first; BLEU's parts (brevity penalty,
    # precisions, lengths), chrF++ and the decoded count are logged, never fitted.
    metrics = [m for m in downstream_laws.SCORES if m in present] or ["bleu"]
    return _downstream(study, step, metrics)


def ce_step(study: Study, step: Step) -> list[dict[str, Any]]:
    return _downstream(study, step, ["loss"])


def zeroshot_step(study: Study, step: Step) -> dict[str, Any]:
    if not zeroshot_figures.has_scores(study.runs):
        raise Skip("no run has zero-shot results (MODEL_DIR/zeroshot/<step>.json)")
    res = zeroshot_figures.figures(study.runs, size=study.zeroshot_size)
    study.skipped.update({f"zeroshot/{k}": v for k, v in res.pop("skipped").items()})
    if not res["fig3"] and not res["fig6"]:
        raise Skip(_why_none("no language with models to compare", study, "zeroshot/"))
    for lang, entry in res["fig3"].items():
        title = f"{lang}: zero-shot, N = {plots.compact_number(entry['size'])}"
        study.draw(step.plot, f"zeroshot_fig3_{lang}.png", entry, title=title)
        if len(entry["by_size"]) > 1:  # Fig. 3 at every size present
            name = f"zeroshot_fig3_{lang}_sizes.png"
            study.draw(
                zeroshot_plots.accuracy_by_size, name, entry, title=f"{lang}: zero-shot by size"
            )
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
      in_all: whether `--law all` runs it (False: only asked for by name).
    """

    name: str
    laws: tuple[str, ...]
    run: Callable[[Study, Step], Any]
    section: Callable[[Any], list[str]]
    plot: Callable[..., Path] | None = None
    in_all: bool = True


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
