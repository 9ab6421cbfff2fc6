"""Sweep manifests: a TOML file that names a study's grid, parsed and validated.

A manifest is a product of axes (sizes, strategies, target languages, replay ratios, mixtures,
tasks, seeds, ...) plus a token-budget rule and gin overrides. `parse_manifest` validates a parsed
TOML document into a `Manifest` (`launch.sweep.load_manifest` reads the file and
`launch.sweep.expand` turns the manifest into `launch.runs.Run`s).

Schema (every table optional unless said):

    [sweep]     name (required), description, family ("llama2" | "t5"), runs_dir, seq_len,
                gin_files (overlays after each strategy's file), gin_search_paths,
                runner ("xlscale" | "t5x": real T5X's `t5x.train`, `launch.t5x_runner`),
                hardware (a slice, e.g. "v5p-128", "8xH100": each run gets the remat policy
                and NUM_MICROBATCHES that fit one of its chips, `launch.estimate.memory_plan`)
    [vars]      NAME = "default"  -- `${NAME}` in any string below; "" means "must be given"
    [env]       environment for every launched job
    [settings]  COMET_MODEL, COMET_PYTHON -- how runs are scored, passed to every runner, not
                part of run ids (`launch.run_settings`: names, allowed values)
    [slurm]     sbatch_lines = ["--constraint=h100", ...]  -- extra `#SBATCH` lines of every job
                under the SLURM launcher (before its `--sbatch-line`s; other launchers ignore them)
    [gin]       KEY = value       -- `--gin.KEY=value` for every run
    [axes]      sizes, strategies, seeds, target_langs, replay_ratios, mixtures, tasks,
                finetune_tokens, init_steps, gin_axes = {MACRO = [values]} (a grid over any
                gin macro, e.g. a learning rate; a FINETUNE_RECIPE axis sets each finetune's
                steps to its recipe's, `rundir.finetune_recipes`)  -- the grid (or the defaults
                of each [[grid]])
    [[grid]]    the same keys as [axes]; the runs are the union of the grids' products
    [budget]    one of tokens_per_param | tokens | steps; one of batch_tokens | batch_size |
                batch_tokens_bands ([[max_params, batch_tokens], ...], first band that fits);
                param_basis for N: "non_embedding" (default) | "total" | "nominal" (paper label)
    [sizes.X]   a custom shape: base (a table size), then any config fields (d_model, ...)
    [strategies.X]  gin_file, gin_files, gin, budget  -- per-strategy settings
    [[override]]    where = {coordinate = value or [values]}, budget, gin, gin_files
    [[exclude]]     where = {...}
    [zeroshot]      tasks ("paper" | "local" | {lang = [tasks]}), languages, strategies, limit,
                    batch_size, local_dir -- score each run's final checkpoint once it completes
                    (`launch.zeroshot_stage`)
    [[select]]      name, strategy, over (coordinates), metric (metrics.jsonl key, `{task}` filled
                    from the run), rule ("min" | "max"), where, at ("last" | "best": the
                    last logged value, or the best evaluated step, `launch.best_checkpoint`)
                    -- pick one run per group of runs
                    that differ only in `over`; dependents of that strategy start from the chosen
                    run (`launch.select_tables`, `launch.run_selection`)
    [design]        runs = [run ids, or their slugs without the hash] -- a designed subset
                    (`xlscale sweep design`, `launch.design`): `expand` keeps only these runs and
                    the runs they need, with the ids they have in the full grid (so runs already
                    done are reused); budget, hardware, mfu, criterion, prior, cost, full_cost,
                    widths, full_widths: what the design was made for and predicts (informational)

Manifest variables name the environment (data and vocabulary locations): ids hash them by name,
not by value, so the same study has the same run ids on every machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from launch import budgets, run_settings, sbatch_options, select_tables, t5x_runner
from launch.manifest_checks import check_keys, require
from launch.runs import RUNNERS, substitute
from launch.select_tables import SelectSpec
from launch.strategies import AXES, COORD_MACROS, STRATEGIES
from launch.zeroshot_stage import ZeroshotStage, parse_stage
from modeling import family as family_lib
from trainer import gin_checks

COMPUTED_MACROS = frozenset(
    {
        "MODEL_DIR",
        "TRAIN_STEPS",
        "BATCH_SIZE",
        "INIT_CHECKPOINT",
        # The budget's own (`[budget] param_basis`, `tokens_per_param`): one value per run.
        "PARAM_BASIS",
        "TOKENS_PER_PARAM",
        *COORD_MACROS.values(),
    }
)
_TOP_KEYS = frozenset(
    "sweep vars env slurm gin axes grid budget sizes strategies override exclude select "
    "settings zeroshot design".split()
)
# [design]: the runs kept, and what the design was made for and predicts (informational).
DESIGN_KEYS = (
    "runs budget hardware mfu criterion law prior cost full_cost widths full_widths".split()
)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A parsed, validated manifest (see the module docstring for the schema)."""

    name: str
    path: str
    description: str
    family: str
    runs_dir: str
    seq_len: int
    gin_files: tuple[str, ...]
    gin_search_paths: tuple[str, ...]
    variables: Mapping[str, str]
    env: Mapping[str, str]
    gin: Mapping[str, Any]
    grids: tuple[Mapping[str, tuple], ...]
    budget: Mapping[str, Any]
    sizes: Mapping[str, Mapping[str, Any]]
    strategies: Mapping[str, Mapping[str, Any]]
    overrides: tuple[Mapping[str, Any], ...]
    excludes: tuple[Mapping[str, Any], ...]
    selects: tuple[SelectSpec, ...] = ()
    # [zeroshot]: the stage that scores the runs once trained (`launch.zeroshot_stage`).
    zeroshot: ZeroshotStage | None = None
    runner: str = "xlscale"
    t5x_paths: t5x_runner.T5xPaths = t5x_runner.T5xPaths()
    sbatch_lines: tuple[str, ...] = ()  # [slurm] sbatch_lines, checked
    # [sweep] hardware: the slice the runs are planned for (`sweep run`/`plan` give each run the
    # remat policy and microbatches that fit it, `launch.estimate.memory_plan`); None: as set.
    hardware: str | None = None
    # [settings]: how the runs are scored (`launch.run_settings`), variables unsubstituted.
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # [design] runs: the designed subset (ids or slugs) `expand` keeps; None: every run.
    design_runs: tuple[str, ...] | None = None
    # [design] law: the laws the design scored ("paper" when the table does not say; None
    # without a table), the adaptive sweep's default.
    design_law: str | None = None

    def missing_variables(self) -> list[str]:
        """Variables that have no value yet (declared as "" and not given)."""
        return sorted(k for k, v in self.variables.items() if v == "")


def parse_manifest(
    data: Mapping[str, Any],
    *,
    path: str = "<manifest>",
    variables: Mapping[str, str] | None = None,
    runs_dir: str | None = None,
    runner: str | None = None,
    t5x_paths: t5x_runner.T5xPaths | None = None,
) -> Manifest:
    """Validates an already-parsed TOML mapping (see `load_manifest`)."""
    check_keys(data, _TOP_KEYS, path)
    sweep = data.get("sweep", {})
    sweep_keys = (
        "name description family runs_dir seq_len gin_files gin_search_paths runner hardware"
    )
    sweep_keys = sweep_keys.split()
    check_keys(sweep, sweep_keys, f"{path} [sweep]")
    require("name" in sweep, f"{path} [sweep]", "missing 'name'")
    family = sweep.get("family", "llama2")
    require(
        family in family_lib.FAMILIES,
        f"{path} [sweep] family",
        f"choose one of {family_lib.names()}",
    )
    runner = runner or sweep.get("runner", "xlscale")
    require(
        runner in RUNNERS,
        f"{path} [sweep] runner",
        f"unknown runner {runner!r}; choose one of {', '.join(RUNNERS)}",
    )
    declared = {k: str(v) for k, v in data.get("vars", {}).items()}
    given = dict(variables or {})
    unknown_vars = sorted(set(given) - set(declared))
    require(not unknown_vars, path, f"variables {unknown_vars} are not declared in [vars]")
    strategies = data.get("strategies", {})
    for name, settings in strategies.items():
        require(name in STRATEGIES, f"{path} [strategies]", f"unknown strategy {name!r}")
        check_keys(
            settings, ("gin_file", "gin_files", "gin", "budget"), f"{path} [strategies.{name}]"
        )
    sizes = data.get("sizes", {})
    for name, shape in sizes.items():
        require(
            "base" in shape, f"{path} [sizes.{name}]", "a custom size needs 'base' (a table size)"
        )
    axes = data.get("axes", {})
    grids = [{**axes, **grid} for grid in data.get("grid", [])] or [axes]
    for i, grid in enumerate(grids):
        where = f"{path} grid {i}"
        check_keys(grid, ("strategies", "gin_axes", *AXES), where)
        for key in ("strategies", "sizes"):
            require(bool(grid.get(key)), where, f"needs a non-empty '{key}' list")
        for s in grid["strategies"]:
            require(
                s in STRATEGIES,
                where,
                f"unknown strategy {s!r}; valid: {sorted(map(str, STRATEGIES))}",
            )
        if "gin_axes" in grid:
            grid["gin_axes"] = select_tables.parse_gin_axes(
                grid["gin_axes"], where=f"{where} gin_axes", computed=COMPUTED_MACROS
            )
    for table in data.get("override", []):
        check_keys(table, ("where", "budget", "gin", "gin_files"), f"{path} [[override]]")
    for table in data.get("exclude", []):
        check_keys(table, ("where",), f"{path} [[exclude]]")
    sbatch_lines = _sbatch_lines(data.get("slurm", {}), path)
    for key in data.get("gin", {}):
        require(key not in COMPUTED_MACROS, f"{path} [gin]", f"{key} is set by the sweep itself")
    # A coordinate set through gin would reach the run but not its id or coordinates (a
    # REPLAY_RATIO on plain CPT: recorded, never applied); coordinates come from the axes.
    coordinate_tables = [
        *((f"[strategies.{n}] gin", s.get("gin", {})) for n, s in strategies.items()),
        *(
            (f"[[override]] {i} gin", t.get("gin", {}))
            for i, t in enumerate(data.get("override", []))
        ),
    ]
    axis_of = {COORD_MACROS[coord]: axis for axis, coord in AXES.items() if coord in COORD_MACROS}
    for where, table in coordinate_tables:
        for key in table:
            require(
                key not in axis_of,
                f"{path} {where}",
                f"{key} is a sweep coordinate: set it with the axis {axis_of.get(key)!r} of [axes]",
            )
    _check_gin_macros(data, path=path, variables={**declared, **given}, grids=grids)
    coordinates: dict[str, set[str]] = {}
    for grid in grids:
        for s in grid["strategies"]:
            names = {"size", "seed", *STRATEGIES[s].axes, *grid.get("gin_axes", {})}
            coordinates.setdefault(s, set()).update(names)
    selects = select_tables.parse_selects(
        data.get("select", []), path=path, strategies=STRATEGIES, coordinates=coordinates
    )
    manifest = Manifest(
        name=sweep["name"],
        path=path,
        description=sweep.get("description", ""),
        family=family,
        runs_dir=runs_dir or sweep.get("runs_dir", f"runs/{sweep['name']}"),
        seq_len=int(
            sweep["seq_len"] if "seq_len" in sweep else family_lib.get(family).default_seq_len
        ),
        gin_files=tuple(sweep.get("gin_files", ())),
        gin_search_paths=tuple(sweep.get("gin_search_paths", ())),
        variables={**declared, **given},
        env={k: str(v) for k, v in data.get("env", {}).items()},
        gin=dict(data.get("gin", {})),
        grids=tuple({k: (v if k == "gin_axes" else tuple(v)) for k, v in g.items()} for g in grids),
        budget=dict(data.get("budget", {})),
        sizes={k: dict(v) for k, v in sizes.items()},
        strategies={k: dict(v) for k, v in strategies.items()},
        overrides=tuple(data.get("override", [])),
        excludes=tuple(data.get("exclude", [])),
        selects=selects,
        zeroshot=parse_stage(data.get("zeroshot"), path=path),
        runner=runner,
        t5x_paths=t5x_paths or t5x_runner.T5xPaths.resolve(),
        sbatch_lines=sbatch_lines,
        hardware=sweep.get("hardware"),
        settings=run_settings.parse(
            data.get("settings", {}),
            where=f"{path} [settings]",
            substitute=lambda v: substitute(v, {**declared, **given}, allow_missing=True),
        ),
        design_runs=_design_runs(data.get("design"), path),
        design_law=_design_law(data.get("design"), path),
    )
    if manifest.budget:  # fail early on a bad rule (strategies may each bring their own)
        budgets.resolve(manifest.budget, where=f"{path} [budget]")
    return manifest


def _design_runs(table: Mapping[str, Any] | None, path: str) -> tuple[str, ...] | None:
    """The manifest's `[design] runs` (None without a [design] table).

    Raises:
      ValueError: an unknown key, or `runs` missing, empty or not a list of strings.
    """
    if table is None:
        return None
    where = f"{path} [design]"
    check_keys(table, DESIGN_KEYS, where)
    runs = table.get("runs")
    require(
        isinstance(runs, list) and runs and all(isinstance(r, str) for r in runs),
        f"{where} runs",
        f"{runs!r}: give a non-empty list of run ids (`xlscale sweep plan` lists them)",
    )
    return tuple(runs)


def _design_law(table: Mapping[str, Any] | None, path: str) -> str | None:
    """The manifest's `[design] law` ("paper" where a [design] table names none; None without
    a table).

    Raises:
      ValueError: a law that is not a string.
    """
    if table is None:
        return None
    law = table.get("law", "paper")
    require(isinstance(law, str), f"{path} [design] law", f"{law!r}: give a law's name")
    return law


def _sbatch_lines(table: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """The manifest's `[slurm] sbatch_lines`, each checked (`launch.sbatch_options`).

    Raises:
      ValueError: naming the manifest, the key and the offending value.
    """
    check_keys(table, ("sbatch_lines",), f"{path} [slurm]")
    where = f"{path} [slurm] sbatch_lines"
    lines = table.get("sbatch_lines", [])
    require(isinstance(lines, list), where, f"{lines!r}: give a list of sbatch options")
    return tuple(sbatch_options.sbatch_option(line, where=where) for line in lines)


def _check_gin_macros(
    data: Mapping[str, Any],
    *,
    path: str,
    variables: Mapping[str, str],
    grids: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Every macro a manifest sets (`[gin]`, `[strategies.X] gin`, `[[override]] gin`, the
    `gin_axes` of its grids) must be
    read by some gin file (the shipped configs, the manifest's gin files and their includes), so a
    misspelt one fails here instead of running the whole sweep on defaults.

    Raises:
      trainer.validation.ConfigError: naming the manifest, the table, the key and the nearest
        macros.
    """
    sweep_table = data.get("sweep", {})
    search_paths = [
        substitute(p, variables, allow_missing=True)
        for p in sweep_table.get("gin_search_paths", ())
    ]
    names = list(sweep_table.get("gin_files", ()))
    tables = [("[gin]", data.get("gin", {}))]
    for name, settings in data.get("strategies", {}).items():
        names += [settings.get("gin_file", ""), *settings.get("gin_files", ())]
        tables.append((f"[strategies.{name}] gin", settings.get("gin", {})))
    for i, table in enumerate(data.get("override", [])):
        names += list(table.get("gin_files", ()))
        tables.append((f"[[override]] {i} gin", table.get("gin", {})))
    for i, grid in enumerate(grids):
        axes = {macro: values[0] for macro, values in grid.get("gin_axes", {}).items()}
        tables.append((f"grid {i} gin_axes", axes))
    files = [substitute(n, variables, allow_missing=True) for n in names if n]
    for where, settings in tables:
        gin_checks.check_macro_table(
            settings, where=f"{path} {where}", files=files, search_paths=search_paths
        )


def matches(coords: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    """Whether `coords` match a `where` table (each key equal to its value or one of a list)."""
    for key, wanted in where.items():
        values = wanted if isinstance(wanted, list) else [wanted]
        if key not in coords or coords[key] not in values:
            return False
    return True
