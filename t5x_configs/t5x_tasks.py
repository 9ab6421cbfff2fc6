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

import seqio

from pipelines import mixtures, names, tasks
from t5x_configs import t5x_env


def _first_pairs(task: seqio.Task, pairs: int) -> seqio.Task:
    """`task` with its train split cut to its first `pairs` examples, in file order (unshuffled,
    so every epoch and every host sees the same set); other splits unchanged."""
    source = task.source

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
        if split == "train":
            return source.get_dataset(split=split, shuffle=False, seed=seed).take(pairs)
        return source.get_dataset(split=split, shuffle=shuffle_files, seed=seed)

    return seqio.Task(
        task.name,
        source=seqio.FunctionDataSource(dataset_fn, splits=source.splits),
        output_features=task.output_features,
        preprocessors=task.preprocessors,
        postprocess_fn=task.postprocessor,
        metric_fns=task.metric_fns,
    )


def limit_finetuning_sets(task_names: list[str], pairs: int | None) -> list[str]:
    """Re-registers every translation task of `task_names` with its first `pairs` training pairs
    (`XLSCALE_FINETUNE_PAIRS`, a finetune's Df / 512); returns the tasks changed."""
    if pairs is None:
        return []
    changed = [name for name in task_names if names.mt_pair(name)]
    for name in changed:
        task = seqio.TaskRegistry.get(name)
        seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add_provider(name, _first_pairs(task, pairs))
    return changed


def register() -> tuple[list[str], list[str]]:
    """Registers (idempotently) the tasks and mixtures; returns their names."""
    registered = tasks.register_tasks(
        vocabulary=t5x_env.vocabulary(), corpora_dir=t5x_env.data_dir()
    )
    limit_finetuning_sets(registered, t5x_env.finetune_pairs())
    return registered, mixtures.register_mixtures()


TASKS, MIXTURES = register()
