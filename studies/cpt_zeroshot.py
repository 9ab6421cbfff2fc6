"""The CPT study's zero-shot stage: the final checkpoints of the source, scratch, CPT and replay
runs scored on the local multiple-choice tasks through lm-evaluation-harness (CPT paper §4.4,
Fig. 3; Appendix A, Fig. 6).

Which runs, per target language of the study's CPT runs (zh, fr, ru: from the runs): the
largest size that has a source, a scratch and a CPT run of that language (the Fig. 3 analogue
compares those three strategies), plus the language's replay runs and the source and CPT runs of
their size (the Fig. 6 analogue plots accuracy against the replay ratio). Each run is
scored on every local task of the study's languages, so the English source model is also scored
in the target language, as in the paper's Fig. 3. A run whose `zeroshot/<step>.json` exists for
its final step is not scored again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rundir import zeroshot
from rundir.run_record import CPT_STRATEGIES, Strategy

Log = Callable[[str], None]

FIG3_STRATEGIES = (Strategy.SOURCE, Strategy.SCRATCH, Strategy.CPT)
REPLAY_STRATEGIES = (Strategy.SOURCE, Strategy.CPT, Strategy.CPT_REPLAY)


def _size(run) -> float:
    return run.info.n_non_embedding


def target_langs(runs: Sequence[Any]) -> list[str]:
    """The target languages of the study's CPT runs (plain and replay), sorted: from the runs,
    not a constant, so a study of zh, fr and ru gets a Fig. 3 group per language."""
    return sorted({r.target_lang for r in runs if r.strategy in CPT_STRATEGIES} - {None})


def fig3_groups(runs: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Target language -> {strategy: run} of the source, scratch and CPT runs of the largest
    size that has all three for that language (the source model is the same for every
    language: it is scored in each target language, as in the paper's Fig. 3)."""
    groups = {}
    for lang in target_langs(runs):
        by_size: dict[float, dict[str, Any]] = {}
        for run in runs:
            if run.strategy == Strategy.SOURCE or (
                run.strategy in FIG3_STRATEGIES and run.target_lang == lang
            ):
                by_size.setdefault(_size(run), {})[run.strategy] = run
        complete = [n for n, found in by_size.items() if set(found) == set(FIG3_STRATEGIES)]
        if complete:
            chosen = by_size[max(complete)]
            groups[lang] = {s: chosen[s] for s in FIG3_STRATEGIES}
    return groups


def fig3_runs(runs: Sequence[Any]) -> list[Any]:
    """The runs of every language's Fig. 3 group (`fig3_groups`), each once."""
    seen: dict[str, Any] = {}
    for group in fig3_groups(runs).values():
        for run in group.values():
            seen.setdefault(run.run_id, run)
    return list(seen.values())


def replay_groups(runs: Sequence[Any]) -> dict[str, list[Any]]:
    """Target language -> its replay runs, with the plain CPT runs of that language and the
    source runs at the replay runs' sizes (ratio 0 and the source model of Fig. 6)."""
    groups = {}
    for lang in target_langs(runs):
        replays = [r for r in runs if r.strategy == Strategy.CPT_REPLAY and r.target_lang == lang]
        sizes = {_size(r) for r in replays}
        if replays:
            groups[lang] = [
                r
                for r in runs
                if _size(r) in sizes
                and (
                    r.strategy == Strategy.SOURCE
                    or (r.strategy in REPLAY_STRATEGIES and r.target_lang == lang)
                )
            ]
    return groups


def replay_runs(runs: Sequence[Any]) -> list[Any]:
    """The runs of every language's Fig. 6 group (`replay_groups`), each once."""
    seen: dict[str, Any] = {}
    for group in replay_groups(runs).values():
        for run in group:
            seen.setdefault(run.run_id, run)
    return list(seen.values())


def chosen_runs(runs: Sequence[Any]) -> list[Any]:
    """The runs the zero-shot stage scores (Fig. 3 and Fig. 6 analogues), each once."""
    seen: dict[str, Any] = {}
    for run in [*fig3_runs(runs), *replay_runs(runs)]:
        seen.setdefault(str(run.path), run)
    return list(seen.values())


def evaluate_study_runs(
    runs_dir: Path,
    corpora: Path,
    out_dir: Path,
    *,
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
    from fitting.readers import run_dirs as io

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
