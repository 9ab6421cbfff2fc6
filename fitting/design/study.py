"""A study as the design sees it: laws that share parameters, and candidate runs yielding points.

A study's laws are `Block`s: each block is one law of `LAWS` (the laws of
`fitting.laws.formulas`, e.g. the from-scratch Chinchilla law and the CPT law, and the
schedule-aware law of `fitting.laws.lr_area`) whose parameters are named in the study's one
parameter vector, so laws that share a parameter (the CPT law takes E, A, α from the
from-scratch fit, CPT paper eq. 7) share it here too. A `Candidate` is one run of a manifest: its
cost in chip-hours, the runs it needs first (a CPT run its source run), and the `Point`s it yields
when it completes — one per evaluation along it, since the fits use every evaluation (Choshen et
al. 2025: intermediate checkpoints improve the estimates).

The noise model is the fits' own: each point's log metric is the law's plus N(0, σ²) (the fits
are Huber in log space; the synthetic generator draws lognormal noise), plus a run's own offset
N(0, τ²) shared by every evaluation along that run (`Block.run_sigma`: a run's seed — its
initialisation and data order — moves its whole curve, so the evaluations of one run are not
independent draws; τ = 0 treats them as independent).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from fitting.laws import formulas, lr_area


@dataclasses.dataclass(frozen=True)
class LawForm:
    """What the design needs of a law: its parameters, its vectorised formula (inputs
    positional, parameters by keyword) and the names of its inputs."""

    params: tuple[str, ...]
    predict: Callable[..., np.ndarray]
    inputs: tuple[str, ...]


def _lr_area(n, s1, s2, **params) -> np.ndarray:
    """The schedule-aware law at inputs already on its fit's reference scales (N/N₀, S₁/S₀,
    S₂), so that a point is self-contained (`launch.design_schedule`)."""
    return lr_area.formula(n, s1, s2, **params)


# A law whose prediction moves by no more than this share when one input doubles does not depend
# on that input: a term at 0 moves it by exactly 0, where a term with the smallest exponent in the
# papers' fits (~0.03) moves by ~2% of itself.
FLAT_REL = 1e-9

# law name -> its form: the papers' laws and the schedule-aware law.
LAWS: Mapping[str, LawForm] = {
    **{
        name: LawForm(tuple(law.params), law.predict, tuple(law.inputs))
        for name, law in formulas.LAWS.items()
    },
    lr_area.LAW: LawForm(lr_area.PARAMS, _lr_area, ("N", "S1", "S2")),
}


@dataclasses.dataclass(frozen=True)
class Block:
    """One law of the study.

    Attributes:
      name: the block's name ("scratch", "cpt", "bleu/en-de/df1M", ...).
      law: a key of `LAWS`.
      params: the law's parameter → the study parameter it reads (e.g. {"E": "scratch.E"}).
      sigma: the noise of one point's log metric.
      run_sigma: the noise of one run's log metric shared by all its points (τ; 0: none).
    """

    name: str
    law: str
    params: Mapping[str, str]
    sigma: float = 0.01
    run_sigma: float = 0.0

    def __post_init__(self):
        if self.law not in LAWS:
            known = ", ".join(sorted(LAWS))
            raise ValueError(f"block {self.name!r}: unknown law {self.law!r}; known: {known}")
        missing = set(LAWS[self.law].params) - set(self.params)
        if missing:
            raise ValueError(f"block {self.name!r}: law {self.law} needs {sorted(missing)}")
        if not self.sigma > 0:
            raise ValueError(f"block {self.name!r}: sigma = {self.sigma}: must be positive")
        if not self.run_sigma >= 0:
            raise ValueError(
                f"block {self.name!r}: run_sigma = {self.run_sigma}: must be 0 or positive"
            )


@dataclasses.dataclass(frozen=True)
class Point:
    """One evaluation a run yields: the block it feeds, the law's inputs (N, D or Dp), the
    run it belongs to (points of one run share its offset, `Block.run_sigma`; "": a run of its
    own), and the share of the run's steps done when it is observed (None: its last input's
    share of the run's last point's, as D and Dp grow with the step; the schedule-aware law's
    areas do not)."""

    block: str
    inputs: tuple[float, ...]
    run: str = ""
    progress: float | None = None


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One run the design may choose.

    Attributes:
      key: the run's id (or slug) in its manifest.
      cost: chip-hours of this run alone.
      points: what it yields once complete (one per evaluation along it).
      requires: keys of runs it needs first (their cost is paid once, by whichever needs them).
    """

    key: str
    cost: float
    points: tuple[Point, ...]
    requires: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class StudyModel:
    """The study's laws and the prior its design starts from.

    Attributes:
      blocks: the laws.
      prior: study parameter → value (the paper's values, or a pilot fit).
    """

    blocks: tuple[Block, ...]
    prior: Mapping[str, float]

    def __post_init__(self):
        names = [b.name for b in self.blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"study blocks must have distinct names, got {names}")
        needed = {p for b in self.blocks for p in b.params.values()}
        missing = needed - set(self.prior)
        if missing:
            raise ValueError(f"study prior lacks {sorted(missing)}")
        bad = self.unusable(self.prior)
        if bad:
            raise ValueError(
                f"study prior {bad}: allowed: finite numbers, and the laws' scales "
                f"({', '.join(formulas.LOG_VARIABLES)}) above 0"
            )

    @property
    def names(self) -> tuple[str, ...]:
        """The study parameters, in a fixed order (first use by the blocks)."""
        seen: dict[str, None] = {}
        for b in self.blocks:
            for p in b.params.values():
                seen.setdefault(p)
        return tuple(seen)

    @property
    def log_scaled(self) -> tuple[bool, ...]:
        """Whether each study parameter varies on a log scale (scales E, A, B, k; the fits'
        own variables, `fitting.laws.formulas.LOG_VARIABLES`)."""
        scaled: dict[str, bool] = {}
        for b in self.blocks:
            for law_param, p in b.params.items():
                scaled.setdefault(p, law_param in formulas.LOG_VARIABLES)
        return tuple(scaled[p] for p in self.names)

    def block(self, name: str) -> Block:
        """The block of that name (an error lists the study's blocks)."""
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(f"no block {name!r}; the study has {[b.name for b in self.blocks]}")

    def unusable(self, params: Mapping[str, float]) -> str:
        """The study parameters among `params` that the design cannot work with, as
        "scratch.A = 0, ..." (empty when none): a value that is not finite, or a scale
        (`log_scaled`) at or below 0, whose log (`to_internal`) does not exist. A prior must
        have none; a fit with one is degenerate (early curves where the larger model is not
        ahead yet fit A·N^-α away, and A underflows to 0)."""
        scaled = dict(self._scales())
        return ", ".join(
            f"{p} = {float(v):.3g}"
            for p, v in params.items()
            if p in scaled and (not math.isfinite(float(v)) or (scaled[p] and float(v) <= 0))
        )

    def ignored_inputs(
        self, block: str, params: Mapping[str, float], inputs: np.ndarray
    ) -> tuple[str, ...]:
        """The inputs of the block's law that its prediction does not depend on at `inputs`
        ([P, k]) with study parameters `params`: doubling that input moves no prediction by
        more than `FLAT_REL` of its size. Such a fit is degenerate: a term the law needs is
        gone (A·N^-α with A or α at 0, e.g. early curves where the larger model is not ahead
        yet), so its scale and its exponent cannot be told apart from E."""
        inputs = np.asarray(inputs, np.float64)
        if inputs.size == 0:
            return ()
        base = self.predict(block, params, inputs)
        scale = np.maximum(np.abs(base), np.finfo(np.float64).tiny)
        names = LAWS[self.block(block).law].inputs
        flat = []
        for i, name in enumerate(names):
            if not np.any(inputs[:, i]):  # doubling zeros moves nothing: no evidence either way
                continue
            moved = inputs.copy()
            moved[:, i] *= 2.0
            change = np.abs(self.predict(block, params, moved) - base) / scale
            if np.all(np.isfinite(change)) and float(np.max(change)) <= FLAT_REL:
                flat.append(name)
        return tuple(flat)

    def to_internal(self, params: Mapping[str, float]) -> np.ndarray:
        """The vector the design differentiates: logs of scales, other parameters as they are."""
        return np.array(
            [math.log(params[p]) if log else float(params[p]) for p, log in self._scales()]
        )

    def to_params(self, theta: Sequence[float]) -> dict[str, float]:
        """Study parameters from the internal vector (inverse of `to_internal`)."""
        return {
            p: math.exp(v) if log else float(v)
            for (p, log), v in zip(self._scales(), theta, strict=True)
        }

    def _scales(self) -> Iterable[tuple[str, bool]]:
        return zip(self.names, self.log_scaled, strict=True)

    def predict(self, block: str, params: Mapping[str, float], inputs: np.ndarray) -> np.ndarray:
        """The block's law at `inputs` ([P, k]: one row per point) with study parameters."""
        b = self.block(block)
        form = LAWS[b.law]
        law_params = {lp: float(params[b.params[lp]]) for lp in form.params}
        columns = np.asarray(inputs, np.float64).T
        return form.predict(*columns, **law_params)


def predict_law(law: str, params: Mapping[str, float], inputs: Sequence[float]) -> float:
    """A law of `LAWS` at one point, with the law's own parameters (e.g. a fit's)."""
    form = LAWS[law]
    values = {p: float(params[p]) for p in form.params}
    return float(form.predict(*np.asarray(inputs, np.float64), **values))


def with_noise(model: StudyModel, noise: Mapping[str, tuple[float, float]]) -> StudyModel:
    """`model` with the blocks of `noise` (block -> (σ, τ), e.g. estimated from a fit's
    residuals, `fitting.design.noise`) given that noise; other blocks keep theirs."""
    blocks = tuple(
        dataclasses.replace(b, sigma=noise[b.name][0], run_sigma=noise[b.name][1])
        if b.name in noise
        else b
        for b in model.blocks
    )
    return dataclasses.replace(model, blocks=blocks)


def points_by_block(points: Iterable[Point]) -> dict[str, np.ndarray]:
    """Points grouped by block, each as an [P, k] array of inputs."""
    grouped: dict[str, list[tuple[float, ...]]] = {}
    for p in points:
        grouped.setdefault(p.block, []).append(p.inputs)
    return {b: np.asarray(rows, np.float64) for b, rows in grouped.items()}
