"""Assembling a job: plan it (model, mesh, checks, counts, steps), then compile its steps.

`plan_job` takes a `trainer.run_request.JobRequest` (a run's `RunRequest.job`) and runs every
check of `trainer.validation` before anything is compiled (including the
memory check: a step whose estimated bytes exceed the device's memory is refused with the
planner's suggestion, `trainer.memory_check`) and returns a frozen `JobPlan`; `compile_plan` compiles
the train and eval steps ahead of time (`jit(...).lower(...).compile()`) inside the mesh and
logical-rules context, so that sharding constraints inside the model resolve and compile errors
surface before the first batch is read. A training run wraps the `JobPlan` in its
`trainer.plan.RunPlan` and `compile_plan` hands the plan whole to compilation (`_compile`);
evaluation calls `build_job` (both at once); the benchmarks call `compile_job` directly, with the
same compilation behind it.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from modeling import family as family_lib
from modeling import memory as memory_lib
from pipelines import features
from trainer import data as data_lib
from trainer import job_checks, memory_check, model_spec, partitioning, steps, validation
from trainer.data import DataConfig, EvalConfig
from trainer.optimizers import OptimizerConfig, build_optimizer, reads_parameter_scale
from trainer.partitioning import MeshConfig, Partitioner
from trainer.run_request import JobRequest, RunLength
from trainer.schedules import ScheduleConfig, build_schedule


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
      train_step: compiled `(state, batch) -> (state, metrics)`, donating the state, with this
        run's schedule numbers bound (`steps.BoundStep`; None when not compiled).
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
    # The initialisation programs (fresh params from an rng; the state around given params),
    # shared with every job of this process that shares its train and eval steps (`_COMPILED`):
    # they depend on nothing more than they do.
    init_programs: dict = dataclasses.field(default_factory=dict)

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
                rng = jnp.asarray(rng)
                which = ("fresh", rng.shape, str(rng.dtype))
                init = self.init_programs.get(which)
                if init is None:
                    fn = jax.jit(
                        lambda r: steps.init_train_state(
                            self.model, self.optimizer, r, seq_len=self.seq_len
                        ),
                        out_shardings=self.shardings,
                    )
                    init = fn.lower(rng).compile(_init_compiler_options())
                    self.init_programs[which] = init
                return init(rng)
            # Given params (CPT, finetuning): one jitted function per shared program set, so
            # a sweep's later runs find it traced and compiled in jit's own cache.
            fn = self.init_programs.get("given")
            if fn is None:
                fn = jax.jit(
                    lambda r, p: steps.init_train_state(self.model, self.optimizer, r, params=p),
                    out_shardings=self.shardings,
                )
                self.init_programs["given"] = fn
            return fn(jnp.asarray(rng), params)

    def assemble_state(self, *, params, opt_state, step: int, rng, skipped: int):
        """A `TrainState` from restored parts, scalars placed as the shardings say."""

        def put(value, sharding):
            return jax.device_put(np.asarray(value), sharding)

        norm = self.init_programs.get("param_norm")
        if norm is None:
            norm = jax.jit(steps.global_norm_of, out_shardings=self.shardings.param_norm)
            self.init_programs["param_norm"] = norm
        return steps.TrainState(
            step=put(np.int32(step), self.shardings.step),
            params=params,
            opt_state=opt_state,
            rng=put(np.asarray(rng, np.uint32), self.shardings.rng),
            skipped=put(np.int32(skipped), self.shardings.skipped),
            param_norm=norm(params),
        )


def _init_compiler_options() -> dict[str, int | bool] | None:
    """XLA options for the one-off initialisation program.

    It runs once per job, and on CPU its random-number kernels take seconds to optimise for
    microseconds saved, so the CPU backend compiles it unoptimised (the values agree to about
    one ulp) and with XLA:CPU's loop emitters, which compile its hundreds of small threefry
    fusions in about 0.7x the CPU time of the newer fusion emitters, to equal values.
    """
    if jax.default_backend() == "cpu":
        return {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
    return None


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
    paper's nominal size `params_nominal` of model `size`), by the one steps rule the sweep's
    `[budget]` uses too (`modeling.family.budget_steps`).

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
    return family_lib.budget_steps(
        tokens_per_step=tokens_per_step, tokens_per_param=tokens_per_param, params=params
    )


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

    @property
    def batch_size(self) -> int:
        """The global train batch, in sequences."""
        return self.data.batch_size

    @property
    def seq_len(self) -> int:
        """The decoder row length."""
        return self.data.seq_len

    @property
    def feature_lengths(self) -> Mapping[str, int]:
        """The task feature lengths."""
        return self.data.task_feature_lengths


def plan_job(request: JobRequest, *, register: bool = True, train: bool = True) -> JobPlan:
    """Builds the model and partitioner, registers the data and runs every check that needs no
    compilation (`trainer.validation`), counts parameters and resolves the steps.

    Args:
      request: model, data, evaluation, optimizer, schedule, mesh, the train step's settings
        (`num_components` is taken from the mixture) and the run's length
        (`resolve_train_steps`).
      register: register the tasks of `data.vocab_path` (False when the caller has).
      train: the job trains: its step's memory is checked against the device's
        (evaluation-only jobs compile no train step).
    Raises:
      trainer.validation.ConfigError: for any invalid setting, before anything is compiled.
    """
    spec, data, evaluation, step = request.model, request.data, request.evaluation, request.step
    wrapper, partitioner, abstract_params = build_partitioned_model(spec, request.mesh)
    family = wrapper.model_family  # looked up once, by `build_partitioned_model`
    if register:
        data_lib.register(data)
    # Every check that needs no compilation, before anything is compiled.
    job_checks.check_shapes(
        spec=spec,
        model=wrapper,
        data=data,
        partitioner=partitioner,
        microbatches=step.num_microbatches,
    )
    job_checks.check_tasks(model=wrapper, data=data, evaluation=evaluation)
    eval_batch = evaluation.batch_size or data.batch_size
    if evaluation.tasks:
        validation.check_batch_size(
            batch_size=eval_batch,
            data_parallel_size=partitioner.data_parallel_size,
            process_count=jax.process_count(),
        )
    components = data_lib.components(data.mixture_or_task, data)
    total, non_embedding = wrapper.param_counts()
    total_steps = resolve_train_steps(
        **dataclasses.asdict(request.length),
        tokens_per_step=data.batch_size * data.seq_len,
        params_total=total,
        params_non_embedding=non_embedding,
        params_nominal=family.nominal_params(spec.size),
        size=spec.size,
    )
    estimate = None
    if train:
        shape = memory_check.step_shape(
            model=wrapper,
            partitioner=partitioner,
            batch_size=data.batch_size,
            seq_len=data.seq_len,
            feature_lengths=data.task_feature_lengths,
            optimizer=request.optimizer,
            num_microbatches=step.num_microbatches,
        )
        estimate = memory_check.check_memory(
            model=wrapper,
            shape=shape,
            limit=memory_check.device_memory_limit(request.mesh, partitioner),
        )
    return JobPlan(
        spec=spec,
        data=data,
        evaluation=evaluation,
        optimizer=request.optimizer,
        schedule=request.schedule,
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
        length=request.length,
    )


def compile_plan(plan: JobPlan, *, compile_train: bool = True) -> Job:
    """Compiles the planned job's steps, the plan handed whole to compilation (`_compile`); the
    job keeps the plan's data settings (where evaluation reads from)."""
    job = _compile(plan, compile_train=compile_train)
    job.data = plan.data
    return job


def build_job(
    *,
    compile_train: bool = True,
    register: bool = True,
    step: steps.StepConfig = steps.StepConfig(),
    train_steps: int | None = None,
    tokens_per_param: float | None = None,
    param_basis: str = "non_embedding",
    **configs,
) -> Job:
    """A job planned (`plan_job`) and compiled (`compile_plan`) at once: evaluation and tests,
    which need no run directory around the job. `configs`: the other `JobRequest` fields
    (model, data, evaluation, optimizer, schedule, mesh)."""
    request = JobRequest(
        **configs, step=step, length=RunLength(train_steps, tokens_per_param, param_basis)
    )
    plan = plan_job(request, register=register, train=compile_train)
    return compile_plan(plan, compile_train=compile_train)


# Compiled train and eval steps of this process (with the initialisation programs, the state's
# abstract shapes and its shardings), most recently used last. A sweep run in
# one process (the demos) builds the same programs again and again -- the source, scratch and CPT
# runs of one size; every finetuning run of one shape -- and tracing and lowering them costs
# seconds per run even when XLA's persistent cache spares the compilation.
_COMPILED: collections.OrderedDict = collections.OrderedDict()
_MAX_COMPILED = 8


class _Compiled(NamedTuple):
    """What jobs with the same `_compiled_key` share (`_COMPILED`'s values)."""

    train_step: Any
    eval_step: Any
    init_programs: dict
    abstract_state: Any
    shardings: Any


def _compiled_key(
    wrapper: Any, partitioner: Partitioner, abstract_params: Any, *, settings
) -> tuple:
    """Everything a compiled step depends on: the model (family, config), the mesh and rules,
    the parameters' shapes and shardings, and the training settings (not the run's length or
    learning rate: the schedule's numbers are the step's arguments)."""
    return (
        type(wrapper).__name__,
        repr(wrapper.config),
        partitioner.mesh,
        partitioner.rules,
        repr(jax.tree.map(lambda a: (a.shape, a.dtype, a.sharding), abstract_params)),
        repr(settings),
    )


@dataclasses.dataclass(frozen=True)
class _CompileSettings:
    """`compile_job`'s arguments under the names a `JobPlan` gives them, so that `_compile`
    reads either the same way."""

    model: Any
    partitioner: Partitioner
    abstract_params: Any
    components: list[str]
    total_steps: int
    batch_size: int
    seq_len: int
    feature_lengths: Mapping[str, int] | None
    eval_batch_size: int | None
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    step: steps.StepConfig


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
    """Builds optimizer and schedule, derives the state shardings and compiles the steps of a job
    given piece by piece (the benchmarks, which plan no data; a run compiles its plan whole,
    `compile_plan`).

    Args:
      abstract_params: parameter shapes with shardings (from `build_partitioned_model`).
      eval_batch_size: compile the eval step for this global batch (None: no eval step).
      feature_lengths: the task feature lengths; None: `{"targets": seq_len}` (decoder-only).
    """
    settings = _CompileSettings(
        model=model,
        partitioner=partitioner,
        abstract_params=abstract_params,
        components=components,
        total_steps=total_steps,
        batch_size=batch_size,
        seq_len=seq_len,
        feature_lengths=feature_lengths,
        eval_batch_size=eval_batch_size,
        optimizer=optimizer,
        schedule=schedule,
        step=step_config,
    )
    return _compile(settings, compile_train=compile_train)


def _compile(plan: JobPlan | _CompileSettings, *, compile_train: bool) -> Job:
    """The compilation of `compile_plan` and `compile_job`: optimizer and schedule, the state's
    shapes and shardings, and the train and eval steps (from this process's cache when the same
    programs were compiled before)."""
    wrapper, partitioner, abstract_params = plan.model, plan.partitioner, plan.abstract_params
    optimizer, schedule, step_config = plan.optimizer, plan.schedule, plan.step
    total_steps, components = plan.total_steps, plan.components
    batch_size, seq_len, eval_batch_size = plan.batch_size, plan.seq_len, plan.eval_batch_size
    feature_lengths = plan.feature_lengths
    lr = build_schedule(schedule, total_steps=total_steps)
    tx = build_optimizer(optimizer, learning_rate=lr)
    lengths = {"targets": seq_len, **(feature_lengths or {})}
    # The schedule's numbers are the train step's arguments: only its formula is compiled in.
    key = _compiled_key(
        wrapper,
        partitioner,
        abstract_params,
        settings=(
            optimizer,
            schedule.name,
            step_config,
            batch_size,
            seq_len,
            tuple(sorted(lengths.items())),
            eval_batch_size,
            compile_train,
        ),
    )
    six_n, with_attn = wrapper.flops_per_token(seq_len=seq_len, inputs_len=lengths.get("inputs"))
    params_shardings = jax.tree.map(lambda a: a.sharding, abstract_params)
    compiled = _COMPILED.get(key)
    if compiled is not None:  # the state's shapes too: tracing the initialisation takes a while
        abstract_state, shardings = compiled.abstract_state, compiled.shardings
    else:
        rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
        abstract_state = jax.eval_shape(
            lambda r: steps.init_train_state(wrapper, tx, r, seq_len=seq_len), rng
        )
        shardings = steps.state_shardings(partitioner, abstract_state, params_shardings)
    abstract_with = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        abstract_state,
        shardings,
    )
    with partitioner.context():
        train_step = None
        if compiled is not None:
            _COMPILED.move_to_end(key)
            train_step, eval_step = compiled.train_step, compiled.eval_step
            init_programs = compiled.init_programs
        elif compile_train:
            batch = batch_abstract(
                partitioner, batch_size=batch_size, seq_len=seq_len, feature_lengths=lengths
            )
            reads = reads_parameter_scale(optimizer)  # Adafactor's parameter scale
            train_step = steps.compile_train_step(
                steps.make_train_step(wrapper, tx, lr, step_config, optimizer_reads_params=reads),
                partitioner=partitioner,
                shardings=shardings,
            )
            numbers = steps.schedule_numbers_abstract(lr.numbers, partitioner.replicated())
            train_step = train_step.lower(abstract_with, batch, numbers).compile()
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
        init_programs = {}
        _COMPILED[key] = _Compiled(train_step, eval_step, init_programs, abstract_state, shardings)
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
        train_step=None
        if train_step is None
        else steps.BoundStep(train_step, lr.numbers, partitioner.replicated()),
        eval_step=eval_step,
        eval_batch_size=eval_batch_size or batch_size,
        seq_len=seq_len,
        feature_lengths=lengths,
        init_programs=init_programs,
    )
