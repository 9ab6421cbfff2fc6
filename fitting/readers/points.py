"""From runs to fit inputs: (N, D, L) points, training curves, and downstream (Dp, score) series.

The fit-point rule (`PointRule`, default: every evaluation after the first token) decides which
evaluations of a run become points of the L(N, D) laws; by default every intermediate evaluation
is one. That is our reading of the CPT paper, which fits "across all trained models"
[q:cpt.appB_procedure] and measures Fig. 2 along each run's training, but does not say which
evaluations of a run its fits take. Runs are evaluated every
EVAL_PERIOD steps, so a run's share of the points follows its length in steps: at paper scale the
49M run gives 1 point and the 5534M run 27. `PointRule(per_run=k)` evens that out (at most k
points per run, evenly spaced, its last evaluation always kept; k = 1: final losses only),
`min_fraction` drops a run's early evaluations and `min_tokens` those before a token count.
The loss is the run's target-language eval loss (`eval/lm_<lang>/loss`); D is tokens seen in this
run, for replay runs only the target language's component (`tokens_by_task`); C is the run's
cumulative 6·N·D FLOPs. An evaluation before any token was seen (D = 0) cannot be a point of a
power law and is always skipped; a NaN or non-positive loss is an error naming the run and step.

N is on the basis the caller picks (`fitting.readers.model_keys.N_BASES`: exact non-embedding counts or
the paper's nominal sizes; C follows it). Curves and downstream series carry their model
(family + size, `fitting.readers.model_keys.model_label`): a downstream series and its baseline are one
model's, never a mix.

Downstream Dp and Df are in the MT paper's units by default: Dp = pretraining steps × batch ×
inputs length (its steps × 256 × 512, the records' `tokens_paper`; real span-corruption target
tokens are ~114/512 of that), Df = finetuning pairs × 512 (run.json's `finetune_tokens_paper`).
So fitted constants such as A, and the valuation guide's "Dp needed", read on the paper's scale.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from fitting.checks import FitInputError
from fitting.readers import model_keys
from fitting.readers.run_data import RunData
from rundir import names, run_record, storage
from rundir.run_record import Strategy


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's evaluations of one task along training.

    Attributes:
      run_id, strategy, language, replay_ratio: from run.json.
      n_params: N on the curve's basis (`n_basis`).
      task: the evaluated task (lm_<lang>).
      steps, tokens, flops, loss: per evaluation; tokens counts only the target language's
        component for replay runs (D of the CPT law), flops the whole run's 6·N·tokens.
      fraction: share of the run's tokens that went to `task`'s language (1 without replay), so
        that compute "allocated to the language" is flops × fraction (CPT paper Fig. 4).
      model: the run's model (`fitting.readers.model_keys.model_label`).
      n_basis: the basis of `n_params` and `flops` ("exact" or "nominal").
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
    model: str = "?"
    n_basis: str = model_keys.DEFAULT_BASIS


@dataclasses.dataclass(frozen=True)
class Points:
    """Fit inputs pooled over runs (one entry per evaluation; `models`: each point's model)."""

    N: np.ndarray
    D: np.ndarray
    L: np.ndarray
    C: np.ndarray
    runs: tuple[str, ...]
    steps: np.ndarray
    models: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.L)


def _component(run: RunData, lang: str) -> str | None:
    """The mixture component that carries `lang`'s language-modelling data."""
    comps = list(run.info.components)
    if f"lm_{lang}" in comps:
        return f"lm_{lang}"
    for name in comps:
        if name.endswith(f"_{lang}"):
            return name
    return None


def curve(
    run: RunData,
    *,
    task: str | None = None,
    n_key: str = "params_non_embedding",
    n_basis: str = model_keys.DEFAULT_BASIS,
) -> Curve:
    """A run's evaluations of `task` (default its target language's lm task) along training.

    Args:
      run: the run.
      task: the evaluated task (default `lm_<target language>`).
      n_key: the run.json count N is on the exact basis.
      n_basis: "exact" (`n_key`) or "nominal" (the paper's size; FLOPs rescaled to it).

    Raises:
      FitInputError: missing parameter count, or a NaN / non-positive loss (naming run and step).
    """
    lang = run.target_lang
    task = task or f"lm_{lang}"
    task_lang = task.rsplit("_", 1)[-1]
    n = _float(getattr(run.info, n_key, None))
    if not (np.isfinite(n) and n > 0):
        raise FitInputError(f"run {run.run_id!r}: run.json has no positive {n_key}")
    # FLOPs were counted with the exact N: on another basis they follow N (C = 6·N·D).
    flops_scale = 1.0
    if n_basis != "exact":
        basis_n = model_keys.n_params(run.info, basis=n_basis, run_id=run.run_id)
        n, flops_scale = basis_n, basis_n / n
    comp = _component(run, task_lang)
    comps = list(run.info.components)
    ratio = _float(run.info.replay_ratio or 0.0)
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
        flops.append(_float(rec.get("flops")) * flops_scale)
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
        model=model_keys.model_label(run.info),
        n_basis=n_basis,
    )


def curves(
    runs: Iterable[RunData],
    *,
    strategies: Sequence[str],
    language: str | None = None,
    task: str | None = None,
    n_basis: str = model_keys.DEFAULT_BASIS,
) -> list[Curve]:
    """Curves of the runs with one of `strategies` (and `language`, if given), N on `n_basis`."""
    out = []
    for run in runs:
        if run.strategy in strategies and (language is None or run.target_lang == language):
            c = curve(run, task=task, n_basis=n_basis)
            if len(c.loss):
                out.append(c)
    return out


@dataclasses.dataclass(frozen=True)
class PointRule:
    """Which evaluations of a run become fit points of the L(N, D) laws (`pool`).

    Attributes:
      min_tokens: keep evaluations after more than this many tokens D (0: all but the step-0
        evaluation, which no power law can take).
      min_fraction: keep evaluations at or after this fraction of the run's largest evaluated
        D (0: from the start; 0.5: the second half of each run).
      per_run: at most this many points per run, evenly spaced over the evaluations the two
        bounds keep, the run's last one always among them (None: all; 1: its final loss only).
    """

    min_tokens: float = 0.0
    min_fraction: float = 0.0
    per_run: int | None = None

    def __post_init__(self):
        if not (self.min_tokens >= 0):
            raise ValueError(f"min_tokens = {self.min_tokens}: allowed: >= 0")
        if not (0.0 <= self.min_fraction <= 1.0):
            raise ValueError(f"min_fraction = {self.min_fraction}: allowed: 0 to 1")
        if self.per_run is not None and int(self.per_run) < 1:
            raise ValueError(f"per_run = {self.per_run}: allowed: None or >= 1")

    def select(self, tokens: np.ndarray) -> np.ndarray:
        """Indices (increasing) of the evaluations at token counts `tokens` that are points."""
        tokens = np.asarray(tokens, np.float64)
        keep = np.flatnonzero(tokens > self.min_tokens)
        if self.min_fraction > 0 and keep.size:
            keep = keep[tokens[keep] >= self.min_fraction * tokens[keep].max()]
        if self.per_run is not None and keep.size > self.per_run:
            pos = np.round(np.linspace(keep.size - 1, 0, int(self.per_run))).astype(int)
            keep = keep[np.unique(pos)]
        return keep

    def describe(self) -> str:
        """The rule in words, for report.md."""
        text = "every evaluation of a run after " + (
            f"more than {self.min_tokens:.4g} tokens" if self.min_tokens else "its first token"
        )
        if self.min_fraction:
            text += f", from {self.min_fraction:.0%} of the run's tokens on"
        if self.per_run is not None:
            text += (
                ", only its last one"
                if self.per_run == 1
                else f", at most {self.per_run} per run (evenly spaced, the last always kept)"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        """fits.json's record of the rule."""
        return {**dataclasses.asdict(self), "text": self.describe()}


def pool(
    curves_: Sequence[Curve], *, min_tokens: float = 0.0, rule: PointRule | None = None
) -> Points:
    """Pools curves into fit points: the evaluations `rule` selects of each (default: every one
    after more than `min_tokens` tokens, so never the step-0 evaluation).

    Raises:
      FitInputError: an evaluation has a NaN token count, or a kept point a non-finite token
        or FLOP count (naming run and step).
    """
    rule = rule if rule is not None else PointRule(min_tokens=min_tokens)
    N, D, L, C, runs, steps, models = [], [], [], [], [], [], []
    for c in curves_:
        bad = np.flatnonzero(np.isnan(c.tokens))
        if bad.size:
            raise FitInputError(
                f"run {c.run_id!r} step {c.steps[bad[0]]}: token count is not a number"
            )
        for i in rule.select(c.tokens):
            N.append(c.n_params)
            D.append(c.tokens[i])
            L.append(c.loss[i])
            C.append(c.flops[i] if np.isfinite(c.flops[i]) else 6.0 * c.n_params * c.tokens[i])
            runs.append(c.run_id)
            steps.append(c.steps[i])
            models.append(c.model)
    return Points(
        np.asarray(N),
        np.asarray(D),
        np.asarray(L),
        np.asarray(C),
        tuple(runs),
        np.asarray(steps),
        tuple(models),
    )


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


@dataclasses.dataclass(frozen=True)
class DownstreamSeries:
    """Downstream results of finetuning checkpoints of one model's pretraining run (MT paper §4).

    Attributes:
      key: (pretraining mixture, finetuning task, finetuning steps) describing the series; with
        `model`, what identifies it (two models' series may share a key, never a series).
      metric: the score's name ("bleu", ...) or "loss" for downstream cross-entropy.
      Dp: pretraining tokens of each checkpoint (sorted), in `dp_unit`.
      values: the finetuned model's final score (or cross-entropy) per checkpoint.
      runs: the finetuning run ids.
      baseline: the same model's same finetuning from random initialisation
        (finetune_scratch), if present.
      model: the finetuned model (`fitting.readers.model_keys.model_label`: family + size).
      dp_unit: what `Dp` counts (a key of `DP_UNITS`).
    """

    key: tuple[str, str, str]
    metric: str
    Dp: np.ndarray
    values: np.ndarray
    runs: tuple[str, ...]
    baseline: float | None = None
    model: str = "?"
    dp_unit: str = "paper"

    @property
    def label(self) -> str:
        """`<model>/<mixture>/<task>/<finetuning group>`: names the series in skips, warnings
        and reports."""
        return "/".join((self.model, *self.key))


_GIN_DF = re.compile(r"^\s*FINETUNE_TOKENS\s*=\s*([0-9_eE.+]+)", re.MULTILINE)


def finetune_tokens(meta: run_record.RunRecord | Mapping[str, Any]) -> int | None:
    """Df of a finetuning run, in the MT paper's unit where the run has it: run.json's
    `finetune_tokens_paper` (pairs × 512, a set given with `FINETUNE_UNIT = 'paper'`), else its
    `finetune_tokens` (the `FINETUNE_TOKENS` it was given: about that many target tokens), else
    FINETUNE_TOKENS in its gin."""
    info = run_record.RunRecord.of(meta)
    for value in (info.finetune_tokens_paper, info.finetune_tokens):
        if value not in (None, ""):
            return int(float(value))
    m = _GIN_DF.search(str(info.gin_config or ""))
    return int(float(m.group(1).replace("_", ""))) if m else None


def finetune_group(meta: run_record.RunRecord | Mapping[str, Any]) -> str:
    """The finetuning recipe of a run, as the third part of a series key: its step count, and
    its Df when it recorded one (the MT paper finetunes 300 steps on sets of several sizes Df,
    so steps alone would merge them): `"300"` or `"300 steps, Df 6000000"`."""
    info = run_record.RunRecord.of(meta)
    steps = str(info.train_steps) if info.holds("train_steps") else ""
    df = finetune_tokens(info)
    return steps if df is None else f"{steps} steps, Df {df}"


def downstream_series(
    runs: Sequence[RunData], *, metric: str, dp_unit: str = "paper", eval_task: str | None = None
) -> list[DownstreamSeries]:
    """Groups finetuning runs into (Dp, final value) series, one per model × pretraining run ×
    task × finetuning recipe.

    Dp is read from the pretraining run named by `init_checkpoint` ('<model_dir>[@step]') at its
    `init_step`, in `dp_unit` (a key of `DP_UNITS`; default the MT paper's steps × batch × 512,
    so that fitted A and the valuation guide's "Dp needed" are on the paper's scale).
    `metric` is a score name ("bleu", "rouge", "comet") or "loss". A series (and
    its non-pretrained baseline) shares the model (family + size: a runs directory holding
    T5-770M and T5-3B gives one series per model, each with its own baseline) and the finetuning
    recipe: steps and Df (`finetune_group`). `eval_task` reads that task's metric instead of the
    finetuning task's (a run finetuned on a mixture, e.g. SuperGLUE, scores each component).
    """
    if dp_unit not in DP_UNITS:
        raise ValueError(f"unknown Dp unit {dp_unit!r}; allowed: {', '.join(DP_UNITS)}")
    tokens_at = DP_UNITS[dp_unit]
    by_id = {r.run_id: r for r in runs}
    groups: dict[tuple[str, str, str, str], list[tuple[float, float, str]]] = {}
    baselines: dict[tuple[str, str, str], float] = {}
    for run in runs:
        if run.strategy not in run_record.FINETUNES:
            continue
        task = eval_task or str(run.info.mixture_or_task)
        value = _final_value(run, task, metric)
        if value is None:
            continue
        steps = finetune_group(run.info)
        model = model_keys.model_label(run.info)
        if run.strategy == Strategy.FINETUNE_SCRATCH:
            baselines[(model, task, steps)] = value
            continue
        ckpt = str(run.info.init_checkpoint or "")
        src_dir, _, at = ckpt.partition("@")
        src = by_id.get(PurePosixPath(src_dir.rstrip("/")).name)
        if src is None:
            raise FitInputError(
                f"run {run.run_id!r}: init_checkpoint {ckpt!r} names no run in this directory"
            )
        step = run.info.init_step if run.info.holds("init_step") else (at or None)
        dp = tokens_at(src, int(step) if step not in (None, "") else None)
        mixture = str(src.info.mixture_or_task if src.info.holds("mixture_or_task") else src.run_id)
        groups.setdefault((model, mixture, task, steps), []).append((dp, value, run.run_id))
    out = []
    for (model, *key), items in sorted(groups.items()):
        items.sort()
        out.append(
            DownstreamSeries(
                key=(key[0], key[1], key[2]),
                metric=metric,
                Dp=np.asarray([i[0] for i in items]),
                values=np.asarray([i[1] for i in items]),
                runs=tuple(i[2] for i in items),
                baseline=baselines.get((model, key[1], key[2])),
                model=model,
                dp_unit=dp_unit,
            )
        )
    return out


def best_step(run: RunData) -> int | None:
    """The step of a finetune's best validation checkpoint where a `[[select]]` with
    `at = "best"` recorded one (`MODEL_DIR/best_checkpoint.json`, `launch.best_checkpoint`)."""
    path = storage.as_path(run.path) / names.BEST_CHECKPOINT_FILE
    return int(json.loads(path.read_text())["step"]) if path.exists() else None


def learning_rates(run: RunData) -> np.ndarray:
    """The learning rate of each of a run's updates (`[k - 1]` is step k's), for the
    schedule-aware law (`fitting.laws.lr_area`): the `learning_rate` its records log every
    LOG_EVERY steps, interpolated linearly between them (held before the first log), up to its
    last logged step. A schedule is an input of the run, known before it trains.

    Raises:
      FitInputError: the run logged no learning rate.
    """
    logged = [
        (int(r["step"]), _float(r["learning_rate"])) for r in run.records if "learning_rate" in r
    ]
    if not logged:
        raise FitInputError(f"run {run.run_id!r}: its metrics log no learning_rate")
    steps, lrs = (np.asarray(x, np.float64) for x in zip(*sorted(logged), strict=True))
    return np.interp(np.arange(1, int(steps[-1]) + 1), steps, lrs)


def _final_value(run: RunData, task: str, metric: str) -> float | None:
    """`task`'s metric of a finetune (scores live at eval/<task>/<metric>): at its best
    validation step where one is recorded (`best_step`; the MT manifests choose finetunes there,
    since a small set's last step measures overfitting) and evaluated there, else its last."""
    key = f"eval/{task}/{metric}"
    step = best_step(run)
    at_best = [r for r in run.records if r.get("step") == step and key in r]
    for rec in reversed(at_best or run.records):
        if key in rec:
            v = _float(rec[key])
            if not np.isfinite(v):
                raise FitInputError(f"run {run.run_id!r} step {rec['step']}: {key} is not a number")
            return v
    return None


def _tokens_at(run: RunData, step: int | None, *, key: str = "tokens") -> float:
    """The cumulative count `key` of a pretraining run at `step` (its last record when step is
    None), from its records."""
    recs = [r for r in run.records if key in r]
    if not recs:
        raise FitInputError(f"run {run.run_id!r}: no token counts to date its checkpoints")
    if step is None:
        return _float(recs[-1][key])
    before = [r for r in recs if r["step"] <= step]
    if not before:
        raise FitInputError(f"run {run.run_id!r}: no record at or before step {step}")
    last = before[-1]
    if last["step"] == step:
        return _float(last[key])
    # Tokens grow linearly in steps at a fixed batch: scale the last count to the step.
    return _float(last[key]) * step / max(int(last["step"]), 1)


def paper_tokens_per_step(meta: run_record.RunRecord | Mapping[str, Any]) -> float | None:
    """A run's paper tokens per step from run.json: `tokens_paper_per_step`, else batch_size ×
    the paper's row length (the `inputs` feature length of an encoder-decoder, else `targets`;
    `rundir.paper_units`), else None (a run.json that says neither)."""
    info = run_record.RunRecord.of(meta)
    if info.tokens_paper_per_step not in (None, ""):
        return _float(info.tokens_paper_per_step)
    lengths = info.task_feature_lengths or {}
    length = lengths.get("inputs", lengths.get("targets"))
    if info.batch_size and length:
        return _float(info.batch_size) * _float(length)
    return None


def paper_tokens_at(run: RunData, step: int | None) -> float:
    """Dp of a pretraining run's checkpoint at `step` in the papers' unit (the MT paper's steps ×
    batch 256 × 512): its records' `tokens_paper`; for runs written before that field, step ×
    `paper_tokens_per_step`; for run directories that record neither (T5X's, whose `tokens` are
    already step × batch × length, or synthetic ones), their `tokens`."""
    if any("tokens_paper" in r for r in run.records):
        return _tokens_at(run, step, key="tokens_paper")
    per_step = paper_tokens_per_step(run.info)
    if per_step is None:
        return _tokens_at(run, step)
    if step is None:
        steps = [int(r["step"]) for r in run.records if "step" in r]
        if not steps:
            raise FitInputError(f"run {run.run_id!r}: no records to date its checkpoints")
        step = max(steps)
    return float(step) * per_step


# What the Dp of a downstream series counts -> how it is read off the pretraining run.
DP_UNITS = {
    "paper": paper_tokens_at,  # the MT paper's Dp: steps × batch × inputs length (512)
    "target": _tokens_at,  # real target tokens (span-corruption targets: ~114/512 of the above)
}
