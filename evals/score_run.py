"""A sweep's zero-shot stage for one run: `python -m evals.score_run --model-dir D --tasks ...`.

Every launcher runs this after a run's training (`launch.zeroshot_stage`). It scores the run's
final checkpoint (its latest kept step) on the tasks not yet in `MODEL_DIR/zeroshot/<step>.json`
at the same item limit, and writes them into that file beside the tasks already there, so a stage
that is started again (a requeued job, a second manifest sharing the run) scores nothing twice.
`--tasks` takes lm-eval names and `local:<lang>` (the local tasks of a language, under
`--include-path`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from evals import job
from rundir import records, zeroshot

LOCAL_PREFIX = "local:"


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def resolve_tasks(tasks: Sequence[str], include_path: str | None) -> job.TaskChoice:
    """The lm-eval tasks of a stage: names as given, `local:<lang>` as the local tasks of that
    language under `include_path`.

    Raises:
      ValueError: `local:` tasks mixed with lm-eval names, or without `include_path`, or a
        language with no local task (naming the directory).
    """
    langs = [t[len(LOCAL_PREFIX) :] for t in tasks if t.startswith(LOCAL_PREFIX)]
    if not langs:
        return job.TaskChoice(tuple(tasks), include_path, "sweep")
    if len(langs) != len(tasks) or not include_path:
        raise ValueError(
            f"--tasks {','.join(tasks)}: local:<lang> tasks need --include-path and no "
            "lm-eval names beside them"
        )
    return job.choose_tasks(".", local_dir=include_path, langs=langs)


def score_run(
    model_dir: str,
    tasks: Sequence[str],
    *,
    limit: int | None = None,
    batch_size: int = 16,
    include_path: str | None = None,
    log_fn: Callable[[str], None] = print,
) -> list[str]:
    """Scores the final checkpoint of a completed run on the tasks it lacks; returns them
    (empty: already scored, nothing done).

    Raises:
      ValueError: the run is not completed, has no checkpoint, or bad tasks.
    """
    if records.read_completed(model_dir) is None:
        raise ValueError(f"--model-dir {model_dir}: not completed (no COMPLETED): nothing to score")
    choice = resolve_tasks(tasks, include_path)
    step = job.resolve_step(model_dir, None)
    done = zeroshot.scored_tasks(model_dir, step, limit=limit) or {}
    missing = tuple(t for t in choice.tasks if t not in done)
    if not missing:
        log_fn(f"[zeroshot] {model_dir} step {step}: already scored on {len(done)} task(s)")
        return []
    earlier = (zeroshot.read_results_file(model_dir, step) or {}).get("tasks") or {}
    job.run_zeroshot(
        model_dir,
        job.TaskChoice(missing, choice.include_path, choice.source),
        step=step,
        limit=limit,
        batch_size=batch_size,
        log_fn=log_fn,
        keep_tasks=earlier,
    )
    return list(missing)


def main(argv: Sequence[str] | None = None) -> int:
    """The stage's command line; exits 2 on bad input (an unfinished run, unknown tasks)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--tasks", type=_csv, required=True)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--include-path", default=None)
    args = parser.parse_args(argv)
    try:
        score_run(
            args.model_dir,
            args.tasks,
            limit=args.limit,
            batch_size=args.batch_size,
            include_path=args.include_path,
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"evals.score_run: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
