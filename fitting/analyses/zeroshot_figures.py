"""Tables of the CPT paper's zero-shot figures from any directory of runs (`xlscale fit`'s
"zeroshot" step): Fig. 3 (CPT vs from scratch vs the source model, per target language) and
Fig. 6 (relative performance against the source-language replay ratio).

Scores are each run's `MODEL_DIR/zeroshot/<step>.json` (`rundir.zeroshot`), acc_norm at the run's
latest scored step. Where several runs share a role (strategy, language, size, replay ratio),
the one with the latest scored step is taken (ties: the first run id), so the figures compare
the longest-trained models.

Model size: per target language, the sizes (run.json `params_non_embedding`) at which every
compared model has scores; `size=None` takes the one closest to the paper's 1.4B (`PAPER_SIZE`,
compared with a run's nominal N where run.json records it, else its non-embedding N), a number
the one closest to it, both on a log scale. The chosen size and the rule are recorded.

Fig. 3 compares the target language's own benchmarks (tasks whose `language` is the target
language, as the paper's Fr./Ru./Zh. panels) that all three models have, and their mean, at the
chosen size and (`by_size`) at every size where all three models have scores.
Fig. 6 (CPT paper Appendix A) divides each benchmark's acc_norm by the highest acc_norm across
all training settings of that size, as the paper does ("accuracy relative to the highest accuracy
achieved across different training settings with 1.4B parameters" [q:cpt.fig6_relative]): the replay settings (plain
CPT is ratio 0), the English-only source model and the target-only model from scratch, so the
best of them all is 1; benchmarks are grouped into the source language's and the target
language's, and each group's mean acc_norm is divided likewise.

This module reads runs only (no trainer, no JAX).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fitting.checks import FitInputError
from fitting.readers.run_data import RunData
from rundir import zeroshot
from rundir.run_record import CPT_STRATEGIES, Strategy

# The source model is the English checkpoint.
FIG3_STRATEGIES = (Strategy.SOURCE, Strategy.SCRATCH, Strategy.CPT)
# The paper's zero-shot figures are at 1.4B parameters (its llama2_1393m row, nominal N).
PAPER_SIZE = 1.393e9
# Fig. 6's settings beside the replay ratios: the source-language-only and target-only models.
FIG6_REFERENCES = (Strategy.SOURCE, Strategy.SCRATCH)


def latest_scores(run: RunData) -> tuple[int, dict[str, zeroshot.ZeroshotScore]]:
    """(step, task -> score) at the run's latest scored step, tasks with a finite acc_norm only
    ((-1, {}) when the run has no zero-shot results).

    Raises:
      FitInputError: a zero-shot file in another format (naming the run).
    """
    try:
        scores = zeroshot.latest(zeroshot.read_zeroshot(run.path))
    except zeroshot.ZeroshotFormatError as e:
        raise FitInputError(f"run {run.run_id!r}: {e}") from e
    kept = {s.task: s for s in scores if math.isfinite(s.acc_norm)}
    return (scores[0].step if kept else -1), kept


def _size(run: RunData) -> float | None:
    n = run.info.params_non_embedding
    return float(n) if n else None


def _nominal(run: RunData) -> float | None:
    """The run's nominal N (the paper's label) where run.json records it, else None."""
    n = run.info.params_nominal
    return float(n) if n else None


def _choose(
    sizes: Sequence[float], size: float | None, nominal: Mapping[float, float | None] | None = None
) -> tuple[float, str]:
    """The chosen size among `sizes` and the rule that chose it, in words: the one closest to
    `size`, or to the paper's 1.4B (`nominal`: size -> its runs' nominal N, where known)."""
    if size is None:
        label = {s: (nominal or {}).get(s) or s for s in sizes}
        chosen = min(sizes, key=lambda s: (abs(math.log(label[s] / PAPER_SIZE)), -s))
        return chosen, (
            "the size closest to the paper's 1.4B (nominal N where recorded) at which every "
            "compared model has scores"
        )
    chosen = min(sizes, key=lambda s: (abs(math.log(s / size)), -s))
    return chosen, f"the size closest to {size:.4g} at which every compared model has scores"


class _Scored:
    """The runs with zero-shot scores and, per role key, the longest-scored run."""

    def __init__(self, runs: Sequence[RunData]):
        self.scores: dict[str, tuple[int, dict[str, zeroshot.ZeroshotScore]]] = {}
        self.runs: dict[str, RunData] = {}
        for run in runs:
            step, tasks = latest_scores(run)
            if tasks and _size(run):
                self.scores[run.run_id], self.runs[run.run_id] = (step, tasks), run

    def best(self, pick) -> dict[Any, RunData]:
        """Key -> run over the scored runs with `pick(run)` not None, latest step winning."""
        out: dict[Any, RunData] = {}
        for rid in sorted(self.runs):
            key = pick(self.runs[rid])
            if key is None:
                continue
            if key not in out or self.scores[rid][0] > self.scores[out[key].run_id][0]:
                out[key] = self.runs[rid]
        return out


def _source_lang(scored: _Scored, lang: str) -> str:
    langs = {
        str(r.info.source_lang or "")
        for r in scored.runs.values()
        if r.strategy in CPT_STRATEGIES and r.target_lang == lang
    } - {""}
    return sorted(langs)[0] if langs else "en"


def _trained(run: RunData, step: int) -> dict[str, float | None]:
    """The run's cumulative `tokens` and `flops` (metrics.jsonl) at the latest record up to the
    scored `step` (None where no record has them)."""
    out: dict[str, float | None] = {"tokens": None, "flops": None}
    for rec in run.records:
        if int(rec.get("step", -1)) <= step:
            out.update({k: float(rec[k]) for k in out if rec.get(k) is not None})
    return out


def _fig3_at(scored: _Scored, by: Mapping, n: float, lang: str) -> dict[str, Any] | None:
    """Fig. 3's comparison at one size: the runs, their steps, the `lang` benchmarks all three
    models have, acc_norm per strategy and benchmark, each strategy's mean, and the tokens and
    FLOPs each model was trained on up to its scored step (None when they share no `lang`
    benchmark)."""
    picked = {s: by[(s, n)] for s in FIG3_STRATEGIES}
    tasks = {s: scored.scores[r.run_id][1] for s, r in picked.items()}
    common = set.intersection(*(set(t) for t in tasks.values()))
    benchmarks = sorted(t for t in common if tasks[Strategy.CPT][t].language == lang)
    if not benchmarks:
        return None
    acc = {s: {t: tasks[s][t].acc_norm for t in benchmarks} for s in FIG3_STRATEGIES}
    return {
        "size": n,
        "runs": {s: r.run_id for s, r in picked.items()},
        "steps": {s: scored.scores[r.run_id][0] for s, r in picked.items()},
        "benchmarks": benchmarks,
        "acc_norm": acc,
        "average": {s: sum(v.values()) / len(v) for s, v in acc.items()},
        "chance": {t: tasks[Strategy.CPT][t].chance for t in benchmarks},
        "trained": {s: _trained(r, scored.scores[r.run_id][0]) for s, r in picked.items()},
    }


def fig3(runs: Sequence[RunData], *, size: float | None = None):
    """Fig. 3 per target language of the scored CPT runs.

    Returns:
      ({language: entry}, {language: why it was left out}); an entry holds the chosen `size`,
      `size_rule`, `source_lang`, `runs` and `steps` per strategy, the `benchmarks` compared,
      `acc_norm` {strategy: {task: value}}, `average` {strategy: mean over the benchmarks},
      `averaged_over` and each benchmark's `chance`; and `by_size`, the same comparison
      (`size`, `runs`, `steps`, `benchmarks`, `acc_norm`, `average`, `chance`) at every size
      where all three models have scores, ascending.
    """
    scored, out, skipped = _Scored(runs), {}, {}
    for lang in sorted({r.target_lang for r in scored.runs.values() if r.strategy == Strategy.CPT}):
        src = _source_lang(scored, lang)
        want = {Strategy.CPT: lang, Strategy.SCRATCH: lang, Strategy.SOURCE: src}
        by = scored.best(
            lambda r, want=want: (
                (r.strategy, _size(r)) if want.get(r.strategy) == r.target_lang else None
            )
        )
        sizes = sorted({n for (_, n) in by if all((s, n) in by for s in FIG3_STRATEGIES)})
        if not sizes:
            skipped[lang] = (
                f"no model size with zero-shot scores of all of CPT and scratch ({lang}) and "
                f"the source model ({src})"
            )
            continue
        at = {n: _fig3_at(scored, by, n, lang) for n in sizes}
        sizes = [n for n in sizes if at[n] is not None]
        if not sizes:
            skipped[lang] = f"no {lang} benchmark scored for all of {', '.join(FIG3_STRATEGIES)}"
            continue
        nominal = {n: _nominal(by[(Strategy.CPT, n)]) for n in sizes}
        chosen, rule = _choose(sizes, size, nominal)
        entry = dict(at[chosen])
        out[lang] = {
            **entry,
            "size_rule": rule,
            "sizes_available": sizes,
            "source_lang": src,
            "averaged_over": entry["benchmarks"],
            "by_size": [at[n] for n in sizes],
        }
    return out, skipped


def _ratio(run: RunData) -> float | None:
    if run.strategy == Strategy.CPT:
        return 0.0
    r = run.info.replay_ratio if run.info.holds("replay_ratio") else None
    return float(r) if r is not None else None


def fig6(runs: Sequence[RunData], *, size: float | None = None):
    """Fig. 6 per target language with scored cpt_replay runs.

    Returns:
      ({language: entry}, {language: why it was left out}); an entry holds `size`, `size_rule`,
      `groups` {group: [tasks]} (group "<source_lang> (source)" and "<lang> (target)"),
      `settings`, one per replay ratio in ascending order, and `references`, the source-only
      and scratch models of that size that have every benchmark (`setting` "source" or
      "scratch"), each with `run`, `step`, `acc_norm` and `relative` {task: value} (acc_norm ÷
      the best across all settings and references: max 1 per task), `group_acc_norm` and
      `group_relative` {group: value} (the group's mean acc_norm ÷ the best such mean); the
      `denominator` {task or group: {"value", "setting"}} says which setting was best, and
      `denominator_over` which settings it was taken over (`references_missing`: why a
      reference was left out).
    """
    scored, out, skipped = _Scored(runs), {}, {}
    for lang in sorted(
        {r.target_lang for r in scored.runs.values() if r.strategy == Strategy.CPT_REPLAY}
    ):
        src = _source_lang(scored, lang)
        by = scored.best(
            lambda r, lang=lang: (
                (_size(r), _ratio(r))
                if r.strategy in CPT_STRATEGIES and r.target_lang == lang and _ratio(r) is not None
                else None
            )
        )
        per_size: dict[float, list[float]] = {}
        for n, ratio in by:
            per_size.setdefault(n, []).append(ratio)
        sizes = sorted(n for n, ratios in per_size.items() if len(ratios) >= 2)
        if not sizes:
            skipped[lang] = "no model size with zero-shot scores at two or more replay ratios"
            continue
        nominal = {n: _nominal(by[(n, per_size[n][0])]) for n in sizes}
        chosen, rule = _choose(sizes, size, nominal)
        picked = {ratio: by[(chosen, ratio)] for ratio in sorted(per_size[chosen])}
        tasks = {ratio: scored.scores[r.run_id][1] for ratio, r in picked.items()}
        common = sorted(set.intersection(*(set(t) for t in tasks.values())))
        first = next(iter(tasks.values()))
        groups = {
            f"{src} (source)": [t for t in common if first[t].language == src],
            f"{lang} (target)": [t for t in common if first[t].language == lang],
        }
        groups = {g: ts for g, ts in groups.items() if ts}
        if not groups:
            skipped[lang] = f"no {src} or {lang} benchmark scored at every replay ratio"
            continue
        bench = [t for ts in groups.values() for t in ts]
        # Every training setting of this size: the replay ratios, then the references that
        # have every benchmark (the paper's denominator is the best of them all).
        rows: dict[Any, tuple[RunData, dict[str, zeroshot.ZeroshotScore]]] = {
            ratio: (run, tasks[ratio]) for ratio, run in picked.items()
        }
        missing = {}
        want = {Strategy.SOURCE: src, Strategy.SCRATCH: lang}
        refs = scored.best(
            lambda r, want=want, n=chosen: (
                r.strategy if want.get(r.strategy) == r.target_lang and _size(r) == n else None
            )
        )
        for setting in FIG6_REFERENCES:
            run = refs.get(setting)
            lacking = [t for t in bench if run and t not in scored.scores[run.run_id][1]]
            if run is None or lacking:
                missing[str(setting)] = (
                    f"no scored {setting} run of this size"
                    if run is None
                    else f"`{run.run_id}` lacks {', '.join(lacking)}"
                )
                continue
            rows[str(setting)] = (run, scored.scores[run.run_id][1])
        acc = {key: {t: scores[t].acc_norm for t in bench} for key, (_, scores) in rows.items()}
        means = {
            key: {g: sum(acc[key][t] for t in ts) / len(ts) for g, ts in groups.items()}
            for key in rows
        }
        best = {t: _best({k: a[t] for k, a in acc.items()}) for t in bench}
        best |= {g: _best({k: m[g] for k, m in means.items()}) for g in groups}
        table = {
            key: {
                "run": run.run_id,
                "step": scored.scores[run.run_id][0],
                "acc_norm": acc[key],
                "relative": {t: _rel(acc[key][t], best[t]) for t in bench},
                "group_acc_norm": means[key],
                "group_relative": {g: _rel(means[key][g], best[g]) for g in groups},
            }
            for key, (run, _) in rows.items()
        }
        out[lang] = {
            "size": chosen,
            "size_rule": rule,
            "sizes_available": sizes,
            "source_lang": src,
            "groups": groups,
            "settings": [{"ratio": r, **table[r]} for r in picked],
            "references": [
                {"setting": key, **table[key]} for key in map(str, FIG6_REFERENCES) if key in rows
            ],
            "references_missing": missing,
            "denominator": best,
            "denominator_over": [_setting_name(k) for k in rows],
        }
    return out, skipped


def _setting_name(key: Any) -> str:
    """A Fig. 6 setting in words: `replay 0.3`, `plain CPT` (ratio 0), `source`, `scratch`."""
    if isinstance(key, str):
        return key
    return "plain CPT" if key == 0 else f"replay {key:g}"


def _best(values: Mapping[Any, float]) -> dict[str, Any]:
    """The highest of the settings' values and the setting that reached it."""
    key = max(values, key=lambda k: values[k])
    return {"value": values[key], "setting": _setting_name(key)}


def _rel(value: float, best: Mapping[str, Any]) -> float | None:
    """`value` ÷ the best setting's value (None when that is not positive)."""
    return value / best["value"] if best["value"] > 0 else None


def figures(runs: Sequence[RunData], *, size: float | None = None) -> dict[str, Mapping]:
    """`{"fig3": ..., "fig6": ..., "skipped": {"fig3/<lang>"|"fig6/<lang>": why}}`."""
    f3, s3 = fig3(runs, size=size)
    f6, s6 = fig6(runs, size=size)
    skipped = {f"fig3/{k}": v for k, v in s3.items()} | {f"fig6/{k}": v for k, v in s6.items()}
    return {"fig3": f3, "fig6": f6, "skipped": skipped}


def has_scores(runs: Sequence[RunData]) -> bool:
    """Whether any run has zero-shot results."""
    return any(latest_scores(r)[1] for r in runs)
