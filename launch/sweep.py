"""Sweeps: a manifest file read (`load_manifest`) and expanded into concrete training runs.

`expand` turns a `launch.manifest.Manifest` into `launch.runs.Run`s, each with a stable id (a hash
of its resolved configuration), its `MODEL_DIR`, its dependencies (a CPT run needs its size's
source checkpoint, a finetuning run its pretraining checkpoint) and the exact
`python -m trainer.train` argv, in dependency order; `select` narrows them by run-id globs.
The manifest schema is in `launch.manifest`'s docstring.
"""

from __future__ import annotations

import fnmatch
import hashlib
import heapq
import itertools
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launch import budgets, select_tables, t5x_runner, zeroshot_stage
from launch import strategies as strategies_lib
from launch.manifest import COMPUTED_MACROS, Manifest, matches, parse_manifest
from launch.manifest_checks import require
from launch.runs import Run, gin_literal
from launch.strategies import AXES, COORD_MACROS, STRATEGIES, Counts, StrategySpec
from modeling import family as family_lib
from rundir import finetune_recipes

MANIFESTS_DIR = Path(__file__).parent / "manifests"

# Bindings that restate the budget (the steps are bound too): not part of a run's identity.
_BUDGET_RESTATED = frozenset({"PARAM_BASIS", "TOKENS_PER_PARAM"})


def resolve_manifest_path(name_or_path: str | Path) -> Path:
    """A manifest path, or the name of a shipped manifest (`cpt_paper` → launch/manifests/...)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = MANIFESTS_DIR / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    if shipped.exists():
        return shipped
    names = sorted(p.stem for p in MANIFESTS_DIR.glob("*.toml"))
    raise FileNotFoundError(f"no manifest {name_or_path!r}; shipped manifests: {', '.join(names)}")


def load_manifest(
    name_or_path: str | Path,
    *,
    variables: Mapping[str, str] | None = None,
    runs_dir: str | None = None,
    runner: str | None = None,
    t5x_paths: t5x_runner.T5xPaths | None = None,
) -> Manifest:
    """Reads and validates a manifest; `variables` fill `[vars]`, `runs_dir` and `runner` replace
    the manifest's own, `t5x_paths` says where the t5x runner's code is. Errors name the manifest
    and the offending key."""
    path = resolve_manifest_path(name_or_path)
    with open(path, "rb") as f:
        data = tomllib.load(f)
    return parse_manifest(
        data,
        path=str(path),
        variables=variables,
        runs_dir=runs_dir,
        runner=runner,
        t5x_paths=t5x_paths,
    )


def _short_count(value: float) -> str:
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


# Coordinate -> its type, so that `0` and `0.0` (or "0") are the same replay ratio.
_COORD_TYPES: dict[str, type] = {
    "seed": int,
    "replay_ratio": float,
    "init_step": int,
    "finetune_tokens": int,
}
# Coordinate -> how it reads in a run id (in this order, after strategy and size).
_SLUG_PARTS: dict[str, Any] = {
    "target_lang": str,
    "mixture": str,
    "init_step": lambda v: f"step{v}",
    "task": str,
    "finetune_tokens": lambda v: f"df{_short_count(v)}",
    "replay_ratio": lambda v: f"replay{round(100 * v, 6):g}",
}


_STANDARD_COORDS = frozenset(AXES.values())


def _slug(strategy: str, coords: Mapping[str, Any]) -> str:
    """The readable part of a run id: strategy, size, the other coordinates, seed."""
    parts = [strategy, str(coords["size"])]
    parts += [fmt(coords[key]) for key, fmt in _SLUG_PARTS.items() if key in coords]
    parts += [
        select_tables.axis_slug(key, value)
        for key, value in sorted(coords.items())
        if key not in _STANDARD_COORDS
    ]
    parts.append(f"s{coords['seed']}")
    return re.sub(r"[^A-Za-z0-9_.]+", "-", "_".join(parts))


class _Expander:
    """Builds runs from a manifest, creating parents on demand and caching by coordinates."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        wanted: Sequence[tuple[str, Mapping[str, Any]]] = (),
        chosen: Mapping[tuple[str, str], str] | None = None,
    ):
        self.m = manifest
        self.family = family_lib.get(manifest.family)
        self.runs: dict[tuple, Run] = {}
        self._counts: dict[tuple, Counts | None] = {}
        self.wanted: dict[str, list[Mapping[str, Any]]] = {}
        for name, coords in wanted:
            self.wanted.setdefault(name, []).append(coords)
        self.chosen = dict(chosen or {})  # (select name, group) -> chosen run id
        # Every run's zero-shot languages: the stage's, else en and all the sweep's targets.
        targets = {c["target_lang"] for _, c in wanted if "target_lang" in c}
        self.zeroshot_langs = (
            zeroshot_stage.stage_languages(manifest.zeroshot, sorted(targets))
            if manifest.zeroshot
            else ()
        )

    def counts(self, base: str, overrides: Mapping[str, Any], where: str) -> Counts | None:
        """Counts of a model shape, computed once per shape."""
        key = (base, json.dumps(dict(overrides), sort_keys=True, default=str))
        if key not in self._counts:
            try:
                self._counts[key] = strategies_lib.counts(
                    self.family, base, overrides, seq_len=self.m.seq_len
                )
            except (TypeError, ValueError) as e:  # unknown size or config field
                raise ValueError(f"{where}: model {base!r} with {dict(overrides)}: {e}") from e
        return self._counts[key]

    def run(self, strategy_name: str, coords: Mapping[str, Any]) -> Run:
        """The run of a strategy at some coordinates, built once (parents first)."""
        key = (strategy_name, tuple(sorted(coords.items())))
        if key not in self.runs:
            self.runs[key] = self._build(STRATEGIES[strategy_name], dict(coords))
        return self.runs[key]

    def _build(self, strategy: StrategySpec, coords: dict[str, Any]) -> Run:
        m, where = self.m, f"{self.m.path} run {strategy.name} {coords}"
        require(strategy.family == m.family, where, f"strategy is for family {strategy.family!r}")
        settings = m.strategies.get(strategy.name, {})
        matching = [
            o
            for o in m.overrides
            if matches({"strategy": strategy.name, **coords}, o.get("where", {}))
        ]
        gin_files = [settings.get("gin_file", strategy.gin_file), *m.gin_files]
        gin_files += list(settings.get("gin_files", ()))
        gin = {**dict(strategy.macros), **m.gin, **settings.get("gin", {})}
        budget = budgets.merge(m.budget, settings.get("budget", {}))
        for o in matching:
            gin_files += list(o.get("gin_files", ()))
            gin.update(o.get("gin", {}))
            budget = budgets.merge(budget, o.get("budget", {}))
        clash = sorted(set(gin) & COMPUTED_MACROS)
        require(not clash, where, f"gin sets {clash}, which the sweep computes")

        size = coords["size"]
        shape = dict(m.sizes.get(size, {}))
        base = shape.pop("base", size)
        # Custom shape fields join any MODEL_OVERRIDES the gin settings give (e.g. vocab_size).
        overrides = gin.pop("MODEL_OVERRIDES", {})
        require(isinstance(overrides, Mapping), where, "MODEL_OVERRIDES must be a table")
        overrides = {**overrides, **shape}
        counts = self.counts(base, overrides, where)
        rule = budgets.resolve(budget, where=where)  # once per budget
        params = family_lib.basis_params(
            rule.basis,
            total=None if counts is None else counts.params_total,
            non_embedding=None if counts is None else counts.params_non_embedding,
            nominal=self.family.nominal_params(base),
        )
        steps, batch_size = budgets.steps_and_batch(
            budget, rule, params=params, seq_len=m.seq_len, where=where
        )
        if "FINETUNE_RECIPE" in coords:  # a finetune-length axis: the recipe gives the steps
            try:
                steps = finetune_recipes.recipe(str(coords["FINETUNE_RECIPE"])).steps
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from e
        elif "FINETUNE_RECIPE" in gin:  # the recipe names the length: the budget must agree
            recipe = finetune_recipes.recipe(str(gin["FINETUNE_RECIPE"]))
            require(
                steps == recipe.steps,
                where,
                f"FINETUNE_RECIPE {gin['FINETUNE_RECIPE']!r} trains {recipe.steps} steps; the "
                f"budget gives {steps}",
            )

        parent, selected_from, candidates = None, None, ()
        if strategy.parent:
            parent, selected_from, candidates = self._parent(strategy, coords, where)

        bindings: dict[str, str] = {"MODEL_SIZE": gin_literal(base)}
        if overrides:
            bindings["MODEL_OVERRIDES"] = gin_literal(dict(sorted(overrides.items())))
        for name, value in coords.items():
            if name in COORD_MACROS and name != "size":
                bindings[COORD_MACROS[name]] = gin_literal(value)
        bindings["TRAIN_STEPS"] = str(steps)
        bindings["BATCH_SIZE"] = str(batch_size)
        # The budget's N basis and tokens per parameter are the run's own settings (PARAM_BASIS,
        # TOKENS_PER_PARAM): the trainer computes from them the steps bound above
        # (tests/test_token_budget.py) and records them in run.json.
        bindings["PARAM_BASIS"] = gin_literal(rule.basis)
        if rule.amount_key == "tokens_per_param":
            bindings["TOKENS_PER_PARAM"] = gin_literal(budget["tokens_per_param"])
        if "TASK_FEATURE_LENGTHS" not in gin:  # a manifest may set its own (e.g. T5 targets 114)
            lengths = {k: m.seq_len for k in self.family.feature_keys}
            bindings["TASK_FEATURE_LENGTHS"] = gin_literal(lengths)
        bindings.update({k: gin_literal(v) for k, v in sorted(gin.items())})
        for name, value in sorted(coords.items()):
            if name not in _STANDARD_COORDS:  # a gin_axes coordinate
                require(name not in gin, where, f"{name} is a grid dimension and also set in gin")
                bindings[name] = gin_literal(value)
        identity = {
            "family": m.family,
            "strategy": strategy.name,
            "coords": sorted(coords.items()),
            "shape": sorted(m.sizes.get(size, {}).items()),
            "gin_files": gin_files,
            # PARAM_BASIS and TOKENS_PER_PARAM only restate the budget that TRAIN_STEPS already
            # resolves: left out, so runs keep the ids they had before the trainer recorded them.
            "bindings": sorted((k, v) for k, v in bindings.items() if k not in _BUDGET_RESTATED),
            "seq_len": m.seq_len,
            "parent": selected_from or (parent.run_id if parent else None),
            # Another runner's job is another run (its own MODEL_DIR); xlscale's ids stay as were.
            **({"runner": m.runner} if m.runner != "xlscale" else {}),
        }
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode())
        run_id = f"{_slug(strategy.name, coords)}-{digest.hexdigest()[:10]}"
        model_dir = f"{m.runs_dir.rstrip('/')}/{run_id}"
        if parent is not None or selected_from is not None:
            step = coords.get("init_step")
            name, group = (selected_from or ": ").split(": ", 1)
            start = parent.model_dir if parent else f"<chosen-by-select:{name}[{group}]>"
            checkpoint = start + (f"@{step}" if step is not None else "")
            bindings["INIT_CHECKPOINT"] = gin_literal(checkpoint)
        bindings = {"MODEL_DIR": gin_literal(model_dir), **bindings}
        gin_axes = tuple(sorted(n for n in coords if n not in _STANDARD_COORDS))
        run = Run(
            run_id=run_id,
            strategy=strategy.name,
            family=m.family,
            size=size,
            base_size=base,
            overrides=tuple(sorted(overrides.items())),
            coords=tuple(sorted(coords.items())),
            seq_len=m.seq_len,
            batch_size=batch_size,
            steps=steps,
            counts=counts,
            gin_files=tuple(gin_files),
            gin_search_paths=m.gin_search_paths,
            bindings=tuple(bindings.items()),
            model_dir=model_dir,
            parent=parent.run_id if parent else None,
            variables=tuple(sorted(m.variables.items())),
            env=tuple(sorted(m.env.items())),
            selected_from=selected_from,
            candidates=candidates,
            zeroshot=zeroshot_stage.score_spec(m.zeroshot, strategy.name, self.zeroshot_langs),
            runner=m.runner,
            t5x_paths=m.t5x_paths,
            gin_axes=gin_axes,
            manifest_path=m.path,
            sbatch_lines=m.sbatch_lines,
            settings=tuple(sorted(m.settings.items())),
        )
        if m.runner == "t5x":
            t5x_runner.check(run, manifest=m.path)
        return run

    def _parent(
        self, strategy: StrategySpec, coords: Mapping[str, Any], where: str
    ) -> tuple[Run | None, str | None, tuple[str, ...]]:
        """The run whose checkpoint starts `strategy` at `coords`: (parent, selection, candidates).

        The parent shares the child's size, seed and the parent strategy's axes. When the
        manifest's parent runs also vary over gin axes the child lacks (a learning-rate grid),
        a `[[select]]` on the parent strategy over those axes picks one: the parent is the chosen
        run once selection.json names it, else None and the child waits for every candidate.
        """
        name = strategy.parent
        shared = {k: coords[k] for k in ("size", "seed", *STRATEGIES[name].axes)}
        candidates = [
            c for c in self.wanted.get(name, ()) if all(c.get(k) == v for k, v in shared.items())
        ]
        extra = {k for c in candidates for k in c if k not in shared}
        shared.update({k: coords[k] for k in extra if k in coords})  # the child's own value
        extra = {k for k in extra if k not in coords}
        if not extra:
            return self.run(name, shared), None, ()
        candidates = [c for c in candidates if all(c.get(k) == v for k, v in shared.items())]
        specs = [
            s
            for s in self.m.selects
            if s.strategy == name and extra <= set(s.over) and matches(shared, dict(s.where))
        ]
        require(
            len(specs) == 1,
            where,
            f"starts from {name} runs that vary over {sorted(extra)}; "
            + (
                f"[[select]] tables {[s.name for s in specs]} all choose among them; keep one"
                if specs
                else f"add a [[select]] with strategy = {str(name)!r}, over = {sorted(extra)} "
                "(or give this run the same grid)"
            ),
        )
        spec = specs[0]
        group = select_tables.group_key({**shared, **candidates[0]}, spec.over)
        runs = [self.run(name, c) for c in candidates]
        chosen = self.chosen.get((spec.name, group))
        parent = next((r for r in runs if r.run_id == chosen), None)
        return parent, f"{spec.name}: {group}", tuple(r.run_id for r in runs)


def expand(manifest: Manifest, *, selection: Mapping[str, Any] | None = None) -> list[Run]:
    """All runs of a manifest in dependency order (parents first, then manifest order), with
    missing parents (e.g. the source run of a replay-only study) added. Duplicates collapse.

    Args:
      manifest: the parsed manifest.
      selection: the contents of the sweep's selection.json (`launch.run_selection.read`), whose
        chosen runs start the runs that depend on a `[[select]]`; without it (or for a group it
        has not decided) those runs wait for the choice (`Run.waits_for_selection`).
    """
    wanted = [
        (strategy_name, coords)
        for grid in manifest.grids
        for strategy_name in grid["strategies"]
        for coords in _grid_coords(manifest, grid, strategy_name)
    ]
    expander = _Expander(manifest, wanted=wanted, chosen=chosen_runs(selection))
    runs = [expander.run(name, coords) for name, coords in wanted]
    unique = {r.run_id: r for r in [*runs, *expander.runs.values()]}
    ordered = topological_order(list(unique.values()))
    return ordered if manifest.design_runs is None else designed(manifest, ordered)


def designed(manifest: Manifest, runs: Sequence[Run]) -> list[Run]:
    """The runs a `[design]` table keeps: those it names (by id, or by slug: the id without its
    hash) and every run they depend on, in `runs`' order.

    Raises:
      ValueError: a name that is no run of the manifest's grid, or a slug of several runs.
    """
    by_slug: dict[str, list[str]] = {}
    for r in runs:
        by_slug.setdefault(r.run_id.rsplit("-", 1)[0], []).append(r.run_id)
    ids = {r.run_id for r in runs}
    wanted = []
    for name in manifest.design_runs or ():
        found = [name] if name in ids else by_slug.get(name, [])
        require(
            len(found) == 1,
            f"{manifest.path} [design] runs",
            f"{name!r} is "
            + (f"the slug of {len(found)} runs: give the id" if found else "no run of the grid")
            + " (`xlscale sweep plan` on the manifest without [design] lists the ids)",
        )
        wanted += found
    return select(runs, wanted)


def _grid_coords(
    manifest: Manifest, grid: Mapping[str, Any], strategy_name: str
) -> list[dict[str, Any]]:
    """The coordinates of a strategy's runs in one grid (the product of its axes and gin axes,
    less the excluded)."""
    strategy = STRATEGIES[strategy_name]
    axes = ("size", "seed", *strategy.axes)
    plural = {v: k for k, v in AXES.items()}
    values = []
    for coord in axes:
        default = (0,) if coord == "seed" else None
        given = grid.get(plural[coord], default)
        require(
            given is not None and len(given) > 0,
            f"{manifest.path}",
            f"strategy {strategy_name!r} needs axis '{plural[coord]}'",
        )
        values.append(given)
    gin_axes = grid.get("gin_axes", {})
    out = []
    for combo in itertools.product(*values, *gin_axes.values()):
        coords = {k: _COORD_TYPES.get(k, str)(v) for k, v in zip(axes, combo, strict=False)}
        coords.update(zip(gin_axes, combo[len(axes) :], strict=True))
        if not any(
            matches({"strategy": strategy_name, **coords}, e["where"]) for e in manifest.excludes
        ):
            out.append(coords)
    return out


def chosen_runs(selection: Mapping[str, Any] | None) -> dict[tuple[str, str], str]:
    """(select name, group) -> chosen run id, from a selection.json document (None: none)."""
    out = {}
    for name, stage in ((selection or {}).get("selections") or {}).items():
        for group, decided in (stage.get("groups") or {}).items():
            if decided.get("chosen"):
                out[(name, group)] = decided["chosen"]
    return out


def topological_order(runs: Sequence[Run]) -> list[Run]:
    """Orders runs so that every run comes after the runs it depends on, otherwise keeping the
    given order. Raises on a dependency that is not among `runs` or on a cycle."""
    by_id = {r.run_id: r for r in runs}
    for r in runs:
        for dep in r.depends_on:
            require(dep in by_id, r.run_id, f"depends on {dep}, which is not in the sweep")
    # Kahn's algorithm, always taking the earliest ready run (linear-ish in runs, not quadratic).
    order = {run_id: i for i, run_id in enumerate(by_id)}
    waiting = {run_id: len(set(r.depends_on)) for run_id, r in by_id.items()}
    children: dict[str, list[str]] = {}
    for run_id, r in by_id.items():
        for dep in set(r.depends_on):
            children.setdefault(dep, []).append(run_id)
    ready = [order[i] for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    ids = list(by_id)
    ordered: list[Run] = []
    while ready:
        run_id = ids[heapq.heappop(ready)]
        ordered.append(by_id[run_id])
        for child in children.get(run_id, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, order[child])
    left = [i for i in ids if waiting[i] > 0]
    require(not left, "sweep", f"dependency cycle among {left}")
    return ordered


def select(runs: Sequence[Run], patterns: Sequence[str]) -> list[Run]:
    """The runs whose id matches any glob in `patterns`, plus everything they depend on."""
    by_id = {r.run_id: r for r in runs}
    chosen: set[str] = set()
    stack = [r.run_id for r in runs if any(fnmatch.fnmatch(r.run_id, p) for p in patterns)]
    while stack:
        run_id = stack.pop()
        if run_id not in chosen:
            chosen.add(run_id)
            stack.extend(by_id[run_id].depends_on)
    return [r for r in runs if r.run_id in chosen]
