"""What the translation study's runs say: per-(mixture, Df) series and the paper's four questions.

Pure functions over `fitting.readers.run_data.RunData`s (and fits.json), used by `studies.mt_report`:
`collect` groups finetuning runs into cells (one per pretraining data × task × finetuning size,
every metric aligned by checkpoint, the same grouping as the fits); `aligned_vs_english`,
`pretraining_gain`, `co_movement` and `verdicts` measure what the MT paper (Isik et al. 2024)
claims: aligned data is better, pretraining matters less at large Df, BLEU and cross-entropy can
disagree (§3.4), and the §3.5 valuation guide's verdict.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fitting.analyses.correlations import spearman
from fitting.analyses.task_alignment import alignment_of
from fitting.readers import points
from rundir import finetune_recipes, names
from rundir.run_record import FINETUNES

# Score names a finetuning run may report under eval/<task>/<metric>, in report order.
SCORE_LABELS: dict[str, str] = {
    "bleu": "BLEU",
    "chrf": "chrF++",
    "rouge_l": "ROUGE-L",
    "rougeL": "ROUGE-L",
    "comet": "COMET",
}
CE = "loss"
LABELS = {**SCORE_LABELS, CE: "downstream CE"}
COMET = "comet"
# The COMET checkpoint a run was scored with, in its resolved gin config (run.json's
# `gin_config`): the `COMET_MODEL` macro, or a direct `DecodeConfig.comet_model` binding.
_GIN_COMET = re.compile(
    r"^\s*(?:COMET_MODEL|[\w.]*comet_model)\s*=\s*(['\"])(?P<path>[^'\"]+)\1", re.M
)
# "Beyond noise" for a change between checkpoints: 5% in log space, as fitting.valuation.
TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class Cell:
    """Every metric of one (model, pretraining data, task, finetuning size) series of finetuned
    checkpoints.

    Attributes:
      mixture: the pretraining mixture (`mix_en_50_fr_50`).
      task: the finetuning task (`mt_en_fr`).
      df: finetuning tokens Df (None when the runs do not say).
      steps: finetuning steps (the key `fitting.readers.points.downstream_series` groups by).
      Dp: pretraining tokens of each checkpoint, increasing.
      init_steps: the pretraining step of each checkpoint.
      values: metric → value per checkpoint (NaN where a run did not report it).
      baseline: metric → the non-pretrained model's value at the same Df.
      runs: the finetuning run ids, in Dp order.
      alignment: the translation alignment score of the mixture for the task (eq. 2).
      model: the finetuned model (`fitting.readers.model_keys.model_label`); cells of two models are
        never merged.
      train_steps: finetuning steps of every run of the cell (None when they differ or the
        runs do not say), to tell a change of Df from a change of training length.
    """

    mixture: str
    task: str
    df: int | None
    steps: str
    Dp: np.ndarray
    init_steps: tuple[int | None, ...]
    values: Mapping[str, np.ndarray]
    baseline: Mapping[str, float]
    runs: tuple[str, ...]
    alignment: float | None
    model: str = "?"
    train_steps: int | None = None

    @property
    def label(self) -> str:
        """`<mixture>, Df=<tokens>` for tables and legends."""
        return f"{self.mixture}, Df={count_label(self.df)}"


def count_label(x: Any) -> str:
    """A token or parameter count for tables and legends: `42M`, `1.5k` (3 significant digits);
    `?` when unknown."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "?"
    x = float(x)
    for factor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{suffix}"
    return f"{x:.3g}"


def score_metrics(runs: Sequence[Any]) -> list[str]:
    """The translation scores the finetuning runs report, BLEU first."""
    found = {
        k.rsplit("/", 1)[-1]
        for r in runs
        if r.strategy in FINETUNES
        for rec in r.records
        for k in rec
        if k.startswith("eval/") and k.count("/") == 2
    }
    order = list(SCORE_LABELS)
    return sorted(found & set(SCORE_LABELS), key=order.index)


def collect(runs: Sequence[Any]) -> list[Cell]:
    """Groups the finetuning runs into cells, one per (model, pretraining data, task, Df), each
    with all metrics aligned by checkpoint (the same grouping as the fits in fits.json)."""
    by_id = {r.run_id: r for r in runs}
    metrics = [*score_metrics(runs), CE]
    per_key: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for metric in metrics:
        for s in points.downstream_series(runs, metric=metric):
            cell = per_key.setdefault((s.model, *s.key), {"Dp": {}, "values": {}, "baseline": {}})
            for dp, v, rid in zip(s.Dp, s.values, s.runs, strict=True):
                cell["Dp"][rid] = float(dp)
                cell["values"].setdefault(metric, {})[rid] = float(v)
            if s.baseline is not None:
                cell["baseline"][metric] = float(s.baseline)
    cells = []
    for (model, mixture, task, steps), c in sorted(per_key.items()):
        order = sorted(c["Dp"], key=lambda rid: c["Dp"][rid])
        dfs = {points.finetune_tokens(by_id[rid].info) for rid in order}
        n_steps = {_int(by_id[rid].info.train_steps) for rid in order}
        init = tuple(
            None if by_id[rid].info.init_step is None else int(by_id[rid].info.init_step)
            for rid in order
        )
        cells.append(
            Cell(
                mixture=mixture,
                task=task,
                df=dfs.pop() if len(dfs) == 1 else None,
                steps=steps,
                Dp=np.asarray([c["Dp"][rid] for rid in order]),
                init_steps=init,
                values={
                    m: np.asarray([vals.get(rid, math.nan) for rid in order])
                    for m, vals in c["values"].items()
                },
                baseline=dict(c["baseline"]),
                runs=tuple(order),
                alignment=alignment_of(mixture, task),
                model=model,
                train_steps=n_steps.pop() if len(n_steps) == 1 else None,
            )
        )
    return sorted(
        cells, key=lambda c: (c.task, -(c.alignment or 0.0), c.mixture, c.df or 0, c.model)
    )


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def finetune_design(cells: Sequence[Cell]) -> tuple[str, bool]:
    """What varies between the finetuning sizes Df of the cells, in words, and whether it is Df
    alone: (text, fixed), naming the finetuning recipe whose length the cells share. The MT paper
    finetunes every Df for the same 300 steps [q:mt.s4_finetune], so a gain that
    shrinks with Df is the set's size; where a larger Df also trains for more steps (one pass
    over each set), the two effects are mixed and the text says so."""
    steps_by_df: dict[Any, set] = {}
    for c in cells:
        steps_by_df.setdefault(c.df, set()).add(c.train_steps)
    if len(steps_by_df) < 2:
        return "One finetuning size Df only: the effect of Df cannot be measured.", False
    steps = set().union(*steps_by_df.values())
    dfs = ", ".join(count_label(d) for d in sorted(steps_by_df, key=lambda d: d or 0))
    # Every Df trained at the same length(s): one, or each recipe of a FINETUNE_RECIPE grid axis
    # (mt_paper: 2^18 and 300 steps), each a series of its own.
    if len({frozenset(v) for v in steps_by_df.values()}) == 1 and None not in steps:
        lengths = []
        for n in sorted(steps):
            named = [k for k, r in finetune_recipes.RECIPES.items() if r.steps == n]
            lengths.append(
                f"{n} finetuning steps" + (f" (FINETUNE_RECIPE {named[0]!r})" if named else "")
            )
        fixed = (
            lengths[0] if len(lengths) == 1 else " and at ".join(lengths) + ", each Df under each"
        )
        return (
            f"Here Df ({dfs} tokens) varies at a fixed {fixed}, as the "
            "paper fixes one length, 300 steps, for every Df [q:mt.s4_finetune] (2^18 steps, "
            "'raffel_2^18', is ours: Raffel et al.'s finetuning length, which the paper does not "
            "name but its Df sizes and App. A timings fit, rundir/finetune_recipes.py): a smaller "
            "set is repeated more often, so a change between Df is the finetuning set's size, not "
            "the training length.",
            True,
        )
    per = "; ".join(
        f"Df={count_label(d)}: {', '.join(str(s) for s in sorted(v, key=lambda s: s or 0))} steps"
        for d, v in sorted(steps_by_df.items(), key=lambda kv: kv[0] or 0)
    )
    return (
        f"Here Df and the finetuning length vary together ({per}): a change between Df mixes "
        "the finetuning set's size with the number of training steps (the paper fixes one "
        "length for every Df).",
        False,
    )


def _better(metric: str, a: float, b: float) -> bool:
    """Whether value a is better than b (lower for cross-entropy, higher for scores)."""
    return a < b if metric == CE else a > b


def _best(metric: str, values: np.ndarray) -> float:
    ok = values[np.isfinite(values)]
    if not ok.size:
        return math.nan
    return float(ok.min() if metric == CE else ok.max())


def aligned_vs_english(
    cells: Sequence[Cell], metric: str, *, noise: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """Per (model, task, Df): the most and least aligned mixtures compared checkpoint by
    checkpoint (same pretraining step), counting where the aligned one is better (the paper's
    Remark 1 [q:mt.remark1_aligned]: English-only is "significantly worse" than the balanced
    mixtures). Mixtures are compared within one model, never across models.

    Args:
      cells: from `collect`.
      metric: the metric compared.
      noise: run id → the metric's resampling half-width (e.g. BLEU's bootstrap 95% interval);
        when given, `beyond_noise` counts the checkpoints whose difference exceeds both runs'
        half-widths combined (None where a run has no estimate).
    """
    rows = []
    groups: dict[tuple[str, Any, str], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.task, c.df, c.model), []).append(c)
    for (task, df, model), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])
    ):
        ranked = sorted(
            (c for c in group if c.alignment is not None and metric in c.values),
            key=lambda c: -(c.alignment or 0.0),
        )
        if len(ranked) < 2 or ranked[0].alignment == ranked[-1].alignment:
            continue
        hi, lo = ranked[0], ranked[-1]
        a = dict(zip(hi.init_steps, hi.values[metric], strict=True))
        b = dict(zip(lo.init_steps, lo.values[metric], strict=True))
        run_a = dict(zip(hi.init_steps, hi.runs, strict=True))
        run_b = dict(zip(lo.init_steps, lo.runs, strict=True))
        common = [s for s in hi.init_steps if s in b and np.isfinite(a[s]) and np.isfinite(b[s])]
        if not common:
            continue
        diffs = [a[s] - b[s] for s in common]
        beyond = None
        if noise is not None and all(run_a[s] in noise and run_b[s] in noise for s in common):
            beyond = sum(
                abs(a[s] - b[s]) > math.hypot(noise[run_a[s]], noise[run_b[s]])
                and _better(metric, a[s], b[s])
                for s in common
            )
        rows.append(
            {
                "model": model,
                "task": task,
                "df": df,
                "aligned": hi.mixture,
                "other": lo.mixture,
                "wins": sum(_better(metric, a[s], b[s]) for s in common),
                "beyond_noise": beyond,
                "n": len(common),
                "mean_diff": float(np.mean(diffs)),
                "last_aligned": a[common[-1]],
                "last_other": b[common[-1]],
            }
        )
    return rows


def pretraining_gain(cells: Sequence[Cell], metric: str) -> list[dict[str, Any]]:
    """Per cell: best and last checkpoint against the non-pretrained baseline; `gain` is positive
    when pretraining helps (score up, or cross-entropy down)."""
    rows = []
    for c in cells:
        v, base = c.values.get(metric), c.baseline.get(metric)
        if v is None or base is None or not np.isfinite(v).any():
            continue
        best = _best(metric, v)
        last = float(v[np.isfinite(v)][-1])
        sign = -1.0 if metric == CE else 1.0
        rows.append(
            {
                "model": c.model,
                "mixture": c.mixture,
                "task": c.task,
                "df": c.df,
                "baseline": base,
                "best": best,
                "last": last,
                "gain": sign * (best - base),
                "gain_last": sign * (last - base),
                "rel_gain": sign * (best - base) / abs(base) if base else math.nan,
            }
        )
    return rows


def co_movement(cells: Sequence[Cell], score: str = "bleu") -> list[dict[str, Any]]:
    """Per cell: does the score follow the cross-entropy along pretraining (MT paper §3.4
    [q:mt.s3_4_ce_monotone])?

    Counts the steps between consecutive checkpoints where the cross-entropy falls, where the
    score rises, and where the cross-entropy falls but the score drops by more than the noise
    tolerance (the paper's disagreement); `rho` is the rank correlation of the score with −CE
    (+1: they move together)."""
    rows = []
    for c in cells:
        s, ce = c.values.get(score), c.values.get(CE)
        if s is None or ce is None or len(s) < 2:
            continue
        ok = np.isfinite(s) & np.isfinite(ce)
        s, ce = s[ok], ce[ok]
        with np.errstate(divide="ignore", invalid="ignore"):
            ds = np.diff(np.log(np.where(s > 0, s, np.nan)))
        dce = np.diff(ce)
        rows.append(
            {
                "model": c.model,
                "mixture": c.mixture,
                "task": c.task,
                "df": c.df,
                "steps": len(dce),
                "ce_down": int(np.sum(dce < 0)),
                "score_up": int(np.sum(np.nan_to_num(ds, nan=0.0) > 0)),
                "disagree": int(np.sum((dce < 0) & (np.nan_to_num(ds, nan=0.0) < -TOLERANCE))),
                "rho": spearman(s, -ce),
            }
        )
    return rows


def brevity_penalty(runs: Sequence[Any]) -> dict[str, Any]:
    """BLEU's brevity penalty over the finetuning runs' last decoded evaluation, against the MT
    paper's Remark 2 [q:mt.remark2_bp].

    Returns:
      n: runs that logged `eval/<task>/bleu_bp`; at_one: how many have BP = 1 (to 1e-9); min_bp,
      min_run: the smallest BP and its run; ratio: that run's hypothesis / reference length
      (`bleu_sys_len / bleu_ref_len`, NaN when not logged); median_bp over the runs.
    """
    found = []
    for r in runs:
        if r.strategy not in FINETUNES:
            continue
        task = str(r.info.mixture_or_task)
        for rec in reversed(r.records):
            if f"eval/{task}/bleu_bp" in rec:
                sys_len = float(rec.get(f"eval/{task}/bleu_sys_len", math.nan))
                ref_len = float(rec.get(f"eval/{task}/bleu_ref_len", math.nan))
                ratio = sys_len / ref_len if ref_len > 0 else math.nan
                found.append((float(rec[f"eval/{task}/bleu_bp"]), r.run_id, ratio))
                break
    if not found:
        return {"n": 0}
    bp, run_id, ratio = min(found)
    return {
        "n": len(found),
        "at_one": sum(b >= 1.0 - 1e-9 for b, _, _ in found),
        "min_bp": bp,
        "min_run": run_id,
        "ratio": ratio,
        "median_bp": float(np.median([b for b, _, _ in found])),
    }


def verdicts(cells: Sequence[Cell], score: str = "bleu") -> dict[tuple[str, str, str, Any], Any]:
    """The §3.5 valuation verdict of each cell's score series (`fitting.analyses.valuation.assess`), keyed
    by (model, mixture, task, Df): two models' series of one mixture are two verdicts."""
    from fitting.analyses import valuation

    out = {}
    for c in cells:
        v = c.values.get(score)
        if v is None or not np.all(np.isfinite(v)):
            continue
        out[(c.model, c.mixture, c.task, c.df)] = valuation.assess(
            c.Dp, v, baseline=c.baseline.get(score), tolerance=TOLERANCE
        )
    return out


# --------------------------------------------------------------------------------------- noise


def final_predictions(run: Any) -> Any | None:
    """The predictions file of a finetuning run's last decoded step (`trainer.downstream` writes
    `predictions/<task>_<step>.jsonl`, `rundir.names.predictions_file`): of the run's own task
    where it has one, else of any task; None when it has none."""
    found = []
    for path in (run.path / names.PREDICTIONS_SUBDIR).glob("*.jsonl"):
        parsed = names.parse_predictions_file(path.name)
        if parsed is not None:
            found.append((parsed[0] == run.info.mixture_or_task, parsed[1], path.name, path))
    return max(found)[-1] if found else None


def bleu_noise(runs: Sequence[Any], *, n_bootstrap: int = 200) -> dict[str, tuple[float, float]]:
    """Per finetuning run with saved predictions: (BLEU, bootstrap 95% half-width) on its final
    predictions file, so differences can be judged against resampling noise."""
    from sacrebleu.metrics import BLEU

    out = {}
    for r in runs:
        if r.strategy not in FINETUNES:
            continue
        path = final_predictions(r)
        if path is None:
            continue
        refs, hyps = [], []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            ref, hyp = row.get(names.PREDICTION_TARGET), row.get(names.PREDICTION_OUTPUT)
            if isinstance(ref, str) and isinstance(hyp, str):
                refs.append(ref)
                hyps.append(hyp)
        if len(refs) >= 10:
            tgt = str(r.info.mixture_or_task).rsplit("_", 1)[-1]
            score = BLEU(tokenize="zh" if tgt == "zh" else "13a").corpus_score(
                hyps, [refs], n_bootstrap=n_bootstrap
            )
            out[r.run_id] = (float(score.score), float(getattr(score, "_ci", math.nan)))
    return out


def comet_models(runs: Sequence[Any]) -> dict[str, list[str]]:
    """The COMET checkpoint(s) behind the finetuning runs' `eval/<task>/comet`: checkpoint path
    (as the runs' gin configs name it; `"?"` where a run's config names none) → run ids.

    The report says which COMET model scored the runs, since COMET values of two models (or of
    a randomly initialised test model) are not comparable.
    """
    found: dict[str, list[str]] = {}
    for r in runs:
        if r.strategy not in FINETUNES:
            continue
        if not any(k.endswith(f"/{COMET}") for rec in r.records for k in rec):
            continue
        m = _GIN_COMET.search(str(r.info.gin_config or ""))
        found.setdefault(m.group("path") if m else "?", []).append(r.run_id)
    return found
