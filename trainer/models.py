"""Model wrappers: what the trainer needs from a network, independent of its family.

A wrapper owns a flax module and its config and provides `init_variables` / `abstract_variables`,
`loss_fn` (summed token cross-entropy over packed sequences; the trainer divides by the token
count of the whole global batch, so the loss is normalised per token), `score_batch`
(per-example sums for evaluation), `predict_batch` (decoding) and parameter/FLOP counts.
`feature_keys` names the task features a model reads: `("targets",)` for the decoder-only LLaMA2,
`("inputs", "targets")` for the T5 encoder-decoder, whose batches add the `encoder_*` arrays.

Families are built from a `ModelSpec` through the dict registry `MODEL_FAMILIES`
(`llama2`, `t5`); each family's package is imported only when a model of it is built.
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
      family: a key of `MODEL_FAMILIES` (`llama2`, `t5`).
      size: a size name of the family's table (gin macro `MODEL_SIZE`).
      overrides: config fields to replace, e.g. `{"vocab_size": 512, "remat_policy": "full"}`.
      dropout_rate: the model's dropout in training steps (gin macro `DROPOUT_RATE`; None: the
        size table's value). Kept apart from `overrides` so that a run kind (T5X: pretraining
        0.0, finetuning 0.1) and a model shape can be set independently; an explicit
        `overrides["dropout_rate"]` wins. Families without dropout (LLaMA2) accept only 0/None.
    """

    family: str = "llama2"
    size: str = ""
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dropout_rate: float | None = None


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


class _Wrapper:
    """What both families share: construction, the embedding size, counts, abstract variables
    (from the subclass's `init_variables`).

    Args:
      module: the flax module.
      config: the module's frozen config (needs `vocab_size`).
      name: size name, recorded in `run.json`.
      counts_fn: config -> object with `total` and `non_embedding` parameter counts.
      flops_fn: the family's FLOPs counter (see the subclass).
    """

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
        """Size of the model's (shared) token embedding."""
        return self.config.vocab_size

    def param_counts(self) -> tuple[int, int]:
        """(total, non-embedding) parameter counts."""
        counts = self._counts_fn(self.config)
        return int(counts.total), int(counts.non_embedding)

    def abstract_variables(self, *, batch_size: int = 1, seq_len: int = 8) -> Any:
        """Shapes and dtypes of `init_variables` without allocating anything."""
        return jax.eval_shape(
            lambda rng: self.init_variables(rng, batch_size=batch_size, seq_len=seq_len),
            jax.random.key(0),
        )


class DecoderOnlyModel(_Wrapper):
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

    @property
    def max_len(self) -> int:
        """The longest sequence the model is configured for."""
        return self.config.max_len

    def flops_per_token(
        self, *, seq_len: int, inputs_len: int | None = None
    ) -> tuple[float, float]:
        """(6·N, attention-inclusive) training FLOPs per token (`inputs_len` is ignored: a
        decoder-only model has no inputs)."""
        del inputs_len
        flops = self._flops_fn(self.config, seq_len=seq_len)
        return float(flops.six_n), float(flops.with_attention)

    def init_variables(self, rng: jax.Array, *, batch_size: int, seq_len: int) -> Any:
        """Initial variables (`params`, and `params_axes` naming each parameter's axes)."""
        tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
        return self.module.init(rng, tokens)

    def _logits(self, params: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
        return self.module.apply(
            {"params": params},
            batch["decoder_input_tokens"],
            segment_ids=batch.get("decoder_segment_ids"),
            positions=batch.get("decoder_positions"),
        )

    def loss_fn(
        self,
        params: Any,
        batch: Mapping[str, jax.Array],
        *,
        z_loss: float = 0.0,
        dropout_rng: jax.Array | None = None,
    ) -> LossOutput:
        """Summed cross-entropy over the batch's target tokens (`decoder_loss_weights` > 0).

        Packed rows are handled by the module (segment-masked attention, per-segment positions);
        padding has weight 0. `dropout_rng` is accepted for the common interface and unused
        (LLaMA2 has no dropout).
        """
        del dropout_rng
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
        the module's `cache` collection one token at a time (`modeling.decoding`).
        """
        from modeling import decoding

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


class EncoderDecoderModel(_Wrapper):
    """An encoder-decoder (T5) as the trainer sees it: the interface of `DecoderOnlyModel` over
    batches that add `encoder_input_tokens`, `encoder_segment_ids` and `encoder_positions`.

    Args:
      module: the flax `t5_jax.model.Transformer` (T5X's `encode`/`decode`/`__call__` contract).
      config: its frozen `T5Config`.
      name: size name, recorded in `run.json`.
      counts_fn: config -> object with `total` and `non_embedding` parameter counts.
      flops_fn: (config, inputs_length=, targets_length=) -> object with `six_n` and
        `with_attention` FLOPs per example.
    """

    family = "t5"
    feature_keys = ("inputs", "targets")
    # Relative position buckets set no length limit; this bound only catches typos in
    # TASK_FEATURE_LENGTHS (the MT paper uses 512).
    MAX_LEN = 8192

    @property
    def max_len(self) -> int:
        """The longest inputs or targets feature accepted (`MAX_LEN`)."""
        return self.MAX_LEN

    def flops_per_token(
        self, *, seq_len: int, inputs_len: int | None = None
    ) -> tuple[float, float]:
        """(6·N, attention-inclusive) training FLOPs per *target* token.

        One packed example of `inputs_len` encoder and `seq_len` decoder positions costs
        `6·(N_enc·inputs_len + N_dec·seq_len)` (+ attention); dividing by `seq_len` makes
        `flops = flops_per_token × tokens` hold with `tokens` counting target tokens, as the
        trainer's counters do. `inputs_len` defaults to `seq_len`.
        """
        inputs_len = seq_len if inputs_len is None else inputs_len
        flops = self._flops_fn(self.config, inputs_length=inputs_len, targets_length=seq_len)
        return float(flops.six_n) / seq_len, float(flops.with_attention) / seq_len

    def init_variables(
        self, rng: jax.Array, *, batch_size: int, seq_len: int, inputs_len: int | None = None
    ) -> Any:
        """Initial variables (`params`, and `params_axes` naming each parameter's axes); their
        shapes do not depend on the lengths."""
        encoder = jnp.ones((batch_size, inputs_len or seq_len), jnp.int32)
        decoder = jnp.ones((batch_size, seq_len), jnp.int32)
        return self.module.init(rng, encoder, decoder, decoder)

    def _logits(
        self, params: Any, batch: Mapping[str, jax.Array], dropout_rng: jax.Array | None = None
    ) -> jax.Array:
        dropout = dropout_rng is not None and self.config.dropout_rate > 0
        return self.module.apply(
            {"params": params},
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            batch["decoder_target_tokens"],
            encoder_segment_ids=batch.get("encoder_segment_ids"),
            decoder_segment_ids=batch.get("decoder_segment_ids"),
            encoder_positions=batch.get("encoder_positions"),
            decoder_positions=batch.get("decoder_positions"),
            enable_dropout=dropout,
            rngs={"dropout": dropout_rng} if dropout else None,
        )

    def loss_fn(
        self,
        params: Any,
        batch: Mapping[str, jax.Array],
        *,
        z_loss: float = 0.0,
        dropout_rng: jax.Array | None = None,
    ) -> LossOutput:
        """Summed cross-entropy over the target tokens (`decoder_loss_weights` > 0).

        Packed rows are handled by the module: encoder, decoder and cross attention are masked
        to the example's segment, so a packed row scores exactly as its examples would alone.
        Dropout (at the config's rate) is on when `dropout_rng` is given.
        """
        logits = self._logits(params, batch, dropout_rng)
        weights = batch["decoder_loss_weights"].astype(jnp.float32)
        ce, zl = token_cross_entropy(logits, batch["decoder_target_tokens"], weights, z_loss=z_loss)
        return LossOutput(loss_sum=ce.sum(), z_loss_sum=zl.sum(), weight_sum=weights.sum())

    def score_batch(
        self, params: Any, batch: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        """Per-row summed cross-entropy and target-token count, `[batch]` each (no dropout)."""
        logits = self._logits(params, batch)
        weights = batch["decoder_loss_weights"].astype(jnp.float32)
        ce, _ = token_cross_entropy(logits, batch["decoder_target_tokens"], weights)
        return ce.sum(axis=-1), weights.sum(axis=-1)

    def predict_batch(
        self,
        params: Any,
        inputs: jax.Array,
        *,
        max_decode_len: int,
        eos_id: int = 1,
        method: str = "beam",
        num_decodes: int = 4,
        alpha: float = 0.6,
    ) -> jax.Array:
        """Decodes encoder inputs `[batch, Li]` (0-padded, unpacked) into `[batch,
        max_decode_len]` tokens ending in `eos_id`, then 0s.

        `method` "beam" is T5X's beam search (`num_decodes` beams, brevity penalty
        `((5 + len) / 6) ** alpha`, best beam returned); "greedy" takes the arg-max. One jitted
        program per (config, shapes, method, beams) through `t5_jax.predict.predict_batch`, so
        repeated calls, and runs of the same shapes in one process, compile once.
        """
        from t5_jax import predict

        tokens, _ = predict.predict_batch(
            self.module,
            params,
            inputs,
            max_decode_length=max_decode_len,
            method=method,
            num_decodes=num_decodes,
            alpha=alpha,
            eos_id=eos_id,
        )
        return tokens


def build_t5(spec: ModelSpec) -> EncoderDecoderModel:
    """A T5 encoder-decoder of `spec.size` (`t5_jax.sizes`: MT paper Tables 1-2, T5.1.1 small and
    base, a tiny test size) with `spec.dropout_rate` and then `spec.overrides` applied."""
    from t5_jax import counting, model, sizes

    fields = {} if spec.dropout_rate is None else {"dropout_rate": float(spec.dropout_rate)}
    fields.update(spec.overrides)
    config = sizes.get_config(spec.size, **fields)
    return EncoderDecoderModel(
        module=model.Transformer(config),
        config=config,
        name=spec.size,
        counts_fn=counting.param_counts,
        flops_fn=counting.flops_per_example,
    )


def _t5_sizes() -> list[str]:
    from t5_jax import sizes

    return list(sizes.SIZES)


def build_llama2(spec: ModelSpec) -> DecoderOnlyModel:
    """A LLaMA2 model of `spec.size` (CPT paper Table 4) with `spec.overrides` applied."""
    from llama_jax import counting, model, sizes

    if spec.dropout_rate:
        raise ValueError(
            f"ModelSpec.dropout_rate = {spec.dropout_rate} (DROPOUT_RATE): llama2 has no dropout; "
            "allowed: None or 0"
        )
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


# family -> builder and size table.
MODEL_FAMILIES: dict[str, ModelFamily] = {
    "llama2": ModelFamily(build=build_llama2, sizes=_llama2_sizes),
    "t5": ModelFamily(build=build_t5, sizes=_t5_sizes),
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
