"""Optimizers of the two papers (optax), selected by name from a dict registry.

- `adamw` (CPT paper, LLaMA2 recipe): β1 0.9, β2 0.95, ε 1e-8, decoupled weight decay 0.1 on
  matrices (not on norm scales), global-norm gradient clipping at 1.0.
- `adafactor` (MT paper, T5 defaults): factored second moments, decay rate 0.8, update clipping
  at 1.0, updates scaled by the parameter's RMS, no momentum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from trainer import validation


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Which optimizer and its settings (each field is used only by the optimizers that need it).

    Attributes:
      name: a key of `OPTIMIZERS` (`adamw`, `adafactor`).
      b1, b2, eps: Adam moment decay rates and denominator epsilon.
      weight_decay: decoupled weight decay (AdamW) or Adafactor's `weight_decay_rate` (0 = off).
      decay_vectors: also decay 1-D parameters (norm scales); LLaMA does not.
      grad_clip_norm: clip gradients to this global norm first (None = no clipping).
      decay_rate: Adafactor's second-moment decay exponent.
      clipping_threshold: Adafactor's update clipping (RMS of the update).
      multiply_by_parameter_scale: Adafactor scales updates by the parameter RMS.
      min_dim_size_to_factor: Adafactor factors second moments of dims at least this large.
    """

    name: str = "adamw"
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_vectors: bool = False
    grad_clip_norm: float | None = 1.0
    decay_rate: float = 0.8
    clipping_threshold: float | None = 1.0
    multiply_by_parameter_scale: bool = True
    min_dim_size_to_factor: int = 128


def _decay_mask(config: OptimizerConfig) -> Callable:
    """A mask function: True for the parameters that receive weight decay."""

    def mask(params):
        return jax.tree.map(lambda p: config.decay_vectors or p.ndim >= 2, params)

    return mask


def adamw(config: OptimizerConfig, learning_rate: optax.Schedule) -> optax.GradientTransformation:
    """AdamW (CPT paper / LLaMA2 settings by default); `build_optimizer` adds the clipping."""
    return optax.adamw(
        learning_rate=learning_rate,
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=_decay_mask(config),
    )


def adafactor(
    config: OptimizerConfig, learning_rate: optax.Schedule
) -> optax.GradientTransformation:
    """Adafactor with T5's defaults: `optax.adafactor`'s chain, the same transformations in the
    same order (so the same state), with the parameter scale taken in one pass
    (`scale_by_param_rms`); `build_optimizer` adds the clipping."""
    chain = [
        optax.scale_by_factored_rms(
            factored=True,
            decay_rate=config.decay_rate,
            step_offset=0,
            min_dim_size_to_factor=config.min_dim_size_to_factor,
            epsilon=1e-30,
        )
    ]
    if config.clipping_threshold is not None:
        chain.append(optax.clip_by_block_rms(config.clipping_threshold))
    chain.append(optax.scale_by_learning_rate(learning_rate, flip_sign=False))
    if config.multiply_by_parameter_scale:
        chain.append(scale_by_param_rms())
    if config.weight_decay:
        chain.append(optax.add_decayed_weights(config.weight_decay, mask=_decay_mask(config)))
    chain.append(optax.scale(-1.0))
    return optax.chain(*chain)


def scale_by_param_rms(min_scale: float = 1e-3) -> optax.GradientTransformation:
    """Each update times its parameter's root mean square, at least `min_scale`: Adafactor's
    `multiply_by_parameter_scale`, the values of `optax.scale_by_param_block_rms`.

    optax's takes the RMS twice (the second time of the parameter with ones where the RMS is
    below `min_scale`, which only matters for a gradient through the optimizer), and XLA
    cannot merge the two: a second pass over every parameter in every step. An optimizer
    update is never differentiated here, so one pass gives the same values.
    """

    def update(updates, state, params=None):
        if params is None:
            raise ValueError(
                "scale_by_param_rms needs the parameters (optimizer.update(..., params))"
            )
        scaled = jax.tree.map(
            lambda u, p: u * jnp.maximum(jnp.sqrt(jnp.mean(jnp.square(p))), min_scale),
            updates,
            params,
        )
        return scaled, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


OPTIMIZERS: dict[str, Callable[[OptimizerConfig, optax.Schedule], optax.GradientTransformation]] = {
    "adamw": adamw,
    "adafactor": adafactor,
}


def reads_parameter_scale(config: OptimizerConfig) -> bool:
    """Whether the optimizer scales each update by its parameter's root mean square (Adafactor's
    `multiply_by_parameter_scale`): a reduction of every parameter that needs no gradient, which
    the train step can let XLA take with the parameters' compute-dtype casts
    (`trainer.steps.make_train_step`'s `optimizer_reads_params`)."""
    return OPTIMIZERS.get(config.name) is adafactor and config.multiply_by_parameter_scale


def build_optimizer(
    config: OptimizerConfig, *, learning_rate: optax.Schedule
) -> optax.GradientTransformation:
    """The optimizer named by `config.name`, driven by the `learning_rate` schedule, after
    global-norm clipping when `config.grad_clip_norm` is set (one `optax.chain` either way).

    Raises:
      ValueError: for an unknown name, listing the known ones.
    """
    build = validation.registry_entry(
        OPTIMIZERS, key=config.name, what="optimizer", binding="OptimizerConfig.name"
    )
    clipping = (
        [] if config.grad_clip_norm is None else [optax.clip_by_global_norm(config.grad_clip_norm)]
    )
    return optax.chain(*clipping, build(config, learning_rate))


def adafactor_defaults() -> OptimizerConfig:
    """The MT paper's Adafactor (T5 defaults): no weight decay and no gradient clipping."""
    return OptimizerConfig(name="adafactor", weight_decay=0.0, grad_clip_norm=None)
