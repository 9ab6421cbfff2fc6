"""The MT study simulated (Isik et al. 2024): pretraining runs whose checkpoints are finetuned.

Shaped like `mt_paper`: each pretrained model (size × mixture) trains `pretrain_steps`, and each
series (model, mixture, task, Df) finetunes its checkpoints at the init steps; BLEU follows the
log-law and downstream cross-entropy the power law in Dp = init step × batch × 512 (the paper's
unit), per series. A finetune needs its pretraining run trained to its init step, so the
pretraining run is cut into segments (`pretrain/<model>@<step>`, each needing the one before),
and a design that stops at step s pays for s steps only: pretraining is a required parent whose
cost counts once. Neither the learning-rate grids nor the non-pretrained baselines are laws'
points; the grids multiply costs (`pretrain_repeats`, `finetune_repeats`), the baselines are left
out of both the full sweep and any design.

The project fits each series on its first `n_fit` points by Dp and scores the rest
(`fitting.laws.downstream_laws`, n_fit = 4). Under that convention the full sweep's parameters
are a function of its four smallest checkpoints alone, so a design that runs exactly those
reproduces them bit for bit; `n_fit=None` (the default here) fits every point a sweep has, the
stricter test of a design against a sweep that knows more. The bootstrap resamples whole runs
(finetunes) within a series (`_bootstrap`: at least 6 runs, resamples with 4 distinct Dp).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from fitting.checks import FitInputError
from fitting.design import paper_models, simulate
from fitting.design.choose import closure
from fitting.design.study import Candidate, Point
from fitting.laws import downstream_laws, robust_fit

MT_INPUT_LENGTH = 512  # Dp counts input tokens: init step × batch × 512 (the paper's unit)
MIN_BOOTSTRAP_RUNS = 6  # a series' runs needed for a bootstrap interval (see `_bootstrap`)
FITTERS = {"log_law": downstream_laws.fit_bleu_law, "power_law": downstream_laws.fit_ce_law}


@dataclasses.dataclass(frozen=True)
class Series:
    """One finetuning series and the laws it follows.

    Attributes:
      key: "<model>/<mixture>/<task>/<Df>".
      pretrained: the pretrained model it finetunes ("<size>/<mixture>").
      bleu: log-law parameters (log_A, alpha, beta).
      ce: power-law parameters (E, A, alpha).
    """

    key: str
    pretrained: str
    bleu: Mapping[str, float]
    ce: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A pretrained model: its parameter count and how long its run trains."""

    params: float
    steps: int


def mt_study(
    series: Sequence[Series],
    pretrained: Mapping[str, Pretrained],
    *,
    init_steps: Sequence[int],
    pretrain_batch: int = 256,
    pretrain_tokens_per_sequence: int = 512 + 114,
    finetune_steps: int = 300,
    finetune_batch: int = 128,
    finetune_tokens_per_sequence: int = 512 + 512,
    pretrain_repeats: int = 6,
    finetune_repeats: int = 5,
    bleu_sigma: float = 0.005,
    ce_sigma: float = 0.001,
    n_fit: int | None = None,
    chip_hour_flops: float = simulate.H100_CHIP_HOUR_FLOPS,
) -> simulate.SimStudy:
    """The MT study as a `SimStudy` (see the module docstring).

    Args:
      series: the finetuning series and their true laws.
      pretrained: "<size>/<mixture>" → its parameters and pretraining steps.
      init_steps: the checkpoints finetuned (those past a run's steps are skipped).
      finetune_steps: the recipe's steps ('paper_300': 300, 'raffel_2^18': 262,144).
      pretrain_repeats, finetune_repeats: the learning-rate grids' sizes (each run is trained
        once per grid value; mt_paper: 6 BASE_LR, 5 PEAK_LR).
      bleu_sigma, ce_sigma: the generator's noise (`synthetic.write_study`: σ and 0.2σ).
      n_fit: points per series fitted (the project's 4), or None for all of them.

    Raises:
      ValueError: a series whose pretrained model is not in `pretrained`, or a series with
        fewer than 4 checkpoints.
    """
    candidates: list[Candidate] = []
    for name, p in pretrained.items():
        per_step = 6.0 * p.params * pretrain_batch * pretrain_tokens_per_sequence
        steps = sorted({s for s in init_steps if s <= p.steps} | {p.steps})
        previous = 0
        for s in steps:
            needs = (_segment(name, previous),) if previous else ()
            cost = pretrain_repeats * per_step * (s - previous) / chip_hour_flops
            candidates.append(Candidate(_segment(name, s), cost, (), needs))
            previous = s
    held, laws = [], {}
    for se in series:
        if se.pretrained not in pretrained:
            raise ValueError(f"series {se.key!r}: no pretrained model {se.pretrained!r}")
        p = pretrained[se.pretrained]
        steps = sorted(s for s in init_steps if s <= p.steps)
        if len(steps) < 4:
            raise ValueError(f"series {se.key!r}: {len(steps)} checkpoints; the laws need 4")
        tokens = finetune_steps * finetune_batch * finetune_tokens_per_sequence
        cost = finetune_repeats * 6.0 * p.params * tokens / chip_hour_flops
        for s in steps:
            dp = float(s * pretrain_batch * MT_INPUT_LENGTH)
            points = (Point(f"bleu/{se.key}", (dp,)), Point(f"ce/{se.key}", (dp,)))
            key = f"finetune/{se.key}@{s}"
            candidates.append(Candidate(key, cost, points, (_segment(se.pretrained, s),)))
        held.append(f"finetune/{se.key}@{steps[-1]}")
        laws[se.key] = {"bleu": se.bleu, "ce": se.ce}
    model = paper_models.mt_model(laws)
    sigma = {b.name: bleu_sigma if b.law == "log_law" else ce_sigma for b in model.blocks}
    model = dataclasses.replace(
        model,
        blocks=tuple(dataclasses.replace(b, sigma=sigma[b.name]) for b in model.blocks),
    )
    return simulate.SimStudy(
        "mt", model, tuple(candidates), tuple(held), sigma, fit_mt_study, n_fit=n_fit
    )


def _segment(pretrained: str, step: int) -> str:
    return f"pretrain/{pretrained}@{step}"


def _fit_block(law: str, x: np.ndarray, y: np.ndarray, n_fit: int | None):
    return FITTERS[law](x, y, n_fit=len(x) if n_fit is None else n_fit)


def _bootstrap(law, x, y, runs, n_fit, bootstrap, rng) -> list[dict[str, float]]:
    """Refits on runs resampled within the series. A resample with fewer than 4 distinct Dp is
    skipped (3 would fit the 3-parameter law exactly, whatever the noise), and a series of fewer
    than `MIN_BOOTSTRAP_RUNS` runs gets no interval (its resamples would be nearly all alike)."""
    names = sorted(set(runs))
    if len(names) < MIN_BOOTSTRAP_RUNS:
        return []
    index = {r: [i for i, rr in enumerate(runs) if rr == r] for r in names}
    samples = []
    for _ in range(bootstrap):
        pick = [i for j in rng.integers(0, len(names), len(names)) for i in index[names[j]]]
        xs, ys = x[pick], y[pick]
        if len(np.unique(xs)) < 4:
            continue
        try:
            f = _fit_block(law, xs, ys, n_fit)
        except FitInputError:
            continue
        if f.converged:
            samples.append(f.params)
    return samples


def fit_mt_study(
    study: simulate.SimStudy,
    values: Mapping[str, np.ndarray],
    keys: Sequence[str],
    *,
    bootstrap: int = 0,
    seed: int = 0,
) -> simulate.StudyFit:
    """Each series' BLEU log-law and cross-entropy power law fitted by the project's fitters
    (`fitting.laws.downstream_laws`) on the runs `keys`, with a bootstrap over its runs."""
    rng = np.random.default_rng(seed)
    params: dict[str, float] = {}
    ci: dict[str, tuple[float, float]] = {}
    converged = True
    for block_name, (x, y, runs) in sorted(simulate.block_points(study, values, keys).items()):
        block = study.model.block(block_name)
        try:
            f = _fit_block(block.law, x[:, 0], y, study.n_fit)
        except FitInputError:  # too few checkpoints of this series: its parameters stay NaN
            converged = False
            continue
        converged &= f.converged
        params.update({block.params[k]: v for k, v in f.params.items()})
        if bootstrap:
            samples = _bootstrap(block.law, x[:, 0], y, runs, study.n_fit, bootstrap, rng)
            cis = robust_fit.percentile_cis(samples)
            ci.update({block.params[k]: v for k, v in cis.items()})
    params = {n: params.get(n, float("nan")) for n in study.model.names}
    converged = converged and all(math.isfinite(v) for v in params.values())
    return simulate.StudyFit(params, ci, converged, simulate.cost_of(study, keys))


def first_checkpoints(study: simulate.SimStudy, n: int = 4) -> list[str]:
    """The design the project's convention implies: each series' `n` smallest checkpoints (the
    points its laws are fitted on) and each pretraining run only as far as they need."""
    by_key = {c.key: c for c in study.candidates}
    series: dict[str, list[tuple[int, str]]] = {}
    for c in study.candidates:
        if c.key.startswith("finetune/"):
            name, step = c.key.rsplit("@", 1)
            series.setdefault(name, []).append((int(step), c.key))
    keys: list[str] = []
    for runs in series.values():
        for _, key in sorted(runs)[:n]:
            keys += closure(key, by_key, set(keys))
    return keys
