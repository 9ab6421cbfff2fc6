"""Grid dimensions over gin macros and the `[[select]]` stage of a sweep manifest, as data.

A manifest may sweep any gin macro (a learning rate, say) by listing its values under
`gin_axes = {MACRO = [v1, v2, ...]}` in `[axes]` or a `[[grid]]`: each value is a coordinate of
its own (named by the macro), carried into run ids (`base_lr0.5`) and `--gin.MACRO=value`.

A `[[select]]` table names how to pick one run out of each group of runs that differ only in
some coordinates (`over`): by a metric of `metrics.jsonl` (its last logged value, or with
`at = "best"` its best evaluated one, `launch.best_checkpoint`) and a rule (`min` | `max`). Runs that depend on a selected strategy (finetuning from the best pretraining
learning rate) start from the chosen run's checkpoint; `launch.run_selection` makes the choice and
writes it to `<runs_dir>/selection.json`, which `fitting.readers.rejected_runs` reads so that fits use only
the chosen runs.

This module holds only parsing and naming (no file access), so `launch.sweep` can use it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rundir import names

SELECTION_FILE = names.SELECTION_FILE
RULES = ("min", "max")
SELECT_KEYS = ("name", "strategy", "over", "metric", "rule", "where", "at")
# Which value of a candidate's metric is compared: its last logged one, or its best evaluated one
# (a finetune whose small set repeats overfits by its last step; `launch.best_checkpoint`).
AT = ("last", "best")
_MACRO = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclasses.dataclass(frozen=True)
class SelectSpec:
    """One `[[select]]` stage of a manifest.

    Attributes:
      name: the stage's name (the key of its entry in selection.json).
      strategy: the strategy whose runs are chosen among.
      over: the coordinates the candidates of one group differ in (e.g. `("BASE_LR",)`).
      metric: a metrics.jsonl key; `{coordinate}` is filled from the run (`eval/{task}/loss`).
      rule: "min" or "max": which value wins.
      where: only runs matching these coordinates (as `[[override]] where`) are selected among.
      at: "last" (the last logged value) or "best" (the best evaluated step, recorded in each
        candidate's best_checkpoint.json).
    """

    name: str
    strategy: str
    over: tuple[str, ...]
    metric: str
    rule: str
    where: tuple[tuple[str, Any], ...] = ()
    at: str = "last"

    def metric_for(self, coords: Mapping[str, Any]) -> str:
        """The metric key of a run at `coords` (placeholders filled)."""
        return self.metric.format(**coords)

    def better(self, a: float, b: float) -> bool:
        """Whether value `a` beats `b` under the rule (non-finite values never win)."""
        if not math.isfinite(a):
            return False
        if not math.isfinite(b):
            return True
        return a < b if self.rule == "min" else a > b


def _fail(where: str, message: str) -> None:
    raise ValueError(f"{where}: {message}")


def parse_gin_axes(value: Any, *, where: str, computed: Iterable[str]) -> dict[str, tuple]:
    """Validates a `gin_axes` table: macro name -> non-empty list of distinct scalar values.

    Raises:
      ValueError: naming `where` (the manifest and table), the macro and what is allowed.
    """
    if not isinstance(value, Mapping):
        _fail(where, f"gin_axes must be a table {{MACRO = [values]}}, got {value!r}")
    out = {}
    for macro, values in value.items():
        if not _MACRO.fullmatch(macro):
            _fail(where, f"gin_axes key {macro!r} must be a gin macro name (UPPER_CASE)")
        if macro in set(computed):
            _fail(where, f"gin_axes {macro} is set by the sweep itself; grid another macro")
        ok = isinstance(values, list) and values
        ok = ok and all(isinstance(v, str | int | float | bool) for v in values)
        if not ok:
            _fail(where, f"gin_axes {macro} must be a non-empty list of numbers or strings")
        if len(set(values)) != len(values):
            _fail(where, f"gin_axes {macro} repeats a value: {values}")
        out[macro] = tuple(values)
    return out


def axis_slug(macro: str, value: Any) -> str:
    """How a gin-axis coordinate reads in a run id: `BASE_LR` 0.5 -> `base_lr0.5`."""
    text = format(value, "g") if isinstance(value, float) else str(value)
    return f"{macro.lower()}{text}"


def parse_selects(
    tables: Sequence[Any],
    *,
    path: str,
    strategies: Iterable[str],
    coordinates: Mapping[str, set[str]],
) -> tuple[SelectSpec, ...]:
    """Validates the `[[select]]` tables of a manifest.

    Args:
      tables: the parsed `[[select]]` list.
      path: the manifest, for messages.
      strategies: the known strategy names.
      coordinates: strategy -> the coordinates its runs have in this manifest (the strategy's
        axes plus the gin axes of the grids that list it); a strategy no grid lists is absent.

    Raises:
      ValueError: naming the manifest, the select table and key, and the allowed values.
    """
    specs: list[SelectSpec] = []
    for i, table in enumerate(tables):
        where = f"{path} [[select]] {i}"
        if not isinstance(table, Mapping):
            _fail(where, "must be a table")
        unknown = sorted(set(table) - set(SELECT_KEYS))
        if unknown:
            _fail(where, f"unknown keys {unknown}; valid: {sorted(SELECT_KEYS)}")
        for key in ("strategy", "over", "metric"):
            if key not in table:
                _fail(where, f"missing {key!r}")
        strategy = table["strategy"]
        if strategy not in set(strategies):
            _fail(
                where,
                f"strategy {strategy!r} is not a strategy; valid: {sorted(map(str, strategies))}",
            )
        if strategy not in coordinates:
            _fail(where, f"strategy {strategy!r} has no runs in this manifest's grids")
        known = coordinates[strategy]
        over = table["over"]
        over = [over] if isinstance(over, str) else over
        if not isinstance(over, list) or not over or not all(isinstance(o, str) for o in over):
            _fail(where, "over must be a coordinate name or a non-empty list of them")
        bad = sorted(set(over) - known)
        if bad:
            _fail(where, f"over {bad}: not coordinates of {strategy} runs; valid: {sorted(known)}")
        rule = table.get("rule", "min")
        if rule not in RULES:
            _fail(where, f"rule {rule!r}: choose one of {list(RULES)}")
        at = table.get("at", "last")
        if at not in AT:
            _fail(where, f"at {at!r}: choose one of {list(AT)}")
        metric = table["metric"]
        if not isinstance(metric, str) or not metric:
            _fail(where, "metric must be a metrics.jsonl key, e.g. 'eval/{task}/loss'")
        fields = {f for _, f, _, _ in string.Formatter().parse(metric) if f is not None}
        bad = sorted(fields - known - {"size", "seed"})
        if bad:
            _fail(where, f"metric {metric!r} names {bad}, not coordinates of {strategy} runs")
        where_table = table.get("where", {})
        if not isinstance(where_table, Mapping):
            _fail(where, "where must be a table {coordinate = value or [values]}")
        bad = sorted(set(where_table) - known)
        if bad:
            _fail(where, f"where {bad}: not coordinates of {strategy} runs; valid: {sorted(known)}")
        name = table.get("name", f"{strategy}_{'_'.join(o.lower() for o in over)}")
        if any(s.name == name for s in specs):
            _fail(where, f"name {name!r} is used by another [[select]]; give each its own name")
        specs.append(
            SelectSpec(
                name=str(name),
                strategy=strategy,
                over=tuple(over),
                metric=metric,
                rule=rule,
                where=tuple(sorted(where_table.items())),
                at=at,
            )
        )
    return tuple(specs)


def group_key(coords: Mapping[str, Any], over: Iterable[str]) -> str:
    """The name of the group a run at `coords` belongs to: its coordinates except `over`,
    sorted (`mixture=mix_en_100,seed=0,size=t5_3b`)."""
    skip = set(over)
    return ",".join(f"{k}={v}" for k, v in sorted(coords.items()) if k not in skip)
