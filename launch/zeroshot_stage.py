"""A sweep's zero-shot stage: the manifest's `[zeroshot]` table, and what each run is scored on.

    [zeroshot]
    tasks = "paper"          # "paper": the CPT paper's benchmarks per language
                             #   (`evals.paper_tasks`); "local": the local tasks under
                             #   `local_dir`; or a table {en = ["hellaswag"], zh = [...]}
    languages = ["en", "zh"] # default: the source language (en) and the sweep's target languages
    strategies = ["source", "scratch", "cpt", "cpt_replay"]  # the runs scored (this default)
    limit = 500              # at most this many items per task (default: all)
    batch_size = 16
    local_dir = "${DATA_DIR}/zeroshot_tasks"  # tasks = "local" only

`sweep run` scores the final checkpoint of every run of those strategies once it completes, with
`python -m evals.score_run` (each launcher runs it after the run's training: `launch.launchers`,
`launch.slurm`, `launch.xm_launch`). Every run is scored on the tasks of every language, so the
English source model is scored in each target language (CPT paper Fig. 3) and every setting in
both languages (Fig. 6's denominator is the best of all of them). The stage is resumable: a run
whose `zeroshot/<final step>.json` holds every task at the same limit is not scored again
(`is_scored`); a run scored on fewer tasks (a source run shared by two manifests) is scored on
the missing ones only, and its file keeps the others.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evals import local_tasks, paper_tasks
from evals.score_run import LOCAL_PREFIX  # `local:<lang>`: the local tasks of a language
from launch.manifest_checks import check_keys, require
from launch.runs import substitute
from rundir import zeroshot
from rundir.run_record import Strategy

SCORE_MODULE = "evals.score_run"
# The languages the paper's benchmarks are mapped for (`evals.paper_tasks.PAPER_TASKS`, which a
# test ties to this tuple); the source models are English.
PAPER_LANGUAGES = ("en", "zh", "fr", "ru")
SOURCE_LANGUAGE = "en"
TASK_CHOICES = ("paper", "local")
DEFAULT_STRATEGIES = (Strategy.SOURCE, Strategy.SCRATCH, Strategy.CPT, Strategy.CPT_REPLAY)
_KEYS = ("tasks", "languages", "strategies", "limit", "batch_size", "local_dir")


@dataclasses.dataclass(frozen=True)
class ZeroshotStage:
    """A manifest's `[zeroshot]` table, checked (see the module docstring).

    Attributes:
      tasks: "paper", "local", or language -> lm-eval task names.
      languages: the languages scored (empty: the source language and the sweep's targets).
      strategies: the strategies whose runs are scored.
      limit: items per task (None: all); batch_size: requests scored together.
      local_dir: the local tasks' directory (tasks = "local"; manifest variables allowed).
    """

    tasks: str | Mapping[str, tuple[str, ...]] = "paper"
    languages: tuple[str, ...] = ()
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    limit: int | None = None
    batch_size: int = 16
    local_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
    """What one run is scored on: lm-eval task names, items per task, batch size, and the local
    tasks' directory (None: lm-eval's own tasks)."""

    tasks: tuple[str, ...]
    limit: int | None
    batch_size: int
    include_path: str | None = None


def parse_stage(table: Mapping[str, Any] | None, *, path: str) -> ZeroshotStage | None:
    """The manifest's `[zeroshot]` table checked (None when the manifest has none).

    Raises:
      ValueError: naming the manifest, the key, the value and the allowed values.
    """
    if table is None:
        return None
    where = f"{path} [zeroshot]"
    check_keys(table, _KEYS, where)
    tasks = table.get("tasks", "paper")
    if isinstance(tasks, Mapping):
        for lang, names in tasks.items():
            require(
                isinstance(names, list) and names and all(isinstance(n, str) for n in names),
                f"{where} tasks.{lang}",
                f"{names!r}: give a non-empty list of lm-eval task names",
            )
        tasks = {lang: tuple(names) for lang, names in tasks.items()}
    else:
        require(
            tasks in TASK_CHOICES,
            f"{where} tasks",
            f"{tasks!r}: choose one of {', '.join(map(repr, TASK_CHOICES))} or a table "
            "{language = [lm-eval task names]}",
        )
    languages = tuple(table.get("languages", ()))
    if tasks == "paper":
        bad = sorted(set(languages) - set(PAPER_LANGUAGES))
        require(
            not bad,
            f"{where} languages",
            f"{bad}: the paper's benchmarks are mapped for {', '.join(PAPER_LANGUAGES)} only",
        )
    elif isinstance(tasks, Mapping) and languages:
        missing = sorted(set(languages) - set(tasks))
        require(not missing, f"{where} languages", f"{missing} have no list in tasks")
    strategies = tuple(table.get("strategies", DEFAULT_STRATEGIES))
    bad = sorted(set(strategies) - set(DEFAULT_STRATEGIES))
    require(
        not bad,
        f"{where} strategies",
        f"{bad}: choose among {', '.join(DEFAULT_STRATEGIES)} (the runs of the CPT paper's "
        "zero-shot figures)",
    )
    limit = table.get("limit")
    require(
        limit is None or (isinstance(limit, int) and limit > 0),
        f"{where} limit",
        f"{limit!r}: give a whole number of items per task > 0 (or leave it out: all)",
    )
    batch_size = table.get("batch_size", 16)
    require(
        isinstance(batch_size, int) and batch_size > 0,
        f"{where} batch_size",
        f"{batch_size!r}: give a whole number > 0",
    )
    local_dir = table.get("local_dir")
    require(
        (local_dir is not None) == (tasks == "local"),
        f"{where} local_dir",
        'give it with tasks = "local" (the directory `xlscale data build` writes), and only then',
    )
    return ZeroshotStage(tasks, languages, strategies, limit, batch_size, local_dir)


def stage_languages(stage: ZeroshotStage, target_langs: Sequence[str]) -> tuple[str, ...]:
    """The languages every run is scored in: the stage's own, else the source language and the
    sweep's target languages."""
    if stage.languages:
        return stage.languages
    return tuple(dict.fromkeys([SOURCE_LANGUAGE, *sorted(target_langs)]))


def task_names(stage: ZeroshotStage, languages: Sequence[str]) -> tuple[str, ...]:
    """The lm-eval task names of `languages` ("local": the language codes, which the scorer
    turns into the local tasks of those languages)."""
    if stage.tasks == "paper":
        names = [t for lang in languages for t in paper_tasks.paper_tasks(lang)]
    elif stage.tasks == "local":
        names = [f"{LOCAL_PREFIX}{lang}" for lang in languages]
    else:
        names = [t for lang in languages for t in stage.tasks.get(lang, ())]
    return tuple(dict.fromkeys(names))


def score_spec(stage: ZeroshotStage | None, strategy: str, languages: Sequence[str]):
    """The `ScoreSpec` of a run of `strategy`, or None when the stage does not score it."""
    if stage is None or strategy not in stage.strategies:
        return None
    return ScoreSpec(
        tasks=task_names(stage, languages),
        limit=stage.limit,
        batch_size=stage.batch_size,
        include_path=stage.local_dir,
    )


def score_args(spec: ScoreSpec, model_dir: str) -> list[str]:
    """The flags of `python -m evals.score_run` for one run (manifest variables unsubstituted)."""
    args = ["--model-dir", model_dir, "--tasks", ",".join(spec.tasks)]
    args += ["--batch-size", str(spec.batch_size)]
    args += ["--limit", str(spec.limit)] if spec.limit is not None else []
    args += ["--include-path", spec.include_path] if spec.include_path else []
    return args


def score_argv(spec: ScoreSpec, model_dir: str, python: str | None = None) -> list[str]:
    """The scoring command line: `python -m evals.score_run --model-dir ... --tasks ...`."""
    return [python or sys.executable, "-m", SCORE_MODULE, *score_args(spec, model_dir)]


def is_scored(
    spec: ScoreSpec, model_dir: str, step: int, *, include_path: str | None = None
) -> bool:
    """Whether `MODEL_DIR/zeroshot/<step>.json` holds every task of `spec` at its limit
    (`local:<lang>` entries: the local tasks of that language under `include_path`, the spec's
    directory with variables filled). Unreadable storage or local tasks count as not scored (the
    scorer then decides)."""
    try:
        done = zeroshot.scored_tasks(model_dir, step, limit=spec.limit)
        langs = {t[len(LOCAL_PREFIX) :] for t in spec.tasks if t.startswith(LOCAL_PREFIX)}
        wanted = [t for t in spec.tasks if not t.startswith(LOCAL_PREFIX)]
        if langs:
            found = local_tasks.read_local_tasks(Path(include_path or spec.include_path or ""))
            wanted += [t for t, lang in found.items() if lang in langs]
    except Exception:  # noqa: BLE001 -- no filesystem for that scheme here, a bad file, no index
        return False
    return done is not None and all(t in done for t in wanted)


def needs_scoring(run: Any) -> bool:
    """Whether a run (`launch.runs.Run`) has a zero-shot stage whose results at its final step
    (`run.steps`) are not all written yet."""
    spec = getattr(run, "zeroshot", None)
    if spec is None:
        return False
    include = spec.include_path
    if include:
        include = substitute(include, dict(run.variables), allow_missing=True)
    return not is_scored(spec, run.model_dir, run.steps, include_path=include)


def run_argv(run: Any, python: str | None = None, *, allow_missing: bool = False) -> list[str]:
    """A run's scoring command line, with its manifest variables substituted (`local_dir` may
    name one); `allow_missing` leaves unset ones as written (dry runs)."""
    variables = dict(run.variables)
    argv = score_argv(run.zeroshot, run.model_dir, python)
    return [substitute(a, variables, allow_missing=allow_missing) for a in argv]


def job_name(run: Any) -> str:
    """The scheduler name of a run's scoring job (SLURM job, xmanager work unit)."""
    return f"{run.run_id}.zeroshot"


def score_in_process(run: Any, log_path: Any = None) -> int:
    """The zero-shot stage of `run` in this process, exactly as `python -m evals.score_run`
    runs it (`launch.launchers.LocalLauncher(scorer=...)`: in-process studies and tests)."""
    from evals import score_run  # JAX and lm-eval: only when scoring

    return score_run.main(run_argv(run)[3:])
