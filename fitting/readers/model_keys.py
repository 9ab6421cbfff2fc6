"""What identifies a run's model, and the parameter count N a fit uses for it.

A model is its family and size (run.json `family`, `model`): runs of different models are never
pooled into one downstream series, and every series and fit row names its model
(`model_label`). N has two bases (`N_BASES`):

- `exact`: run.json's `params_non_embedding`, counted from the initialised tree (the project's
  convention, and the default);
- `nominal`: the paper's nominal size of the model (the CPT paper's Table 4 "Parameter Size"),
  which is what the paper fitted its Table 2 and eqs. 8-9 on. It is read from run.json's
  `params_nominal` where the run recorded one, else from the family's size table
  (`modeling.family`), and is an error naming the run for a size the paper has no count for.

On the nominal basis a run's FLOPs are rescaled to the same N (C = 6·N_nominal·D), so that
compute frontiers and allocations stay on one basis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fitting.checks import FitInputError
from rundir import run_record

EXACT_KEY = "params_non_embedding"
NOMINAL_KEY = "params_nominal"
DEFAULT_BASIS = "exact"
# Strategies of the upstream (CPT paper) fits, whose N the basis applies to.
UPSTREAM = run_record.UPSTREAM
# What the functions below read: run.json as a record, or (for callers with a dict) its object.
Info = run_record.RunRecord | Mapping[str, Any]


def model_label(meta: Info) -> str:
    """The model of a run as one readable key: its size name (`llama2_49m`, `t5_770m`), prefixed
    by its family where the name does not already start with it (`llama2/demo_d48`); `?` when
    run.json names no model."""
    info = run_record.RunRecord.of(meta)
    model = str(info.model or "")
    family = str(info.family or "")
    if not model:
        return f"{family}/?" if family else "?"
    if not family or model.startswith(family):
        return model
    return f"{family}/{model}"


def nominal_params(meta: Info) -> float | None:
    """The paper's nominal parameter count of a run's model: run.json's `params_nominal`, else
    the family's size table (`ModelFamily.nominal_params`); None where neither has one."""
    info = run_record.RunRecord.of(meta)
    if info.params_nominal not in (None, ""):
        return float(info.params_nominal)
    family, model = info.family, info.model
    if not family or not model:
        return None
    from modeling import family as families

    try:
        return families.get(str(family)).nominal_params(str(model))
    except ValueError:  # a family this install does not know
        return None


def _exact(meta: Info) -> float | None:
    value = run_record.RunRecord.of(meta).params_non_embedding
    return None if value in (None, "") else float(value)


# Basis name -> run.json -> N (None: the run has no such count).
N_BASES: Mapping[str, Callable[[Info], float | None]] = {
    "exact": _exact,
    "nominal": nominal_params,
}


def check_basis(basis: str) -> None:
    """Raises ValueError naming the bases unless `basis` is one of `N_BASES`."""
    if basis not in N_BASES:
        raise ValueError(f"unknown N basis {basis!r}; choose one of {', '.join(N_BASES)}")


def n_params(meta: Info, *, basis: str = DEFAULT_BASIS, run_id: str = "?") -> float:
    """N of a run on `basis` (`N_BASES`).

    Raises:
      ValueError: unknown basis.
      FitInputError: the run has no positive count on that basis (naming the run and model).
    """
    check_basis(basis)
    value = N_BASES[basis](meta)
    if value is None or not (math.isfinite(value) and value > 0):
        if basis == "exact":
            raise FitInputError(f"run {run_id!r}: run.json has no positive {EXACT_KEY}")
        raise FitInputError(
            f"run {run_id!r} (model {model_label(meta)}): no nominal parameter count (run.json "
            f"has no {NOMINAL_KEY} and the paper's size table has no such size); fit on the "
            "exact basis (--n-basis exact)"
        )
    return float(value)


def paper_basis(runs: Iterable[Any], *, strategies: Iterable[str] = UPSTREAM) -> str:
    """The basis a comparison with the CPT paper should fit on: "nominal" when every run of
    `strategies` has a nominal count (the paper's own basis), else "exact" (e.g. the CPU demo's
    sizes, which the paper never trained); a report must say which it used."""
    wanted = set(strategies)
    chosen = [r for r in runs if r.strategy in wanted]
    if chosen and all(nominal_params(r.info) is not None for r in chosen):
        return "nominal"
    return "exact"
