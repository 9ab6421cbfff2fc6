"""What a training run is asked to do, as one value.

`RunRequest` holds every input of `trainer.train.train`, so that the planner
(`trainer.plan.build_run_plan`) takes the request whole instead of a copy of `train`'s keyword
list; `JobRequest` is the part of it a job's plan (`trainer.jobs.plan_job`) needs, and `RunLength`
the part that says how long the run trains. `RunInfo` (what `run.json` says the run is) and
`TrainResult` (how `train` ended) live here too, so that the plan can type them; `trainer.train`
re-exports both (gin files bind `train_script.RunInfo`, tests and callers import them from there).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from rundir import finetune_recipes
from rundir.lease import LeaseConfig
from trainer import model_spec
from trainer.checkpoints import CheckpointConfig
from trainer.data import DataConfig, EvalConfig
from trainer.loop import LoopConfig
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig
from trainer.steps import StepConfig


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What the run is, for `run.json` (read by `fitting`).

    Attributes:
      strategy: one of `trainer.train.STRATEGIES`.
      languages: languages trained on (default: derived from the mixture's components).
      target_lang, source_lang: CPT's target and source languages.
      replay_ratio: fraction of source-language tokens replayed during CPT (0-1).
      finetune_tokens: the finetuning set size Df as given (`FINETUNE_TOKENS`), if one was.
      finetune_unit: what `finetune_tokens` counts (`FINETUNE_UNIT`, a key of
        `rundir.paper_units.DF_UNITS`): `"target"` real target tokens, `"paper"` the MT
        paper's pairs × 512.
      finetune_recipe: the finetuning length by name (`FINETUNE_RECIPE`, a key of
        `rundir.finetune_recipes.RECIPES`), None for runs that are not finetunes.
    """

    strategy: str = "pretrain"
    languages: Sequence[str] = ()
    target_lang: str | None = None
    source_lang: str | None = None
    replay_ratio: float = 0.0
    finetune_tokens: int | None = None
    finetune_unit: str = "target"
    finetune_recipe: str | None = None

    def __post_init__(self):
        if self.finetune_recipe is not None:
            finetune_recipes.recipe(self.finetune_recipe)  # refuses an unknown name, naming it


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How a call to `train` ended: `completed` False means preempted or stopped early."""

    model_dir: str
    step: int
    tokens: int
    completed: bool


@dataclasses.dataclass(frozen=True)
class RunLength:
    """How long a run trains, as asked (`trainer.jobs.resolve_train_steps` turns it into steps):
    `train_steps`, or `tokens_per_param` tokens per parameter, N counted on `param_basis`. One
    bundle, since the plan, the fingerprint and the resume policy always take the three together.
    """

    train_steps: int | None = None
    tokens_per_param: float | None = None
    param_basis: str = "non_embedding"


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """What a job's plan (`trainer.jobs.plan_job`) is built from: the model, its data, how it is
    evaluated, optimised and laid out, its train step's settings and its length. A training run
    takes it from its `RunRequest` (`RunRequest.job`); evaluation and tests build it directly
    (`trainer.jobs.build_job`)."""

    model: model_spec.ModelSpec
    data: DataConfig
    evaluation: EvalConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    mesh: MeshConfig
    step: StepConfig = StepConfig()
    length: RunLength = RunLength()


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """Every input of one call to `trainer.train.train`, as given (see its docstring for each
    field). `train` builds one and hands it whole to the planner, so a new input is one field
    here and one keyword of `train` (which gin binds), not an edit of every layer between."""

    model_dir: str | os.PathLike
    model: model_spec.ModelSpec
    data: DataConfig
    train_steps: int | None = None
    tokens_per_param: float | None = None
    param_basis: str = "non_embedding"
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    mesh: MeshConfig = MeshConfig()
    evaluation: EvalConfig = EvalConfig()
    step: StepConfig = StepConfig()
    loop: LoopConfig = LoopConfig()
    run: RunInfo = RunInfo()
    init_checkpoint: str | None = None
    seed: int = 0
    gin_config: str = ""
    resume_policy: str | Sequence[str] | None = None
    lease: LeaseConfig = LeaseConfig()
    expect_platform: str | None = None

    @property
    def length(self) -> RunLength:
        """How long the run trains, as asked."""
        return RunLength(self.train_steps, self.tokens_per_param, self.param_basis)

    @property
    def job(self) -> JobRequest:
        """The part of the request a job's plan needs (`trainer.jobs.plan_job`)."""
        return JobRequest(
            model=self.model,
            data=self.data,
            evaluation=self.evaluation,
            optimizer=self.optimizer,
            schedule=self.schedule,
            mesh=self.mesh,
            step=self.step,
            length=self.length,
        )
