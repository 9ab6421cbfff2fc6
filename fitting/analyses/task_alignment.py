"""The translation alignment score (eq. 2 of the MT paper) of a mixture for a task, by name."""

from __future__ import annotations

from fitting.analyses import alignment
from pipelines.names import mt_pair


def alignment_of(mixture: str, task: str) -> float | None:
    """Alignment score of pretraining `mixture` for translation `task` (`mt_<src>_<tgt>`); None
    when the task is no translation task or the mixture's languages cannot be read from its
    name, so tables can show the gap instead of failing."""
    pair = mt_pair(task)
    if pair is None:
        return None
    try:
        return alignment.score(mixture, *pair)
    except ValueError:
        return None
