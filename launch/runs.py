"""A sweep's run: one training job (identity, budget, gin configuration, dependencies), and the
runners that start its job (`python -m trainer.train`, or real T5X's `t5x.train`).

`launch.sweep.expand` builds the runs of a manifest; launchers, status and estimates read them.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from launch import run_settings, t5x_runner
from launch.strategies import Counts
from rundir.run_record import FINETUNES, Strategy

TRAIN_MODULE = "trainer.train"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclasses.dataclass(frozen=True)
class Run:
    """One training job: its identity, budget, gin configuration and dependencies."""

    run_id: str
    strategy: Strategy
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
    # The manifest's zero-shot stage for this run (`launch.zeroshot_stage.ScoreSpec`: tasks,
    # limit, batch size; None: not scored): how the run is scored after training, not its id.
    zeroshot: Any = None
    # What runs the job (a key of RUNNERS); for "t5x", where T5X's and our code are, the gin-axis
    # macros passed on, and the manifest (named in errors).
    runner: str = "xlscale"
    t5x_paths: t5x_runner.T5xPaths = t5x_runner.T5xPaths()
    gin_axes: tuple[str, ...] = ()
    manifest_path: str = ""
    # Extra `#SBATCH` options from the manifest's [slurm] table: where the job runs, not what it
    # computes, so not part of the run's id.
    sbatch_lines: tuple[str, ...] = ()
    # The manifest's [settings] (`launch.run_settings`: how the run is scored, not part of its
    # id), variables unsubstituted.
    settings: tuple[tuple[str, str], ...] = ()

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
        runner = RUNNERS[self.runner]
        return runner.module_for(self) if runner.module_for else runner.module

    def scoring_settings(self, *, allow_missing: bool = False) -> dict[str, str]:
        """The manifest's [settings] that are on for this run, variables substituted and checked:
        only finetunes decode and score translations, so other runs get none.

        Raises:
          ValueError: a variable without a value (unless `allow_missing`), or a value not allowed
            (naming the setting and the allowed values).
        """
        if self.strategy not in FINETUNES:
            return {}
        variables = dict(self.variables)
        values = {
            k: substitute(v, variables, allow_missing=allow_missing) for k, v in self.settings
        }
        return run_settings.active(values, where=f"{self.manifest_path} run {self.run_id}")

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
    args += [f"--gin.{key}={value}" for key, value in run.bindings]
    settings = run.scoring_settings(allow_missing=allow_missing).items()
    return args + [f"--gin.{key}={gin_literal(value)}" for key, value in settings]


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
    # The module of one run where it is not always `module` (T5X with COMET: a wrapper).
    module_for: Callable[[Run], str] | None = None


# Runner name (manifest `[sweep] runner`, `xlscale sweep ... --runner`) -> how its jobs start.
RUNNERS: dict[str, Runner] = {
    "xlscale": Runner(TRAIN_MODULE, _trainer_args, lambda run: {}),
    "t5x": Runner(
        t5x_runner.MODULE,
        _t5x_args,
        lambda run: t5x_runner.environment(run, manifest=run.manifest_path),
        t5x_runner.done_marker,
        lambda run: t5x_runner.module(run.scoring_settings(allow_missing=True)),
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
