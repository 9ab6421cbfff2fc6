"""`RunRecord`: one training run as `fitting` sees it, whichever format it was read from
(xlscale's run directory, `fitting.io`; T5X's, `fitting.t5x_runs`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from etils import epath

EVAL_PREFIX = "eval/"


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One training run as written by the trainer.

    Attributes:
      run_id: the directory name.
      path: the run directory.
      meta: the contents of run.json.
      records: metrics.jsonl objects (or TensorBoard scalars regrouped by step), by step.
      completed: the COMPLETED marker's contents, or None for a run still going (or failed).
    """

    run_id: str
    path: epath.Path
    meta: dict[str, Any]
    records: tuple[dict[str, Any], ...]
    completed: dict[str, Any] | None = None

    @property
    def strategy(self) -> str:
        """source, scratch, cpt, cpt_replay, pretrain, finetune or finetune_scratch."""
        return str(self.meta.get("strategy", ""))

    @property
    def target_lang(self) -> str:
        """Language the run is trained for (for a source run: its only language)."""
        lang = self.meta.get("target_lang") or self.meta.get("source_lang")
        if not lang and self.meta.get("languages"):
            lang = self.meta["languages"][0]
        return str(lang or "")

    def evals(self) -> list[dict[str, Any]]:
        """Records that carry at least one eval/ value."""
        return [r for r in self.records if any(k.startswith(EVAL_PREFIX) for k in r)]
