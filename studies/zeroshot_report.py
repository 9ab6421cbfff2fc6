"""The CPT report's zero-shot section: Fig. 3 and Fig. 6 analogues from the runs' zero-shot JSON
(`evals.results`, read by `rundir.zeroshot`), with 95% Wilson intervals and a plain statement
of which scores cannot be told apart from chance.

Scores are pooled per language (every item of the language's tasks counted once, as the paper
averages its benchmarks per language), from each run's latest scored step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rundir.run_record import Strategy
from studies import cpt_zeroshot


def _latest_scores(run) -> list[Any]:
    from rundir import zeroshot

    scores = zeroshot.read_zeroshot(run.path)
    if not scores:
        return []
    last = max(s.step for s in scores)
    return [s for s in scores if s.step == last]


def pooled(run) -> dict[str, dict[str, Any]]:
    """Language -> `{acc, n, correct, lo, hi, chance, tasks}`: acc_norm pooled over the
    language's tasks (items weighted equally) at the run's latest scored step."""
    from evals import confidence

    by_lang: dict[str, dict[str, Any]] = {}
    for s in _latest_scores(run):
        row = by_lang.setdefault(s.language, {"correct": 0, "n": 0, "chance_sum": 0.0, "tasks": []})
        row["correct"] += round(s.acc_norm * s.n)
        row["n"] += s.n
        row["chance_sum"] += (s.chance or 0.0) * s.n
        row["tasks"].append(s.task)
    for row in by_lang.values():
        n = row["n"]
        row["acc"] = row["correct"] / n if n else float("nan")
        row["lo"], row["hi"] = confidence.wilson_interval(row["correct"], n)
        row["chance"] = row.pop("chance_sum") / n if n else None
    return by_lang


def _row(run, lang: str, stats: dict[str, Any], **extra) -> dict[str, Any]:
    return {
        "language": lang,
        "strategy": run.strategy,
        "run": run.run_id,
        "model": str(run.info.model or run.run_id),
        **stats,
        **extra,
    }


def _scale(runs: Sequence[Any]) -> str:
    """'N1–N2 non-embedding parameters trained on T1–T2 tokens' of the scored runs."""
    from fitting.formats import fmt

    scored = [*cpt_zeroshot.fig3_runs(runs), *cpt_zeroshot.replay_runs(runs)]
    params = [float(r.info.params_non_embedding or 0) for r in scored]
    # Each run's last token count (zero-shot records, written after training, carry none).
    tokens = [max(float(rec.get("tokens") or 0) for rec in r.records) for r in scored]
    tokens = [t for t in tokens if t > 0]

    def span(values: list[float]) -> str:
        lo, hi = min(values), max(values)
        return fmt(lo, 3) if lo == hi else f"{fmt(lo, 3)}–{fmt(hi, 3)}"

    if not params or not tokens:
        return "far fewer parameters and tokens"
    return f"{span(params)} non-embedding parameters trained on {span(tokens)} tokens"


def _fmt(row: dict[str, Any] | None) -> str:
    if row is None:
        return "–"
    return f"{row['acc']:.3f} [{row['lo']:.3f}, {row['hi']:.3f}] (n={row['n']})"


def section(runs: Sequence[Any], out_dir: Path) -> str:
    """Markdown for report.md (empty when no run has zero-shot scores); writes
    `zeroshot_by_strategy.png` and `zeroshot_vs_replay.png` into `out_dir`."""
    from evals import confidence
    from fitting.reports import zeroshot_plots

    targets = cpt_zeroshot.target_langs(runs)
    several = len(targets) > 1
    fig3, replay = [], []
    for target, group in cpt_zeroshot.fig3_groups(runs).items():
        for run in group.values():
            fig3 += [_row(run, lang, stats, target=target) for lang, stats in pooled(run).items()]
    for target, group in cpt_zeroshot.replay_groups(runs).items():
        for run in group:
            ratio = None if run.strategy == Strategy.SOURCE else float(run.info.replay_ratio or 0.0)
            replay += [
                _row(run, lang, stats, ratio=ratio, target=target)
                for lang, stats in pooled(run).items()
            ]
    if not fig3 and not replay:
        return ""
    # The languages scored, the source language first, then the targets (from the runs).
    sources = sorted(
        {str(r.info.source_lang or "en") for r in runs if r.strategy == Strategy.SOURCE}
    )
    found = {r["language"] for r in fig3 + replay}
    langs = [lang for lang in dict.fromkeys([*sources, *targets, *sorted(found)]) if lang in found]
    # In a study of several target languages, each plotted language is labelled with the target
    # language of the runs it comes from (a zh run's English score is not an fr run's).
    for r in fig3 + replay:
        r["label"] = f"{r['language']} ({r['target']} runs)" if several else r["language"]
    out = ["## Zero-shot accuracy (CPT paper Fig. 3 and Fig. 6 analogues)", ""]
    out.append(
        "Local multiple-choice tasks built from held-out text of the study's corpora (choose a "
        "passage's true ending among endings of other passages; choose the right translation "
        "among other sentences' translations), scored by the `xlscale` lm-evaluation-harness "
        "model. Numbers are acc_norm pooled over each language's tasks, with 95% Wilson "
        "intervals."
    )
    out.append("")
    if fig3:
        size = ", ".join(dict.fromkeys(r["model"] for r in fig3))
        zeroshot_plots.accuracy_by_strategy(
            [
                {**r, "language": r["label"]}
                for r in fig3
                if r["language"] in (r["target"], *sources)
            ],
            out_dir / "zeroshot_by_strategy.png",
            title=f"zero-shot acc_norm per language and strategy ({size})",
            strategies=cpt_zeroshot.FIG3_STRATEGIES,
        )
        head = ["language", "source (en)", "scratch", "CPT"]
        head = ["CPT target", *head] if several else head
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for target in dict.fromkeys(r["target"] for r in fig3):
            for lang in langs:
                rows = [r for r in fig3 if r["target"] == target and r["language"] == lang]
                if not rows or lang not in (target, *sources):
                    continue
                cells = [
                    _fmt(next((r for r in rows if r["strategy"] == s), None))
                    for s in cpt_zeroshot.FIG3_STRATEGIES
                ]
                lead = f"| {target} | {lang} | " if several else f"| {lang} | "
                out.append(lead + " | ".join(cells) + " |")
        out += ["", "![zeroshot_by_strategy](zeroshot_by_strategy.png)", ""]
    if replay:
        shown = [r for r in replay if r["language"] in (r["target"], *sources)]
        zeroshot_plots.accuracy_vs_replay(
            [{**r, "language": r["label"]} for r in shown],
            out_dir / "zeroshot_vs_replay.png",
            title="zero-shot acc_norm against replay ratio",
            languages=list(dict.fromkeys(r["label"] for r in shown)),
        )
        out += ["| run | replay | " + " | ".join(langs) + " |", "|---|---|" + "---|" * len(langs)]
        for run_id in dict.fromkeys(r["run"] for r in replay):
            rows = [r for r in replay if r["run"] == run_id]
            ratio = rows[0]["ratio"]
            label = "source model" if ratio is None else f"{ratio:.0%}"
            cells = [_fmt(next((r for r in rows if r["language"] == lang), None)) for lang in langs]
            out.append(f"| {run_id} | {label} | " + " | ".join(cells) + " |")
        out += ["", "![zeroshot_vs_replay](zeroshot_vs_replay.png)", ""]
    scored = fig3 + replay
    at_chance = [
        r
        for r in scored
        if r["chance"] is not None
        and confidence.indistinguishable_from_chance(r["acc"], r["n"], r["chance"])
    ]
    if at_chance:
        out.append(
            f"**At chance:** {len(at_chance)} of {len(scored)} scores above cannot be told apart "
            "from guessing (two-sided exact binomial test, 5%). The paper's models have 0.1–7B "
            f"parameters trained on billions of tokens; these have {_scale(runs)}, so where they "
            "are at chance they say nothing about the paper's Fig. 3 and Fig. 6, and elsewhere "
            "only the direction of a difference larger than its interval is worth reading. The "
            "pipeline that produces them is the one that scores real checkpoints on the real "
            "benchmarks (`xlscale zeroshot --paper`)."
        )
    else:
        out.append(
            "Every score above is distinguishable from chance (two-sided exact binomial test, 5%)."
        )
    out.append("")
    return "\n".join(out)
