"""From runs to fit inputs: (N, D, L) points, training curves, and downstream (Dp, score) series.

Every intermediate evaluation is a point, as in the CPT paper, which fits along training curves.
The loss is the run's target-language eval loss (`eval/lm_<lang>/loss`); D is tokens seen in this
run, for replay runs only the target language's component (`tokens_by_task`); C is the run's
cumulative 6·N·D FLOPs. An evaluation before any token was seen (D = 0) cannot be a point of a
power law and is skipped; a NaN or non-positive loss is an error naming the run and step.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from fitting.checks import FitInputError
from fitting.io import RunRecord


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's evaluations of one task along training.

    Attributes:
      run_id, strategy, language, replay_ratio: from run.json.
      n_params: non-embedding parameters (N).
      task: the evaluated task (lm_<lang>).
      steps, tokens, flops, loss: per evaluation; tokens counts only the target language's
        component for replay runs (D of the CPT law), flops the whole run's 6·N·tokens.
      fraction: share of the run's tokens that went to `task`'s language (1 without replay), so
        that compute "allocated to the language" is flops × fraction (CPT paper Fig. 4).
    """

    run_id: str
    strategy: str
    language: str
    replay_ratio: float
    n_params: float
    task: str
    steps: np.ndarray
    tokens: np.ndarray
    flops: np.ndarray
    loss: np.ndarray
    fraction: np.ndarray


@dataclasses.dataclass(frozen=True)
class Points:
    """Fit inputs pooled over runs (one entry per evaluation)."""

    N: np.ndarray
    D: np.ndarray
    L: np.ndarray
    C: np.ndarray
    runs: tuple[str, ...]
    steps: np.ndarray

    def __len__(self) -> int:
        return len(self.L)


def _component(run: RunRecord, lang: str) -> str | None:
    """The mixture component that carries `lang`'s language-modelling data."""
    comps = list(run.meta.get("components") or [])
    if f"lm_{lang}" in comps:
        return f"lm_{lang}"
    for name in comps:
        if name.endswith(f"_{lang}"):
            return name
    return None


def curve(run: RunRecord, *, task: str | None = None, n_key: str = "params_non_embedding") -> Curve:
    """A run's evaluations of `task` (default its target language's lm task) along training.

    Raises:
      FitInputError: missing parameter count, or a NaN / non-positive loss (naming run and step).
    """
    lang = run.target_lang
    task = task or f"lm_{lang}"
    task_lang = task.rsplit("_", 1)[-1]
    n = _float(run.meta.get(n_key))
    if not (np.isfinite(n) and n > 0):
        raise FitInputError(f"run {run.run_id!r}: run.json has no positive {n_key}")
    comp = _component(run, task_lang)
    comps = list(run.meta.get("components") or [])
    ratio = _float(run.meta.get("replay_ratio") or 0.0)
    steps, tokens, flops, loss, frac = [], [], [], [], []
    for rec in run.records:
        key = f"eval/{task}/loss"
        if key not in rec:
            continue
        value = _float(rec[key])
        if not (np.isfinite(value) and value > 0):
            raise FitInputError(
                f"run {run.run_id!r} step {rec['step']}: {key} = {rec[key]!r} is not a positive number"
            )
        total = _float(rec.get("tokens"))
        by_task = rec.get("tokens_by_task") or {}
        if comp is not None and comp in by_task and total > 0:
            f = _float(by_task[comp]) / total
        elif len(comps) == 1:
            f = 1.0 if (comp is not None or task_lang == lang) else 0.0
        else:
            f = 1.0 - ratio if task_lang == lang else ratio
        steps.append(int(rec["step"]))
        tokens.append(total * f)
        flops.append(_float(rec.get("flops")))
        loss.append(value)
        frac.append(f)
    return Curve(
        run_id=run.run_id,
        strategy=run.strategy,
        language=lang,
        replay_ratio=ratio,
        n_params=n,
        task=task,
        steps=np.asarray(steps, int),
        tokens=np.asarray(tokens, np.float64),
        flops=np.asarray(flops, np.float64),
        loss=np.asarray(loss, np.float64),
        fraction=np.asarray(frac, np.float64),
    )


def curves(
    runs: Iterable[RunRecord],
    *,
    strategies: Sequence[str],
    language: str | None = None,
    task: str | None = None,
) -> list[Curve]:
    """Curves of the runs with one of `strategies` (and `language`, if given)."""
    out = []
    for run in runs:
        if run.strategy in strategies and (language is None or run.target_lang == language):
            c = curve(run, task=task)
            if len(c.loss):
                out.append(c)
    return out


def pool(curves_: Sequence[Curve], *, min_tokens: float = 0.0) -> Points:
    """Pools curves into fit points, skipping evaluations with no tokens seen yet.

    Raises:
      FitInputError: a kept point has a non-finite token or FLOP count (naming run and step).
    """
    N, D, L, C, runs, steps = [], [], [], [], [], []
    for c in curves_:
        for i in range(len(c.loss)):
            if not (c.tokens[i] > min_tokens):
                if not np.isfinite(c.tokens[i]):
                    raise FitInputError(
                        f"run {c.run_id!r} step {c.steps[i]}: token count is not a number"
                    )
                continue
            N.append(c.n_params)
            D.append(c.tokens[i])
            L.append(c.loss[i])
            C.append(c.flops[i] if np.isfinite(c.flops[i]) else 6.0 * c.n_params * c.tokens[i])
            runs.append(c.run_id)
            steps.append(c.steps[i])
    return Points(
        np.asarray(N), np.asarray(D), np.asarray(L), np.asarray(C), tuple(runs), np.asarray(steps)
    )


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@dataclasses.dataclass(frozen=True)
class DownstreamSeries:
    """Downstream results of finetuning checkpoints of one pretraining run (MT paper §4).

    Attributes:
      key: (pretraining mixture, finetuning task, finetuning steps) describing the series.
      metric: the score's name ("bleu", ...) or "loss" for downstream cross-entropy.
      Dp: pretraining tokens of each checkpoint (sorted).
      values: the finetuned model's final score (or cross-entropy) per checkpoint.
      runs: the finetuning run ids.
      baseline: the same finetuning from random initialisation (finetune_scratch), if present.
    """

    key: tuple[str, str, str]
    metric: str
    Dp: np.ndarray
    values: np.ndarray
    runs: tuple[str, ...]
    baseline: float | None = None


_GIN_DF = re.compile(r"^\s*FINETUNE_TOKENS\s*=\s*([0-9_eE.+]+)", re.MULTILINE)


def finetune_tokens(meta: dict) -> int | None:
    """Df of a finetuning run: run.json's `finetune_tokens`, else FINETUNE_TOKENS in its gin."""
    if meta.get("finetune_tokens") not in (None, ""):
        return int(float(meta["finetune_tokens"]))
    m = _GIN_DF.search(str(meta.get("gin_config") or ""))
    return int(float(m.group(1).replace("_", ""))) if m else None


def finetune_group(meta: dict) -> str:
    """The finetuning recipe of a run, as the third part of a series key: its step count, and
    its Df when it recorded one (the MT paper finetunes 300 steps on sets of several sizes Df,
    so steps alone would merge them): `"300"` or `"300 steps, Df 6000000"`."""
    steps = str(meta.get("train_steps", ""))
    df = finetune_tokens(meta)
    return steps if df is None else f"{steps} steps, Df {df}"


def downstream_series(runs: Sequence[RunRecord], *, metric: str) -> list[DownstreamSeries]:
    """Groups finetuning runs into (Dp, final value) series, one per pretraining run × task.

    Dp is read from the pretraining run named by `init_checkpoint` ('<model_dir>[@step]') at its
    `init_step`. `metric` is a score name ("bleu", "rouge", "comet") or "loss". A series (and
    its non-pretrained baseline) shares the finetuning recipe: steps and Df (`finetune_group`).
    """
    by_id = {r.run_id: r for r in runs}
    groups: dict[tuple[str, str, str], list[tuple[float, float, str]]] = {}
    baselines: dict[tuple[str, str], float] = {}
    for run in runs:
        if run.strategy not in ("finetune", "finetune_scratch"):
            continue
        task = str(run.meta.get("mixture_or_task", ""))
        value = _final_value(run, task, metric)
        if value is None:
            continue
        steps = finetune_group(run.meta)
        if run.strategy == "finetune_scratch":
            baselines[(task, steps)] = value
            continue
        ckpt = str(run.meta.get("init_checkpoint") or "")
        src_dir, _, at = ckpt.partition("@")
        src = by_id.get(PurePosixPath(src_dir.rstrip("/")).name)
        if src is None:
            raise FitInputError(
                f"run {run.run_id!r}: init_checkpoint {ckpt!r} names no run in this directory"
            )
        step = run.meta.get("init_step", at or None)
        dp = _tokens_at(src, int(step) if step not in (None, "") else None)
        key = (str(src.meta.get("mixture_or_task", src.run_id)), task, steps)
        groups.setdefault(key, []).append((dp, value, run.run_id))
    out = []
    for key, items in sorted(groups.items()):
        items.sort()
        out.append(
            DownstreamSeries(
                key=key,
                metric=metric,
                Dp=np.asarray([i[0] for i in items]),
                values=np.asarray([i[1] for i in items]),
                runs=tuple(i[2] for i in items),
                baseline=baselines.get((key[1], key[2])),
            )
        )
    return out


def _final_value(run: RunRecord, task: str, metric: str) -> float | None:
    """Last evaluation of `task`'s metric in a run (scores live at eval/<task>/<metric>)."""
    key = f"eval/{task}/{metric}"
    for rec in reversed(run.records):
        if key in rec:
            v = _float(rec[key])
            if not np.isfinite(v):
                raise FitInputError(f"run {run.run_id!r} step {rec['step']}: {key} is not a number")
            return v
    return None


def _tokens_at(run: RunRecord, step: int | None) -> float:
    """Tokens a pretraining run had seen at `step` (its last record when step is None)."""
    recs = [r for r in run.records if "tokens" in r]
    if not recs:
        raise FitInputError(f"run {run.run_id!r}: no token counts to date its checkpoints")
    if step is None:
        return _float(recs[-1]["tokens"])
    before = [r for r in recs if r["step"] <= step]
    if not before:
        raise FitInputError(f"run {run.run_id!r}: no record at or before step {step}")
    last = before[-1]
    if last["step"] == step:
        return _float(last["tokens"])
    # Tokens grow linearly in steps at a fixed batch: scale the last count to the step.
    return _float(last["tokens"]) * step / max(int(last["step"]), 1)
