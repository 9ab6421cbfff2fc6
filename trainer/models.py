"""Model wrappers: what the trainer needs from a network, independent of its family.

A wrapper owns a flax module and its config and provides `init_variables` / `abstract_variables`,
`loss_fn` (summed token cross-entropy over packed sequences; the trainer divides by the token
count of the whole global batch, so the loss is normalised per token), `score_batch`
(per-example sums for evaluation), `predict_batch` (greedy decoding) and parameter/FLOP counts.

Families are built from a `ModelSpec` through the dict registry `MODEL_FAMILIES`; the
encoder-decoder wrapper for T5 registers itself here through the same interface.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which model to build: a family, a size name from that family's table, and overrides.

    Attributes:
      family: a key of `MODEL_FAMILIES` (`llama2`).
      size: a size name of the family's table (gin macro `MODEL_SIZE`).
      overrides: config fields to replace, e.g. `{"vocab_size": 512, "remat_policy": "full"}`.
    """

    family: str = "llama2"
    size: str = ""
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LossOutput:
    """Sums over the target tokens of one (micro)batch; divide by `weight_sum` for the mean."""

    loss_sum: jax.Array
    z_loss_sum: jax.Array
    weight_sum: jax.Array


jax.tree_util.register_dataclass(
    LossOutput, data_fields=["loss_sum", "z_loss_sum", "weight_sum"], meta_fields=[]
)


def token_cross_entropy(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, *, z_loss: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Per-token cross-entropy (nats) and z-loss `z·logsumexp²`, both multiplied by `weights`.

    Computed in float32 whatever the logits' dtype.
    """
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    zl = z_loss * jnp.square(jax.nn.logsumexp(logits, axis=-1)) if z_loss else jnp.zeros_like(ce)
    return ce * weights, zl * weights


class DecoderOnlyModel:
    """A decoder-only language model (LLaMA2) as the trainer sees it.

    Args:
      module: the flax module; called as `module(tokens, segment_ids=, positions=, decode=)`.
      config: the module's frozen config (needs `vocab_size`, `max_len`).
      name: size name, recorded in `run.json`.
      counts_fn: config -> object with `total` and `non_embedding` parameter counts.
      flops_fn: (config, seq_len=) -> object with `six_n` and `with_attention` FLOPs per token.
    """

    family = "llama2"
    feature_keys = ("targets",)

    def __init__(
        self,
        *,
        module: Any,
        config: Any,
        name: str,
        counts_fn: Callable[[Any], Any],
        flops_fn: Callable[..., Any],
    ):
        self.module = module
        self.config = config
        self.name = name
        self._counts_fn = counts_fn
        self._flops_fn = flops_fn

    @property
    def vocab_size(self) -> int:
        """Size of the model's embedding table."""
        return self.config.vocab_size

    @property
    def max_len(self) -> int:
        """The longest sequence the model is configured for."""
        return self.config.max_len

    def param_counts(self) -> tuple[int, int]:
        """(total, non-embedding) parameter counts."""
        counts = self._counts_fn(self.config)
        return int(counts.total), int(counts.non_embedding)

    def flops_per_token(self, *, seq_len: int) -> tuple[float, float]:
        """(6·N, attention-inclusive) training FLOPs per token."""
        flops = self._flops_fn(self.config, seq_len=seq_len)
        return float(flops.six_n), float(flops.with_attention)

    def init_variables(self, rng: jax.Array, *, batch_size: int, seq_len: int) -> Any:
        """Initial variables (`params`, and `params_axes` naming each parameter's axes)."""
        tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
        return self.module.init(rng, tokens)

    def abstract_variables(self, *, batch_size: int = 1, seq_len: int = 8) -> Any:
        """Shapes and dtypes of `init_variables` without allocating anything."""
        return jax.eval_shape(
            lambda rng: self.init_variables(rng, batch_size=batch_size, seq_len=seq_len),
            jax.random.key(0),
        )

    def _logits(self, params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return self.module.apply(
            {"params": params},
            batch["decoder_input_tokens"],
            segment_ids=batch.get("decoder_segment_ids"),
            positions=batch.get("decoder_positions"),
        )

    def loss_fn(
        self, params: Any, batch: Mapping[str, jax.Array], *, z_loss: float = 0.0
    ) -> LossOutput:
        """Summed cross-entropy over the batch's target tokens (`decoder_loss_weights` > 0).

        Packed rows are handled by the module (segment-masked attention, per-segment positions);
        padding has weight 0.
        """
        logits = self._logits(params, batch)
        weights = batch["decoder_loss_weights"].astype(jnp.float32)
        ce, zl = token_cross_entropy(logits, batch["decoder_target_tokens"], weights, z_loss=z_loss)
        return LossOutput(loss_sum=ce.sum(), z_loss_sum=zl.sum(), weight_sum=weights.sum())

    def score_batch(
        self, params: Any, batch: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        """Per-example summed cross-entropy and target-token count, `[batch]` each."""
        logits = self._logits(params, batch)
        weights = batch["decoder_loss_weights"].astype(jnp.float32)
        ce, _ = token_cross_entropy(logits, batch["decoder_target_tokens"], weights)
        return ce.sum(axis=-1), weights.sum(axis=-1)

    def predict_batch(
        self, params: Any, prompts: jax.Array, *, max_decode_len: int, eos_id: int = 1
    ) -> jax.Array:
        """Greedy decoding: `prompts [batch, P]` (0-padded on the right) are forced, then the
        arg-max continuation follows until `eos_id` (kept; 0 after it) or `max_decode_len`.

        Returns `[batch, max_decode_len]`: prompt tokens followed by the continuation, through
        the module's `cache` collection one token at a time (`trainer.decoding`).
        """
        from trainer import decoding

        cache = self.module.apply(
            {"params": params},
            jnp.zeros((prompts.shape[0], max_decode_len), jnp.int32),
            decode=True,
            mutable=["cache"],
        )[1]["cache"]

        def tokens_to_logits(state):
            logits, mutated = self.module.apply(
                {"params": params, "cache": state.cache},
                state.cur_token,
                decode=True,
                mutable=["cache"],
            )
            return logits[:, -1], mutated["cache"]

        sequences, _ = decoding.greedy_decode(
            prompts, cache, tokens_to_logits, eos_id=eos_id, max_decode_len=max_decode_len
        )
        return sequences


def build_llama2(spec: ModelSpec) -> DecoderOnlyModel:
    """A LLaMA2 model of `spec.size` (CPT paper Table 4) with `spec.overrides` applied."""
    from llama_jax import counting, model, sizes

    config = sizes.get_config(spec.size, **dict(spec.overrides))
    return DecoderOnlyModel(
        module=model.Llama(config),
        config=config,
        name=spec.size,
        counts_fn=counting.param_counts,
        flops_fn=counting.flops_per_token,
    )


def _llama2_sizes() -> list[str]:
    from llama_jax import sizes

    return list(sizes.SIZES)


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """How to build a family's wrapper and which size names its table has."""

    build: Callable[[ModelSpec], Any]
    sizes: Callable[[], list[str]]


# family -> builder and size table. The T5 encoder-decoder wrapper adds "t5" the same way.
MODEL_FAMILIES: dict[str, ModelFamily] = {
    "llama2": ModelFamily(build=build_llama2, sizes=_llama2_sizes),
}


def build_model(spec: ModelSpec) -> Any:
    """Builds the wrapper for `spec` from the registry.

    Raises:
      ValueError: unknown family (listing the registered ones) or unknown size (listing the
        family's sizes, as `get_config` does).
    """
    if spec.family not in MODEL_FAMILIES:
        raise ValueError(
            f"unknown model family {spec.family!r} (ModelSpec.family); "
            f"choose one of {sorted(MODEL_FAMILIES)}"
        )
    return MODEL_FAMILIES[spec.family].build(spec)
