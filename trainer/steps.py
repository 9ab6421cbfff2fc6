"""The compiled steps: train (microbatched gradients, optimizer update, non-finite guard) and eval.

Steps are plain functions of a `TrainState` and a batch; `compile_*` wraps them in `jax.jit` with
explicit in/out shardings (the modern pjit) and donates the old state's buffers to the new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from modeling.attention import target_backend
from pipelines import features
from trainer.partitioning import Partitioner


@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything the train step updates; checkpointed as params + opt_state + JSON.

    Attributes:
      step: completed optimizer steps (int32 scalar).
      params: the parameter tree.
      opt_state: the optax state.
      rng: base RNG key data (uint32[2]); step `s` uses `fold_in(rng, s)`.
      skipped: number of updates skipped because the loss, the gradients or the update were
        not finite.
      param_norm: the global norm of `params` (float32 scalar), which the next step's guard
        needs before its update (`update_bounded`). Each step takes it from the values it
        keeps, inside the update's own pass; a state built from parts (a restore) computes it
        once (`global_norm_of`). Not checkpointed: it follows from the parameters.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    skipped: jax.Array
    param_norm: jax.Array


jax.tree_util.register_dataclass(
    TrainState,
    data_fields=["step", "params", "opt_state", "rng", "skipped", "param_norm"],
    meta_fields=[],
)


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Settings of the train step.

    Attributes:
      num_microbatches: split each global batch into this many sequential microbatches and sum
        their gradients (activation memory / microbatches; same update up to float rounding).
      z_loss: weight of the `logsumexp²` auxiliary loss (0 = off).
      num_components: mixture components, for per-component token counts.
    """

    num_microbatches: int = 1
    z_loss: float = 0.0
    num_components: int = 1


def tokens_by_component(batch: Mapping[str, jax.Array], num_components: int) -> jax.Array:
    """Target tokens of the batch per mixture component (int32 `[num_components]`).

    A comparison against each component id and a sum, not a `segment_sum`: the components are a
    handful, and a scatter-add is what XLA offloads to a TPU's SparseCore, where its cost model
    cannot price it (the whole step's `optimal_seconds` then reads negative). Ids outside
    `[0, num_components)` count for none."""
    weights = batch[features.DECODER_LOSS_WEIGHTS] > 0
    if features.DECODER_TASK_IDS not in batch:
        first = jnp.arange(num_components) == 0  # every target counts for the first component
        return jnp.where(first, weights.sum(dtype=jnp.int32), 0)
    ids = batch[features.DECODER_TASK_IDS]
    hits = (ids[..., None] == jnp.arange(num_components, dtype=ids.dtype)) & weights[..., None]
    return hits.sum(axis=tuple(range(ids.ndim)), dtype=jnp.int32)


def tree_finite(tree: Any) -> jax.Array:
    """Whether every floating-point leaf of `tree` is finite (a bool scalar; integer leaves such as
    optimizer step counts are ignored). One fused reduction per leaf, cheap beside the update."""
    checks = [
        jnp.isfinite(leaf).all()
        for leaf in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.inexact)
    ]
    return jnp.stack(checks).all() if checks else jnp.asarray(True)


# A bound on the elementwise size of a normalised optimizer's direction before the learning
# rate scales it (`trainer.optimizers`): Adam's m/√v is within a few units for any betas in use,
# and Adafactor's update, clipped to RMS 1 and scaled by max(RMS(p), 1e-3), is within √n·‖p‖ for
# n < 10^12 parameters per array. Generous on purpose: it only decides when a learning rate is
# absurd.
DIRECTION_BOUND = 1e6


def global_norm_of(params: Any) -> jax.Array:
    """The global L2 norm of a parameter tree as a float32 scalar (`TrainState.param_norm`)."""
    return optax.global_norm(params).astype(jnp.float32)


def update_bounded(learning_rate: jax.Array, param_norm: jax.Array) -> jax.Array:
    """Whether an update of a normalised optimizer at `learning_rate` keeps parameters of global
    norm `param_norm` finite (a bool scalar): `|Δp| <= lr · DIRECTION_BOUND · (1 + ‖p‖)` for
    the optimizers of `trainer.optimizers` (weight decay included), so `p + Δp` overflows only
    where that bound, plus `‖p‖`, does. Two scalars, no pass over the update; the parameters'
    norm fuses into a pass XLA makes anyway."""
    bound = learning_rate * DIRECTION_BOUND * (1.0 + param_norm) + param_norm
    return jnp.isfinite(bound)


def _split_microbatches(batch: Mapping[str, jax.Array], num: int) -> dict[str, jax.Array]:
    """`[B, ...]` -> `[num, B/num, ...]`, microbatch m holding rows m, m+num, ...

    Strided rows keep every device's share of each microbatch local when rows are sharded in
    contiguous blocks (no data movement).
    """

    def split(x):
        return jnp.swapaxes(x.reshape((x.shape[0] // num, num) + x.shape[1:]), 0, 1)

    return {key: split(value) for key, value in batch.items()}


def after_their_gradients(
    grads: Any,
    params: Any,
    opt_state: Any,
    *,
    params_too: bool = True,
    only: Collection[str] | None = None,
) -> tuple[Any, Any]:
    """`params` and the parameter-shaped parts of `opt_state` (AdamW's moments, ...), each array
    made available only once its own gradient exists (an optimisation barrier per array);
    `params_too=False` leaves the parameters free (the optimizer state is still tied). `only`
    names the top-level parameter modules tied (e.g. `("token_embedder",)`); None: all.

    Values are unchanged. What the update needs of a parameter or its moments in another layout
    (the embedding's: its gradient is a row-major scatter, against the column-major layout XLA
    gives the table's shard) is then copied when its update runs, not at the start of the step
    and held through the backward pass, where the step's memory peaks. One barrier per array,
    not one over all the gradients: each array's update can still start as soon as its own
    gradient is ready, overlapping the rest of the backward pass. An array whose update needs
    no other layout gains nothing from waiting, and its barrier only narrows XLA's schedule: a
    model names the modules that need it (`tied_to_gradients`, LLaMA's embedding), and tying
    every other LLaMA array too made its estimates up to 0.5% slower on TPU.

    An optimizer that scales each update by its parameter's size (Adafactor's parameter scale)
    reads every parameter once more; left free, that read runs at the start of the step in the
    same pass that casts the parameters to the compute dtype. Tied, it is a pass of its own
    after the backward (2.7% of a 2-layer T5-3B step on 4 chips, accumulating 2 microbatches):
    `params_too=False`, which `make_train_step` chooses for such optimizers when it accumulates.
    """
    structure = jax.tree.structure(params)

    def tie(path, x, g):
        if only is not None and getattr(path[0], "key", None) not in only:
            return x
        return jax.lax.optimization_barrier((x, g))[0]

    def tied(tree):
        return jax.tree_util.tree_map_with_path(tie, tree, grads)

    def like_params(node) -> bool:
        return jax.tree.structure(node) == structure

    state = jax.tree.map(
        lambda node: tied(node) if like_params(node) else node, opt_state, is_leaf=like_params
    )
    return (tied(params) if params_too else params), state


def make_train_step(
    model: Any,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    config: StepConfig,
    *,
    optimizer_reads_params: bool = False,
) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds `train_step(state, batch, numbers) -> (state, metrics)`.

    `numbers` are the learning-rate schedule's (`schedule.numbers` of a
    `trainer.schedules.Schedule`): taken as arguments, not constants, so runs that differ only in
    length or learning rate share one compiled program (None: the schedule's own, as constants).
    `optimizer` must be built with `schedule`, which then reads them too.

    The loss is normalised per target token of the whole global batch (microbatches included).
    A step whose loss or gradient norm is not finite, or whose update could overflow
    (`update_bounded`: a huge learning rate turns finite gradients into infinite parameters),
    leaves params and optimizer state untouched (and counts it in `skipped`), so a non-finite
    state can never be checkpointed. The metrics `finite_loss`, `finite_grads` and
    `finite_update` say which part failed, `finite` whether the update was applied.

    The guard is three scalars known before the update (the loss, the gradients' global norm,
    the parameters' global norm with the learning rate), not a check of every new value: its
    selects then fuse into the update itself, where a check of the new state would have to
    finish before any select began (a second pass over parameters and optimizer state, ~5% of
    a 1.1B-parameter step on a TPU). A finite gradient norm bounds every gradient's square, so
    the optimizers' running averages of the gradients and their squares (AdamW's, Adafactor's)
    stay finite.

    Dropout (models that have it) draws from `fold_in(rng, s)` at the s-th update (1-based, so
    never the key that initialised the parameters), folded with the microbatch index.

    Off the CPU each parameter-shaped array of the update waits for its own gradient
    (`after_their_gradients`; only those of the modules in the model's `tied_to_gradients`
    where it names some), except, when microbatches are accumulated, the parameters
    themselves for an optimizer whose update reads them beyond applying it
    (`optimizer_reads_params`: `optimizers.reads_parameter_scale`). Accumulating, the step
    casts every parameter before its loop, and that read then joins the same pass. Without
    microbatches nothing reads them all at the start, and freeing them made XLA keep more
    (T5-770M on 4 chips: 1.1 GB more temporaries for a 0.7% faster estimate). Values are the
    same either way.
    """
    tie_params = not (optimizer_reads_params and config.num_microbatches > 1)
    tied_modules = getattr(model, "tied_to_gradients", None)

    def loss_and_grads(params, batch, dropout_rng, scale):
        # Differentiates the loss times `scale`: with microbatches, the inverse of the global
        # batch's target tokens, as T5X and MaxText normalise theirs. The accumulated gradients
        # then leave the loop normalised, where dividing them afterwards is a pass of its own
        # over every gradient (which XLA wrote out again for Adafactor's reductions: 1.8% of a
        # 4-layer T5-3B step). Without microbatches `scale` is 1 and the gradients are divided
        # after the backward pass: a normalised seed there made XLA keep every layer's gathered
        # weights for the backward pass of an unscanned llama2_5534m on 16 chips (18 -> 49 GB
        # of temporaries), and across two slices.
        def objective(p):
            out = model.loss_fn(p, batch, z_loss=config.z_loss, dropout_rng=dropout_rng)
            return (out.loss_sum + out.z_loss_sum) * scale, out

        (_, out), grads = jax.value_and_grad(objective, has_aux=True)(params)
        return out, grads

    def train_step(state: TrainState, batch: Mapping[str, jax.Array], numbers=None):
        given = schedule.given(numbers) if numbers else contextlib.nullcontext()
        with given:
            return _train_step(state, batch)

    def _train_step(state: TrainState, batch: Mapping[str, jax.Array]):
        step_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step + 1)
        if config.num_microbatches > 1:
            # The loss's denominator, known from the batch before any forward pass: the target
            # tokens' weights, as `loss_fn` sums them into `weight_sum`.
            weights = batch[features.DECODER_LOSS_WEIGHTS].astype(jnp.float32)
            denom = jnp.maximum(weights.sum(), 1.0)
            scale = 1.0 / denom
            micro = _split_microbatches(batch, config.num_microbatches)

            def body(acc, xs):
                index, mb = xs
                out, grads = loss_and_grads(
                    state.params, mb, jax.random.fold_in(step_rng, index), scale
                )
                return jax.tree.map(jnp.add, acc, (out, grads)), None

            zero_out, zero_grads = jax.eval_shape(
                loss_and_grads, state.params, jax.tree.map(lambda x: x[0], micro), step_rng, scale
            )
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (zero_out, zero_grads))
            indices = jnp.arange(config.num_microbatches, dtype=jnp.int32)
            (out, grads), _ = jax.lax.scan(body, zeros, (indices, micro))
        else:
            out, grads = loss_and_grads(state.params, batch, step_rng, jnp.float32(1.0))
            denom = jnp.maximum(out.weight_sum, 1.0)
            grads = jax.tree.map(lambda g: g / denom, grads)

        grad_norm = optax.global_norm(grads)
        loss = out.loss_sum / denom
        finite_loss = jnp.isfinite(loss)
        finite_grads = jnp.isfinite(grad_norm)

        learning_rate = jnp.asarray(schedule(state.step), jnp.float32)
        finite_update = update_bounded(learning_rate, state.param_norm)
        params, opt_state = state.params, state.opt_state
        if target_backend() != "cpu":
            params, opt_state = after_their_gradients(
                grads, params, opt_state, params_too=tie_params, only=tied_modules
            )
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        finite = finite_loss & finite_grads & finite_update
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        new_params = keep(optax.apply_updates(params, updates), params)
        new_state = TrainState(
            step=state.step + 1,
            params=new_params,
            opt_state=keep(new_opt_state, opt_state),
            rng=state.rng,
            skipped=state.skipped + (~finite).astype(jnp.int32),
            # The next step's guard needs it before its update; taken here, XLA reduces the
            # new values in the pass that writes them.
            param_norm=global_norm_of(new_params),
        )
        metrics = {
            "loss_sum": out.loss_sum,
            "z_loss_sum": out.z_loss_sum,
            "weight_sum": out.weight_sum,
            "grad_norm": grad_norm,
            "learning_rate": learning_rate,
            "finite": finite,
            "finite_loss": finite_loss,
            "finite_grads": finite_grads,
            "finite_update": finite_update,
            "tokens_by_task": tokens_by_component(batch, config.num_components),
        }
        if features.ENCODER_INPUT_TOKENS in batch:  # encoder-decoder: also count the inputs
            inputs = batch[features.ENCODER_INPUT_TOKENS]
            metrics["input_tokens"] = (inputs > 0).sum(dtype=jnp.int32)
        return new_state, metrics

    return train_step


def make_eval_step(model: Any) -> Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, ...]]:
    """Builds `eval_step(params, batch) -> (summed cross-entropy, target tokens)` (scalars)."""

    def eval_step(params, batch):
        ce, weights = model.score_batch(params, batch)
        return ce.sum(), weights.sum()

    return eval_step


def init_train_state(
    model: Any,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    *,
    params: Any | None = None,
    seq_len: int = 8,
) -> TrainState:
    """A step-0 state: fresh params (unless `params` is given, e.g. for CPT from a source
    checkpoint) and fresh optimizer state, whose moments are all zero.

    Args:
      rng: raw key data (uint32[2], `jax.random.key_data`); params are drawn from a key derived
        from it, and it is kept as the run's base key.
    """
    if params is None:
        key = jax.random.fold_in(jax.random.wrap_key_data(rng), 0)
        params = model.init_variables(key, batch_size=1, seq_len=seq_len)["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=rng,
        skipped=jnp.zeros((), jnp.int32),
        param_norm=global_norm_of(params),
    )


def state_shardings(
    partitioner: Partitioner, abstract_state: TrainState, params_shardings: Any
) -> TrainState:
    """Shardings of every leaf of a `TrainState` (params by logical axes, the rest derived)."""
    replicated = partitioner.replicated()
    return TrainState(
        step=replicated,
        params=params_shardings,
        opt_state=partitioner.state_shardings(
            abstract_state.opt_state,
            abstract_params=abstract_state.params,
            params_shardings=params_shardings,
        ),
        rng=replicated,
        skipped=replicated,
        param_norm=replicated,
    )


def compile_train_step(
    train_step: Callable, *, partitioner: Partitioner, shardings: TrainState
) -> Callable:
    """`jax.jit` of the train step: state sharded as given, batch split over data axes, the
    schedule's numbers and the metrics replicated, and the input state donated (updated in
    place)."""
    return jax.jit(
        train_step,
        in_shardings=(shardings, partitioner.batch_sharding(), partitioner.replicated()),
        out_shardings=(shardings, partitioner.replicated()),
        donate_argnums=(0,),
    )


def schedule_numbers_abstract(numbers: Mapping[str, Any], sharding: Any) -> dict:
    """The shapes a compiled train step takes the schedule's numbers as (float32 scalars)."""
    return {k: jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding) for k in numbers}


class BoundStep:
    """A compiled train step with one run's schedule numbers bound: `step(state, batch)`.

    The numbers are put on the devices at the first call (replicated, on every host alike; a
    compile-only program, e.g. for a TPU topology, never holds them). Every other attribute
    (`memory_analysis`, `cost_analysis`, `as_text`) is the compiled program's.
    """

    def __init__(self, compiled: Any, numbers: Mapping[str, Any], sharding: Any):
        self.compiled, self.numbers, self._sharding = compiled, dict(numbers), sharding
        self._on_devices: dict[str, jax.Array] | None = None

    def __call__(self, state: TrainState, batch: Mapping[str, jax.Array]):
        if self._on_devices is None:
            self._on_devices = {
                k: jax.make_array_from_callback((), self._sharding, lambda _, v=v: np.float32(v))
                for k, v in self.numbers.items()
            }
        return self.compiled(state, batch, self._on_devices)

    def __getattr__(self, name: str):
        return getattr(self.compiled, name)


def compile_eval_step(eval_step: Callable, *, partitioner: Partitioner, params_shardings: Any):
    """`jax.jit` of the eval step with params sharded and the batch split over data axes."""
    return jax.jit(
        eval_step,
        in_shardings=(params_shardings, partitioner.batch_sharding()),
        out_shardings=partitioner.replicated(),
    )


def params_finite(tree: Any) -> bool:
    """Whether every floating-point value of `tree` (params, optimizer state: any sharding) is
    finite. Resume checks restored checkpoints with it: older code could write infinite
    parameters after a divergent update, and resuming them would fail again at once."""
    return bool(jax.jit(tree_finite)(tree))
