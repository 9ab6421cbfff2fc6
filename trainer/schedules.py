"""Learning-rate schedules of the two papers, selected by name from a dict registry.

- `cosine`: the CPT paper's schedule (§2.1): linear warm-up from 0 over the first 5% of the steps
  to the peak 2e-4, then cosine decay to `final_fraction` of the peak at the last step.
- `rsqrt`: T5's inverse square root, `base / sqrt(max(step, 10_000))` (flat for the first 10k
  steps), used by the MT paper's pretraining with Adafactor.
- `constant`: finetuning.

A schedule maps the optimizer step (0 for the first update) to a learning rate.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

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


# name -> builder taking (config, total_steps).
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


# Schedules whose values do not depend on the run's length (compiled steps can be shared).
LENGTH_FREE = frozenset({"rsqrt", "constant"})


def build_schedule(config: ScheduleConfig, *, total_steps: int) -> optax.Schedule:
    """The schedule named by `config.name` for a run of `total_steps` optimizer steps.

    Raises:
      ValueError: for an unknown name, listing the known ones.
    """
    build = validation.registry_entry(
        SCHEDULES, key=config.name, what="schedule", binding="ScheduleConfig.name"
    )
    if not math.isfinite(config.peak) or config.peak < 0:
        raise ValueError(
            f"ScheduleConfig.peak must be a finite non-negative number, got {config.peak}"
        )
    return build(config, total_steps)
