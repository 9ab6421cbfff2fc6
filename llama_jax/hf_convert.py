"""Weights of Hugging Face `LlamaForCausalLM` and Meta `consolidated.*.pth` <-> `llama_jax` params.

Pure numpy, one tensor at a time, so callers can stream a 7B checkpoint. HF linear weights are
`[out, in]`; xlscale kernels are `[in, out]` with the head axes split out:

    model.embed_tokens.weight               [V, D]      token_embedder/embedding  [V, D]
    model.layers.i.input_layernorm.weight   [D]         layers_i/attention_norm/scale
    model.layers.i.self_attn.q_proj.weight  [H*hd, D]   layers_i/attention/query  W.T -> [D, H, hd]
    model.layers.i.self_attn.k_proj.weight  [K*hd, D]   layers_i/attention/key    W.T -> [D, K, hd]
    model.layers.i.self_attn.v_proj.weight  [K*hd, D]   layers_i/attention/value  W.T -> [D, K, hd]
    model.layers.i.self_attn.o_proj.weight  [D, H*hd]   layers_i/attention/out    W.T -> [H, hd, D]
    model.layers.i.post_attention_layernorm.weight      layers_i/ffn_norm/scale
    model.layers.i.mlp.gate_proj.weight     [F, D]      layers_i/mlp/w1           W.T
    model.layers.i.mlp.up_proj.weight       [F, D]      layers_i/mlp/w3           W.T
    model.layers.i.mlp.down_proj.weight     [D, F]      layers_i/mlp/w2           W.T
    model.norm.weight                       [D]         final_norm/scale
    lm_head.weight                          [V, D]      lm_head/kernel            W.T -> [D, V]

(H query heads, K key/value heads, hd head size.) `llama_jax` rotates q/k with HF's
"rotate half" pairing, so HF tensors need no permutation. A tied HF checkpoint has no
`lm_head.weight`: its kernel is the embedding transposed (xlscale's head is always untied).

Meta's original checkpoints pair adjacent dimensions in RoPE; transformers' conversion script
permutes the rows of `wq` (with H) and `wk` (with K) into rotate-half order,
`w.view(n, rows/n/2, 2, D).transpose(1, 2).reshape(rows, D)`; `meta_to_hf` applies exactly that
permutation and `hf_to_meta` its inverse. Model-parallel Meta shards are concatenated along
`META_SHARD_AXES`.

The params tree built here is the unscanned layout (`layers_<i>/...`); `stack_layers` gives the
scanned one (`layers/...`, a leading layer axis) of `LlamaConfig(scan_layers=True)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
_LAYER_PREFIX = "model.layers."


def _linear(w: np.ndarray, config: Any) -> np.ndarray:
    del config
    return w.T


def _linear_back(p: np.ndarray, config: Any) -> np.ndarray:
    del config
    return p.T


def _in_heads(w: np.ndarray, config: Any) -> np.ndarray:
    """`[n*hd, D]` -> `[D, n, hd]` (query: n = heads; key/value: n = kv heads)."""
    return w.T.reshape(config.d_model, -1, config.head_size)


def _in_heads_back(p: np.ndarray, config: Any) -> np.ndarray:
    return p.reshape(config.d_model, -1).T


def _out_heads(w: np.ndarray, config: Any) -> np.ndarray:
    """`[D, H*hd]` -> `[H, hd, D]`."""
    return w.T.reshape(config.num_heads, config.head_size, config.d_model)


def _out_heads_back(p: np.ndarray, config: Any) -> np.ndarray:
    return p.reshape(-1, config.d_model).T


def _same(w: np.ndarray, config: Any) -> np.ndarray:
    del config
    return w


# How a tensor kind maps: (HF -> xlscale, xlscale -> HF).
_TRANSFORMS: dict[str, tuple[Callable, Callable]] = {
    "same": (_same, _same),
    "linear": (_linear, _linear_back),
    "in_heads": (_in_heads, _in_heads_back),
    "out_heads": (_out_heads, _out_heads_back),
}

# HF name inside `model.layers.<i>.` -> (xlscale path inside `layers_<i>`, transform kind).
LAYER_TENSORS: dict[str, tuple[tuple[str, str], str]] = {
    "input_layernorm.weight": (("attention_norm", "scale"), "same"),
    "self_attn.q_proj.weight": (("attention", "query"), "in_heads"),
    "self_attn.k_proj.weight": (("attention", "key"), "in_heads"),
    "self_attn.v_proj.weight": (("attention", "value"), "in_heads"),
    "self_attn.o_proj.weight": (("attention", "out"), "out_heads"),
    "post_attention_layernorm.weight": (("ffn_norm", "scale"), "same"),
    "mlp.gate_proj.weight": (("mlp", "w1"), "linear"),
    "mlp.up_proj.weight": (("mlp", "w3"), "linear"),
    "mlp.down_proj.weight": (("mlp", "w2"), "linear"),
}
# HF name -> (xlscale path, transform kind), outside the blocks.
GLOBAL_TENSORS: dict[str, tuple[tuple[str, ...], str]] = {
    EMBED: (("token_embedder", "embedding"), "same"),
    FINAL_NORM: (("final_norm", "scale"), "same"),
    LM_HEAD: (("lm_head", "kernel"), "linear"),
}


def hf_tensor_paths(config: Any) -> dict[str, tuple[tuple[str, ...], str]]:
    """Every HF tensor name of an untied `LlamaForCausalLM` of `config`'s shape -> (xlscale param
    path, transform kind), in transformers' order."""
    table = {EMBED: GLOBAL_TENSORS[EMBED]}
    for i in range(config.num_layers):
        for suffix, (path, kind) in LAYER_TENSORS.items():
            table[f"{_LAYER_PREFIX}{i}.{suffix}"] = ((f"layers_{i}", *path), kind)
    table[FINAL_NORM] = GLOBAL_TENSORS[FINAL_NORM]
    table[LM_HEAD] = GLOBAL_TENSORS[LM_HEAD]
    return table


def hf_shape(name: str, config: Any) -> tuple[int, ...]:
    """The shape transformers gives tensor `name` for `config` (for checks before reading)."""
    d, hd = config.d_model, config.head_size
    suffix = name.split(".", 3)[-1] if name.startswith(_LAYER_PREFIX) else name
    shapes = {
        EMBED: (config.vocab_size, d),
        FINAL_NORM: (d,),
        LM_HEAD: (config.vocab_size, d),
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (config.num_heads * hd, d),
        "self_attn.k_proj.weight": (config.kv_heads * hd, d),
        "self_attn.v_proj.weight": (config.kv_heads * hd, d),
        "self_attn.o_proj.weight": (d, config.num_heads * hd),
        "mlp.gate_proj.weight": (config.d_ff, d),
        "mlp.up_proj.weight": (config.d_ff, d),
        "mlp.down_proj.weight": (d, config.d_ff),
    }
    return shapes[suffix]


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree: Mapping, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def params_from_hf(
    tensor: Callable[[str], np.ndarray],
    *,
    config: Any,
    tied: bool = False,
    dtype: Any = None,
    source: str = "checkpoint",
) -> dict[str, Any]:
    """The unscanned params tree of `config`'s model from HF tensors, read one at a time.

    Args:
      tensor: `name -> array` (e.g. a lazy safetensors reader's `get`).
      config: the model's `LlamaConfig`.
      tied: the checkpoint has no `lm_head.weight`; the kernel is the embedding transposed.
      dtype: the params' dtype (None: keep each tensor's, e.g. bfloat16).
      source: the checkpoint, for messages.

    Raises:
      ValueError: a tensor's shape differs from what `config` implies (naming both).
    """
    params: dict[str, Any] = {}
    for name, (path, kind) in hf_tensor_paths(config).items():
        read = EMBED if (tied and name == LM_HEAD) else name
        array = np.asarray(tensor(read))
        want = hf_shape(read, config)
        if array.shape != want:
            raise ValueError(
                f"{source}: tensor {read!r} has shape {array.shape}, config.json implies {want}"
            )
        value = _TRANSFORMS[kind][0](array, config)
        # A C-ordered copy: the result owns its memory (never a view of a memory-mapped file).
        _set(params, path, value.astype(array.dtype if dtype is None else dtype, order="C"))
    return params


def hf_tensor(
    params: Mapping[str, Any], name: str, *, config: Any, dtype: Any = None
) -> np.ndarray:
    """HF tensor `name` of an (unscanned) params tree, as a C-contiguous numpy array."""
    path, kind = hf_tensor_paths(config)[name]
    value = np.asarray(_get(params, path))
    value = np.ascontiguousarray(_TRANSFORMS[kind][1](value, config))
    return value if dtype is None else value.astype(dtype)


def hf_tensors(
    params: Mapping[str, Any], *, config: Any, dtype: Any = None
) -> Iterator[tuple[str, np.ndarray]]:
    """Every `(HF name, array)` of an (unscanned) params tree, one tensor at a time."""
    for name in hf_tensor_paths(config):
        yield name, hf_tensor(params, name, config=config, dtype=dtype)


def stack_layers(params: Mapping[str, Any], num_layers: int) -> dict[str, Any]:
    """Unscanned (`layers_<i>/...`) -> scanned (`layers/...`, stacked on a leading axis)."""
    out = {k: v for k, v in params.items() if not k.startswith("layers_")}
    per_layer = [params[f"layers_{i}"] for i in range(num_layers)]

    def stack(*path):
        return np.stack([_get(layer, path) for layer in per_layer])

    stacked: dict[str, Any] = {}
    for group, leaves in per_layer[0].items():
        for leaf in leaves:
            _set(stacked, (group, leaf), stack(group, leaf))
    out["layers"] = stacked
    return out


def unstack_layers(params: Mapping[str, Any]) -> dict[str, Any]:
    """Scanned (`layers/...`) -> unscanned (`layers_<i>/...`); an unscanned tree is returned as is."""
    if "layers" not in params:
        return dict(params)
    out = {k: v for k, v in params.items() if k != "layers"}
    for group, leaves in params["layers"].items():
        for leaf, value in leaves.items():
            for i in range(np.shape(value)[0]):
                _set(out, (f"layers_{i}", group, leaf), np.asarray(value)[i])
    return out


# --- Meta's original layout ---------------------------------------------------------------

# Meta name inside `layers.<i>.` -> HF name inside `model.layers.<i>.`.
META_LAYER_NAMES: dict[str, str] = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
META_GLOBAL_NAMES: dict[str, str] = {
    "tok_embeddings.weight": EMBED,
    "norm.weight": FINAL_NORM,
    "output.weight": LM_HEAD,
}
# Meta tensors that are not weights of the model (RoPE's frequency table).
META_IGNORED = ("rope.freqs",)
# Axis along which model-parallel Meta shards split a tensor (None: replicated in every shard).
META_SHARD_AXES: dict[str, int | None] = {
    "tok_embeddings.weight": 1,
    "output.weight": 0,
    "norm.weight": None,
    "attention_norm.weight": None,
    "ffn_norm.weight": None,
    "attention.wq.weight": 0,
    "attention.wk.weight": 0,
    "attention.wv.weight": 0,
    "attention.wo.weight": 1,
    "feed_forward.w1.weight": 0,
    "feed_forward.w3.weight": 0,
    "feed_forward.w2.weight": 1,
}


def meta_suffix(name: str) -> str:
    """`layers.3.attention.wq.weight` -> `attention.wq.weight`; global names unchanged."""
    return name.split(".", 2)[2] if name.startswith("layers.") else name


def hf_name_of_meta(name: str) -> str:
    """The HF name of a Meta tensor name.

    Raises:
      KeyError: a name that is no Meta LLaMA weight.
    """
    if name.startswith("layers."):
        _, index, suffix = name.split(".", 2)
        return f"{_LAYER_PREFIX}{index}.{META_LAYER_NAMES[suffix]}"
    return META_GLOBAL_NAMES[name]


def hf_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Meta's adjacent-pair RoPE rows -> HF's rotate-half rows (transformers'
    `convert_llama_weights_to_hf.permute`) for a `[n_heads*hd, D]` projection."""
    rows, cols = w.shape
    return (
        w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)
    )


def meta_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of `hf_permute`: HF rows -> Meta's adjacent-pair order."""
    rows, cols = w.shape
    return (
        w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)
    )


def _permute_heads(name: str, config: Any) -> int | None:
    """The head count `name` is permuted with (wq: heads, wk: kv heads), else None."""
    return {"attention.wq.weight": config.num_heads, "attention.wk.weight": config.kv_heads}.get(
        meta_suffix(name)
    )


def meta_to_hf(name: str, w: np.ndarray, *, config: Any) -> tuple[str, np.ndarray]:
    """One Meta tensor as its HF name and layout (`wq`/`wk` permuted)."""
    heads = _permute_heads(name, config)
    return hf_name_of_meta(name), (w if heads is None else hf_permute(w, heads))


def hf_to_meta(name: str, w: np.ndarray, *, config: Any) -> tuple[str, np.ndarray]:
    """One HF tensor as its Meta name and layout (the inverse of `meta_to_hf`)."""
    meta = {v: k for k, v in META_GLOBAL_NAMES.items()}.get(name)
    if meta is None:
        _, _, index, suffix = name.split(".", 3)
        meta = f"layers.{index}." + {v: k for k, v in META_LAYER_NAMES.items()}[suffix]
    heads = _permute_heads(meta, config)
    return meta, (w if heads is None else meta_permute(w, heads))


def merge_meta_shards(name: str, shards: list[np.ndarray]) -> np.ndarray:
    """One tensor from model-parallel `consolidated.0k.pth` shards (`META_SHARD_AXES`)."""
    if len(shards) == 1:
        return shards[0]
    axis = META_SHARD_AXES[meta_suffix(name)]
    return shards[0] if axis is None else np.concatenate(shards, axis=axis)
