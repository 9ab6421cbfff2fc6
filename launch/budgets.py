"""Token-budget rules of sweep manifests: how many steps, and how big a batch, a run gets.

A budget names one amount (`tokens_per_param` | `tokens` | `steps`), one batch rule
(`batch_tokens` | `batch_size` | `batch_tokens_bands`, the first band whose max_params covers N)
and the basis of N for the rules that need it (`param_basis`: one of
`modeling.family.PARAM_BASES`, the trainer's `PARAM_BASIS` values; the sweep binds the budget's
basis as the run's `PARAM_BASIS`, so a run records the N its steps were computed from). Budgets
layer ([budget], then `[strategies.X] budget`, then matching `[[override]] budget`s): `merge` lets
a later layer's amount or batch key replace the earlier one's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from launch.manifest_checks import check_keys, require
from modeling.family import PARAM_BASES, budget_steps

AMOUNT_KEYS = ("tokens_per_param", "tokens", "steps")
BATCH_KEYS = ("batch_tokens", "batch_size", "batch_tokens_bands")


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Layers budgets: setting one amount (or batch) key clears the others of its group."""
    merged = dict(base)
    for group in (AMOUNT_KEYS, BATCH_KEYS):
        if any(k in update for k in group):
            for k in group:
                merged.pop(k, None)
    merged.update(update)
    return merged


class Rule(NamedTuple):
    """A validated budget's rule (`resolve`): which amount and batch keys it sets, and the basis
    of N; `steps_and_batch` takes it, so a budget is validated once."""

    amount_key: str
    batch_key: str
    basis: str


def resolve(budget: Mapping[str, Any], *, where: str) -> Rule:
    """Validates a budget; returns its amount key, batch key and parameter basis."""
    check_keys(budget, (*AMOUNT_KEYS, *BATCH_KEYS, "param_basis"), where)
    amounts = [k for k in AMOUNT_KEYS if k in budget]
    batches = [k for k in BATCH_KEYS if k in budget]
    require(len(amounts) == 1, where, f"set exactly one of {AMOUNT_KEYS}, got {amounts}")
    require(len(batches) == 1, where, f"set exactly one of {BATCH_KEYS}, got {batches}")
    basis = budget.get("param_basis", "non_embedding")
    require(basis in PARAM_BASES, where, f"param_basis must be one of {PARAM_BASES}")
    if batches[0] == "batch_tokens_bands":
        bands = budget["batch_tokens_bands"]
        ok = all(isinstance(b, list) and len(b) == 2 for b in bands) and bands
        require(bool(ok), where, "batch_tokens_bands is a list of [max_params, batch_tokens]")
        bounds = [float(b[0]) for b in bands]
        require(bounds == sorted(bounds), where, "batch_tokens_bands must be in increasing order")
    return Rule(amounts[0], batches[0], basis)


def steps_and_batch(
    budget: Mapping[str, Any], rule: Rule, *, params: float | None, seq_len: int, where: str
) -> tuple[int, int]:
    """(train steps, batch size in sequences) for a budget and its rule (`resolve`, called once
    per budget by the caller); `params` is N on the budget's basis (None when unknown, which only
    rules that need N reject). The steps follow the trainer's rule (`modeling.family.budget_steps`).
    """
    amount_key, batch_key, basis = rule
    needs_params = amount_key == "tokens_per_param" or batch_key == "batch_tokens_bands"
    require(
        params is not None or not needs_params,
        where,
        f"{amount_key}/{batch_key} need the {basis} parameter count, which is unavailable",
    )
    if batch_key == "batch_size":
        batch_size = int(budget["batch_size"])
    else:
        tokens = budget.get("batch_tokens")
        if batch_key == "batch_tokens_bands":
            fitting = [int(t) for bound, t in budget[batch_key] if params <= float(bound)]
            require(bool(fitting), where, f"no batch_tokens_bands entry covers N={params:.4g}")
            tokens = fitting[0]
        batch_size = max(1, int(tokens) // seq_len)
    amount = float(budget[amount_key])
    if amount_key == "steps":
        return int(amount), batch_size
    per_step = batch_size * seq_len
    if amount_key == "tokens_per_param":
        steps = budget_steps(tokens_per_step=per_step, tokens_per_param=amount, params=params)
    else:
        steps = budget_steps(tokens_per_step=per_step, tokens=amount)
    return steps, batch_size
