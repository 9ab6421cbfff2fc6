"""Model wrappers: what the trainer needs from a network, independent of its family.

A wrapper owns a flax module and its config and provides `init_variables` /
`abstract_variables`, `loss_fn` (summed token cross-entropy over packed sequences; the trainer
divides by the token count of the whole global batch, so the loss is normalised per token),
`score_batch` (per-example sums for evaluation), `predict_batch` (decoding) and parameter/FLOP
counts (asked of its family, `modeling.family`). As in t5x's `BaseTransformerModel`, `loss_fn`
and `score_batch` are written once, over the abstract `_logits` each kind of model defines.
`feature_keys` names the task features a model reads: `("targets",)` for a decoder-only model,
`("inputs", "targets")` for an encoder-decoder, whose batches add the `encoder_*` arrays.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from modeling import decoding

# (wrapper type, config, batch, length) -> `abstract_variables`' shapes: pure functions of the
# key, a few per process.
_ABSTRACT_VARIABLES: dict[tuple, Any] = {}


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

    Computed in float32 whatever the logits' dtype. The target's logit is picked by comparing
    each vocabulary index with the target and summing (one nonzero term, so exactly the value
    `optax.softmax_cross_entropy_with_integer_labels` gathers): the comparison fuses into the
    same pass over the logits as the normaliser, where a gather reads them again and its
    gradient is a scatter (which XLA offloads to a v5p's SparseCore, whose cost it cannot
    estimate).
    """
    logits = logits.astype(jnp.float32)
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    vocab = jax.lax.broadcasted_iota(targets.dtype, shifted.shape, shifted.ndim - 1)
    target_logit = jnp.sum(jnp.where(vocab == targets[..., None], shifted, 0.0), axis=-1)
    ce = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1)) - target_logit
    zl = z_loss * jnp.square(jax.nn.logsumexp(logits, axis=-1)) if z_loss else jnp.zeros_like(ce)
    return ce * weights, zl * weights


class TransformerModel(abc.ABC):
    """What every wrapper shares: construction, counts from the family, abstract variables, and
    the loss and per-example scores over the subclass's `_logits`.

    Args:
      module: the flax module.
      config: the module's frozen config (needs `vocab_size`).
      name: size name, recorded in `run.json`.
      family: the model family (`modeling.family.ModelFamily`) that counts parameters and FLOPs;
        its `name` is recorded in `run.json` as `family`.
    """

    feature_keys: tuple[str, ...] = ()
    # The top-level parameter modules whose update waits for their own gradient on accelerators
    # (`trainer.steps.after_their_gradients`); None: every parameter's.
    tied_to_gradients: tuple[str, ...] | None = None

    def __init__(self, *, module: Any, config: Any, name: str, family: Any):
        self.module = module
        self.config = config
        self.name = name
        self.family = family.name
        self._family = family

    @property
    def model_family(self) -> Any:
        """The family (`modeling.family.ModelFamily`) that built this wrapper: what a job's plan
        and its memory check ask (nominal sizes, memory estimates) without looking the family up
        by name again (`family` is its name)."""
        return self._family

    @property
    def vocab_size(self) -> int:
        """Size of the model's (shared) token embedding."""
        return self.config.vocab_size

    @property
    @abc.abstractmethod
    def max_len(self) -> int:
        """The longest sequence (feature length) the model accepts."""

    def param_counts(self) -> tuple[int, int]:
        """(total, non-embedding) parameter counts."""
        total, non_embedding = self._family.param_counts(self.config)
        return int(total), int(non_embedding)

    def flops_per_token(
        self, *, seq_len: int, inputs_len: int | None = None
    ) -> tuple[float, float]:
        """(6·N, attention-inclusive) training FLOPs per target token (`ModelFamily`)."""
        six_n, with_attention = self._family.flops_per_token(
            self.config, seq_len=seq_len, inputs_len=inputs_len
        )
        return float(six_n), float(with_attention)

    @abc.abstractmethod
    def init_variables(self, rng: jax.Array, *, batch_size: int, seq_len: int) -> Any:
        """Initial variables (`params`, and `params_axes` naming each parameter's axes)."""

    def abstract_variables(self, *, batch_size: int = 1, seq_len: int = 8) -> Any:
        """Shapes and dtypes of `init_variables` without allocating anything (traced once per
        model config in a process: a sweep's runs of one shape ask again and again)."""
        key = (type(self).__name__, repr(self.config), batch_size, seq_len)
        shapes = _ABSTRACT_VARIABLES.get(key)
        if shapes is None:
            shapes = jax.eval_shape(
                lambda rng: self.init_variables(rng, batch_size=batch_size, seq_len=seq_len),
                jax.random.key(0),
            )
            _ABSTRACT_VARIABLES[key] = shapes
        return shapes

    @abc.abstractmethod
    def _logits(
        self, params: Any, batch: Mapping[str, jax.Array], dropout_rng: jax.Array | None = None
    ) -> jax.Array:
        """Logits `[batch, targets length, vocab]` of a packed batch (dropout on with a key)."""

    def loss_fn(
        self,
        params: Any,
        batch: Mapping[str, jax.Array],
        *,
        z_loss: float = 0.0,
        dropout_rng: jax.Array | None = None,
    ) -> LossOutput:
        """Summed cross-entropy over the batch's target tokens (`decoder_loss_weights` > 0).

        Packed rows are handled by the module (attention masked to each example's segment,
        per-segment positions), so a packed row scores exactly as its examples would alone;
        padding has weight 0. Dropout (at the config's rate, where the model has any) is on
        when `dropout_rng` is given.
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

    def token_scores(
        self, params: Any, batch: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        """Per-row log-likelihood of the weighted target tokens (`-score_batch`'s cross-entropy,
        the same computation) and whether each weighted token is the arg-max prediction,
        `[batch]` each: what lm-evaluation-harness's `loglikelihood` returns per request.
        """
        logits = self._logits(params, batch)
        weights = batch["decoder_loss_weights"].astype(jnp.float32)
        targets = batch["decoder_target_tokens"]
        ce, _ = token_cross_entropy(logits, targets, weights)
        greedy = (jnp.argmax(logits, axis=-1) == targets) | (weights == 0)
        return -ce.sum(axis=-1), greedy.all(axis=-1)

    @abc.abstractmethod
    def predict_batch(
        self, params: Any, inputs: jax.Array, *, max_decode_len: int, eos_id: int = 1
    ) -> jax.Array:
        """Decoded tokens `[batch, max_decode_len]` for `inputs` (see the subclasses)."""


class DecoderOnlyModel(TransformerModel):
    """A decoder-only language model (LLaMA2) as the trainer sees it.

    The module is called as `module(tokens, segment_ids=, positions=, decode=)` and keeps its
    decoding state in a `cache` collection; its config needs `vocab_size` and `max_len`.
    """

    feature_keys = ("targets",)
    # The embedding's gradient is a scatter into a row-major table against the column-major
    # layout XLA gives its shard, so its update copies the table and both moments; waiting for
    # the gradient keeps those copies out of the backward pass. No other array needs that.
    tied_to_gradients = ("token_embedder",)

    @property
    def max_len(self) -> int:
        """The longest sequence the model is configured for."""
        return self.config.max_len

    def init_variables(self, rng: jax.Array, *, batch_size: int, seq_len: int) -> Any:
        """Initial variables (`params`, and `params_axes` naming each parameter's axes)."""
        tokens = jnp.zeros((batch_size, seq_len), jnp.int32)
        return self.module.init(rng, tokens)

    def _logits(
        self, params: Any, batch: Mapping[str, jax.Array], dropout_rng: jax.Array | None = None
    ) -> jax.Array:
        del dropout_rng  # no dropout in a decoder-only model here (LLaMA2 has none)
        return self.module.apply(
            {"params": params},
            batch["decoder_input_tokens"],
            segment_ids=batch.get("decoder_segment_ids"),
            positions=batch.get("decoder_positions"),
        )

    def predict_batch(
        self,
        params: Any,
        prompts: jax.Array,
        *,
        max_decode_len: int,
        eos_id: int = 1,
        start_id: int = 0,
    ) -> jax.Array:
        """Greedy decoding: `prompts [batch, P]` (0-padded on the right) are forced behind the
        start token `start_id` (the one training put at every document start), then the
        arg-max continuation follows until `eos_id` (kept; 0 after it) or `max_decode_len`.

        Returns `[batch, max_decode_len]`: prompt tokens followed by the continuation, through
        the module's `cache` collection one token at a time (`modeling.decoding`).
        """
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
            prompts,
            cache,
            tokens_to_logits,
            eos_id=eos_id,
            max_decode_len=max_decode_len,
            start_id=start_id,
        )
        return sequences


class EncoderDecoderModel(TransformerModel):
    """An encoder-decoder (T5) as the trainer sees it: batches add `encoder_input_tokens`,
    `encoder_segment_ids` and `encoder_positions`.

    Args:
      module: the flax module (T5X's `encode`/`decode`/`__call__` contract, `enable_dropout`).
      config: its frozen config (needs `vocab_size`, `dropout_rate`).
      name: size name, recorded in `run.json`.
      family: the model family that counts parameters and FLOPs.
      predict_fn: the family's decoder, `(module, params, inputs, *, max_decode_length, method,
        num_decodes, alpha, eos_id) -> (tokens, scores)` (`t5_jax.predict.predict_batch`).
    """

    feature_keys = ("inputs", "targets")
    # Relative position buckets set no length limit; this bound only catches typos in
    # TASK_FEATURE_LENGTHS (the MT paper uses 512).
    MAX_LEN = 8192

    def __init__(
        self, *, module: Any, config: Any, name: str, family: Any, predict_fn: Callable[..., Any]
    ):
        super().__init__(module=module, config=config, name=name, family=family)
        self._predict_fn = predict_fn

    @property
    def max_len(self) -> int:
        """The longest inputs or targets feature accepted (`MAX_LEN`)."""
        return self.MAX_LEN

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
        `((5 + len) / 6) ** alpha`, best beam returned); "greedy" takes the arg-max. The
        family's `predict_fn` jits one program per (config, shapes, method, beams), so repeated
        calls, and runs of the same shapes in one process, compile once.
        """
        tokens, _ = self._predict_fn(
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
