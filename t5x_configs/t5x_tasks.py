"""xlscale's seqio tasks and mixtures for real T5X: `--gin.MIXTURE_OR_TASK_MODULE="'t5x_configs.t5x_tasks'"`.

T5X imports the module named by `MIXTURE_OR_TASK_MODULE` before it looks a task up, so this
module registers at import, and does nothing else: every `span_<lang>` / `lm_<lang>` task whose
training text is under `XLSCALE_DATA_DIR`, both directions `mt_<src>_<tgt>` of every pair present,
and the mixtures of `pipelines.mixtures.RATIOS` whose tasks exist, all against the vocabulary at
`XLSCALE_VOCAB_PATH` (with 100 sentinels). An unset variable is a `RuntimeError` naming it.

Mixture rates are `RATIOS`' token fractions; seqio under T5X samples them as *example* rates
(xlscale's own streams convert them to example rates per component), so token shares under T5X
follow the fractions only as far as the components' example lengths agree.
"""

from __future__ import annotations

from pipelines import mixtures, tasks
from t5x_configs import t5x_env


def register() -> tuple[list[str], list[str]]:
    """Registers (idempotently) the tasks and mixtures; returns their names."""
    names = tasks.register_tasks(vocabulary=t5x_env.vocabulary(), corpora_dir=t5x_env.data_dir())
    return names, mixtures.register_mixtures()


TASKS, MIXTURES = register()
