"""`RunData`: one training run as `fitting` sees it, whichever format it was read from
(xlscale's run directory, `fitting.readers.run_dirs`; T5X's, `fitting.readers.t5x_runs`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from etils import epath

from rundir import run_record

EVAL_PREFIX = "eval/"


@dataclasses.dataclass(frozen=True)
class RunData:
    """One training run as written by the trainer.

    Attributes:
      run_id: the directory name.
      path: the run directory.
      meta: the contents of run.json.
      records: metrics.jsonl objects (or TensorBoard scalars regrouped by step), by step.
      completed: the COMPLETED marker's contents, or None for a run still going (or failed).
      warnings: what the reader left out or could not tell (a torn last line of metrics.jsonl,
        an empty run.json), each naming the run; `xlscale fit` reports them.
      info: `meta` as a typed record (`rundir.run_record.RunRecord`), what readers use.
    """

    run_id: str
    path: epath.Path
    meta: dict[str, Any]
    records: tuple[dict[str, Any], ...]
    completed: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    info: run_record.RunRecord = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "info", run_record.RunRecord.of(self.meta))

    @property
    def strategy(self) -> run_record.Strategy | str:
        """A `rundir.run_record.Strategy` (compares equal to its name), or the record's string
        where it names none."""
        return self.info.strategy

    @property
    def target_lang(self) -> str:
        """Language the run is trained for (for a source run: its only language)."""
        return self.info.language

    def evals(self) -> list[dict[str, Any]]:
        """Records that carry at least one eval/ value."""
        return [r for r in self.records if any(k.startswith(EVAL_PREFIX) for k in r)]
