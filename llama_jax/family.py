"""LLaMA2 as a model family (`modeling.family.ModelFamily`): the CPT paper's decoder-only model.

Answers from `llama_jax.sizes` (the 42-row table, the paper's recipe) and `llama_jax.counting`;
the module and the wrapper are imported only when a model is built, so asking for sizes or
counts imports no flax.
"""

from __future__ import annotations

from typing import Any

from llama_jax import counting, hf_config, sizes
from llama_jax import memory as memory_terms
from modeling import axes
from modeling.memory import MemoryEstimate, StepShape


class LlamaFamily:
    """The `llama2` family: decoder-only, context 2048 (CPT paper §2.1), no dropout."""

    name = "llama2"
    feature_keys = ("targets",)
    default_seq_len = sizes.PAPER_SEQ_LEN
    # MODEL_SIZE='hf:<dir>': a shape imported from a Hugging Face config.json.
    size_prefixes = (hf_config.HF_SIZE_PREFIX,)

    def sizes(self) -> list[str]:
        """The CPT paper's Table 4 sizes and our small ones."""
        return list(sizes.SIZES)

    def get_config(self, size: str, **overrides: Any) -> Any:
        """The `LlamaConfig` of `size` with `overrides` (`llama_jax.sizes.get_config`)."""
        return sizes.get_config(size, **overrides)

    def nominal_params(self, size: str) -> float | None:
        """The paper's nominal size of a Table 4 row (None for our small sizes)."""
        row = sizes.SIZES.get(size)
        nominal = None if row is None else row.nominal_m
        return None if nominal is None else nominal * 1e6

    def build(self, spec: Any) -> Any:
        """A `DecoderOnlyModel` over `llama_jax.model.Llama` of `spec.size` with
        `spec.attention_kernel` and then `spec.overrides` applied.

        Raises:
          ValueError: a non-zero `spec.dropout_rate` (LLaMA2 has no dropout) or an unknown size.
        """
        from llama_jax import model
        from modeling import models

        if spec.dropout_rate:
            raise ValueError(
                f"ModelSpec.dropout_rate = {spec.dropout_rate} (DROPOUT_RATE): llama2 has no "
                "dropout; allowed: None or 0"
            )
        fields = (
            {} if spec.attention_kernel is None else {"attention_kernel": spec.attention_kernel}
        )
        fields.update(spec.overrides)
        config = self.get_config(spec.size, **fields)
        return models.DecoderOnlyModel(
            module=model.Llama(config), config=config, name=spec.size, family=self
        )

    def param_counts(self, config: Any) -> tuple[int, int]:
        """(total, non-embedding) counts; embeddings are the input table and the untied output
        projection (`llama_jax.counting`)."""
        counts = counting.param_counts(config)
        return counts.total, counts.non_embedding

    def flops_per_token(
        self, config: Any, *, seq_len: int, inputs_len: int | None = None
    ) -> tuple[float, float]:
        """(6·N, 6·N + causal attention) per token (`inputs_len` is ignored: a decoder-only
        model has no inputs)."""
        del inputs_len
        flops = counting.flops_per_token(config, seq_len=seq_len)
        return float(flops.six_n), float(flops.with_attention)

    def cost_per_token(self, config: Any, *, seq_len: int, inputs_len: int | None = None) -> float:
        """Every matmul a step computes per token: attention-inclusive FLOPs plus the output
        projection (`counting.matmul_flops_per_token`)."""
        del inputs_len
        return float(counting.matmul_flops_per_token(config, seq_len=seq_len))

    def memory_estimate(self, config: Any, *, shape: StepShape) -> MemoryEstimate:
        """Per-device bytes of the trainer's step for `config` at `shape`, under
        `config.remat_policy` (`llama_jax.memory`)."""
        return memory_terms.memory_estimate(config, shape=shape)

    def axis_rules(self) -> tuple[tuple[str, Any], ...]:
        """The shared logical-axis rules (`modeling.axes`)."""
        return axes.logical_axis_rules()

    def paper_recipe(self, size: str, *, seq_len: int) -> sizes.Recipe:
        """The CPT paper's recipe (§2.1): 20 tokens per nominal parameter and a batch of 1M, 2M
        or 4M tokens by size band (its Table 1), in sequences of `seq_len`."""
        return sizes.paper_recipe(size, seq_len=seq_len)


FAMILY = LlamaFamily()
