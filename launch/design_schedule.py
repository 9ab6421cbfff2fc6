"""`xlscale sweep design --law lr_area`: a CPT manifest's runs as candidates of the schedule-aware
law, and the study model a pilot fit of that law gives.

The papers' L(N, D) laws read the loss at step s as the final loss of an s-step run; fitted on every
evaluation along cosine-scheduled runs they misfit each run by 1-2% at the demo's scale, and only
the schedule-aware law (`fitting.laws.lr_area`) predicted the demo's skipped sizes within the seed
noise (README, "Measured"). A design scored on the law the study will fit chooses the runs that
inform *that* law. Here:

- a run's learning rate at each update comes from its own gin (`schedules.ScheduleConfig` as its
  files and bindings set it, built by `trainer.schedules`), so the areas S₁, S₂ at each evaluation
  are known before it trains. They are computed as the law's fits will compute them
  (`logged_learning_rates`): from the rates its metrics.jsonl will hold, interpolated as
  `fitting.readers.points.learning_rates` does. That reader holds the first logged rate before
  it, so a warm-up shorter than LOG_EVERY reads as flat: the demo's S₂ ends 2.5 higher than the
  true schedule's (λ 0.8). The pilot fit was made on that convention, and so is every later fit,
  so the design must use it too;
- each evaluation (`launch.design.run_eval_steps`, step 0 left out) is a `Point(block, (N/N₀,
  S₁/S₀, S₂))` on the pilot fit's reference scales and λ, so the block's law is
  `lr_area.formula` with its parameters alone (`fitting.design.study.LAWS`);
- blocks are the strategies' (`launch.design.BLOCK_OF_STRATEGY`), each with its own parameters:
  as `xlscale fit --law lr_area` fits them, the source runs from their language's from-scratch
  entry, the scratch runs from the target language's, the CPT runs from its CPT entry;
- the prior is such a fit (`read_prior`: the fits.json of `xlscale fit RUNS --law lr_area`), with
  each block's σ its fit's RMS relative residual; there are no paper values of this law, so a
  pilot fit is required;
- the targets are the parameters and each block's final loss at its largest run (held out); the
  compute-optimal allocation is not one: under this law it depends on the schedule, and no closed
  form exists (the L(N, D) design reports it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fitting.design.information import Target
from fitting.design.paper_models import loss_target
from fitting.design.study import Block, Candidate, Point, StudyModel
from fitting.laws import lr_area
from launch import design
from launch.runs import Run
from rundir.run_record import Strategy
from trainer import loop, schedules

LAW = lr_area.LAW
# block -> the group of `xlscale fit --law lr_area` that fits it (its `schedule_fit.GROUPS`).
GROUP_OF_BLOCK: Mapping[str, str] = {
    "source": "from_scratch",
    "scratch": "from_scratch",
    "cpt": "cpt",
}
_SCALE_FLOOR = 1e-12  # a fitted scale at its bound 0 (E) has no log: the design needs one


@dataclasses.dataclass(frozen=True)
class BlockScales:
    """What a block's points need besides the law's parameters: the pilot fit's λ and reference
    scales, and its noise (σ: the fit's RMS relative residual, one evaluation's log spread)."""

    decay: float
    n_ref: float
    s_ref: float
    sigma: float


@dataclasses.dataclass(frozen=True)
class Prior:
    """A pilot fit of the schedule-aware law as the design's prior.

    Attributes:
      params: study parameters ("scratch.E", ...).
      scales: block -> its `BlockScales`.
      source: the file and, per block, the fit entry it came from (for the design's record).
    """

    params: Mapping[str, float]
    scales: Mapping[str, BlockScales]
    source: str


def learning_rates(run: Run) -> np.ndarray:
    """The learning rate of each of the run's updates (`[k - 1]` is step k's), from the
    `ScheduleConfig` its gin binds (`launch.design.configurable_params`; unbound fields keep
    their defaults) over its `run.steps`, as the trainer builds it.

    Raises:
      ValueError: a schedule field bound to something that is not a literal, or an unknown name.
    """
    fields = {f.name for f in dataclasses.fields(schedules.ScheduleConfig)}
    bound = design.configurable_params(run, "ScheduleConfig")
    config = schedules.ScheduleConfig(**{k: v for k, v in bound.items() if k in fields})
    schedule = schedules.build_schedule(config, total_steps=run.steps)
    return np.asarray(schedule(np.arange(run.steps)), np.float64)


def logged_steps(run: Run) -> np.ndarray:
    """The steps whose metrics.jsonl records will hold a learning rate: every `log_every`
    (`loop.LoopConfig`, as the run's gin binds it), every evaluation after step 0, and the last
    (`trainer.train`; kept-checkpoint steps, which add records too, are left out: they do not
    change a linear interpolation between logged rates of one schedule by much)."""
    default = loop.LoopConfig.__dataclass_fields__["log_every"].default
    every = int(design.configurable_params(run, "LoopConfig").get("log_every") or default)
    steps = {*range(every, run.steps + 1, every), run.steps}
    steps |= {s for s in design.run_eval_steps(run) if 0 < s <= run.steps}
    return np.asarray(sorted(steps))


def logged_learning_rates(run: Run) -> np.ndarray:
    """`learning_rates` as the law's fits will read them: the rate logged at each of
    `logged_steps` (a record at step k holds step k's update's rate), interpolated linearly
    between them and held before the first, as `fitting.readers.points.learning_rates` reads a
    run's records."""
    exact = learning_rates(run)
    steps = logged_steps(run)
    return np.interp(np.arange(1, run.steps + 1), steps, exact[steps - 1])


def block_language(run: Run) -> str:
    """The language whose loss the run's block fits: a scratch or CPT run's target language, a
    source run's source language (its SOURCE_LANG macro, else English)."""
    if run.strategy == Strategy.SOURCE:
        return str(design.gin_macros(run).get("SOURCE_LANG") or "en")
    return str(run.coord("target_lang"))


def _scored(runs: Sequence[Run]) -> list[Run]:
    return [r for r in runs if r.strategy in design.BLOCK_OF_STRATEGY]


def read_prior(path: str | Path, runs: Sequence[Run]) -> Prior:
    """The prior of each block the runs feed, from a fits.json of `xlscale fit RUNS --law
    lr_area` (`fitting.reports.schedule_fit`): its `lr_area[<language>][<group>]` entries
    (`block_language`, `GROUP_OF_BLOCK`).

    Raises:
      ValueError: the file is unreadable, holds no lr_area fits, lacks an entry a block needs,
        was fitted on another N basis than the runs', or the runs target several languages (the
        message names `--prior` and the file, and what it holds).
    """
    where = f"--prior {path}"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: cannot read a JSON fits file: {e}") from e
    fits = data.get(LAW) if isinstance(data, Mapping) else None
    if not isinstance(fits, Mapping) or not fits:
        raise ValueError(
            f"{where}: holds no {LAW} fits; make one from pilot runs with `xlscale fit RUNS_DIR "
            f"--law {LAW}` (its fits.json)"
        )
    scored = _scored(runs)
    targets = sorted({block_language(r) for r in scored if r.strategy != Strategy.SOURCE})
    if len(targets) > 1:
        raise ValueError(
            f"--law {LAW}: the design models one target language; the manifest has "
            f"{', '.join(targets)}"
        )
    basis = design.n_basis(runs)
    if data.get("n_basis") not in (None, basis):
        raise ValueError(
            f"{where}: fitted on the {data['n_basis']} N basis; the manifest's runs are on the "
            f"{basis} basis (`launch.design.n_basis`), so its N₀ does not apply"
        )
    params: dict[str, float] = {}
    scales: dict[str, BlockScales] = {}
    used = []
    for block in dict.fromkeys(design.BLOCK_OF_STRATEGY[r.strategy] for r in scored):
        lang = next(
            block_language(r) for r in scored if design.BLOCK_OF_STRATEGY[r.strategy] == block
        )
        entry = (fits.get(lang) or {}).get(GROUP_OF_BLOCK[block])
        if not entry:
            held = [f"{k}/{g}" for k, groups in fits.items() for g in groups]
            raise ValueError(
                f"{where}: no {LAW} fit of {lang}/{GROUP_OF_BLOCK[block]} for the {block} runs; "
                f"it holds {', '.join(held)}"
            )
        fit = entry["fit"]
        for p in lr_area.PARAMS:
            value = float(fit["params"][p])
            params[f"{block}.{p}"] = max(value, _SCALE_FLOOR) if p in ("E", "A", "B") else value
        scales[block] = BlockScales(
            float(fit["decay"]), float(fit["n_ref"]), float(fit["s_ref"]), float(fit["rms"])
        )
        used.append(f"{block}={lang}/{GROUP_OF_BLOCK[block]}")
    return Prior(params, scales, f"{path} ({LAW}: {', '.join(used)})")


def _points(run: Run, basis: str, scales: BlockScales, block: str) -> tuple[Point, ...]:
    """The run's evaluations as points of `block` on the pilot fit's scales."""
    s1, s2 = lr_area.areas(logged_learning_rates(run), decay=scales.decay)
    n = design.n_params(run, basis) / scales.n_ref
    steps = [s for s in design.run_eval_steps(run) if 0 < s <= run.steps]
    return tuple(
        Point(block, (n, s1[s] / scales.s_ref, s2[s]), run=run.run_id, progress=s / run.steps)
        for s in steps
    )


def candidates(
    runs: Sequence[Run], prior: Prior, *, hardware: str | None = None, mfu: float = 0.5
) -> list[Candidate]:
    """The runs as candidates of the schedule-aware law (module docstring): costs and
    dependencies as `launch.design.candidates`, points (N/N₀, S₁/S₀, S₂) per evaluation; replay
    runs, which no law of the study fits, yield none."""
    cost = design.cost_fn(hardware, mfu=mfu)
    basis = design.n_basis(runs)
    out = []
    for r in runs:
        block = design.BLOCK_OF_STRATEGY.get(r.strategy)
        points = () if block is None else _points(r, basis, prior.scales[block], block)
        out.append(Candidate(r.run_id, cost(r), points, tuple(r.depends_on)))
    return out


def study_model(prior: Prior) -> StudyModel:
    """One schedule-aware block per strategy the prior covers, each with its own parameters and
    its pilot fit's σ."""
    blocks = tuple(
        Block(block, LAW, {p: f"{block}.{p}" for p in lr_area.PARAMS}, scales.sigma)
        for block, scales in prior.scales.items()
    )
    return StudyModel(blocks, dict(prior.params))


def targets(model: StudyModel, cands: Sequence[Candidate]) -> list[Target]:
    """Each block's loss at the last evaluation of its largest run (largest N, then most
    schedule area): what a sweep that skips that run would predict for it."""
    last: dict[str, Point] = {}
    for c in cands:
        for p in c.points[-1:]:
            if p.block not in last or p.inputs[:2] > last[p.block].inputs[:2]:
                last[p.block] = p
    out = [loss_target(model, b, p.inputs, "loss(largest run)") for b, p in last.items()]
    return [t for t in out if math.isfinite(t.value(model.prior))]
