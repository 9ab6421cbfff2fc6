"""Hugging Face `config.json` and Meta `params.json` <-> `LlamaConfig` fields (pure JSON, no torch).

A published LLaMA checkpoint describes its shape in `config.json` (`LlamaForCausalLM`, model type
`llama`); Meta's original release in `params.json`. Both map onto the shape fields of
`llama_jax.config.LlamaConfig`:

    vocab_size               vocab_size
    hidden_size              d_model
    intermediate_size        d_ff
    num_hidden_layers        num_layers
    num_attention_heads      num_heads
    num_key_value_heads      num_kv_heads (absent: = heads, plain multi-head attention)
    head_dim                 head_dim (absent: hidden_size / heads)
    max_position_embeddings  max_len
    rope_theta               rope_theta (transformers 5 nests it in `rope_parameters`)
    rms_norm_eps             norm_eps

`tie_word_embeddings` is not a `LlamaConfig` field: xlscale's LLaMA always has an untied output
projection, so a tied checkpoint imports with `lm_head` set to a copy of the embedding (and the
exported checkpoint is untied). What cannot be represented (rope scaling, biases, another
activation) is refused with a message naming the field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
META_PARAMS_FILE = "params.json"
HF_SIZE_PREFIX = "hf:"

# config.json key -> LlamaConfig field, for the keys that map one to one.
_HF_FIELDS: dict[str, str] = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "intermediate_size": "d_ff",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "max_position_embeddings": "max_len",
    "rms_norm_eps": "norm_eps",
}
# config.json key -> the values xlscale's LLaMA computes (anything else is refused).
_HF_REQUIRED_VALUES: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu", None),
    "attention_bias": (False, None),
    "mlp_bias": (False, None),
    "pretraining_tp": (1, None),
}


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON file as a dict; a missing file is named in the error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected a checkpoint's JSON config)")
    return json.loads(path.read_text())


def _rope_theta(hf: Mapping[str, Any], *, source: str) -> float:
    """`rope_theta` from a v4 (top-level, `rope_scaling`) or v5 (`rope_parameters`) config."""
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise ValueError(
            f"{source}: rope type {kind!r} (rope scaling) is not supported; xlscale's LLaMA "
            "computes plain RoPE only (rope_type 'default')"
        )
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def llama_fields(hf: Mapping[str, Any], *, source: str = CONFIG_FILE) -> dict[str, Any]:
    """`LlamaConfig` keyword fields of an HF `config.json` dict (see the module docstring).

    Raises:
      ValueError: not a LLaMA config, a missing shape key, or a feature xlscale does not compute
        (named with its value and what is allowed).
    """
    model_type = hf.get("model_type")
    if model_type not in ("llama", None):
        raise ValueError(f"{source}: model_type {model_type!r} is not 'llama'")
    for key, allowed in _HF_REQUIRED_VALUES.items():
        if hf.get(key) not in allowed:
            raise ValueError(
                f"{source}: {key} = {hf.get(key)!r} is not supported; allowed: "
                f"{[a for a in allowed if a is not None]}"
            )
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size") if k not in hf]
    missing += [k for k in ("num_hidden_layers", "num_attention_heads") if k not in hf]
    if missing:
        raise ValueError(f"{source}: missing keys {missing}")
    fields = {field: hf[key] for key, field in _HF_FIELDS.items() if hf.get(key) is not None}
    if fields.get("head_dim") == fields["d_model"] // fields["num_heads"]:
        fields.pop("head_dim")  # the default: keep configs of plain shapes equal to table rows
    fields["rope_theta"] = _rope_theta(hf, source=source)
    fields["norm_eps"] = float(fields.get("norm_eps", 1e-6))
    return fields


def tied_embeddings(hf: Mapping[str, Any]) -> bool:
    """Whether the checkpoint has no `lm_head.weight` of its own (transformers' default: tied)."""
    return bool(hf.get("tie_word_embeddings", True))


def hf_config(
    config: Any,
    *,
    dtype: str = "float32",
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
) -> dict[str, Any]:
    """The `config.json` of an untied `LlamaForCausalLM` with `config`'s (a `LlamaConfig`) shape.

    Args:
      config: the model's `LlamaConfig`.
      dtype: the dtype the exported tensors are stored in.
      bos_id, eos_id, pad_id: the model's special token ids, for generation defaults (None:
        not set).
    """
    theta = float(config.rope_theta)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_size,
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": float(config.norm_eps),
        "rope_theta": theta,  # transformers 4
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},  # transformers 5
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": dtype,  # transformers 4
        "dtype": dtype,  # transformers 5
    }


def meta_fields(
    params: Mapping[str, Any], *, vocab_size: int, d_ff: int, source: str = META_PARAMS_FILE
) -> dict[str, Any]:
    """`LlamaConfig` keyword fields of a Meta `params.json` dict.

    Meta's file leaves the vocabulary (`vocab_size: -1`) and the MLP width (a formula over
    `multiple_of` and `ffn_dim_multiplier`) implicit, so both come from the weights' shapes.

    Raises:
      ValueError: a missing key, naming the file.
    """
    missing = [k for k in ("dim", "n_layers", "n_heads") if k not in params]
    if missing:
        raise ValueError(f"{source}: missing keys {missing}")
    fields = {
        "vocab_size": int(vocab_size),
        "d_model": int(params["dim"]),
        "d_ff": int(d_ff),
        "num_layers": int(params["n_layers"]),
        "num_heads": int(params["n_heads"]),
        "rope_theta": float(params.get("rope_theta", 10000.0)),
        "norm_eps": float(params.get("norm_eps", 1e-5)),
    }
    if params.get("n_kv_heads"):
        fields["num_kv_heads"] = int(params["n_kv_heads"])
    return fields


def meta_ffn_dim(params: Mapping[str, Any]) -> int:
    """The SwiGLU width Meta's `FeedForward` derives from `dim`, `multiple_of` and
    `ffn_dim_multiplier` (used only to check the weights' shape)."""
    hidden = int(2 * 4 * params["dim"] / 3)
    if params.get("ffn_dim_multiplier"):
        hidden = int(params["ffn_dim_multiplier"] * hidden)
    multiple = int(params.get("multiple_of", 256))
    return multiple * math.ceil(hidden / multiple)


def is_hf_size(name: str) -> bool:
    """Whether a `MODEL_SIZE` names an imported shape (`'hf:/path/to/model'`)."""
    return name.startswith(HF_SIZE_PREFIX)


def size_fields(name: str) -> dict[str, Any]:
    """`LlamaConfig` fields of the size `'hf:<dir>'`: its `<dir>/config.json`.

    Raises:
      FileNotFoundError: `<dir>` has no `config.json` (naming the size and the path).
    """
    directory = Path(name[len(HF_SIZE_PREFIX) :]).expanduser()
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"MODEL_SIZE {name!r}: no {CONFIG_FILE} in {directory} (an imported size names a "
            "Hugging Face model directory)"
        )
    return llama_fields(read_json(path), source=os.fspath(path))
