"""The `t5x` runner: a sweep's runs as real T5X jobs (`python -m t5x.train`), not xlscale's trainer.

A manifest with `[sweep] runner = "t5x"` (or `xlscale sweep run ... --runner t5x`) keeps its grid,
ids, dependencies and launchers; only each run's command changes, to the form agreed with the
gin files under `t5x_configs/t5x/`:

    python -m t5x.train --gin_search_paths=<repo>/t5x_configs,<T5X_DIR>
      --gin_file=t5x/models/<t5_770m|t5_3b|tiny>.gin --gin_file=t5x/runs/<span_pretrain|finetune>.gin
      --gin.MODEL_DIR="'<dir>'" --gin.MIXTURE_OR_TASK_NAME="'<task>'" --gin.TRAIN_STEPS=<N>
      --gin.MIXTURE_OR_TASK_MODULE="'t5x_configs.t5x_tasks'" --gin.RANDOM_SEED=<seed>
      [--gin.INITIAL_CHECKPOINT_PATH="'<pretrain dir>/checkpoint_<step>'"]

with the environment `XLSCALE_VOCAB_PATH` and `XLSCALE_DATA_DIR` (the manifest's `VOCAB_PATH` and
`DATA_DIR`, which `t5x_configs.t5x_tasks` reads), and for a finetune with Df in the paper's unit
`XLSCALE_FINETUNE_PAIRS` = Df / 512 (the task module cuts the translation task's train split to
its first that many pairs; a token-budget Df has no T5X form and is refused). A finetune restores the checkpoint's step and
T5X counts `TRAIN_STEPS` from 0 (its finetune.gin: "TRAIN_STEPS includes pretrain steps"), so a
finetune's TRAIN_STEPS is its init step + its own steps, and its own steps are also given as
`FINETUNE_STEPS` (t5x/runs/finetune.gin's `TRAIN_STEPS_RELATIVE`, which T5X prefers) with the
manifest's `FINETUNE_RECIPE` (its name, recorded in config.gin); the `t5_tiny`
size is `t5x/models/tiny.gin` as an overlay after the run file; a non-pretrained baseline
(`finetune_scratch`) binds `INITIAL_CHECKPOINT_PATH = None` (T5X then restores nothing). The
manifest's gin-axis macros (a learning-rate grid) and a finetune's Df (`FINETUNE_TOKENS`) follow
as `--gin.<MACRO>=<value>`, so the runs of a grid differ; the manifest's `MODEL_OVERRIDES` follow
as the t5x/models/t5.gin macros that bind the same `sizes.get_config` fields (`vocab_size` ->
`VOCAB_SIZE`: the MT paper's 250,112 rows, not T5's 32,128), and a run whose overrides have no such
macro is refused, naming them. `EVAL_AT_START` is passed under its name (the run files bind it
to T5X's `run_eval_before_training`, the step-0 evaluation); a log-spaced `EVAL_SCHEDULE` has no
T5X form and is refused; the other `[gin]` settings are xlscale trainer macros and are not
passed. A finetune's `EVAL_PERIOD` (its evaluations and decodes, among which the best validation
step is chosen, `launch.best_checkpoint`) and `CHECKPOINT_PERIOD` are passed when the manifest
sets them (T5X keeps every checkpoint it saves). A `FINETUNE_RECIPE` grid axis is passed once.

COMET: with the manifest's `[settings] COMET_MODEL` (`launch.run_settings`) a finetune runs as
`python -m launch.t5x_comet <the same flags>`, which runs `t5x.train`, then scores every
inference output T5X wrote (`inference_eval/<task>-<step>.jsonl`) with the project's COMET worker
(`pipelines.comet.scoring`, 0-100) into `inference_eval/<task>/` as `eval/comet`, where
`fitting.readers.t5x_runs` reads `eval/<task>/comet` as for xlscale's runs. The job's environment
carries `XLSCALE_COMET_MODEL` and `COMET_PYTHON`, and `--gin.COMET_MODEL` records the model in
config.gin (the MT report names it).
"""

from __future__ import annotations

import ast
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rundir.run_record import FINETUNES, Strategy

MODULE = "t5x.train"
TASK_MODULE = "t5x_configs.t5x_tasks"
T5X_DIR_ENV = "T5X_DIR"
REPO_ROOT = Path(__file__).resolve().parent.parent
# Size-table name -> (model file under t5x_configs/, overlays given after the run file). `tiny.gin`
# is an overlay (size, vocabulary rows, lengths, batch, periods) over a full model file.
MODEL_GIN: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "t5_770m": ("t5x/models/t5_770m.gin", ()),
    "t5_3b": ("t5x/models/t5_3b.gin", ()),
    "t5_tiny": ("t5x/models/t5_770m.gin", ("t5x/models/tiny.gin",)),
}
# Strategy -> (run file under t5x_configs/, the coordinate naming its MIXTURE_OR_TASK_NAME).
RUN_GIN: Mapping[Strategy, tuple[str, str]] = {
    Strategy.PRETRAIN: ("t5x/runs/span_pretrain.gin", "mixture"),
    Strategy.FINETUNE: ("t5x/runs/finetune.gin", "task"),
    Strategy.FINETUNE_SCRATCH: ("t5x/runs/finetune.gin", "task"),
}
# Coordinates passed on as macros beyond the agreed form: the finetuning set size Df (recorded in
# T5X's config.gin, gin.config_str(), where `fitting.readers.t5x_runs` reads it back; the set itself is
# cut by `t5x_configs.t5x_tasks` from `XLSCALE_FINETUNE_PAIRS`, see `environment`).
PASSED_COORDS: Mapping[str, str] = {"finetune_tokens": "FINETUNE_TOKENS"}
PAIRS_ENV = "XLSCALE_FINETUNE_PAIRS"
# `MODEL_OVERRIDES` field (a `t5_jax` T5Config field) -> the t5x/models/t5.gin macro bound to that
# keyword of `sizes.get_config`. Only these reach T5X: the other fields have no binding there, so
# a run overriding them would silently train the size table's shape (and is refused instead).
OVERRIDE_MACROS: Mapping[str, str] = {"vocab_size": "VOCAB_SIZE", "dtype": "ACTIVATION_DTYPE"}
# Environment of a T5X job -> the manifest [gin] macro whose value it carries.
ENV_FROM_GIN: Mapping[str, str] = {
    "XLSCALE_VOCAB_PATH": "VOCAB_PATH",
    "XLSCALE_DATA_DIR": "DATA_DIR",
}
# xlscale trainer macros a manifest may set that the t5x/runs/ gin files bind under the same name
# (EVAL_AT_START -> T5X's `run_eval_before_training`, the step-0 evaluation).
PASSED_MACROS: tuple[str, ...] = ("EVAL_AT_START",)
# Finetune macros t5x/runs/finetune.gin binds under the same names: evaluate (validation loss and
# decoding) and save every so many steps, so that the best validation step can be chosen.
PASSED_FINETUNE_MACROS: tuple[str, ...] = ("EVAL_PERIOD", "CHECKPOINT_PERIOD")
# The wrapper a finetune with COMET runs as (`t5x.train`, then COMET on its inference outputs),
# and the environment variable naming the COMET checkpoint there.
COMET_MODULE = "launch.t5x_comet"
COMET_MODEL_ENV = "XLSCALE_COMET_MODEL"
COMET_PYTHON_ENV = "COMET_PYTHON"
# EVAL_SCHEDULE values T5X can run: its train loop evaluates every `eval_period` steps only, so a
# log-spaced schedule (trainer/eval_schedule.py) has no T5X form and is refused, not dropped.
T5X_EVAL_SCHEDULES: tuple[str, ...] = ("periodic",)


@dataclasses.dataclass(frozen=True)
class T5xPaths:
    """Where the T5X jobs find their code.

    Attributes:
      t5x_dir: T5X's source checkout (its `t5x/configs/...` gin files); "" when not given
        (`--t5x-dir` or `$T5X_DIR`): dry runs show `${T5X_DIR}`, real launches refuse.
      repo_dir: the xlscale checkout on the machines that run the jobs (`<repo>/t5x_configs`).
    """

    t5x_dir: str = ""
    repo_dir: str = str(REPO_ROOT)

    @classmethod
    def resolve(cls, *, t5x_dir: str | None = None, repo_dir: str | None = None) -> T5xPaths:
        """The paths given, else `$T5X_DIR` and this checkout."""
        return cls(
            t5x_dir=t5x_dir or os.environ.get(T5X_DIR_ENV, ""),
            repo_dir=repo_dir or str(REPO_ROOT),
        )


def module(settings: Mapping[str, str]) -> str:
    """The module a run with these active [settings] starts: `t5x.train`, or with COMET_MODEL
    the wrapper that also scores COMET (`launch.t5x_comet`)."""
    return COMET_MODULE if "COMET_MODEL" in settings else MODULE


def _bindings(run: Any) -> dict[str, str]:
    return dict(run.bindings)


def _where(run: Any, manifest: str) -> str:
    return f"{manifest} run {run.run_id} ({run.strategy}, size {run.base_size})"


def model_overrides(run: Any) -> dict[str, Any]:
    """The run's `MODEL_OVERRIDES` (the manifest's and its custom shape's), {} when none."""
    value = _bindings(run).get("MODEL_OVERRIDES")
    return dict(_literal(value)) if value else {}


def check(run: Any, *, manifest: str) -> None:
    """Raises ValueError naming the manifest, the run and the allowed values when the run has no
    T5X form (a size or strategy without a gin file under t5x_configs/t5x/, or a
    `MODEL_OVERRIDES` field no t5x/ gin macro binds)."""
    unpassable = sorted(set(model_overrides(run)) - set(OVERRIDE_MACROS))
    if unpassable:
        raise ValueError(
            f"{_where(run, manifest)}: the t5x runner cannot pass MODEL_OVERRIDES "
            f"{', '.join(unpassable)} (no t5x/models/t5.gin macro binds them); passable: "
            f"{', '.join(OVERRIDE_MACROS)}"
        )
    schedule = str(_literal(_bindings(run).get("EVAL_SCHEDULE", "'periodic'")))
    if schedule not in T5X_EVAL_SCHEDULES:
        raise ValueError(
            f"{_where(run, manifest)}: EVAL_SCHEDULE = {schedule!r} has no T5X form (T5X "
            f"evaluates every EVAL_PERIOD steps, and before training with EVAL_AT_START); "
            f"allowed under the t5x runner: {', '.join(map(repr, T5X_EVAL_SCHEDULES))}"
        )
    if run.base_size not in MODEL_GIN:
        raise ValueError(
            f"{_where(run, manifest)}: the t5x runner has no model file for size "
            f"{run.base_size!r}; allowed: {', '.join(MODEL_GIN)}"
        )
    if run.strategy not in RUN_GIN:
        raise ValueError(
            f"{_where(run, manifest)}: the t5x runner has no run file for strategy "
            f"{str(run.strategy)!r}; allowed: {', '.join(RUN_GIN)}"
        )


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def _init_checkpoint(run: Any) -> str:
    """`<pretrain dir>/checkpoint_<step>` from the run's xlscale `INIT_CHECKPOINT` (`dir@step`)."""
    start = str(_literal(_bindings(run)["INIT_CHECKPOINT"]))
    directory, _, step = start.partition("@")
    return f"{directory.rstrip('/')}/checkpoint_{step or run.coord('init_step')}"


def total_steps(run: Any) -> int:
    """T5X's TRAIN_STEPS of a run: its steps, plus the restored step for a finetune."""
    steps = int(run.steps)
    if run.strategy == Strategy.FINETUNE:
        steps += int(run.coord("init_step") or 0)  # T5X counts on from the restored step
    return steps


def done_marker(run: Any) -> str:
    """T5X writes no COMPLETED: its checkpoint at the last step says the job finished."""
    return f"checkpoint_{total_steps(run)}"


def gin_args(
    run: Any, *, paths: T5xPaths, gin_axes: Sequence[str], allow_missing: bool = False
) -> list[str]:
    """The `t5x.train` flags of one run (see the module docstring).

    Raises:
      ValueError: no T5X source directory (unless `allow_missing`, for dry runs).
    """
    t5x_dir = paths.t5x_dir
    if not t5x_dir:
        if not allow_missing:
            raise ValueError(
                f"run {run.run_id}: the t5x runner needs T5X's source directory; "
                f"pass --t5x-dir DIR or set {T5X_DIR_ENV}"
            )
        t5x_dir = "${" + T5X_DIR_ENV + "}"
    run_file, task_coord = RUN_GIN[run.strategy]
    model_file, overlays = MODEL_GIN[run.base_size]
    bindings = _bindings(run)
    steps = total_steps(run)
    args = [
        f"--gin_search_paths={paths.repo_dir.rstrip('/')}/t5x_configs,{t5x_dir}",
        f"--gin_file={model_file}",
        f"--gin_file={run_file}",
        *(f"--gin_file={overlay}" for overlay in overlays),
        f"--gin.MODEL_DIR={bindings['MODEL_DIR']}",
        f"--gin.MIXTURE_OR_TASK_NAME={run.coord(task_coord)!r}",
        f"--gin.TRAIN_STEPS={steps}",
        f"--gin.MIXTURE_OR_TASK_MODULE={TASK_MODULE!r}",
        # The sweep's seed, as the trainer gets it (T5X's default None draws a time-based one).
        f"--gin.RANDOM_SEED={int(run.coord('seed') or 0)}",
    ]
    if run.strategy == Strategy.FINETUNE:
        args.append(f"--gin.INITIAL_CHECKPOINT_PATH={_init_checkpoint(run)!r}")
    elif run.strategy == Strategy.FINETUNE_SCRATCH:
        args.append("--gin.INITIAL_CHECKPOINT_PATH=None")
    if run.strategy in FINETUNES:
        # t5x/runs/finetune.gin counts TRAIN_STEPS_RELATIVE = FINETUNE_STEPS from the checkpoint.
        args.append(f"--gin.FINETUNE_STEPS={int(run.steps)}")
        if "FINETUNE_RECIPE" in bindings:  # its name, into config.gin (the sweep checked steps)
            args.append(f"--gin.FINETUNE_RECIPE={bindings['FINETUNE_RECIPE']}")
        args += [f"--gin.{m}={bindings[m]}" for m in PASSED_FINETUNE_MACROS if m in bindings]
        comet = run.scoring_settings(allow_missing=allow_missing).get("COMET_MODEL")
        if comet:  # recorded in config.gin: the report names the model that scored the run
            args.append(f"--gin.COMET_MODEL={comet!r}")
    args += [
        f"--gin.{macro}={run.coord(coord)!r}"
        for coord, macro in PASSED_COORDS.items()
        if run.coord(coord) is not None
    ]
    args += [
        f"--gin.{OVERRIDE_MACROS[field]}={value!r}"
        for field, value in sorted(model_overrides(run).items())
    ]
    args += [f"--gin.{name}={bindings[name]}" for name in PASSED_MACROS if name in bindings]
    passed = {a.split("=", 1)[0] for a in args}
    args += [
        f"--gin.{name}={bindings[name]}"
        for name in gin_axes
        if name in bindings and f"--gin.{name}" not in passed
    ]
    return args


def environment(run: Any, *, manifest: str) -> dict[str, str]:
    """`XLSCALE_VOCAB_PATH` / `XLSCALE_DATA_DIR` from the run's `VOCAB_PATH` / `DATA_DIR` macros
    (manifest variables unsubstituted; the caller substitutes them).

    Raises:
      ValueError: the manifest binds neither macro, naming it and the run.
    """
    bindings = _bindings(run)
    missing = [macro for macro in ENV_FROM_GIN.values() if macro not in bindings]
    if missing:
        raise ValueError(
            f"{_where(run, manifest)}: the t5x runner passes {', '.join(ENV_FROM_GIN)} from the "
            f"manifest's [gin] {', '.join(ENV_FROM_GIN.values())}; missing: {', '.join(missing)}"
        )
    env = {env: str(_literal(bindings[macro])) for env, macro in ENV_FROM_GIN.items()}
    df = run.coord("finetune_tokens") if run.strategy in FINETUNES else None
    if df is not None:
        from rundir import paper_units

        unit = str(_literal(bindings.get("FINETUNE_UNIT", "'target'")))
        pairs = paper_units.finetune_set(finetune_tokens=int(df), unit=unit).pairs
        if pairs is None:
            raise ValueError(
                f"{_where(run, manifest)}: FINETUNE_TOKENS {df} in FINETUNE_UNIT {unit!r} has no "
                "T5X form (a token budget needs xlscale's trainer); allowed under the t5x "
                "runner: FINETUNE_UNIT = 'paper' (Df = pairs x 512)"
            )
        env[PAIRS_ENV] = str(pairs)
    settings = run.scoring_settings(allow_missing=True)  # Run.environment substitutes the rest
    if "COMET_MODEL" in settings:
        env[COMET_MODEL_ENV] = settings["COMET_MODEL"]
    if "COMET_PYTHON" in settings:
        env[COMET_PYTHON_ENV] = settings["COMET_PYTHON"]
    return env
