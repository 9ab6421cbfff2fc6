"""The model-family protocol, and the registry that finds a family by name.

Everything above the model packages (the trainer, the sweep, estimates, `xlscale sizes`) asks a
family these questions instead of testing its name: which features its batches carry, its
paper's context length, its size table, how to build and count a model of a size, how many
bytes its training step needs on a device, its logical axis rules and its paper's training recipe. A new family is one module that defines `FAMILY`
(an object satisfying `ModelFamily`) plus one line in `FAMILIES`; importing this registry
imports no family (t5x's `BaseTransformerModel` plays the same role for its models).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from modeling.memory import MemoryEstimate, StepShape

# What N a token budget in tokens per parameter multiplies (`TOKENS_PER_PARAM`, a manifest's
# `[budget] param_basis`): the exact non-embedding or total count of the model, or the paper's
# nominal size of its table row (`ModelFamily.nominal_params`). One setting of a run, read by the
# trainer (`PARAM_BASIS`) and the sweep alike, so both give a recipe the same steps.
PARAM_BASES: tuple[str, ...] = ("non_embedding", "total", "nominal")

# Family name -> the module that defines its `FAMILY`, imported only by `get`.
FAMILIES: dict[str, str] = {
    "llama2": "llama_jax.family",
    "t5": "t5_jax.family",
}


@runtime_checkable
class ModelFamily(Protocol):
    """What a model family answers.

    Attributes:
      name: the registry key (`ModelSpec.family`, a manifest's `[sweep] family`).
      feature_keys: the task features its batches read: `("targets",)` for a decoder-only
        model, `("inputs", "targets")` for an encoder-decoder.
      default_seq_len: its paper's context (targets) length: 2048 for LLaMA2 (CPT paper), 512
        for T5 (MT paper).
    """

    name: str
    feature_keys: tuple[str, ...]
    default_seq_len: int

    def sizes(self) -> list[str]:
        """The size names of the family's table."""
        ...

    def get_config(self, size: str, **overrides: Any) -> Any:
        """The frozen config of table size `size` with fields replaced by `overrides`.

        Raises:
          ValueError: unknown size (listing the valid ones) or unknown field.
        """
        ...

    def nominal_params(self, size: str) -> float | None:
        """The paper's nominal parameter count of `size` (None when the paper has none)."""
        ...

    def build(self, spec: Any) -> Any:
        """The model wrapper (`modeling.models`) of a spec with `size`, `overrides`,
        `dropout_rate` and `attention_kernel` attributes (`trainer.model_spec.ModelSpec`)."""
        ...

    def param_counts(self, config: Any) -> tuple[int, int]:
        """(total, non-embedding) parameter counts of `config`, equal to its initialised tree."""
        ...

    def flops_per_token(
        self, config: Any, *, seq_len: int, inputs_len: int | None = None
    ) -> tuple[float, float]:
        """(6·N, attention-inclusive) training FLOPs per target token at these lengths
        (`inputs_len` defaults to `seq_len` where the family has inputs)."""
        ...

    def cost_per_token(self, config: Any, *, seq_len: int, inputs_len: int | None = None) -> float:
        """FLOPs a training step computes per target token (matmuls, attention and the output
        projection): what run-time estimates scale a measured throughput by."""
        ...

    def memory_estimate(self, config: Any, *, shape: StepShape) -> MemoryEstimate:
        """Per-device bytes of the trainer's train step for `config` (its `remat_policy`,
        dtypes, kernel) at `shape` (batch, lengths, microbatches, mesh, optimizer, platform):
        parameters, optimizer state, gradients, saved activations, logits
        (`modeling.memory`)."""
        ...

    def axis_rules(self) -> tuple[tuple[str, Any], ...]:
        """The logical-axis -> mesh-axis rules its parameters and activations are sharded by."""
        ...

    def paper_recipe(self, size: str, *, seq_len: int) -> Any | None:
        """The paper's training recipe of `size` (an object with at least `batch_size`, in
        sequences of `seq_len`), or None where the paper fixes none per size."""
        ...


def size_prefixes(family: ModelFamily) -> tuple[str, ...]:
    """Name prefixes of the sizes a family resolves outside its table (an optional attribute
    `size_prefixes`; LLaMA2: `'hf:'`, a shape read from a Hugging Face `config.json`)."""
    return tuple(getattr(family, "size_prefixes", ()))


def names() -> list[str]:
    """The registered family names, sorted (no family is imported)."""
    return sorted(FAMILIES)


def check_name(name: str) -> None:
    """Raises ValueError naming `name` and the registered families unless it is one of them."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; allowed: {', '.join(names())}")


def get(name: str, *, registry: Mapping[str, str] | None = None) -> ModelFamily:
    """The family registered as `name`, importing its module now.

    Args:
      name: a key of `FAMILIES`.
      registry: name -> module path to look in instead of `FAMILIES` (tests).
    Raises:
      ValueError: unknown name (listing the registered ones).
    """
    registry = FAMILIES if registry is None else registry
    if name not in registry:
        raise ValueError(f"unknown model family {name!r}; allowed: {', '.join(sorted(registry))}")
    return importlib.import_module(registry[name]).FAMILY


def basis_params(
    basis: str, *, total: float | None, non_embedding: float | None, nominal: float | None
) -> float | None:
    """N on `basis` (one of `PARAM_BASES`) from a model's counts and its nominal size; None
    when that count is unknown (e.g. 'nominal' for a size the paper does not list).

    Raises:
      ValueError: `basis` is not one of `PARAM_BASES`.
    """
    if basis not in PARAM_BASES:
        raise ValueError(f"param_basis {basis!r}; allowed: {', '.join(PARAM_BASES)}")
    return {"non_embedding": non_embedding, "total": total, "nominal": nominal}[basis]


def budget_steps(
    *,
    tokens_per_step: int,
    tokens: float | None = None,
    tokens_per_param: float | None = None,
    params: float | None = None,
) -> int:
    """The steps rule of a token budget: optimizer steps that train `tokens` tokens, or
    `tokens_per_param × params` (N on the run's basis, `basis_params`), in whole batches of
    `tokens_per_step` tokens (rounded up, at least one). The one rule behind the trainer's
    `TOKENS_PER_PARAM` (`trainer.jobs.resolve_train_steps`) and the sweep's `[budget]`
    (`launch.budgets.steps_and_batch`), so that both give a recipe the same steps.

    Raises:
      ValueError: not exactly one of `tokens` and `tokens_per_param`, or `tokens_per_param`
        without `params`.
    """
    if (tokens is None) == (tokens_per_param is None):
        raise ValueError("give exactly one of tokens and tokens_per_param")
    if tokens is None:
        if params is None:
            raise ValueError("tokens_per_param needs the parameter count")
        tokens = float(tokens_per_param) * params
    return max(1, math.ceil(float(tokens) / tokens_per_step))
