"""A synthetic paper-scale study: every run of the papers' manifests, written from their own laws.

`write_paper_study(out)` expands the shipped manifests with `launch.sweep`'s own expansion (so the
runs are exactly those `xlscale sweep run` would launch: every size, strategy, replay ratio,
language, model, mixture, checkpoint and Df) and writes each as a finished run directory in the
trainer's format (docs/interfaces.md "Training outputs": run.json with the trainer's fields and the
family's own parameter and FLOP counts and the paper-unit fields, metrics.jsonl at the runs'
evaluation steps with `tokens` and `tokens_paper`, COMPLETED):

- `cpt_paper` + `cpt_replay` + `cpt_languages` under `<out>/cpt` (one runs_dir, as the manifests
  share one: the 1.4B source run is written once). Eval losses follow the CPT paper's Table 2 laws
  at the paper's nominal N (Table 4; the basis we read Table 2 as fitted on), times lognormal
  noise.
  French and Russian (Fig. 3 only, no coefficients) follow the Chinese laws.
- `mt_paper` under `<out>/mt`: finetunes whose BLEU and downstream cross-entropy follow the MT
  paper's laws (`mt_truth`) at the paper's Dp (pretraining steps × 256 × 512) with noise.

A manifest with a learning-rate grid (a `BASE_LR` / `PEAK_LR` coordinate) gets worse losses and
scores away from the grid's best value (`BEST_LR`), so that its `[[select]]` stages, run on the
written runs as `xlscale sweep select` would (`run_select_stages`), choose that value; finetunes
start from the pretraining run the stage chooses (`pretraining_runs`).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.laws import formulas as laws
from fitting.laws import synthetic
from launch import sweep
from launch.runs import Run, substitute
from modeling import family as family_lib
from rundir import paper_units
from rundir import records as rundir_records
from rundir.run_record import FROM_SCRATCH, Strategy
from studies.paper_truth import BALANCED, BEST_LR, Truth, mt_truth

CPT_MANIFESTS = ("cpt_paper", "cpt_replay", "cpt_languages")
MT_MANIFESTS = ("mt_paper",)
# mt_paper finetunes under two recipes (a FINETUNE_RECIPE grid axis); the synthetic check writes
# the one we compare with the paper's tables, our choice: the paper prints 300 steps, but only
# under 2^18 can its Df sizes differ in the data seen (rundir/finetune_recipes.py).
MT_RECIPE = "raffel_2^18"
SOURCE_LANG = "en"  # the CPT study's source language (runs/cpt.gin SOURCE_LANG)
# Evaluation period in steps (runs/common/cpt_paper.gin, runs/span_pretrain.gin) where a manifest
# binds none; finetunes evaluate at their last step (runs/finetune.gin EVAL_PERIOD = 0), and at
# step 0 under EVAL_AT_START. The other settings default as runs/common/train.gin's.
EVAL_PERIOD = 1000
EVAL_DEFAULTS = {
    "EVAL_AT_START": False,
    "EVAL_SCHEDULE": "periodic",
    "EVAL_LOG_POINTS": 20,
    "EVAL_LOG_START": 0.001,
}
# A finetune's loss before its first update (EVAL_AT_START), as a multiple of its final loss: the
# paper prints no such point, so this is a stand-in (the pretrained model has not seen the task).
FINETUNE_START_FACTOR = 1.5
# The paper's Dp: pretraining steps × batch × 512 input tokens (MT paper §4).
MT_INPUT_LENGTH = 512
PAIR_TOKENS = paper_units.PAIR_TOKENS  # the MT paper counts each finetuning pair as 512 tokens


@dataclasses.dataclass(frozen=True)
class StudyDirs:
    """Where `write_paper_study` put the runs, and which runs it wrote."""

    cpt: Path
    mt: Path
    cpt_runs: tuple[Run, ...]
    mt_runs: tuple[Run, ...]


def expand_manifests(names: Sequence[str], *, runs_dir: str | Path) -> list[Run]:
    """The union of the manifests' runs (a run shared by two manifests once), parents first,
    with `runs_dir` as their runs directory (placeholder variables: ids do not depend on them)."""
    runs: dict[str, Run] = {}
    for name in names:
        manifest = sweep.load_manifest(name, runs_dir=str(runs_dir))
        values = {k: f"synthetic_{k.lower()}" for k in manifest.missing_variables()}
        manifest = sweep.load_manifest(name, runs_dir=str(runs_dir), variables=values)
        for run in sweep.expand(manifest):
            if run.coord("FINETUNE_RECIPE") in (None, MT_RECIPE):
                runs.setdefault(run.run_id, run)
    return sweep.topological_order(list(runs.values()))


# --- run directories -------------------------------------------------------------------------------


def _write_run(path, meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
    rundir_records.write_run(path, info=meta, records=list(records))


def _lengths(run: Run) -> dict[str, int]:
    bound = dict(run.bindings).get("TASK_FEATURE_LENGTHS")
    return {k: int(v) for k, v in ast.literal_eval(bound).items()} if bound else {}


def _counts(run: Run) -> dict[str, float]:
    """The run's counts as the trainer records them (the family's own counting; an
    encoder-decoder's FLOPs per target token at its feature lengths)."""
    fam = family_lib.get(run.family)
    config = fam.get_config(run.base_size, **dict(run.overrides))
    total, non_embedding = fam.param_counts(config)
    lengths = _lengths(run)
    seq_len = lengths.get("targets", run.seq_len)
    six_n, attn = fam.flops_per_token(config, seq_len=seq_len, inputs_len=lengths.get("inputs"))
    return {
        "params_total": total,
        "params_non_embedding": non_embedding,
        "flops_per_token": six_n,
        "flops_per_token_attn": attn,
    }


def _unit_fields(run: Run) -> dict[str, Any]:
    """run.json's paper-unit fields, as `rundir.paper_units.run_fields` records them: tokens per
    step in the papers' count (batch × the `inputs` length of an encoder-decoder, else the
    `targets` length) and, for a finetune whose Df is in the paper's unit (`FINETUNE_UNIT =
    'paper'`), its exact pairs and Df = pairs × 512."""
    unit = _gin_value(run, "FINETUNE_UNIT", "target")
    df = run.coord("finetune_tokens")
    subset = None
    if df is not None:
        subset = paper_units.finetune_set(finetune_tokens=int(df), unit=unit).pairs
    return paper_units.run_fields(
        batch_size=run.batch_size,
        task_feature_lengths=_lengths(run) or {"targets": run.seq_len},
        subset_examples=subset,
        finetune_unit=unit,
    )


def _gin_value(run: Run, macro: str, default: Any) -> Any:
    """A macro's value among the run's bindings (a gin literal), else `default`."""
    bound = dict(run.bindings).get(macro)
    return default if bound is None else ast.literal_eval(bound)


def _gin_config(run: Run) -> str:
    variables = dict(run.variables)
    lines = [f"# synthetic run (studies.paper_study); gin files: {', '.join(run.gin_files)}"]
    lines += [f"{k} = {substitute(v, variables, allow_missing=True)}" for k, v in run.bindings]
    return "\n".join(lines) + "\n"


def _meta(run: Run, **fields: Any) -> dict[str, Any]:
    """run.json as trainer.train writes it (`_run_json`)."""
    lengths = _lengths(run)
    meta = {
        "model": run.base_size,
        "family": run.family,
        **_counts(run),
        "strategy": run.strategy,
        "languages": [],
        "target_lang": None,
        "source_lang": None,
        "replay_ratio": float(run.coord("replay_ratio", 0.0)),
        "mixture_or_task": "",
        "components": [],
        "init_checkpoint": None,
        "init_step": None,
        "init_params_hash": None,
        "seed": int(run.coord("seed", 0)),
        "seq_len": lengths.get("targets", run.seq_len),
        "task_feature_lengths": lengths,
        "finetune_tokens": None,
        "batch_size": run.batch_size,
        "train_steps": run.steps,
        **_unit_fields(run),
    }
    meta.update(fields)
    meta["gin_config"] = _gin_config(run)
    return meta


def eval_steps(run: Run, *, period: int = EVAL_PERIOD) -> list[int]:
    """The steps `run` evaluates at under its manifest's evaluation settings (`EVAL_PERIOD`,
    `EVAL_AT_START`, `EVAL_SCHEDULE`, `EVAL_LOG_POINTS`, `EVAL_LOG_START`), computed by the
    trainer's own `trainer.eval_schedule`, so a synthetic study has the points a real one would:
    step 0 and the dense early, log-spaced ones of the paper manifests included."""
    from trainer import eval_schedule

    setting = {name: _gin_value(run, name, default) for name, default in EVAL_DEFAULTS.items()}
    config = types.SimpleNamespace(
        enabled=True,
        period=int(_gin_value(run, "EVAL_PERIOD", period)),
        at_start=bool(setting["EVAL_AT_START"]),
        schedule=str(setting["EVAL_SCHEDULE"]),
        log_points=int(setting["EVAL_LOG_POINTS"]),
        log_start=float(setting["EVAL_LOG_START"]),
    )
    return eval_schedule.eval_steps(config, total=run.steps)


def _lr_factor(run: Run, grids: Mapping[str, Sequence[float]]) -> float:
    """≥ 1: how much worse the run is for its learning-rate coordinates (1 at the best value)."""
    factor = 1.0
    for name, values in grids.items():
        lr = run.coord(name)
        if lr is None:
            continue
        best = min(values, key=lambda v: abs(math.log(v / BEST_LR[name])))
        factor *= 1.0 + 0.05 * abs(math.log10(float(lr) / best))
    return factor


def _lr_grids(runs: Iterable[Run]) -> dict[str, list[float]]:
    grids: dict[str, set[float]] = {}
    for run in runs:
        for name in BEST_LR:
            if run.coord(name) is not None:
                grids.setdefault(name, set()).add(float(run.coord(name)))
    return {k: sorted(v) for k, v in grids.items()}


def _cosine_lr(step: int, steps: int, *, peak: float = 2e-4, warmup: float = 0.05) -> float:
    """runs/common/cpt_paper.gin's schedule: 5% linear warm-up, cosine to 10% of the peak."""
    w = max(1, int(warmup * steps))
    if step < w:
        return peak * step / w
    frac = (step - w) / max(1, steps - w)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _cpt_layout(run: Run) -> dict[str, Any]:
    """Languages, mixture, components and eval tasks of a CPT-study run (the gin files')."""
    target, source = run.coord("target_lang"), SOURCE_LANG
    if run.strategy in FROM_SCRATCH:  # one language: the source run's, or the target's
        role, lang = ("source", source) if run.strategy == Strategy.SOURCE else ("target", target)
        return {
            "languages": [lang],
            f"{role}_lang": lang,
            "mixture_or_task": f"lm_{lang}",
            "components": [f"lm_{lang}"],
            "evals": [f"lm_{lang}"],
        }
    both = [f"lm_{target}", f"lm_{source}"]
    if run.strategy == Strategy.CPT:
        return {
            "languages": [target],
            "target_lang": target,
            "source_lang": source,
            "mixture_or_task": f"lm_{target}",
            "components": [f"lm_{target}"],
            "evals": both,
        }
    pct = round(100 * float(run.coord("replay_ratio")))
    return {
        "languages": [target, source],
        "target_lang": target,
        "source_lang": source,
        "mixture_or_task": f"cpt_{target}_replay_{source}_{pct}",
        "components": both,
        "evals": both,
    }


def _cpt_loss(
    strategy: str,
    task: str,
    by_task: Mapping[str, float],
    tokens: float,
    *,
    n: float,
    total: float,
    truth: Truth,
    floor_tokens: float,
    ceiling: float,
) -> float:
    """The noiseless eval loss of `task` for a CPT-study run of nominal size `n` (`total` tokens)
    after `tokens` (`by_task` per component): Table 2's laws for the target language, the
    source law for source runs, forgetting (relieved by replay) for the source language in CPT.

    The laws diverge as D -> 0, so a law is read at no fewer than `floor_tokens` (one step's) and
    capped at `ceiling` (ln V, a uniform guess): the step-0 and earliest log-spaced points are
    stand-ins of the right shape, not the paper's values (its laws are fitted from ~1B tokens)."""
    d = max(by_task.get(task, 0.0), floor_tokens)
    if strategy in FROM_SCRATCH:
        law = truth.source if strategy == Strategy.SOURCE else truth.scratch
        return min(ceiling, float(laws.chinchilla(n, d, **law)))
    if task != f"lm_{SOURCE_LANG}":
        return min(ceiling, float(laws.cpt(n, d, **truth.cpt)))
    return synthetic.forgetting(n, by_task.get(task, 0.0), tokens, truth.source, total)


def write_cpt_runs(
    runs: Sequence[Run], *, truth: Truth = Truth(), seed: int = 0, log: Callable = print
) -> None:
    """Writes the CPT study's runs (source, scratch, cpt, cpt_replay) into their model dirs."""
    rng = np.random.default_rng(seed)
    llama = family_lib.get("llama2")
    by_id = {r.run_id: r for r in runs}
    grids = _lr_grids(runs)
    for i, run in enumerate(runs):
        n = float(llama.nominal_params(run.base_size))
        layout = _cpt_layout(run)
        evals = layout.pop("evals")
        comps = layout["components"]
        ratio = float(run.coord("replay_ratio", 0.0))
        share = {comps[0]: 1.0 - ratio, **({comps[1]: ratio} if len(comps) > 1 else {})}
        tokens_per_step = run.batch_size * run.seq_len
        total = run.steps * tokens_per_step
        worse = _lr_factor(run, grids)
        fields = dict(layout)
        if run.parent:
            parent = by_id[run.parent]
            fields.update(init_checkpoint=parent.model_dir, init_step=parent.steps)
        meta = _meta(run, **fields)
        ceiling = math.log(llama.get_config(run.base_size).vocab_size)

        records = []
        for step in eval_steps(run):
            tokens = float(step * tokens_per_step)
            by_task = {c: tokens * s for c, s in share.items()}
            rec = {
                "step": step,
                "tokens": tokens,
                "tokens_paper": step * meta["tokens_paper_per_step"],
                "tokens_by_task": by_task,
                "flops": meta["flops_per_token"] * tokens,
                "flops_attn": meta["flops_per_token_attn"] * tokens,
                "learning_rate": _cosine_lr(step, run.steps),
                "tokens_per_s": 1e6,
            }
            for task in evals:
                value = _cpt_loss(
                    run.strategy,
                    task,
                    by_task,
                    tokens,
                    n=n,
                    total=total,
                    truth=truth,
                    floor_tokens=tokens_per_step,
                    ceiling=ceiling,
                )
                noise = math.exp(truth.sigma * rng.standard_normal())
                rec[f"eval/{task}/loss"] = value * worse * noise
                rec[f"eval/{task}/tokens"] = 1048576
            rec["train/loss"] = rec[f"eval/{evals[0]}/loss"]
            records.append(rec)
        _write_run(run.model_dir, meta, records)
        if (i + 1) % 25 == 0 or i + 1 == len(runs):
            log(f"  cpt: {i + 1}/{len(runs)} runs written")


def _mixture_shares(mixture: str) -> dict[str, float]:
    """`mix_en_50_de_50` -> {"span_en": 0.5, "span_de": 0.5}."""
    parts = mixture.split("_")[1:]
    return {
        f"span_{lang}": int(pct) / 100 for lang, pct in zip(parts[::2], parts[1::2], strict=True)
    }


def pretraining_runs(runs: Sequence[Run]) -> dict[str, Run]:
    """Finetune id -> the pretraining run it starts from: its parent, or, where a select stage
    picks it (a learning-rate grid: no parent until the choice), the run of its model and
    mixture that the stage will choose, the one at the grid's best learning rate (`BEST_LR`)."""
    by_id = {r.run_id: r for r in runs}
    grids = _lr_grids(runs)
    best: dict[tuple, Run] = {}
    for r in runs:
        if r.strategy == Strategy.PRETRAIN:
            key = (r.base_size, r.coord("mixture"), r.coord("seed"))
            if key not in best or _lr_factor(r, grids) < _lr_factor(best[key], grids):
                best[key] = r
    out = {}
    for r in runs:
        if r.strategy != Strategy.FINETUNE:
            continue
        key = (r.base_size, r.coord("mixture"), r.coord("seed"))
        if not r.parent and key not in best:
            raise ValueError(f"{r.run_id}: no pretraining run of its model and mixture")
        out[r.run_id] = by_id[r.parent] if r.parent else best[key]
    return out


def paper_dp(run: Run, parent: Run) -> float:
    """The MT paper's Dp of a finetune's checkpoint: steps × batch × 512 input tokens."""
    return float(run.coord("init_step")) * parent.batch_size * MT_INPUT_LENGTH


def write_mt_runs(
    runs: Sequence[Run], *, truth: Truth = Truth(), seed: int = 0, log: Callable = print
) -> None:
    """Writes the MT study's runs (pretrain, finetune, finetune_scratch) into their model dirs."""
    rng = np.random.default_rng(seed + 1)
    grids = _lr_grids(runs)
    parents = pretraining_runs(runs)
    first_step = {}
    for run in runs:  # each (model, task, Df)'s smallest checkpoint: where the baselines sit
        if run.strategy == Strategy.FINETUNE:
            key = (run.base_size, run.coord("task"), run.coord("finetune_tokens"))
            dp = paper_dp(run, parents[run.run_id])
            first_step[key] = min(first_step.get(key, dp), dp)

    def noise() -> float:
        return math.exp(truth.mt_sigma * rng.standard_normal())

    for i, run in enumerate(runs):
        lengths = _lengths(run)
        worse = _lr_factor(run, grids)
        if run.strategy == Strategy.PRETRAIN:
            mixture = run.coord("mixture")
            shares = _mixture_shares(mixture)
            meta = _meta(
                run,
                languages=[c.split("_", 1)[1] for c in shares],
                mixture_or_task=mixture,
                components=list(shares),
            )
            records = []
            for step in eval_steps(run):
                tokens = float(step * run.batch_size * lengths["targets"])
                ce = (1.6 + 40.0 * max(step, 1) ** -0.35) * worse
                rec = {
                    "step": step,
                    "tokens": tokens,
                    "tokens_paper": step * meta["tokens_paper_per_step"],
                    "tokens_by_task": {c: tokens * s for c, s in shares.items()},
                    "input_tokens": float(step * run.batch_size * lengths["inputs"]),
                    "flops": meta["flops_per_token"] * tokens,
                    "flops_attn": meta["flops_per_token_attn"] * tokens,
                    "learning_rate": float(run.coord("BASE_LR", 1.0)) / math.sqrt(max(step, 1e4)),
                    "tokens_per_s": 1e6,
                    "train/loss": ce,
                }
                rec.update({f"eval/{c}/loss": ce * noise() for c in shares})
                records.append(rec)
        else:
            task = run.coord("task")
            src, tgt = task.split("_")[1:]
            df = int(run.coord("finetune_tokens"))
            fields = {
                "languages": [src, tgt],
                "source_lang": src,
                "target_lang": tgt,
                "mixture_or_task": task,
                "components": [task],
                "finetune_tokens": df,
            }
            if run.strategy == Strategy.FINETUNE:
                parent = parents[run.run_id]
                fields.update(init_checkpoint=parent.model_dir, init_step=run.coord("init_step"))
                dp, mixture = paper_dp(run, parent), run.coord("mixture")
                bleu = mt_truth(run.base_size, mixture, task, df, "bleu")(dp) / worse
                ce = mt_truth(run.base_size, mixture, task, df, "loss")(dp) * worse
            else:  # not pretrained: below the balanced mixture's law at the first checkpoint
                dp = first_step[(run.base_size, task, df)]
                bleu = 0.8 * mt_truth(run.base_size, BALANCED[task], task, df, "bleu")(dp) / worse
                ce = 1.25 * mt_truth(run.base_size, BALANCED[task], task, df, "loss")(dp) * worse
            meta = _meta(run, **fields)
            records = []
            at_start = 0 in eval_steps(run, period=0)
            for step in (0,) * at_start + (run.steps // 3, 2 * run.steps // 3, run.steps):
                tokens = float(step * run.batch_size * lengths["targets"])
                records.append(
                    {
                        "step": step,
                        "tokens": tokens,
                        "tokens_paper": step * meta["tokens_paper_per_step"],
                        "tokens_by_task": {task: tokens},
                        "input_tokens": float(step * run.batch_size * lengths["inputs"]),
                        "flops": meta["flops_per_token"] * tokens,
                        "flops_attn": meta["flops_per_token_attn"] * tokens,
                        "learning_rate": float(run.coord("PEAK_LR", 1e-3)),
                        "tokens_per_s": 1e6,
                        "train/loss": 1.0,
                    }
                )
            if at_start:  # before the first update: the checkpoint's loss on the task, no decoding
                records[0].update(
                    {
                        f"eval/{task}/loss": FINETUNE_START_FACTOR * float(ce) * noise(),
                        f"eval/{task}/tokens": 1e6,
                    }
                )
            records[-1].update(
                {
                    f"eval/{task}/loss": float(ce) * noise(),
                    f"eval/{task}/tokens": 1e6,
                    f"eval/{task}/bleu": float(bleu) * noise(),
                    f"eval/{task}/decoded": 3000,
                }
            )
        _write_run(run.model_dir, meta, records)
        if (i + 1) % 100 == 0 or i + 1 == len(runs):
            log(f"  mt: {i + 1}/{len(runs)} runs written")


def run_select_stages(names: Sequence[str], *, runs_dir: str | Path, runs: Sequence[Run]):
    """Runs the manifests' `[[select]]` stages (if they declare any) on the written runs, as
    `xlscale sweep select` would: `<runs_dir>/selection.json`, which the fits read."""
    for name in names:
        manifest = sweep.load_manifest(name, runs_dir=str(runs_dir))
        if getattr(manifest, "selects", ()):
            from launch import run_selection  # only manifests with select stages need it

            run_selection.select_and_write(manifest, runs, status=lambda _run: "done")


def write_paper_study(
    out: str | Path, *, truth: Truth = Truth(), seed: int = 0, log: Callable = print
) -> StudyDirs:
    """Writes the synthetic paper-scale study: `<out>/cpt` (the CPT manifests' runs) and
    `<out>/mt` (mt_paper's), every run finished, metrics from the papers' laws (`Truth`)."""
    out = Path(out).resolve()
    cpt_dir, mt_dir = out / "cpt", out / "mt"
    cpt_runs = expand_manifests(CPT_MANIFESTS, runs_dir=cpt_dir)
    mt_runs = expand_manifests(MT_MANIFESTS, runs_dir=mt_dir)
    log(f"writing {len(cpt_runs)} CPT runs ({', '.join(CPT_MANIFESTS)}) under {cpt_dir}")
    write_cpt_runs(cpt_runs, truth=truth, seed=seed, log=log)
    log(f"writing {len(mt_runs)} MT runs ({', '.join(MT_MANIFESTS)}) under {mt_dir}")
    write_mt_runs(mt_runs, truth=truth, seed=seed, log=log)
    run_select_stages(CPT_MANIFESTS, runs_dir=cpt_dir, runs=cpt_runs)
    run_select_stages(MT_MANIFESTS, runs_dir=mt_dir, runs=mt_runs)
    return StudyDirs(cpt_dir, mt_dir, tuple(cpt_runs), tuple(mt_runs))
