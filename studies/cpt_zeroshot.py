"""The CPT study's zero-shot stage: the final checkpoints of the source, scratch, CPT and replay
runs scored on the local multiple-choice tasks through lm-evaluation-harness (CPT paper §4.4,
Fig. 3; Appendix A, Fig. 6).

Which runs: the largest size that has a source, a scratch and a CPT run (the Fig. 3 analogue
compares those three strategies), plus every replay run and the source and CPT runs of the
replay runs' size (the Fig. 6 analogue plots accuracy against the replay ratio). Each run is
scored on every local task of the study's languages, so the English source model is also scored
in the target language, as in the paper's Fig. 3. A run whose `zeroshot/<step>.json` exists for
its final step is not scored again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rundir import zeroshot

Log = Callable[[str], None]

FIG3_STRATEGIES = ("source", "scratch", "cpt")
REPLAY_STRATEGIES = ("source", "cpt", "cpt_replay")


def _size(run) -> float:
    return float(run.meta.get("params_non_embedding", math.nan))


def fig3_runs(runs: Sequence[Any]) -> list[Any]:
    """The source, scratch and CPT runs of the largest size that has all three."""
    by_size: dict[float, dict[str, Any]] = {}
    for run in runs:
        if run.strategy in FIG3_STRATEGIES:
            by_size.setdefault(_size(run), {})[run.strategy] = run
    complete = [size for size, found in by_size.items() if set(found) == set(FIG3_STRATEGIES)]
    if not complete:
        return []
    chosen = by_size[max(complete)]
    return [chosen[s] for s in FIG3_STRATEGIES]


def replay_runs(runs: Sequence[Any]) -> list[Any]:
    """The replay runs and the source and plain CPT runs of their sizes."""
    sizes = {_size(r) for r in runs if r.strategy == "cpt_replay"}
    return [r for r in runs if r.strategy in REPLAY_STRATEGIES and _size(r) in sizes]


def chosen_runs(runs: Sequence[Any]) -> list[Any]:
    """The runs the zero-shot stage scores (Fig. 3 and Fig. 6 analogues), each once."""
    seen: dict[str, Any] = {}
    for run in [*fig3_runs(runs), *replay_runs(runs)]:
        seen.setdefault(str(run.path), run)
    return list(seen.values())


def evaluate_study_runs(
    *,
    runs_dir: Path,
    corpora: Path,
    out_dir: Path,
    langs: Sequence[str],
    items: int,
    log: Log = print,
) -> list[Path]:
    """Writes the local tasks of `langs` under `<out_dir>/zeroshot_tasks` and scores the
    chosen runs' final checkpoints on them; returns the zero-shot JSON paths.

    Skips the stage with one log line when lm-evaluation-harness is not installed (the `eval`
    extra, which `make setup` installs).
    """
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        log(
            "[demo] zero-shot: skipped (lm-evaluation-harness not installed: pip install '.[eval]')"
        )
        return []
    from evals import job, local_tasks
    from fitting import io

    tasks = local_tasks.write_local_tasks(
        corpora, out_dir / "zeroshot_tasks", langs=list(langs), items=items
    )
    choice = job.TaskChoice(tuple(sorted(tasks.tasks)), str(tasks.dir), "local")
    runs = chosen_runs(io.read_runs(runs_dir))
    log(
        f"[demo] zero-shot: {len(runs)} runs x {len(choice.tasks)} local tasks "
        f"({', '.join(choice.tasks)}) through lm-evaluation-harness"
    )
    paths = []
    # lm-eval logs per task (num_fewshot overrides, missing generation kwargs); the stage logs
    # one line per run instead.
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    for i, run in enumerate(runs, 1):
        step = job.resolve_step(run.path, None)
        path = zeroshot.results_file(run.path, step)
        if path.exists():
            log(f"[demo] zero-shot {i}/{len(runs)}: reusing {path}")
        else:
            log(f"[demo] zero-shot {i}/{len(runs)}: {run.run_id} step {step}")
            job.run_zeroshot(run.path, choice, step=step, log_fn=lambda _: None)
        paths.append(path)
    return paths
