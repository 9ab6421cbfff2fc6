"""Which model a run trains: the gin-configured `ModelSpec`, and `build_model`, which asks the
spec's family (`modeling.family`) for its wrapper (`modeling.models`).

The gin files bind `models.ModelSpec` (`from trainer import model_spec as models`: the gin name
users type stays `models.ModelSpec`), so the spec stays here;
the wrappers and the family protocol live below the trainer, in `modeling`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from modeling import family as family_lib


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which model to build: a family, a size name from that family's table, and overrides.

    Attributes:
      family: a key of `modeling.family.FAMILIES` (`llama2`, `t5`).
      size: a size name of the family's table (gin macro `MODEL_SIZE`).
      overrides: config fields to replace, e.g. `{"vocab_size": 512, "remat_policy": "full"}`.
      dropout_rate: the model's dropout in training steps (gin macro `DROPOUT_RATE`; None: the
        size table's value). Kept apart from `overrides` so that a run kind (T5X: pretraining
        0.0, finetuning 0.1) and a model shape can be set independently; an explicit
        `overrides["dropout_rate"]` wins. Families without dropout (LLaMA2) accept only 0/None.
      attention_kernel: the attention seam's kernel (gin macro `ATTENTION_KERNEL`: `auto`,
        `xla`, `cudnn`, `splash`; see `modeling.attention`); None: the config's default
        (`auto`). An explicit `overrides["attention_kernel"]` wins.
    """

    family: str = "llama2"
    size: str = ""
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dropout_rate: float | None = None
    attention_kernel: str | None = None


def build_model(spec: ModelSpec) -> Any:
    """The model wrapper of `spec`, built by its family.

    Raises:
      ValueError: unknown family (listing the registered ones) or unknown size (listing the
        family's sizes, as `get_config` does).
    """
    return family_lib.get(spec.family).build(spec)
