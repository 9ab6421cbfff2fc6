"""Learning-rate schedules of the two papers, selected by name from a dict registry.

- `cosine`: the CPT paper's schedule (§2.1): linear warm-up from 0 over the first 5% of the steps
  to the peak 2e-4, then cosine decay to `final_fraction` of the peak at the last step.
- `rsqrt`: T5's inverse square root, `base / sqrt(max(step, 10_000))` (flat for the first 10k
  steps), used by the MT paper's pretraining with Adafactor.
- `constant`: finetuning.

A schedule maps the optimizer step (0 for the first update) to a learning rate. The trainer's
schedules (`build_schedule`) are `Schedule` objects: a formula and its numbers (peak, warm-up and
decay steps, ...). The compiled train step takes the numbers as arguments, so runs that differ
only in their length or learning rate share one program (and one compilation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax.numpy as jnp
import optax

from trainer import validation


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Which schedule and its settings (each field is used only by the schedules that need it).

    Attributes:
      name: a key of `SCHEDULES` (`cosine`, `rsqrt`, `constant`).
      peak: peak learning rate (cosine) or the constant value (constant).
      warmup_fraction: share of the total steps spent warming up linearly (cosine).
      final_fraction: learning rate at the last step as a fraction of the peak (cosine).
      base: numerator of the inverse square root (rsqrt).
      rsqrt_offset: steps during which rsqrt stays flat at `base / sqrt(rsqrt_offset)`.
    """

    name: str = "cosine"
    peak: float = 2e-4
    warmup_fraction: float = 0.05
    final_fraction: float = 0.1
    base: float = 1.0
    rsqrt_offset: int = 10_000


def warmup_steps(*, total_steps: int, warmup_fraction: float) -> int:
    """Number of warm-up steps: `warmup_fraction` of `total_steps`, rounded, at least 1."""
    return max(1, round(warmup_fraction * total_steps))


def cosine(
    *, peak: float, total_steps: int, warmup_fraction: float = 0.05, final_fraction: float = 0.1
) -> optax.Schedule:
    """Linear warm-up to `peak` at step `warmup_fraction·total_steps`, then cosine decay that
    reaches `final_fraction·peak` at `total_steps` (and stays there)."""
    warm = warmup_steps(total_steps=total_steps, warmup_fraction=warmup_fraction)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=peak,
        warmup_steps=warm,
        decay_steps=max(total_steps, warm + 1),
        end_value=peak * final_fraction,
    )


def rsqrt(*, base: float = 1.0, offset: int = 10_000) -> optax.Schedule:
    """T5's inverse square root: `base / sqrt(max(step, offset))`."""

    def schedule(step):
        return base / jnp.sqrt(jnp.maximum(jnp.asarray(step, jnp.float32), float(offset)))

    return schedule


def constant(*, value: float) -> optax.Schedule:
    """The same learning rate at every step."""
    return optax.constant_schedule(value)


Numbers = Mapping[str, Any]


class Schedule:
    """A learning-rate schedule as a formula `at(step, numbers)` and the numbers of one run.

    Called as an `optax.Schedule` (`schedule(step)`) it uses its own numbers, or, inside
    `given(traced)`, the numbers a compiled train step received as arguments: the optimizer
    built with this schedule then reads them too, and the program holds no run's values.
    """

    def __init__(self, name: str, at: Callable[[Any, Numbers], Any], numbers: Numbers):
        self.name, self.at, self.numbers = name, at, dict(numbers)
        self._given: Numbers | None = None

    def __call__(self, step):
        return self.at(step, self.numbers if self._given is None else self._given)

    @contextlib.contextmanager
    def given(self, numbers: Numbers) -> Iterator[None]:
        """Within the block, the schedule computes with `numbers` (a train step's arguments)."""
        previous, self._given = self._given, numbers
        try:
            yield
        finally:
            self._given = previous


def _cosine_numbers(c: ScheduleConfig, total: int) -> dict[str, float]:
    # The numbers `cosine` gives optax, computed as optax computes them.
    warm = warmup_steps(total_steps=total, warmup_fraction=c.warmup_fraction)
    decay = max(total, warm + 1)
    alpha = 0.0 if c.peak == 0 else (c.peak * c.final_fraction) / c.peak
    return {"peak": c.peak, "warmup": float(warm), "decay": float(decay - warm), "alpha": alpha}


def _cosine_at(step, n: Numbers):
    # optax.warmup_cosine_decay_schedule's formula (linear warm-up from 0, then cosine decay to
    # alpha·peak, joined at the warm-up's end), with the numbers as values, not constants.
    step = jnp.asarray(step)
    warm = jnp.clip(step, 0, n["warmup"])
    warming = (0.0 - n["peak"]) * (1 - warm / n["warmup"]) + n["peak"]
    count = jnp.minimum(step - n["warmup"], n["decay"])
    cosine_decay = 0.5 * (1 + jnp.cos(jnp.pi * count / n["decay"]))
    decaying = n["peak"] * ((1 - n["alpha"]) * cosine_decay + n["alpha"])
    return jnp.where(step < n["warmup"], warming, decaying)


def _rsqrt_at(step, n: Numbers):
    return n["base"] / jnp.sqrt(jnp.maximum(jnp.asarray(step, jnp.float32), n["offset"]))


def _constant_at(step, n: Numbers):
    return jnp.full(jnp.shape(step), n["value"], jnp.float32)


# name -> (formula, numbers taking (config, total_steps)).
FORMULAS: dict[str, tuple[Callable[[Any, Numbers], Any], Callable[[ScheduleConfig, int], dict]]] = {
    "cosine": (_cosine_at, _cosine_numbers),
    "rsqrt": (_rsqrt_at, lambda c, total: {"base": c.base, "offset": float(c.rsqrt_offset)}),
    "constant": (_constant_at, lambda c, total: {"value": c.peak}),
}


# name -> optax's own builder taking (config, total_steps): the reference `FORMULAS` follow.
SCHEDULES: dict[str, Callable[[ScheduleConfig, int], optax.Schedule]] = {
    "cosine": lambda c, total: cosine(
        peak=c.peak,
        total_steps=total,
        warmup_fraction=c.warmup_fraction,
        final_fraction=c.final_fraction,
    ),
    "rsqrt": lambda c, total: rsqrt(base=c.base, offset=c.rsqrt_offset),
    "constant": lambda c, total: constant(value=c.peak),
}


# Schedules whose values do not depend on the run's length (a run of one can be extended).
LENGTH_FREE = frozenset({"rsqrt", "constant"})


def build_schedule(config: ScheduleConfig, *, total_steps: int) -> Schedule:
    """The schedule named by `config.name` for a run of `total_steps` optimizer steps (a
    `Schedule`: its values are optax's schedule's, its numbers a compiled step's arguments).

    Raises:
      ValueError: for an unknown name, listing the known ones.
    """
    at, numbers = validation.registry_entry(
        FORMULAS, key=config.name, what="schedule", binding="ScheduleConfig.name"
    )
    if not math.isfinite(config.peak) or config.peak < 0:
        raise ValueError(
            f"ScheduleConfig.peak must be a finite non-negative number, got {config.peak}"
        )
    return Schedule(config.name, at, numbers(config, total_steps))


def optax_schedule(config: ScheduleConfig, *, total_steps: int) -> optax.Schedule:
    """optax's own schedule of `config` (`SCHEDULES`): the reference `build_schedule`'s
    formulas are held equal to."""
    return SCHEDULES[config.name](config, total_steps)
