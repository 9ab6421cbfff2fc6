"""Markdown report of a `fitting.reports.fit_all.fit_runs` result.

Numbers are rounded for people (`fitting.formats.fmt`, 4 significant digits); fits.json keeps them
unrounded. A fit that did not converge is flagged next to its numbers and listed at the top. Each
section function here is named after the `fitting.reports.fit_all.STEPS` entry whose results it reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fitting.formats import fmt, markdown_table
from fitting.reports import cpt_comparison, mt_paper_comparison

# fits.json's `n_basis` -> the sentence report.md states it in.
N_BASIS_NOTES = {
    "exact": "N basis: exact non-embedding parameter counts (run.json `params_non_embedding`); "
    "not the CPT paper's basis (its Table 4 nominal sizes), so A, α and the allocation "
    "prefactors are not comparable with its Table 2 and eqs. 8-9.",
    "nominal": "N basis: the paper's nominal sizes (CPT paper Table 4), the basis we read its "
    "Table 2 and eqs. 8-9 as fitted on (its §2.1 sizes runs by them; it names no other N); "
    "C = 6·N·D on the same N.",
}


def _n(v: Any) -> str:
    """A table cell: None as an em dash, floats rounded (`fmt`), everything else as it is."""
    return "—" if v is None else fmt(v)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A markdown table: the header, its rule, then one line per row (cells through `_n`)."""
    return markdown_table(header, ([_n(v) for v in row] for row in rows))


def _status(fit: Mapping[str, Any]) -> str:
    if fit.get("converged"):
        return "converged"
    return f"**NOT CONVERGED** (gradient {_n(fit.get('grad_norm'))})"


def _param_table(fit: Mapping[str, Any]) -> list[str]:
    ci = fit.get("ci") or {}
    fixed = set(fit.get("fixed") or ())
    return _table(
        ("parameter", "value", "CI low", "CI high"),
        (
            (f"{k} (fixed from scratch fit)" if k in fixed else k, v, *ci.get(k, (None, None)))
            for k, v in fit["params"].items()
        ),
    )


def _fit_block(fit: Mapping[str, Any]) -> list[str]:
    lines = _param_table(fit)
    lines.append("")
    lines.append(
        f"Status: {_status(fit)}; objective (summed Huber, δ={_n(fit.get('delta'))}) "
        f"{_n(fit.get('objective'))}; gradient {_n(fit.get('grad_norm'))}; "
        f"{_n(fit.get('n_at_best'))} of {_n(fit.get('n_starts'))} starts reached the best basin; "
        f"{_n(fit.get('n_points'))} points from {_n(fit.get('n_runs'))} runs"
    )
    if fit.get("n_bootstrap"):
        lines.append(
            f"Bootstrap over runs: {_n(fit['n_bootstrap_converged'])} of {_n(fit['n_bootstrap'])} "
            f"refits converged; intervals are {_n(fit.get('ci_level'))} percentile intervals."
        )
    lines.append("")
    return lines


def _allocation(entry: Mapping[str, Any]) -> list[str]:
    a = entry["allocation"]
    if not a.get("valid", True):
        return [f"Compute-optimal allocation: none ({a.get('note')}).", ""]
    ci = entry.get("allocation_ci") or {}
    lines = [
        "Compute-optimal allocation (C = 6ND): "
        f"N_opt = {_n(a['n_coef'])}·C^{_n(a['a'])}, D_opt = {_n(a['d_coef'])}·C^{_n(a['b'])} "
        f"(G = {_n(a['G'])}).",
        "",
    ]
    if ci:
        lines += _table(("quantity", "CI low", "CI high"), ((k, *v) for k, v in ci.items()))
        lines.append("")
    return lines


def _points_per_run(entry: Mapping[str, Any]) -> list[str]:
    """The spread of fit points over runs (one line), where fits.json records it."""
    counts = entry.get("points_per_run")
    if not counts:
        return []
    lo = min(counts, key=lambda r: (counts[r], r))
    hi = max(counts, key=lambda r: (counts[r], r))
    spread = (
        f"{counts[lo]} each"
        if counts[lo] == counts[hi]
        else f"{counts[lo]} ({lo}) to {counts[hi]} ({hi})"
    )
    return [
        f"Fit points per run: {spread}, {sum(counts.values())} from {len(counts)} runs.",
        "",
    ]


def _models(entry: Mapping[str, Any]) -> list[str]:
    """The models a fit pooled (one line), where fits.json lists them."""
    models = entry.get("models")
    return [f"Models ({len(models)}): {', '.join(models)}.", ""] if models else []


def chinchilla(res: Mapping[str, Any]) -> list[str]:
    """The from-scratch Chinchilla fits with their compute-optimal allocations."""
    lines = ["## From-scratch Chinchilla law L = E + A/N^α + B/D^β", ""]
    for lang, e in res.items():
        lines += [f"### {lang}", ""] + _models(e) + _points_per_run(e)
        lines += _fit_block(e["fit"]) + _allocation(e)
    return lines


def cpt(res: Mapping[str, Any]) -> list[str]:
    """The CPT law's second-stage fits, allocations and the Appendix B comparison."""
    lines = ["## CPT law L = E + A/N^α + B'/(D^β'·N^γ) (second stage)", ""]
    for lang, e in res.items():
        lines += [f"### {lang}", ""] + _models(e) + _points_per_run(e)
        lines += _fit_block(e["fit"]) + _allocation(e)
        b = e.get("appendix_b")
        if b:
            lines += appendix_b(b)
    return lines


def appendix_b(b: Mapping[str, Any]) -> list[str]:
    """Both laws' fitting errors on the CPT runs, set against the CPT paper's Appendix B only
    through their ratio: the paper's absolute values are normalised in a way it does not state
    (`fitting.reports.paper_values.ERROR_DEFINITIONS`), the ratio on the same points is not."""
    from fitting.reports.paper_values import CPT_APPENDIX_B

    chin, cpt_ = b["mean_huber_chinchilla"], b["mean_huber_cpt"]
    ratio = cpt_ / chin if chin else float("nan")
    paper = CPT_APPENDIX_B["cpt"]
    return [
        "Fitting error on the CPT runs (ours: mean Huber per point of the log-loss residuals, "
        f"δ={_n(b['chinchilla_fit'].get('delta'))}): Chinchilla law {_n(chin)} "
        f"({_status(b['chinchilla_fit'])}), CPT law {_n(cpt_)}; ratio CPT law / Chinchilla "
        f"{_n(ratio)}. The CPT paper's Appendix B ratio on its CPT runs: "
        f"{paper['cpt_law']} / {paper['chinchilla']} = {_n(paper['cpt_law'] / paper['chinchilla'])} "
        "(below 1: the extended law fits better). Only the ratios are comparable; the paper's "
        "absolute errors are not per-point means and are not set against ours.",
        "",
    ]


def compute(res: Mapping[str, Any]) -> list[str]:
    """Both loss–compute frontier laws per language and run group."""
    lines = ["## Loss–compute frontier", ""]
    for lang, groups in res.items():
        for group, fr in groups.items():
            lines += [f"### {lang}, {group} ({len(fr['C'])} frontier points)", ""]
            for key, title in (("power", "L = k·C^(−g)"), ("loss_compute", "L = E' + A'/C^γ")):
                if fr.get(key):
                    lines += [f"{title}:", ""] + _fit_block(fr[key])
    return lines


def transfer(res: Mapping[str, Any]) -> list[str]:
    """FLOPs saved and transferred data at equal loss, one row per CPT run."""
    rows = []
    for lang, e in res.items():
        for c in e["curves"]:
            saved = [v for v in c["flops_saved"] if v is not None]
            moved = [v for v in c["transferred"] if v is not None]
            rng = f"{_n(min(saved))} … {_n(max(saved))}" if saved else None
            rows.append(
                (
                    lang,
                    c["run_id"],
                    c["reference_id"],
                    c["n_params"],
                    rng,
                    moved[-1] if moved else None,
                )
            )
    header = ("language", "CPT run", "reference", "N", "FLOPs saved (min … max)")
    return [
        "## Transfer at equal loss (FLOPs saved, effectively transferred data)",
        "",
        *_table((*header, "transferred at last eval"), rows),
        "",
    ]


def replay(res: Mapping[str, Any]) -> list[str]:
    """Source-language forgetting under replay, one row per run."""
    keys = ("replay_ratio", "source_start", "source_peak", "source_final")
    rows = [
        (
            lang,
            c["run_id"],
            *(c[k] for k in keys),
            c["tail_fit"]["params"]["g"] if c.get("tail_fit") else None,
        )
        for lang, curves in res.items()
        for c in curves
    ]
    header = ("language", "run", "replay", "source loss start", "peak", "final", "tail exponent g")
    return ["## Forgetting under replay", "", *_table(header, rows), ""]


def schedule(res: Mapping[str, Any]) -> list[str]:
    """The schedule-aware law's fits (`fitting.reports.schedule_fit`): per language and group,
    λ (and whether it was given or chosen), the parameters, and each run's final loss beside the
    law's."""
    lines = [
        "## Schedule-aware law L = E + A·(N/N₀)^-α + (N/N₀)^-γ·(B·(S₁/S₀)^-β − C·S₂)",
        "",
        "S₁, S₂: the learning-rate areas of each run's logged schedule (Tissue et al. 2024); "
        "the points are the evaluations the fit's point rule keeps along each run; λ, the "
        "annealing momentum, is given (--lr-decay) or chosen: the one under which the first "
        "three quarters of the runs best forecast their last quarter.",
        "",
    ]
    for lang, groups in res.items():
        for group, e in groups.items():
            fit = e["fit"]
            lines += [f"### {lang}, {group.replace('_', ' ')}", ""]
            lines += _table(("parameter", "value"), fit["params"].items())
            how = e.get("decay_rule", "chosen")
            lines += [
                "",
                f"λ {_n(e['decay'])} ({how}); "
                f"{'converged' if fit['converged'] else '**NOT CONVERGED**'}; "
                f"RMS relative residual {_n(fit['rms'])}; {fit['n_points']} points from "
                f"{fit['n_runs']} runs.",
                "",
            ]
            rows = ((f["run_id"], f["step"], f["loss"], f["law"], f["error"]) for f in e["finals"])
            lines += _table(("run", "step", "final loss", "law", "relative error"), rows) + [""]
    return lines


def zeroshot(res: Mapping[str, Any]) -> list[str]:
    """CPT paper Fig. 3 (CPT vs scratch vs source per target language) and Fig. 6 (relative
    performance vs replay ratio) tables, with the size chosen and the benchmarks averaged."""
    lines = ["## Zero-shot benchmarks (CPT paper Fig. 3 and Fig. 6)", ""]
    for lang, e in res.get("fig3", {}).items():
        strategies = list(e["acc_norm"])
        lines += [
            f"### Fig. 3, {lang}: N = {_n(e['size'])} ({e['size_rule']}; source model: "
            f"{e['source_lang']})",
            "",
            "acc_norm at each run's latest scored step (runs: "
            + ", ".join(f"{s} `{r}` step {e['steps'][s]}" for s, r in e["runs"].items())
            + f"); average over the {len(e['averaged_over'])} {lang} benchmarks every model "
            "has.",
            "",
        ]
        rows = [
            (t, *(e["acc_norm"][s][t] for s in strategies), e["chance"].get(t))
            for t in e["benchmarks"]
        ]
        rows.append(("average", *(e["average"][s] for s in strategies), None))
        lines += _table(("benchmark", *strategies, "chance"), rows) + [""]
        if len(e.get("by_size", ())) > 1:
            lines += [
                f"Fig. 3, {lang} at every size present: mean acc_norm over the {lang} benchmarks "
                "all three models have at that size.",
                "",
            ]
            rows = [
                (b["size"], *(b["average"][s] for s in strategies), len(b["benchmarks"]))
                for b in e["by_size"]
            ]
            lines += _table(("N", *strategies, "benchmarks"), rows) + [""]
    for lang, e in res.get("fig6", {}).items():
        groups = list(e["groups"])
        lines += [
            f"### Fig. 6, {lang}: N = {_n(e['size'])} ({e['size_rule']})",
            "",
            "Relative performance (the paper's): a group's mean acc_norm ÷ its highest across "
            "all training settings of this size ("
            + ", ".join(e.get("denominator_over", ()))
            + "), so the best setting is 1; best: "
            + "; ".join(f"{g}: {e['denominator'][g]['setting']}" for g in groups)
            + "; groups: "
            + "; ".join(f"{g}: {', '.join(ts)}" for g, ts in e["groups"].items())
            + ".",
            "",
        ]
        rows = [
            (s["ratio"], s["run"], *(s["group_relative"][g] for g in groups)) for s in e["settings"]
        ]
        rows += [
            (r["setting"], r["run"], *(r["group_relative"][g] for g in groups))
            for r in e.get("references", ())
        ]
        lines += _table(("replay ratio", "run", *groups), rows) + [""]
        for setting, why in e.get("references_missing", {}).items():
            lines += [f"Not in the denominator: {setting} ({why}).", ""]
    return lines


def downstream(entries: Sequence[Mapping[str, Any]], *, title: str) -> list[str]:
    """The MT paper's downstream law fits (params, held-out error, valuation), one per series."""
    lines = [f"## {title}", ""]
    for e in entries:
        fit = e["fit"]
        lines += [
            f"### {e.get('model', '?')}: {e['pretraining']} → {e['task']} "
            f"({e['metric']}, {e['finetune_steps']} finetuning steps)",
            "",
        ]
        lines += _table(("parameter", "value"), fit["params"].items())
        lines += [
            "",
            f"Status: {_status(fit)}; fitted on the first {fit['n_fit']} points; held-out "
            f"error (ours: the Huber loss of the held-out log residuals summed, "
            f"δ={_n(fit['delta'])}; not the MT paper's prediction error, which it does not define "
            f"fully enough to recompute) {_n(fit['prediction_error'])}; "
            f"non-pretrained baseline {_n(e.get('baseline'))}; alignment score {_n(e.get('alignment'))}.",
            "",
        ]
        if e.get("verdict"):
            lines += [f"Valuation ({e['verdict']['kind']}): {e['verdict']['explanation']}", ""]
    return lines


def render(result: Mapping[str, Any], *, sections: Mapping[str, Callable[[Any], list[str]]]) -> str:
    """The report as markdown: a header, then `sections[key](result[key])` for each key present
    (in `sections`' order; `fitting.reports.fit_all.render_report` passes its steps' sections)."""
    lines = [
        "# xlscale fit report",
        "",
        f"Runs: `{result['runs_dir']}` ({result['n_runs']} runs); law: {result['law']}; "
        f"bootstrap resamples: {result['bootstrap']} (seed {result['seed']}).",
        "",
        N_BASIS_NOTES.get(result.get("n_basis", "exact"), f"N basis: {result.get('n_basis')}."),
        "",
    ]
    rule = result.get("fit_points")
    if rule and (result.get("chinchilla") or result.get("cpt")):
        lines += [
            f"Fit points of the L(N, D) laws (Chinchilla, CPT, Appendix B): {rule['text']} "
            "(`xlscale fit --points-per-run/--points-min-fraction/--points-min-tokens`); runs "
            "are evaluated every EVAL_PERIOD steps, so with every evaluation a point, longer "
            "runs weigh more; under EVAL_SCHEDULE 'log' (the paper manifests) each run adds "
            "about 20 early points from 0.1% of its length, weighed like the rest unless "
            "--points-min-fraction drops them. The loss–compute frontier takes every evaluation.",
            "",
        ]
    if result.get("input_warnings"):
        lines += ["**Warning — runs skipped or records left out of the fits:**", ""]
        lines += [f"- {w}" for w in result["input_warnings"]] + [""]
    if result["warnings"]:
        lines += ["**Warning — fits that did not converge:**", ""]
        lines += [f"- {w}" for w in result["warnings"]] + [""]
    elif not result.get("unconverged_series"):
        lines += ["All fits converged.", ""]
    if result.get("unconverged_series"):
        lines += ["Downstream series whose own fit did not converge (flagged in their rows):", ""]
        lines += [f"- {w}" for w in result["unconverged_series"]] + [""]
    if result.get("skipped"):
        lines += ["Skipped:", ""] + [f"- {k}: {v}" for k, v in result["skipped"].items()] + [""]
    for key, section in sections.items():
        if result.get(key):
            lines += section(result[key])
    lines += cpt_comparison.section(result)  # CPT paper: Table 2, headlines, consistency
    lines += mt_paper_comparison.section(result)
    if result.get("plots"):
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in result["plots"]] + [""]
    return "\n".join(lines)
