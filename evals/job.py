"""A zero-shot job: which tasks a run is scored on, scoring them through lm-evaluation-harness,
and writing the results where `fitting` and the reports read them.

    xlscale zeroshot --model-dir /runs/cpt_zh_49m               # the local tasks of its languages
    xlscale zeroshot --model-dir /runs/cpt_zh_49m --paper       # the CPT paper's benchmarks
    xlscale zeroshot --model-dir /runs/cpt_zh_49m --tasks xnli_zh,xcopa_zh --step 2000

Results go to `MODEL_DIR/zeroshot/<step>.json` and `metrics.jsonl` (`zeroshot/<task>/acc_norm`,
`evals.results`). Nothing here imports lm_eval until a job runs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rundir import records, storage

log = logging.getLogger(__name__)

# Where `xlscale data build` writes the local tasks, relative to the data root.
LOCAL_TASKS_SUBDIR = "zeroshot_tasks"


@dataclasses.dataclass(frozen=True)
class TaskChoice:
    """The tasks of one zero-shot job and where lm-eval finds the local ones.

    Attributes:
      tasks: lm-eval task or group names.
      include_path: a directory of task YAML (the local tasks), or None for lm-eval's own.
      source: how they were chosen (`--tasks`, `--paper`, `local`), for the log and the JSON.
    """

    tasks: tuple[str, ...]
    include_path: str | None
    source: str


def run_languages(model_dir: str | os.PathLike) -> list[str]:
    """The languages a run was trained on (`run.json` `languages`, target and source language),
    target first."""
    return list(records.read_run_record(model_dir).all_languages)


def default_local_dir() -> Path:
    """`<data root>/zeroshot_tasks`, where `xlscale data build` writes the local tasks."""
    from pipelines.corpora import paths

    return paths.data_root() / LOCAL_TASKS_SUBDIR


def choose_tasks(
    model_dir: str | os.PathLike,
    *,
    tasks: Sequence[str] = (),
    paper: bool = False,
    local_dir: str | os.PathLike | None = None,
    langs: Sequence[str] = (),
) -> TaskChoice:
    """The tasks to score a run on: `tasks` as given; with `paper`, the CPT paper's benchmarks
    of `langs` (default: the run's languages, `evals.paper_tasks`); otherwise the local tasks of
    those languages under `local_dir` (default `default_local_dir()`).

    Raises:
      ValueError: both `tasks` and `paper`; a local task directory that does not exist or has no
        task for any of the languages (naming the directory, the languages and the command that
        writes them).
    """
    from evals import local_tasks, paper_tasks

    if tasks and paper:
        raise ValueError("--tasks and --paper: give one of them (--paper picks the paper's tasks)")
    langs = list(langs) or run_languages(model_dir)
    if tasks:
        return TaskChoice(tuple(tasks), os.fspath(local_dir) if local_dir else None, "--tasks")
    if paper:
        chosen = [t for lang in langs for t in paper_tasks.paper_tasks(lang)]
        return TaskChoice(tuple(dict.fromkeys(chosen)), None, "--paper")
    directory = Path(local_dir) if local_dir else default_local_dir()
    found = local_tasks.read_local_tasks(directory) if directory.is_dir() else {}
    chosen = [task for task, lang in found.items() if lang in langs]
    if not chosen:
        raise ValueError(
            f"--local {directory}: no local zero-shot task for languages {langs} "
            f"(found: {sorted(found) or 'none'}); write them with `xlscale data build` or "
            "evals.local_tasks.write_local_tasks, or pass --tasks / --paper"
        )
    return TaskChoice(tuple(chosen), os.fspath(directory), "local")


def resolve_step(model_dir: str | os.PathLike, step: int | None) -> int:
    """`step`, or the run's latest kept checkpoint step.

    Raises:
      ValueError: the run has no checkpoint, or `step` is not kept (naming the kept steps).
    """
    from trainer import restore

    kept = restore.kept_steps(model_dir, flag="--model-dir")
    if not kept:
        raise ValueError(f"--model-dir {model_dir}: no checkpoint under {model_dir}/checkpoints")
    if step is None:
        return max(kept)
    if step not in kept:
        raise ValueError(f"--step {step}: not a kept checkpoint of {model_dir}; kept: {kept}")
    return int(step)


def run_zeroshot(
    model_dir: str | os.PathLike,
    choice: TaskChoice,
    *,
    step: int | None = None,
    limit: int | None = None,
    batch_size: int = 16,
    bucket: bool = True,
    vocab_path: str | None = None,
    log_fn: Callable[[str], None] = print,
    keep_tasks: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Scores one checkpoint of a run on `choice`'s tasks and writes the results.

    Args:
      step: a kept checkpoint step (None: the latest).
      limit: at most this many items per task.
      batch_size: requests scored together; bucket: pad batches to power-of-two lengths.
      vocab_path: the run's SentencePiece model when the path in `run.json` has moved.
      keep_tasks: rows scored earlier at this step that the results file keeps (task -> row).

    Returns:
      The summary written to `MODEL_DIR/zeroshot/<step>.json` (`evals.results`), with `path`.
    """
    import json

    from evals import harness, results

    step = resolve_step(model_dir, step)
    t0 = time.monotonic()
    log_fn(
        f"[zeroshot] {model_dir} step {step if step is not None else 'latest'}: "
        f"{len(choice.tasks)} task(s) ({choice.source}): {', '.join(choice.tasks)}"
    )
    out = harness.evaluate(
        model_dir=os.fspath(model_dir),
        step=step,
        tasks=list(choice.tasks),
        include_path=choice.include_path,
        limit=limit,
        batch_size=batch_size,
        bucket=bucket,
        vocab_path=vocab_path,
        # Local tasks only: skip indexing lm-eval's own ~15k task files (4 s).
        include_defaults=choice.source != "local",
    )
    used_step = int(out["step"])
    path = results.write_results(
        model_dir,
        step=used_step,
        results=out,
        checkpoint=f"{os.fspath(model_dir)}@{used_step}",
        extra={
            "tasks_source": choice.source,
            "include_path": choice.include_path,
            "limit": limit,
            "batch_size": batch_size,
            "bucket": bucket,
            "seconds": round(time.monotonic() - t0, 3),
        },
        keep_tasks=keep_tasks,
    )
    summary = json.loads(storage.read_text(path))
    summary["path"] = os.fspath(path)
    log_fn(format_summary(summary))
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """A table of a zero-shot JSON's tasks: n, acc, acc_norm with its Wilson 95% interval, chance."""
    from evals import confidence

    lines = [f"[zeroshot] step {summary['step']}: {summary.get('path', '')}"]
    lines.append(f"  {'task':<28} {'n':>5} {'acc':>7} {'acc_norm':>9}  95% CI          chance")
    for task, row in sorted(summary["tasks"].items()):
        n = int(row.get("n") or 0)
        acc_norm = row.get("acc_norm")
        if acc_norm is None or not n:
            lines.append(f"  {task:<28} {n:>5}   (no acc_norm)")
            continue
        lo, hi = confidence.wilson_interval(round(acc_norm * n), n)
        acc = row.get("acc")
        chance = row.get("chance")
        lines.append(
            f"  {task:<28} {n:>5} {acc if acc is not None else float('nan'):7.3f} "
            f"{acc_norm:9.3f}  [{lo:.3f}, {hi:.3f}]  "
            + (f"{chance:.3f}" if chance is not None else "-")
        )
    cost = summary.get("scorer") or {}
    if cost.get("requests"):
        lines.append(
            f"  {cost['requests']} requests in {cost['seconds']:.1f} s "
            f"({cost['requests_per_s'] or 0:.1f}/s, {cost['padding_fraction']:.0%} padding, "
            f"{len(cost.get('compiled_shapes') or [])} compiled lengths)"
        )
    return "\n".join(lines)
