"""T5 as a model family (`modeling.family.ModelFamily`): the MT paper's encoder-decoder.

Answers from `t5_jax.sizes` and `t5_jax.counting`; the module, its decoder and the wrapper are
imported only when a model is built.
"""

from __future__ import annotations

from typing import Any

from modeling import axes
from modeling.memory import MemoryEstimate, StepShape
from t5_jax import counting, sizes
from t5_jax import memory as memory_terms

# The MT paper's input and target length (Isik et al. 2024, appendix A.1).
PAPER_SEQ_LEN = 512


class T5Family:
    """The `t5` family: encoder-decoder, inputs and targets of 512 tokens (MT paper)."""

    name = "t5"
    feature_keys = ("inputs", "targets")
    default_seq_len = PAPER_SEQ_LEN

    def sizes(self) -> list[str]:
        """The MT paper's T5-770M and T5-3B, T5.1.1 small and base, and a tiny test size."""
        return list(sizes.SIZES)

    def get_config(self, size: str, **overrides: Any) -> Any:
        """The `T5Config` of `size` with `overrides` (`t5_jax.sizes.get_config`)."""
        return sizes.get_config(size, **overrides)

    def nominal_params(self, size: str) -> float | None:
        """None: the size table records no nominal counts for T5."""
        del size
        return None

    def build(self, spec: Any) -> Any:
        """An `EncoderDecoderModel` over `t5_jax.model.Transformer` of `spec.size` with
        `spec.dropout_rate`, `spec.attention_kernel` and then `spec.overrides` applied (an explicit
        `overrides["dropout_rate"]` wins)."""
        from modeling import models
        from t5_jax import model, predict

        fields = {} if spec.dropout_rate is None else {"dropout_rate": float(spec.dropout_rate)}
        if spec.attention_kernel is not None:
            fields["attention_kernel"] = spec.attention_kernel
        fields.update(spec.overrides)
        config = self.get_config(spec.size, **fields)
        return models.EncoderDecoderModel(
            module=model.Transformer(config),
            config=config,
            name=spec.size,
            family=self,
            predict_fn=predict.predict_batch,
        )

    def param_counts(self, config: Any) -> tuple[int, int]:
        """(total, non-embedding) counts; relative-position tables are non-embedding."""
        counts = counting.param_counts(config)
        return counts.total, counts.non_embedding

    def flops_per_token(
        self, config: Any, *, seq_len: int, inputs_len: int | None = None
    ) -> tuple[float, float]:
        """(6·N, attention-inclusive) training FLOPs per *target* token.

        One packed example of `inputs_len` encoder and `seq_len` decoder positions costs
        `6·(N_enc·inputs_len + N_dec·seq_len)` (+ attention and output projection); dividing by
        `seq_len` makes `flops = flops_per_token × tokens` hold with `tokens` counting target
        tokens, as the trainer's counters do. `inputs_len` defaults to `seq_len`.
        """
        inputs_len = seq_len if inputs_len is None else inputs_len
        flops = counting.flops_per_example(config, inputs_length=inputs_len, targets_length=seq_len)
        return float(flops.six_n) / seq_len, float(flops.with_attention) / seq_len

    def cost_per_token(self, config: Any, *, seq_len: int, inputs_len: int | None = None) -> float:
        """What a step computes per target token: the attention-inclusive count, which already
        holds the output projection."""
        return self.flops_per_token(config, seq_len=seq_len, inputs_len=inputs_len)[1]

    def memory_estimate(self, config: Any, *, shape: StepShape) -> MemoryEstimate:
        """Per-device bytes of the trainer's step for `config` at `shape` (inputs of
        `shape.inputs_len`), under `config.remat_policy` (`t5_jax.memory`)."""
        return memory_terms.memory_estimate(config, shape=shape)

    def axis_rules(self) -> tuple[tuple[str, Any], ...]:
        """The shared logical-axis rules (`modeling.axes`)."""
        return axes.logical_axis_rules()

    def paper_recipe(self, size: str, *, seq_len: int) -> None:
        """None: the MT paper fixes no per-size batch or length (runs set `BATCH_SIZE`)."""
        del size, seq_len
        return None


FAMILY = T5Family()
