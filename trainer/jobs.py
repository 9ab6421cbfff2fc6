"""Assembling a job: plan it (model, mesh, checks, counts, steps), then compile its steps.

`plan_job` runs every check of `trainer.validation` before anything is compiled (including the
memory check: a step whose estimated bytes exceed the device's memory is refused with the
planner's suggestion, `trainer.memory_check`) and returns a frozen `JobPlan`; `compile_plan` compiles
the train and eval steps ahead of time (`jit(...).lower(...).compile()`) inside the mesh and
logical-rules context, so that sharding constraints inside the model resolve and compile errors
surface before the first batch is read. A training run wraps the `JobPlan` in its
`trainer.plan.RunPlan`; evaluation calls `build_job` (both at once); the benchmarks call
`compile_job` directly.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from modeling import family as family_lib
from modeling import memory as memory_lib
from pipelines import features
from trainer import data as data_lib
from trainer import memory_check, model_spec, partitioning, steps, validation
from trainer.data import DataConfig, EvalConfig
from trainer.optimizers import OptimizerConfig, build_optimizer
from trainer.partitioning import MeshConfig, Partitioner
from trainer.schedules import LENGTH_FREE, ScheduleConfig, build_schedule


@dataclasses.dataclass
class Job:
    """Everything compiled for one run.

    Attributes:
      model: the model wrapper (`modeling.models`).
      partitioner: mesh and logical-axis shardings.
      optimizer, schedule: the optax transformation and learning-rate schedule.
      total_steps: optimizer steps of the whole run.
      components: mixture components (the order of `tokens_by_task`).
      flops_per_token, flops_per_token_attn: 6·N and the attention-inclusive count.
      abstract_state: shapes/dtypes of the `TrainState`.
      shardings: shardings of the `TrainState`.
      train_step: compiled `(state, batch) -> (state, metrics)`, donating the state (None when
        not compiled).
      eval_step: compiled `(params, batch) -> (ce_sum, tokens)`, or None without eval tasks.
      eval_batch_size: global eval batch.
      seq_len: decoder row length.
      eval_data: eval batches read so far, by (task, split, length, batch, tokens).
      feature_lengths: the task feature lengths (`{"targets": L}`, or with `"inputs"` for an
        encoder-decoder).
      data: the run's `DataConfig` (`compile_plan` sets it): where evaluation reads from (a run
        on prepared data reads prepared validation splits); None: through seqio.
    """

    model: Any
    partitioner: Partitioner
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    total_steps: int
    components: list[str]
    flops_per_token: float
    flops_per_token_attn: float
    abstract_state: steps.TrainState
    shardings: steps.TrainState
    train_step: Callable | None
    eval_step: Callable | None
    eval_batch_size: int
    seq_len: int
    eval_data: dict = dataclasses.field(default_factory=dict)
    feature_lengths: dict = dataclasses.field(default_factory=dict)
    data: Any = None

    def flops_kwargs(self) -> dict[str, float]:
        """FLOPs-per-token arguments for metric records."""
        return {
            "flops_per_token": self.flops_per_token,
            "flops_per_token_attn": self.flops_per_token_attn,
        }

    def abstract_state_with_shardings(self) -> steps.TrainState:
        """`abstract_state` with each leaf's sharding attached (restore targets)."""
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            self.abstract_state,
            self.shardings,
        )

    def init_state(self, rng: np.ndarray, *, params: Any | None = None) -> steps.TrainState:
        """A sharded step-0 state: fresh params from `rng` or the given ones, zero moments."""
        with self.partitioner.context():
            if params is None:
                fn = jax.jit(
                    lambda r: steps.init_train_state(
                        self.model, self.optimizer, r, seq_len=self.seq_len
                    ),
                    out_shardings=self.shardings,
                )
                rng = jnp.asarray(rng)
                return fn.lower(rng).compile(_init_compiler_options())(rng)
            fn = jax.jit(
                lambda r, p: steps.init_train_state(self.model, self.optimizer, r, params=p),
                out_shardings=self.shardings,
            )
            return fn(jnp.asarray(rng), params)

    def assemble_state(self, *, params, opt_state, step: int, rng, skipped: int):
        """A `TrainState` from restored parts, scalars placed as the shardings say."""

        def put(value, sharding):
            return jax.device_put(np.asarray(value), sharding)

        return steps.TrainState(
            step=put(np.int32(step), self.shardings.step),
            params=params,
            opt_state=opt_state,
            rng=put(np.asarray(rng, np.uint32), self.shardings.rng),
            skipped=put(np.int32(skipped), self.shardings.skipped),
        )


def _init_compiler_options() -> dict[str, int] | None:
    """XLA options for the one-off initialisation program.

    It runs once per job, and on CPU its random-number kernels take seconds to optimise for
    microseconds saved, so the CPU backend compiles it unoptimised (the values agree to about
    one ulp).
    """
    if jax.default_backend() == "cpu":
        return {"xla_backend_optimization_level": 0}
    return None


def _check_shapes(
    *, spec: model_spec.ModelSpec, model, data: DataConfig, partitioner, microbatches: int
) -> None:
    """The checks of batch and feature shapes against the model and the mesh (see
    `trainer.validation`); they need no registered task."""
    validation.check_batch_size(
        batch_size=data.batch_size,
        data_parallel_size=partitioner.data_parallel_size,
        num_microbatches=microbatches,
        process_count=jax.process_count(),
    )
    validation.check_feature_lengths(
        feature_lengths=data.task_feature_lengths,
        max_len=model.max_len,
        required=model.feature_keys,
        model=spec.size,
    )
    validation.check_model_features(
        feature_lengths=data.task_feature_lengths,
        feature_keys=model.feature_keys,
        family=spec.family,
    )


def _check_tasks(*, model, data: DataConfig, evaluation) -> None:
    """The checks of the training, evaluation and decoding tasks against the registered ones
    and of their vocabulary against the model's (see `trainer.validation`). A run on prepared
    data (`data.seqio_free`) registers no seqio task: its training tasks are checked when their
    prepared splits are opened (`data.prepared_datasets`), its eval tasks' prepared validation
    splits here, and only decoding tasks are registered through seqio."""
    if data_lib.seqio_free(data):
        _check_prepared_tasks(model=model, data=data, evaluation=evaluation)
        return
    names = data_lib.registered_names()
    validation.check_task(name=data.mixture_or_task, allowed=names)
    for task in evaluation.tasks:
        validation.check_task(name=task, allowed=names, binding="eval_tasks")
    decoding = getattr(evaluation, "decoding", None)
    validation.check_decoding(
        tasks=decoding.tasks if decoding is not None else (),
        allowed=names,
        feature_keys=model.feature_keys,
    )
    validation.check_vocab(
        vocab_size=data_lib.vocab_size(data.mixture_or_task),
        model_vocab_size=model.vocab_size,
        vocab_path=data.vocab_path,
    )


def _check_prepared_tasks(*, model, data: DataConfig, evaluation) -> None:
    """`_check_tasks` of a run on prepared data: the eval tasks' prepared splits exist and
    verify, decoding tasks (read through seqio) are registered, and the vocabulary of
    `VOCAB_PATH` fits the model."""
    data_lib.check_prepared_eval(data, evaluation)
    decoding = getattr(evaluation, "decoding", None)
    if decoding is not None and decoding.tasks:
        data_lib.register_seqio(data)  # decoding reads its held-out split through seqio
        validation.check_decoding(
            tasks=decoding.tasks,
            allowed=data_lib.registered_names(),
            feature_keys=model.feature_keys,
        )
    validation.check_vocab(
        vocab_size=data_lib.vocab_size(data.mixture_or_task, data),
        model_vocab_size=model.vocab_size,
        vocab_path=data.vocab_path,
    )


def batch_abstract(
    partitioner: Partitioner,
    *,
    batch_size: int,
    seq_len: int,
    feature_lengths: Mapping[str, int] | None = None,
) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and shardings of a global batch: decoder arrays `[batch, seq_len]`, plus encoder
    arrays `[batch, inputs]` when `feature_lengths` has `inputs`."""
    sharding = partitioner.batch_sharding()
    lengths = features.batch_lengths({"targets": seq_len, **(feature_lengths or {})})
    return {
        key: jax.ShapeDtypeStruct((batch_size, length), jnp.int32, sharding=sharding)
        for key, length in lengths.items()
    }


def build_partitioned_model(
    spec: model_spec.ModelSpec, mesh: MeshConfig, *, devices: Sequence[jax.Device] | None = None
) -> tuple[Any, Partitioner, Any]:
    """The model wrapper, the partitioner (the family's logical-axis rules over the mesh of
    `devices`, default all), and its parameters' abstract tree with shardings (a restore target),
    after checking the family and size. Compile-only devices (a TPU topology) work too."""
    validation.check_choice(name="family", value=spec.family, allowed=family_lib.names())
    family = family_lib.get(spec.family)
    validation.check_model_size(
        family=spec.family,
        size=spec.size,
        allowed=family.sizes(),
        prefixes=family_lib.size_prefixes(family),
    )
    wrapper = family.build(spec)
    partitioner = Partitioner(
        mesh=partitioning.build_mesh(mesh, devices), rules=family.axis_rules()
    )
    variables = wrapper.abstract_variables()
    shardings = partitioner.params_shardings(variables)
    abstract = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        partitioning.unbox(variables["params"]),
        shardings,
    )
    return wrapper, partitioner, abstract


def resolve_train_steps(
    *,
    train_steps: int | None,
    tokens_per_param: float | None,
    tokens_per_step: int,
    params_total: float,
    params_non_embedding: float,
    params_nominal: float | None = None,
    param_basis: str = "non_embedding",
    size: str = "",
) -> int:
    """`train_steps`, or enough steps for `tokens_per_param × N` tokens (rounded up), N on
    `param_basis` (`modeling.family.PARAM_BASES`: the exact non-embedding or total count, or the
    paper's nominal size `params_nominal` of model `size`). The sweep's `[budget]` computes the
    same (`launch.budgets.steps_and_batch`, tests/test_token_budget.py).

    Raises:
      trainer.validation.ConfigError: no positive length, an unknown basis, or 'nominal' for a
        size without a nominal count (only when the steps are computed).
    """
    validation.check_steps(train_steps=train_steps, tokens_per_param=tokens_per_param)
    validation.check_choice(name="param_basis", value=param_basis, allowed=family_lib.PARAM_BASES)
    if train_steps is not None:
        return int(train_steps)
    params = family_lib.basis_params(
        param_basis, total=params_total, non_embedding=params_non_embedding, nominal=params_nominal
    )
    if params is None:
        raise validation.ConfigError(
            f"{validation.BINDINGS['param_basis']} = {param_basis!r}, but MODEL_SIZE {size!r} has "
            "no nominal size in its paper's table; allowed: 'non_embedding' or 'total' (the "
            f"model's exact counts), or set {validation.BINDINGS['train_steps']}"
        )
    return max(1, math.ceil(tokens_per_param * params / tokens_per_step))


@dataclasses.dataclass(frozen=True)
class RunLength:
    """How long a run trains, as asked (`resolve_train_steps` turns it into steps): `train_steps`,
    or `tokens_per_param` tokens per parameter, N counted on `param_basis`. One bundle, since the
    plan, the fingerprint and the resume policy always take the three together."""

    train_steps: int | None = None
    tokens_per_param: float | None = None
    param_basis: str = "non_embedding"


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """What a job compiles, decided and checked before anything is compiled.

    Attributes:
      spec, data, evaluation, optimizer, schedule: the configs as given.
      step: the train step's settings, `num_components` filled in from the mixture.
      model: the model wrapper (`modeling.models`).
      partitioner: mesh and logical-axis shardings.
      abstract_params: parameter shapes with shardings (a restore target).
      components: mixture components (the order of `tokens_by_task`).
      params_total, params_non_embedding: parameter counts (N is the non-embedding one).
      length: the run's length as asked; total_steps: optimizer steps of the whole run.
      eval_batch_size: the global eval batch, None without eval tasks.
      memory: the memory model's estimate of the train step (None: the device memory is
        unknown, or no train step is compiled).
    """

    spec: model_spec.ModelSpec
    data: DataConfig
    evaluation: EvalConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    step: steps.StepConfig
    model: Any
    partitioner: Partitioner
    abstract_params: Any
    components: list[str]
    params_total: int
    params_non_embedding: int
    total_steps: int
    eval_batch_size: int | None
    memory: memory_lib.MemoryEstimate | None = None
    length: RunLength = RunLength()


def plan_job(
    *,
    model: model_spec.ModelSpec,
    data: DataConfig,
    evaluation: EvalConfig,
    optimizer: OptimizerConfig,
    schedule: ScheduleConfig,
    mesh: MeshConfig,
    step: steps.StepConfig = steps.StepConfig(),
    train_steps: int | None = None,
    tokens_per_param: float | None = None,
    param_basis: str = "non_embedding",
    register: bool = True,
    train: bool = True,
) -> JobPlan:
    """Builds the model and partitioner, registers the data and runs every check that needs no
    compilation (`trainer.validation`), counts parameters and resolves the steps.

    Args:
      step: microbatches and z-loss (`num_components` is taken from the mixture).
      train_steps, tokens_per_param, param_basis: the run's length (`resolve_train_steps`).
      register: register the tasks of `data.vocab_path` (False when the caller has).
      train: the job trains: its step's memory is checked against the device's
        (evaluation-only jobs compile no train step).
    Raises:
      trainer.validation.ConfigError: for any invalid setting, before anything is compiled.
    """
    wrapper, partitioner, abstract_params = build_partitioned_model(model, mesh)
    if register:
        data_lib.register(data)
    # Every check that needs no compilation, before anything is compiled.
    _check_shapes(
        spec=model,
        model=wrapper,
        data=data,
        partitioner=partitioner,
        microbatches=step.num_microbatches,
    )
    _check_tasks(model=wrapper, data=data, evaluation=evaluation)
    eval_batch = evaluation.batch_size or data.batch_size
    if evaluation.tasks:
        validation.check_batch_size(
            batch_size=eval_batch,
            data_parallel_size=partitioner.data_parallel_size,
            process_count=jax.process_count(),
        )
    components = data_lib.components(data.mixture_or_task, data)
    total, non_embedding = wrapper.param_counts()
    length = RunLength(train_steps, tokens_per_param, param_basis)
    total_steps = resolve_train_steps(
        **dataclasses.asdict(length),
        tokens_per_step=data.batch_size * data.seq_len,
        params_total=total,
        params_non_embedding=non_embedding,
        params_nominal=family_lib.get(model.family).nominal_params(model.size),
        size=model.size,
    )
    estimate = None
    if train:
        shape = memory_check.step_shape(
            model=wrapper,
            partitioner=partitioner,
            batch_size=data.batch_size,
            seq_len=data.seq_len,
            feature_lengths=data.task_feature_lengths,
            optimizer=optimizer,
            num_microbatches=step.num_microbatches,
        )
        estimate = memory_check.check_memory(
            model=wrapper, shape=shape, limit=memory_check.device_memory_limit(mesh, partitioner)
        )
    return JobPlan(
        spec=model,
        data=data,
        evaluation=evaluation,
        optimizer=optimizer,
        schedule=schedule,
        step=dataclasses.replace(step, num_components=len(components)),
        model=wrapper,
        partitioner=partitioner,
        abstract_params=abstract_params,
        components=components,
        params_total=total,
        params_non_embedding=non_embedding,
        total_steps=total_steps,
        eval_batch_size=eval_batch if evaluation.tasks else None,
        memory=estimate,
        length=length,
    )


def compile_plan(plan: JobPlan, *, compile_train: bool = True) -> Job:
    """Compiles the planned job's steps (`compile_job`); the job keeps the plan's data
    settings (where evaluation reads from)."""
    job = compile_job(
        model=plan.model,
        partitioner=plan.partitioner,
        abstract_params=plan.abstract_params,
        components=plan.components,
        total_steps=plan.total_steps,
        batch_size=plan.data.batch_size,
        seq_len=plan.data.seq_len,
        feature_lengths=plan.data.task_feature_lengths,
        eval_batch_size=plan.eval_batch_size,
        optimizer=plan.optimizer,
        schedule=plan.schedule,
        step_config=plan.step,
        compile_train=compile_train,
    )
    job.data = plan.data
    return job


def build_job(*, compile_train: bool = True, **kwargs) -> Job:
    """`plan_job(**kwargs)` compiled (`compile_plan`): evaluation and tests, which need no run
    directory around the job."""
    return compile_plan(plan_job(train=compile_train, **kwargs), compile_train=compile_train)


# Compiled (train step, eval step) pairs of this process, most recently used last. A sweep run in
# one process (the demos) builds the same programs again and again -- the source, scratch and CPT
# runs of one size; every finetuning run of one shape -- and tracing and lowering them costs
# seconds per run even when XLA's persistent cache spares the compilation.
_COMPILED: collections.OrderedDict = collections.OrderedDict()
_MAX_COMPILED = 8


def _compiled_key(
    wrapper: Any, partitioner: Partitioner, abstract_params: Any, *, total_steps, settings
) -> tuple:
    """Everything a compiled step depends on: the model (family, config), the mesh and rules,
    the parameters' shapes and shardings, and the training settings (steps only where the
    learning-rate schedule depends on them)."""
    return (
        type(wrapper).__name__,
        repr(wrapper.config),
        partitioner.mesh,
        partitioner.rules,
        repr(jax.tree.map(lambda a: (a.shape, a.dtype, a.sharding), abstract_params)),
        total_steps,
        repr(settings),
    )


def compile_job(
    *,
    model: Any,
    partitioner: Partitioner,
    abstract_params: Any,
    components: list[str],
    total_steps: int,
    batch_size: int,
    seq_len: int,
    eval_batch_size: int | None,
    optimizer: OptimizerConfig,
    schedule: ScheduleConfig,
    step_config: steps.StepConfig,
    compile_train: bool = True,
    feature_lengths: Mapping[str, int] | None = None,
) -> Job:
    """Builds optimizer and schedule, derives the state shardings and compiles the steps (the
    part of `build_job` that needs no data; the benchmark calls it directly).

    Args:
      abstract_params: parameter shapes with shardings (from `build_partitioned_model`).
      eval_batch_size: compile the eval step for this global batch (None: no eval step).
      feature_lengths: the task feature lengths; None: `{"targets": seq_len}` (decoder-only).
    """
    wrapper = model
    lr = build_schedule(schedule, total_steps=total_steps)
    tx = build_optimizer(optimizer, learning_rate=lr)
    lengths = {"targets": seq_len, **(feature_lengths or {})}
    key = _compiled_key(
        wrapper,
        partitioner,
        abstract_params,
        total_steps=None if schedule.name in LENGTH_FREE else total_steps,
        settings=(
            optimizer,
            schedule,
            step_config,
            batch_size,
            seq_len,
            tuple(sorted(lengths.items())),
            eval_batch_size,
            compile_train,
        ),
    )
    six_n, with_attn = wrapper.flops_per_token(seq_len=seq_len, inputs_len=lengths.get("inputs"))
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
    abstract_state = jax.eval_shape(
        lambda r: steps.init_train_state(wrapper, tx, r, seq_len=seq_len), rng
    )
    params_shardings = jax.tree.map(lambda a: a.sharding, abstract_params)
    shardings = steps.state_shardings(partitioner, abstract_state, params_shardings)
    abstract_with = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        abstract_state,
        shardings,
    )
    compiled = _COMPILED.get(key)
    with partitioner.context():
        train_step = None
        if compiled is not None:
            _COMPILED.move_to_end(key)
            train_step, eval_step = compiled
        elif compile_train:
            batch = batch_abstract(
                partitioner, batch_size=batch_size, seq_len=seq_len, feature_lengths=lengths
            )
            train_step = steps.compile_train_step(
                steps.make_train_step(wrapper, tx, lr, step_config),
                partitioner=partitioner,
                shardings=shardings,
            )
            train_step = train_step.lower(abstract_with, batch).compile()
        if compiled is None:
            eval_step = None
        if compiled is None and eval_batch_size:
            eval_step = steps.compile_eval_step(
                steps.make_eval_step(wrapper),
                partitioner=partitioner,
                params_shardings=params_shardings,
            )
            batch = batch_abstract(
                partitioner, batch_size=eval_batch_size, seq_len=seq_len, feature_lengths=lengths
            )
            eval_step = eval_step.lower(abstract_with.params, batch).compile()
    if compiled is None:
        _COMPILED[key] = (train_step, eval_step)
        while len(_COMPILED) > _MAX_COMPILED:
            _COMPILED.popitem(last=False)
    return Job(
        model=wrapper,
        partitioner=partitioner,
        optimizer=tx,
        schedule=lr,
        total_steps=total_steps,
        components=components,
        flops_per_token=six_n,
        flops_per_token_attn=with_attn,
        abstract_state=abstract_state,
        shardings=shardings,
        train_step=train_step,
        eval_step=eval_step,
        eval_batch_size=eval_batch_size or batch_size,
        seq_len=seq_len,
        feature_lengths=lengths,
    )
