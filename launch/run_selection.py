"""The `[[select]]` stage of a sweep: choose one run per group by a metric, write selection.json.

`decide` reads the candidates' `metrics.jsonl` (the last logged value of the stage's metric, or
with `at = "best"` its best evaluated value, recorded in the run's best_checkpoint.json) once
every candidate of a group has finished (COMPLETED, or failed: a learning rate that diverged
loses), picks the best by the stage's rule, and returns the document that `write` puts in
`<runs_dir>/selection.json`:

    {"manifest": "mt_paper",
     "selections": {"<select name>": {
         "strategy": "pretrain", "over": ["BASE_LR"], "metric": "train/loss", "rule": "min",
         "at": "last",
         "groups": {"<group>": {"chosen": "<run id>", "model_dir": "...", "metric": "train/loss",
                                "candidates": [{"run_id", "coords", "state", "step", "value"}]}},
         "pending": {"<group>": ["<run id not finished>", ...]},
         "failed": {"<group>": "why no candidate could be chosen"}}}}

`launch.sweep.expand(manifest, selection=read(runs_dir))` then starts dependent runs from the
chosen run's checkpoint, and `fitting.readers.rejected_runs` makes fits skip the runs not chosen.
`launch_in_stages` runs a sweep stage by stage: the runs that can start, then the selections
their results decide, then the runs those selections unblock, and so on.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from launch import best_checkpoint
from launch import status as run_states
from launch.manifest import Manifest, matches
from launch.runs import Run
from launch.select_tables import SelectSpec, group_key
from launch.sweep import expand
from rundir import storage
from rundir.names import SELECTION_FILE


def _path(runs_dir: str):
    return run_states.any_path(runs_dir.rstrip("/") + "/" + SELECTION_FILE)


def read(runs_dir: str) -> dict[str, Any] | None:
    """The selection.json under `runs_dir`, or None when there is none yet."""
    path = _path(runs_dir)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); delete it and select again") from e


def write(runs_dir: str, document: Mapping[str, Any]) -> str:
    """Writes `document` to `<runs_dir>/selection.json` atomically; returns the path."""
    path = _path(runs_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    storage.write_text_atomic(path, json.dumps(document, indent=1, sort_keys=True, default=str))
    return str(path)


def final_value(model_dir: str, metric: str) -> tuple[float | None, int | None]:
    """(value, step) of the last metrics.jsonl record of a run that has `metric` (a real T5X
    MODEL_DIR's summaries, as `fitting.readers.t5x_runs` maps them, where there is no metrics.jsonl)."""
    points = best_checkpoint.series(model_dir, metric)
    return (points[-1][1], points[-1][0]) if points else (None, None)


def best_value(model_dir: str, metric: str, *, rule: str) -> tuple[float | None, int | None]:
    """(value, step) of the best evaluated step of `metric` under `rule`, written to the run's
    best_checkpoint.json (`launch.best_checkpoint`); (None, None) when it logged none."""
    found = best_checkpoint.record(model_dir, metric=metric, rule=rule)
    return (found["value"], found["step"]) if found else (None, None)


def _candidate(spec: SelectSpec, run: Run, state: str) -> dict[str, Any]:
    coords = dict(run.coords)
    entry = {"run_id": run.run_id, "coords": coords, "state": state, "step": None, "value": None}
    if state == "done":
        metric = spec.metric_for(coords)
        if spec.at == "best":
            value, step = best_value(run.model_dir, metric, rule=spec.rule)
        else:
            value, step = final_value(run.model_dir, metric)
        finite = value is not None and math.isfinite(value)
        entry.update(value=value if finite else None, step=step)  # JSON has no NaN
    return entry


def _decide_group(
    spec: SelectSpec, candidates: list[dict[str, Any]], runs: Mapping[str, Run]
) -> dict[str, Any] | None:
    """The decided group (None when no candidate has a finite value of the metric)."""
    best = None
    for c in candidates:
        value = c["value"]
        if value is None:
            continue
        if best is None or spec.better(value, best["value"]):
            best = c
    if best is None or not math.isfinite(best["value"]):
        return None
    return {
        "chosen": best["run_id"],
        "model_dir": runs[best["run_id"]].model_dir,
        "metric": spec.metric_for(best["coords"]),
        "value": best["value"],
        "step": best["step"],
        "candidates": candidates,
    }


def decide(
    manifest: Manifest,
    runs: Sequence[Run],
    *,
    stale_s: float = 900.0,
    status: Callable[[Run], str] | None = None,
) -> dict[str, Any]:
    """The selection.json document of `manifest` for `runs` (its expansion).

    Every group of every `[[select]]` whose candidates have all finished (done or failed) is
    decided; the others are listed under `pending` with the runs still to finish, and groups
    where no candidate logged a finite value of the metric under `failed` with the reason.

    Args:
      manifest: the manifest (its `selects`).
      runs: the manifest's runs.
      stale_s: seconds without new metrics before a run counts as stopped (`launch.status`).
      status: run -> state ("done", "failed", ...), for tests; default `launch.status`.
    """
    by_id = {r.run_id: r for r in runs}
    state_of = status or (lambda r: run_states.run_status(r, stale_s=stale_s).state)
    out: dict[str, Any] = {}
    for spec in manifest.selects:
        groups: dict[str, list[Run]] = {}
        for run in runs:
            coords = dict(run.coords)
            if run.strategy == spec.strategy and matches(coords, dict(spec.where)):
                groups.setdefault(group_key(coords, spec.over), []).append(run)
        decided, pending, failed = {}, {}, {}
        for group, members in groups.items():
            states = {r.run_id: state_of(r) for r in members}
            waiting = [i for i, s in states.items() if s not in ("done", "failed")]
            if waiting:
                pending[group] = waiting
                continue
            candidates = [_candidate(spec, r, states[r.run_id]) for r in members]
            chosen = _decide_group(spec, candidates, by_id)
            if chosen is None:
                failed[group] = (
                    f"no candidate has a finite {spec.metric!r} in its metrics.jsonl ("
                    + ", ".join(f"{c['run_id']} {c['state']}" for c in candidates)
                    + ")"
                )
            else:
                decided[group] = chosen
        out[spec.name] = {
            "strategy": spec.strategy,
            "over": list(spec.over),
            "metric": spec.metric,
            "rule": spec.rule,
            "at": spec.at,
            "where": dict(spec.where),
            "groups": decided,
            "pending": pending,
            "failed": failed,
        }
    return {
        "manifest": manifest.name,
        "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "selections": out,
    }


def select_and_write(manifest: Manifest, runs: Sequence[Run], **kwargs: Any) -> dict[str, Any]:
    """`decide`, then `write` into the manifest's runs dir; returns the document."""
    document = decide(manifest, runs, **kwargs)
    write(manifest.runs_dir, document)
    return document


def launch_in_stages(
    manifest: Manifest,
    launcher: Any,
    *,
    only: Callable[[list[Run]], list[Run]] = lambda runs: runs,
    dry_run: bool = False,
    progress_factory: Callable[[list[Run]], Any] | None = None,
    note: Callable[[str], None] = print,
) -> tuple[list[Any], list[Run]]:
    """Launches a sweep's runs stage by stage around its `[[select]]`s.

    Each round launches the runs that do not wait for a choice (less those that failed or were
    blocked in an earlier round: a diverged learning rate is not retried), then (unless
    `dry_run`) decides the selections whose candidates have all finished (a failed candidate
    loses), writes selection.json and expands again, so that the runs they unblock launch next.
    It stops when nothing waits or a round unblocks nothing (asynchronous launchers: run again
    once the candidates have finished).

    Args:
      manifest: the manifest.
      launcher: a `launch.launchers` launcher (`launch(runs, dry_run=, progress=)`).
      only: narrows each round's runs (e.g. `launch.sweep.select` with --only globs).
      dry_run: print the commands; with no selection made, the waiting runs are printed too,
        their INIT_CHECKPOINT a placeholder.
      progress_factory: runs -> a `launch.status.Progress` for each round (None: the launcher's).
      note: where progress notes go.

    Returns:
      The launch reports of the rounds, and the runs still waiting for a selection.
    """
    reports: list[Any] = []
    given_up: set[str] = set()
    while True:
        runs = only(expand(manifest, selection=read(manifest.runs_dir)))
        waiting = [r for r in runs if r.waits_for_selection]
        ready = [
            r for r in runs if (dry_run or not r.waits_for_selection) and r.run_id not in given_up
        ]
        progress = progress_factory(ready) if progress_factory else None
        report = launcher.launch(ready, dry_run=dry_run, progress=progress)
        reports.append(report)
        given_up.update(report.failed, report.blocked)
        if dry_run or not waiting:
            return reports, ([] if dry_run else waiting)
        document = select_and_write(manifest, runs)
        still = [r for r in only(expand(manifest, selection=document)) if r.waits_for_selection]
        if len(still) == len(waiting):
            for name, stage in document["selections"].items():
                for group, why in stage["failed"].items():
                    note(f"[[select]] {name} [{group}] cannot choose: {why}")
            note(
                f"{len(waiting)} runs wait for a [[select]] choice that their candidates have not "
                "made yet; run the sweep again once they have finished"
            )
            return reports, waiting
        note(f"selection.json: {len(waiting) - len(still)} waiting runs can start")
