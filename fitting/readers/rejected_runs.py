"""The sweep's `selection.json` as the fits see it: which runs a `[[select]]` stage rejected.

A manifest's `[[select]]` stage (a learning-rate grid, say) keeps one run per group of runs that
differ only in the grid's value, and `xlscale sweep select` (or `xlscale sweep run`) records the
choice in `<runs_dir>/selection.json` (format: docs/interfaces.md, "Sweep manifests"). Fitting
every candidate would put five learning rates of one finetune into one series, so
`fitting.readers.run_dirs.read_runs` drops the candidates that were not chosen. Runs in no selection group,
and groups still pending, are untouched. This reader needs nothing from `launch`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fitting.checks import FitInputError
from rundir import names, storage

SELECTION_FILE = names.SELECTION_FILE


def read_selection(root: str | os.PathLike) -> dict[str, Any] | None:
    """The selection.json directly under a runs directory, or None when there is none.

    Raises:
      FitInputError: the file is not valid JSON or not a selection document.
    """
    path = storage.as_path(root) / SELECTION_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise FitInputError(f"{path} is not valid JSON ({e})") from e
    if not isinstance(document, dict) or not isinstance(document.get("selections"), dict):
        raise FitInputError(f"{path} holds no 'selections' table (see docs/interfaces.md)")
    return document


def rejected_runs(document: dict[str, Any] | None) -> dict[str, str]:
    """Run id -> why it is not used: candidates of a decided group other than the chosen run."""
    out = {}
    for name, stage in ((document or {}).get("selections") or {}).items():
        for group, decided in (stage.get("groups") or {}).items():
            chosen = decided.get("chosen")
            for candidate in decided.get("candidates") or ():
                run_id = candidate.get("run_id")
                if run_id and run_id != chosen:
                    out[run_id] = (
                        f"[[select]] {name} [{group}] chose {chosen} "
                        f"({stage.get('rule')} {decided.get('metric', stage.get('metric'))})"
                    )
    return out
