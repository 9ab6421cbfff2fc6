"""Sweep manifests: a TOML file that names a study's grid, expanded into concrete training runs.

A manifest is a product of axes (sizes, strategies, target languages, replay ratios, mixtures,
tasks, seeds, ...) plus a token-budget rule and gin overrides. `load_manifest` parses and
validates it; `expand` turns it into `Run`s, each with a stable id (a hash of its resolved
configuration), its `MODEL_DIR`, its dependencies (a CPT run needs its size's source checkpoint,
a finetuning run its pretraining checkpoint) and the exact `python -m trainer.train` argv.

Schema (every table optional unless said):

    [sweep]     name (required), description, family ("llama2" | "t5"), runs_dir, seq_len,
                gin_files (overlays after each strategy's file), gin_search_paths,
                runner ("xlscale" | "t5x": real T5X's `t5x.train`, `launch.t5x_runner`),
                hardware (a slice, e.g. "v5p-128", "8xH100": each run gets the remat policy
                and NUM_MICROBATCHES that fit one of its chips, `launch.estimate.memory_plan`)
    [vars]      NAME = "default"  -- `${NAME}` in any string below; "" means "must be given"
    [env]       environment for every launched job
    [slurm]     sbatch_lines = ["--constraint=h100", ...]  -- extra `#SBATCH` lines of every job
                under the SLURM launcher (before its `--sbatch-line`s; other launchers ignore them)
    [gin]       KEY = value       -- `--gin.KEY=value` for every run
    [axes]      sizes, strategies, seeds, target_langs, replay_ratios, mixtures, tasks,
                finetune_tokens, init_steps, gin_axes = {MACRO = [values]} (a grid over any
                gin macro, e.g. a learning rate)  -- the grid (or the defaults of each [[grid]])
    [[grid]]    the same keys as [axes]; the runs are the union of the grids' products
    [budget]    one of tokens_per_param | tokens | steps; one of batch_tokens | batch_size |
                batch_tokens_bands ([[max_params, batch_tokens], ...], first band that fits);
                param_basis for N: "non_embedding" (default) | "total" | "nominal" (paper label)
    [sizes.X]   a custom shape: base (a table size), then any config fields (d_model, ...)
    [strategies.X]  gin_file, gin_files, gin, budget  -- per-strategy settings
    [[override]]    where = {coordinate = value or [values]}, budget, gin, gin_files
    [[exclude]]     where = {...}
    [[select]]      name, strategy, over (coordinates), metric (metrics.jsonl key, `{task}` filled
                    from the run), rule ("min" | "max"), where -- pick one run per group of runs
                    that differ only in `over`; dependents of that strategy start from the chosen
                    run (`launch.select_spec`, `launch.selection`)

Manifest variables name the environment (data and vocabulary locations): ids hash them by name,
not by value, so the same study has the same run ids on every machine.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import heapq
import itertools
import json
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from launch import budgets, sbatch_options, select_spec, t5x_runner
from launch import strategies as strategies_lib
from launch.select_spec import SelectSpec
from launch.strategies import AXES, COORD_MACROS, STRATEGIES, Counts, Strategy
from modeling import family as family_lib
from rundir import finetune_recipes
from trainer import gin_checks

MANIFESTS_DIR = Path(__file__).parent / "manifests"
TRAIN_MODULE = "trainer.train"
COMPUTED_MACROS = frozenset(
    {"MODEL_DIR", "TRAIN_STEPS", "BATCH_SIZE", "INIT_CHECKPOINT", *COORD_MACROS.values()}
)
PARAM_BASES = budgets.PARAM_BASES
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOP_KEYS = frozenset(
    "sweep vars env slurm gin axes grid budget sizes strategies override exclude select".split()
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
    runner: str = "xlscale"
    t5x_paths: t5x_runner.T5xPaths = t5x_runner.T5xPaths()
    sbatch_lines: tuple[str, ...] = ()  # [slurm] sbatch_lines, checked
    # [sweep] hardware: the slice the runs are planned for (`sweep run`/`plan` give each run the
    # remat policy and microbatches that fit it, `launch.estimate.memory_plan`); None: as set.
    hardware: str | None = None

    def missing_variables(self) -> list[str]:
        """Variables that have no value yet (declared as "" and not given)."""
        return sorted(k for k, v in self.variables.items() if v == "")


@dataclasses.dataclass(frozen=True)
class Run:
    """One training job: its identity, budget, gin configuration and dependencies."""

    run_id: str
    strategy: str
    family: str
    size: str
    base_size: str  # the size-table entry the model starts from
    overrides: tuple[tuple[str, Any], ...]  # config fields replaced (custom shape, vocab_size)
    coords: tuple[tuple[str, Any], ...]
    seq_len: int
    batch_size: int
    steps: int
    counts: Counts | None
    gin_files: tuple[str, ...]
    gin_search_paths: tuple[str, ...]
    bindings: tuple[tuple[str, str], ...]  # (macro, gin literal); variables unsubstituted
    model_dir: str
    parent: str | None
    variables: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    # A run that starts from the run a [[select]] chooses: "<select name>: <group>". Until the
    # choice is made (selection.json), `parent` is None and the run waits for all `candidates`.
    selected_from: str | None = None
    candidates: tuple[str, ...] = ()
    # What runs the job (a key of RUNNERS); for "t5x", where T5X's and our code are, the gin-axis
    # macros passed on, and the manifest (named in errors).
    runner: str = "xlscale"
    t5x_paths: t5x_runner.T5xPaths = t5x_runner.T5xPaths()
    gin_axes: tuple[str, ...] = ()
    manifest_path: str = ""
    # Extra `#SBATCH` options from the manifest's [slurm] table: where the job runs, not what it
    # computes, so not part of the run's id.
    sbatch_lines: tuple[str, ...] = ()

    @property
    def waits_for_selection(self) -> bool:
        """Whether the run starts from a selected run that is not chosen yet."""
        return self.selected_from is not None and self.parent is None

    @property
    def tokens(self) -> int:
        """Training tokens the run consumes: steps × batch × sequence length."""
        return self.steps * self.batch_size * self.seq_len

    @property
    def depends_on(self) -> tuple[str, ...]:
        """Ids of the runs whose checkpoints this run needs (all candidates of a pending
        selection)."""
        return (self.parent,) if self.parent else self.candidates

    @property
    def flops(self) -> float | None:
        """C = 6·N·D with N non-embedding (None when the counts are unknown)."""
        return None if self.counts is None else self.counts.flops_per_token * self.tokens

    @property
    def cost(self) -> float | None:
        """FLOPs the run actually computes (attention and output projection included)."""
        return None if self.counts is None else self.counts.cost_per_token * self.tokens

    def coord(self, name: str, default: Any = None) -> Any:
        """The run's value on coordinate `name` (size, seed, target_lang, ...)."""
        return dict(self.coords).get(name, default)

    @property
    def module(self) -> str:
        """The Python module the job runs (`trainer.train`, or `t5x.train` for the t5x runner)."""
        return RUNNERS[self.runner].module

    @property
    def done_marker(self) -> str:
        """The path under MODEL_DIR that exists once the job finished (`COMPLETED`; for T5X,
        which writes no marker, its checkpoint at the last step)."""
        return RUNNERS[self.runner].done_marker(self)

    def environment(self, *, allow_missing: bool = False) -> dict[str, str]:
        """Environment variables for the job, with manifest variables substituted (the t5x
        runner adds `XLSCALE_VOCAB_PATH` and `XLSCALE_DATA_DIR`)."""
        env = {**dict(self.env), **RUNNERS[self.runner].environment(self)}
        variables = dict(self.variables)
        return {k: substitute(v, variables, allow_missing=allow_missing) for k, v in env.items()}

    def gin_args(self, *, allow_missing: bool = False) -> list[str]:
        """The job's flags: `--gin_search_paths`, `--gin_file`s and `--gin.KEY=VALUE`s (the
        trainer's, or `t5x.train`'s for the t5x runner, `launch.t5x_runner`).

        Raises:
          ValueError: a manifest variable without a value, or a run that starts from a selected
            run not chosen yet (neither with `allow_missing`, for dry runs and plans).
        """
        if self.waits_for_selection and not allow_missing:
            raise ValueError(
                f"run {self.run_id} starts from the run chosen by [[select]] {self.selected_from}"
                ", which is not chosen yet; run its candidates, then `xlscale sweep select`"
            )
        args = RUNNERS[self.runner].gin_args(self, allow_missing)
        variables = dict(self.variables)
        return [substitute(a, variables, allow_missing=allow_missing) for a in args]

    def argv(self, python: str | None = None, *, allow_missing: bool = False) -> list[str]:
        """The exact command line: `python -m trainer.train --gin_file=... --gin.K=V ...` (or
        `python -m t5x.train ...` for the t5x runner).

        Raises:
          ValueError: see `gin_args`.
        """
        python = python or sys.executable
        return [python, "-m", self.module, *self.gin_args(allow_missing=allow_missing)]


def _trainer_args(run: Run, allow_missing: bool) -> list[str]:
    """xlscale's trainer flags: the run's gin search paths, files and every binding."""
    args = [f"--gin_search_paths={','.join(run.gin_search_paths)}"]
    args = args if run.gin_search_paths else []
    args += [f"--gin_file={f}" for f in run.gin_files]
    return args + [f"--gin.{key}={value}" for key, value in run.bindings]


def _t5x_args(run: Run, allow_missing: bool) -> list[str]:
    return t5x_runner.gin_args(
        run, paths=run.t5x_paths, gin_axes=run.gin_axes, allow_missing=allow_missing
    )


@dataclasses.dataclass(frozen=True)
class Runner:
    """What runs a sweep's jobs: the module `python -m` starts, its flags (manifest variables
    unsubstituted), its extra environment, and the path under MODEL_DIR whose existence says the
    job finished, each from the `Run`."""

    module: str
    gin_args: Callable[[Run, bool], list[str]]
    environment: Callable[[Run], dict[str, str]]
    done_marker: Callable[[Run], str] = lambda run: "COMPLETED"


# Runner name (manifest `[sweep] runner`, `xlscale sweep ... --runner`) -> how its jobs start.
RUNNERS: dict[str, Runner] = {
    "xlscale": Runner(TRAIN_MODULE, _trainer_args, lambda run: {}),
    "t5x": Runner(
        t5x_runner.MODULE,
        _t5x_args,
        lambda run: t5x_runner.environment(run, manifest=run.manifest_path),
        t5x_runner.done_marker,
    ),
}


def substitute(text: str, variables: Mapping[str, str], *, allow_missing: bool = False) -> str:
    """Replaces `${NAME}` with the variable's value; a missing or empty one is an error unless
    `allow_missing` (then it stays as written, for dry runs)."""

    def one(match: re.Match) -> str:
        value = variables.get(match.group(1), "")
        if value == "":
            if allow_missing:
                return match.group(0)
            raise ValueError(
                f"manifest variable {match.group(1)} has no value; pass --var {match.group(1)}=..."
            )
        return value

    return _VAR.sub(one, text)


def gin_literal(value: Any) -> str:
    """A Python/TOML value as a gin literal. Strings starting with `@` or `%` are references and
    pass through raw; other strings become quoted gin strings."""
    if isinstance(value, str):
        return value if value[:1] in ("@", "%") else repr(value)
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(gin_literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(f"{gin_literal(k)}: {gin_literal(v)}" for k, v in value.items()) + "}"
        )
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as a gin literal")


def _require(ok: bool, where: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {message}")


def _check_keys(table: Mapping, allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    _require(not unknown, where, f"unknown keys {unknown}; valid: {sorted(allowed)}")


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
    _check_keys(data, _TOP_KEYS, path)
    sweep = data.get("sweep", {})
    sweep_keys = (
        "name description family runs_dir seq_len gin_files gin_search_paths runner hardware"
    )
    sweep_keys = sweep_keys.split()
    _check_keys(sweep, sweep_keys, f"{path} [sweep]")
    _require("name" in sweep, f"{path} [sweep]", "missing 'name'")
    family = sweep.get("family", "llama2")
    _require(
        family in family_lib.FAMILIES,
        f"{path} [sweep] family",
        f"choose one of {family_lib.names()}",
    )
    runner = runner or sweep.get("runner", "xlscale")
    _require(
        runner in RUNNERS,
        f"{path} [sweep] runner",
        f"unknown runner {runner!r}; choose one of {', '.join(RUNNERS)}",
    )
    declared = {k: str(v) for k, v in data.get("vars", {}).items()}
    given = dict(variables or {})
    unknown_vars = sorted(set(given) - set(declared))
    _require(not unknown_vars, path, f"variables {unknown_vars} are not declared in [vars]")
    strategies = data.get("strategies", {})
    for name, settings in strategies.items():
        _require(name in STRATEGIES, f"{path} [strategies]", f"unknown strategy {name!r}")
        _check_keys(
            settings, ("gin_file", "gin_files", "gin", "budget"), f"{path} [strategies.{name}]"
        )
    sizes = data.get("sizes", {})
    for name, shape in sizes.items():
        _require(
            "base" in shape, f"{path} [sizes.{name}]", "a custom size needs 'base' (a table size)"
        )
    axes = data.get("axes", {})
    grids = [{**axes, **grid} for grid in data.get("grid", [])] or [axes]
    for i, grid in enumerate(grids):
        where = f"{path} grid {i}"
        _check_keys(grid, ("strategies", "gin_axes", *AXES), where)
        for key in ("strategies", "sizes"):
            _require(bool(grid.get(key)), where, f"needs a non-empty '{key}' list")
        for s in grid["strategies"]:
            _require(s in STRATEGIES, where, f"unknown strategy {s!r}; valid: {sorted(STRATEGIES)}")
        if "gin_axes" in grid:
            grid["gin_axes"] = select_spec.parse_gin_axes(
                grid["gin_axes"], where=f"{where} gin_axes", computed=COMPUTED_MACROS
            )
    for table in data.get("override", []):
        _check_keys(table, ("where", "budget", "gin", "gin_files"), f"{path} [[override]]")
    for table in data.get("exclude", []):
        _check_keys(table, ("where",), f"{path} [[exclude]]")
    sbatch_lines = _sbatch_lines(data.get("slurm", {}), path)
    for key in data.get("gin", {}):
        _require(key not in COMPUTED_MACROS, f"{path} [gin]", f"{key} is set by the sweep itself")
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
            _require(
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
    selects = select_spec.parse_selects(
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
        runner=runner,
        t5x_paths=t5x_paths or t5x_runner.T5xPaths.resolve(),
        sbatch_lines=sbatch_lines,
        hardware=sweep.get("hardware"),
    )
    if manifest.budget:  # fail early on a bad rule (strategies may each bring their own)
        budgets.resolve(manifest.budget, where=f"{path} [budget]")
    return manifest


def _sbatch_lines(table: Mapping[str, Any], path: str) -> tuple[str, ...]:
    """The manifest's `[slurm] sbatch_lines`, each checked (`launch.sbatch_options`).

    Raises:
      ValueError: naming the manifest, the key and the offending value.
    """
    _check_keys(table, ("sbatch_lines",), f"{path} [slurm]")
    where = f"{path} [slurm] sbatch_lines"
    lines = table.get("sbatch_lines", [])
    _require(isinstance(lines, list), where, f"{lines!r}: give a list of sbatch options")
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
        select_spec.axis_slug(key, value)
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

    def _build(self, strategy: Strategy, coords: dict[str, Any]) -> Run:
        m, where = self.m, f"{self.m.path} run {strategy.name} {coords}"
        _require(strategy.family == m.family, where, f"strategy is for family {strategy.family!r}")
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
        _require(not clash, where, f"gin sets {clash}, which the sweep computes")

        size = coords["size"]
        shape = dict(m.sizes.get(size, {}))
        base = shape.pop("base", size)
        # Custom shape fields join any MODEL_OVERRIDES the gin settings give (e.g. vocab_size).
        overrides = gin.pop("MODEL_OVERRIDES", {})
        _require(isinstance(overrides, Mapping), where, "MODEL_OVERRIDES must be a table")
        overrides = {**overrides, **shape}
        counts = self.counts(base, overrides, where)
        basis = budget.get("param_basis", "non_embedding")
        params = None
        if basis == "nominal":
            params = self.family.nominal_params(base)
        elif counts is not None:
            params = (
                counts.params_non_embedding if basis == "non_embedding" else counts.params_total
            )
        steps, batch_size = budgets.steps_and_batch(
            budget, params=params, seq_len=m.seq_len, where=where
        )
        if "FINETUNE_RECIPE" in gin:  # the recipe names the length: the budget must agree
            recipe = finetune_recipes.recipe(str(gin["FINETUNE_RECIPE"]))
            _require(
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
        if "TASK_FEATURE_LENGTHS" not in gin:  # a manifest may set its own (e.g. T5 targets 114)
            lengths = {k: m.seq_len for k in self.family.feature_keys}
            bindings["TASK_FEATURE_LENGTHS"] = gin_literal(lengths)
        bindings.update({k: gin_literal(v) for k, v in sorted(gin.items())})
        for name, value in sorted(coords.items()):
            if name not in _STANDARD_COORDS:  # a gin_axes coordinate
                _require(name not in gin, where, f"{name} is a grid dimension and also set in gin")
                bindings[name] = gin_literal(value)
        identity = {
            "family": m.family,
            "strategy": strategy.name,
            "coords": sorted(coords.items()),
            "shape": sorted(m.sizes.get(size, {}).items()),
            "gin_files": gin_files,
            "bindings": sorted(bindings.items()),
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
            runner=m.runner,
            t5x_paths=m.t5x_paths,
            gin_axes=gin_axes,
            manifest_path=m.path,
            sbatch_lines=m.sbatch_lines,
        )
        if m.runner == "t5x":
            t5x_runner.check(run, manifest=m.path)
        return run

    def _parent(
        self, strategy: Strategy, coords: Mapping[str, Any], where: str
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
        _require(
            len(specs) == 1,
            where,
            f"starts from {name} runs that vary over {sorted(extra)}; "
            + (
                f"[[select]] tables {[s.name for s in specs]} all choose among them; keep one"
                if specs
                else f"add a [[select]] with strategy = {name!r}, over = {sorted(extra)} "
                "(or give this run the same grid)"
            ),
        )
        spec = specs[0]
        group = select_spec.group_key({**shared, **candidates[0]}, spec.over)
        runs = [self.run(name, c) for c in candidates]
        chosen = self.chosen.get((spec.name, group))
        parent = next((r for r in runs if r.run_id == chosen), None)
        return parent, f"{spec.name}: {group}", tuple(r.run_id for r in runs)


def expand(manifest: Manifest, *, selection: Mapping[str, Any] | None = None) -> list[Run]:
    """All runs of a manifest in dependency order (parents first, then manifest order), with
    missing parents (e.g. the source run of a replay-only study) added. Duplicates collapse.

    Args:
      manifest: the parsed manifest.
      selection: the contents of the sweep's selection.json (`launch.selection.read`), whose
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
    return topological_order(list(unique.values()))


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
        _require(
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
            _require(dep in by_id, r.run_id, f"depends on {dep}, which is not in the sweep")
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
    _require(not left, "sweep", f"dependency cycle among {left}")
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
