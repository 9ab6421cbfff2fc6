"""When a training run evaluates: every `period` steps, or densely early on a log-spaced grid.

The CPT paper's early-training effects (Fig. 1's gap between CPT and scratch at small compute,
Fig. 2's FLOPs saved at small compute, Fig. 4's English loss rising then falling under replay)
happen in the first percent of training, where a fixed period of 1000 steps gives a large run
its first point at 4-8% and a small run one point in all. `EVAL_SCHEDULE = 'log'` adds
`EVAL_LOG_POINTS` steps spaced evenly in log(step) from `EVAL_LOG_START` (a fraction of the
run's steps, 0.1% by default) to the last step, on top of the periodic ones; `EVAL_AT_START`
(`EvalConfig.at_start`) adds the step-0 evaluation of the initial parameters (for CPT the source
model's loss on the target language). The last step is always evaluated. The MT paper's finetunes
evaluate every `EVAL_PERIOD` steps (mt_paper.toml: 16 points of 2^18 steps, 6 of 300), and the
sweep picks each run's best validation step among them (`launch.best_checkpoint`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any


def periodic_steps(*, total: int, period: int) -> frozenset[int]:
    """Multiples of `period` up to `total`, and `total` (period 0: `total` only)."""
    steps = set(range(period, total + 1, period)) if period > 0 else set()
    return frozenset({*steps, total})


def log_spaced_steps(*, total: int, points: int, start_fraction: float) -> frozenset[int]:
    """`points` steps evenly spaced in log(step) from `start_fraction`·total (at least step 1) to
    `total`, rounded; fewer when rounding merges some (a short run has fewer distinct steps)."""
    first = max(1, round(start_fraction * total))
    if points <= 1 or first >= total:
        return frozenset({total})
    ratio = math.log(total / first) / (points - 1)
    return frozenset(min(total, round(first * math.exp(i * ratio))) for i in range(points))


def _periodic(config: Any, total: int) -> frozenset[int]:
    return periodic_steps(total=total, period=config.period)


def _log(config: Any, total: int) -> frozenset[int]:
    log_steps = log_spaced_steps(
        total=total, points=config.log_points, start_fraction=config.log_start
    )
    return _periodic(config, total) | log_steps


# EVAL_SCHEDULE name -> the evaluated steps (>= 1) of a run of `total` steps under an EvalConfig.
SCHEDULES: Mapping[str, Callable[[Any, int], frozenset[int]]] = {
    "periodic": _periodic,
    "log": _log,
}


def eval_steps(config: Any, *, total: int) -> list[int]:
    """The steps a run of `total` steps evaluates at under `config` (a `trainer.data.EvalConfig`),
    ascending, with 0 first when `config.at_start`; [] when it evaluates nothing."""
    if not config.enabled:
        return []
    steps = {s for s in SCHEDULES[config.schedule](config, total) if s >= 1}  # 0: at_start only
    return sorted({*steps, *((0,) if config.at_start else ())})
