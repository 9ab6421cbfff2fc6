"""Published LLaMA checkpoints in and out of xlscale: Hugging Face and Meta -> orbax, orbax -> HF.

`hf_to_orbax(src=HF_DIR, dst=DST)` and `meta_to_orbax(src=META_DIR, dst=DST)` write a directory
`INIT_CHECKPOINT` accepts, in the layout `convert.init_checkpoints` writes:

    DST/checkpoints/0/{params, train_state, checksums}   what INIT_CHECKPOINT restores
    DST/run.json      {"kind": "xlscale.hf_import", "model": "hf:<src>", "family": "llama2",
                       "llama_config": {...}, "init_import": {source, format, files, params_hash}}
    DST/config.json   the source's config (so MODEL_SIZE='hf:DST' names the shape too)
    DST/tokenizer.model  the source's SentencePiece model, when it has one
    DST/generation_config.json  the source's generation defaults, when it has them

`INIT_CHECKPOINT='hf:<dir>'` converts on first use into a cache directory (`convert.hf_cache`);
a run's `run.json` then records `init_checkpoint` (the cache directory), `init_params_hash`
(equal to the record's `params_hash`) and `init_import` (where the weights came from,
`run_fields`, called once by `trainer.train`).

`orbax_to_hf(src='<run dir>[@step]', dst=DST)` writes `config.json`, `generation_config.json`,
safetensors (sharded above `max_shard_bytes`) and the run's `VOCAB_PATH` as `tokenizer.model`: a
directory `transformers.LlamaForCausalLM.from_pretrained` loads. A model that came from an import
(the import directory itself, or a run whose `INIT_CHECKPOINT` chain leads to one) keeps the
imported model's bos/eos/pad ids and generation config, unless the run trained with another
vocabulary than the import's; otherwise the ids are the vocabulary's.

Memory: HF tensors are read one at a time (memory-mapped, `convert.safetensors_files`) and written
one at a time, but orbax saves and restores a whole params tree at once, so a conversion holds the
model once in the stored dtype (the checkpoint's own by default: bf16, 2 bytes per parameter)
plus orbax's write buffers. Orbax casts on restore, so a float32 run restores bf16-stored params
exactly; the record's `params_hash` is that of the float32 values, as a float32 run's
`init_params_hash` is.

Dependencies point down: this module imports `convert.init_checkpoints`,
`convert.safetensors_files`, `llama_jax` and `rundir`, never `trainer` (which imports `convert`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from convert import init_checkpoints, safetensors_files
from llama_jax import hf_config, hf_convert, sizes
from llama_jax.config import LlamaConfig
from rundir import names, records

log = logging.getLogger(__name__)

IMPORT_KIND = "xlscale.hf_import"
RUN_FIELD = "init_import"
HF_PREFIX = hf_config.HF_SIZE_PREFIX
TOKENIZER_FILE = "tokenizer.model"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
EXPORT_RECORD = "xlscale_export.json"
IMPORT_STEP = 0
# Stored dtype name (of converted params, of exported tensors) -> numpy dtype.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
# Model family (a run's `fingerprint.model.family`) -> its size table's
# `get_config(size, **overrides)`: the shape `orbax_to_hf` exports a run with when the run does
# not record its config. A second family with a tensor-name mapping is one line here.
SIZE_TABLES: dict[str, Callable[..., Any]] = {"llama2": sizes.get_config}


def _config_from_fields(fields: Mapping[str, Any]) -> LlamaConfig:
    return LlamaConfig(**fields)


def _dtype(name: str | None) -> np.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[name]


def _stored_dtype(params: Mapping[str, Any]) -> str:
    """The dtype name the converted embedding (and so every weight) is stored in."""
    return str(params["token_embedder"]["embedding"].dtype)


def file_record(path: Path) -> dict[str, Any]:
    """A weight file as an import record lists it (and the `hf:` cache keys it)."""
    stat = path.stat()
    return {"name": path.name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _to_cpu_arrays(tree: dict[str, Any]) -> None:
    """Replaces every numpy leaf of `tree` by a CPU jax array, in place, so each numpy array is
    freed as soon as it is copied. Orbax saves numpy leaves through another copy of the whole
    tree (peak 2.5x the tree at 1.4B parameters; 1.9x with jax leaves)."""
    cpu = jax.devices("cpu")[0]
    for key, value in tree.items():
        if isinstance(value, dict):
            _to_cpu_arrays(value)
        else:
            tree[key] = jax.device_put(value, cpu)


def _write_import(
    dst: Path,
    *,
    params: dict[str, Any],
    fields: Mapping[str, Any],
    record: dict[str, Any],
    config_json: Mapping[str, Any],
    tokenizer: Path | None,
    generation_config: Path | None = None,
) -> dict[str, Any]:
    """Writes `dst` (see the module docstring) and returns the completed provenance record."""
    target = dst / names.CHECKPOINTS_SUBDIR
    if target.is_dir() and any(target.iterdir()):
        raise FileExistsError(f"{target} already holds checkpoints; choose an empty destination")
    # What a float32 run restores (orbax casts on restore), so it equals its init_params_hash.
    record = {**record, "params_hash": init_checkpoints.params_hash(params, as_dtype=np.float32)}
    _to_cpu_arrays(params)
    init_checkpoints.write_params(
        target,
        step=IMPORT_STEP,
        params=params,
        train_state={"step": IMPORT_STEP, RUN_FIELD: record},
    )
    (dst / hf_config.CONFIG_FILE).write_text(json.dumps(dict(config_json), indent=2) + "\n")
    if tokenizer is not None:
        shutil.copyfile(tokenizer, dst / TOKENIZER_FILE)
    if generation_config is not None:
        shutil.copyfile(generation_config, dst / GENERATION_CONFIG_FILE)
    info = {
        "kind": IMPORT_KIND,
        "model": f"{HF_PREFIX}{record['source']}",
        "family": "llama2",
        "vocab_size": fields["vocab_size"],
        "llama_config": dict(fields),
        "tokenizer_file": TOKENIZER_FILE if tokenizer is not None else None,  # beside run.json
        RUN_FIELD: record,
    }
    records.write_run_json(dst, info)
    return record


def hf_to_orbax(
    *,
    src: str | os.PathLike,
    dst: str | os.PathLike,
    dtype: str | None = None,
    scan_layers: bool = False,
) -> dict[str, Any]:
    """Converts a Hugging Face `LlamaForCausalLM` directory (config.json + safetensors) into an
    `INIT_CHECKPOINT` directory `dst` (see the module docstring).

    Args:
      src: the HF model directory (`save_pretrained` output; sharded or not).
      dst: the directory to write.
      dtype: the stored params' dtype, a key of `DTYPES`; None keeps the checkpoint's (bf16
        for most published models: half the memory and disk of float32). Orbax casts on
        restore, so a float32 run gets the exact float32 values either way.
      scan_layers: write the scanned layout (`layers/...`, stacked), for runs with
        `scan_layers=True`; default: `layers_<i>/...` (as `INIT_CHECKPOINT='hf:...'` does).

    Returns:
      The provenance record (`source`, `format`, `files`, `tied`, `params_hash`, ...).
    Raises:
      FileNotFoundError: no config.json or no safetensors weights in `src`.
      ValueError: a config xlscale cannot represent, or a tensor whose shape the config
        contradicts (each named).
    """
    src, dst = Path(src).resolve(), Path(dst).resolve()  # orbax wants absolute paths
    config_path = src / hf_config.CONFIG_FILE
    config_json = hf_config.read_json(config_path)
    fields = hf_config.llama_fields(config_json, source=os.fspath(config_path))
    config = _config_from_fields(fields)
    files = safetensors_files.CheckpointFiles(src)
    tied = hf_config.tied_embeddings(config_json) and hf_convert.LM_HEAD not in files.names()
    params = hf_convert.params_from_hf(
        files.get, config=config, tied=tied, dtype=_dtype(dtype), source=os.fspath(src)
    )
    if scan_layers:
        params = hf_convert.stack_layers(params, config.num_layers)
    tokenizer = src / TOKENIZER_FILE
    record = _import_record(
        src,
        fmt="hf",
        config_file=config_path,
        files=files.files(),
        tied=tied,
        params=params,
        scan_layers=scan_layers,
    )
    return _write_import(
        dst,
        params=params,
        fields=fields,
        record=record,
        config_json=config_json,
        tokenizer=tokenizer if tokenizer.is_file() else None,
        generation_config=generation
        if (generation := src / GENERATION_CONFIG_FILE).is_file()
        else None,
    )


def _import_record(
    src: Path, *, fmt: str, config_file: Path, files: Any, tied: bool, params: Any, **extra: Any
) -> dict[str, Any]:
    """The provenance of an import (`run.json` `init_import`): source, format, the config's
    SHA-256, the weight files, tied head, stored dtype, and format-specific fields."""
    return {
        "source": os.fspath(src),
        "format": fmt,
        "config_sha256": hashlib.sha256(Path(config_file).read_bytes()).hexdigest(),
        "files": [file_record(p) for p in files],
        "tied": tied,
        **extra,
        "dtype": _stored_dtype(params),
    }


def _torch_numpy(tensor: Any) -> np.ndarray:
    """A CPU torch tensor as numpy; bfloat16 through its bits (numpy has no bfloat16)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def meta_to_orbax(
    *, src: str | os.PathLike, dst: str | os.PathLike, dtype: str | None = None
) -> dict[str, Any]:
    """Converts Meta's original release (`params.json`, `consolidated.*.pth`, and
    `tokenizer.model` there or one folder up, if any) into an `INIT_CHECKPOINT` directory `dst`.

    Needs torch (`pip install 'xlscale[hf]'`) to read the `.pth` files, which are memory-mapped;
    model-parallel shards are concatenated and `wq`/`wk` permuted to rotate-half order
    (`llama_jax.hf_convert`). Returns the provenance record.

    Raises:
      ImportError: torch is not installed.
      FileNotFoundError: no params.json or no consolidated.*.pth in `src`.
    """
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "meta-to-orbax reads Meta's .pth files with torch: pip install 'xlscale[hf]'"
        ) from e
    src, dst = Path(src).resolve(), Path(dst).resolve()  # orbax wants absolute paths
    params_json = hf_config.read_json(src / hf_config.META_PARAMS_FILE)
    shard_paths = sorted(src.glob("consolidated.*.pth"))
    if not shard_paths:
        raise FileNotFoundError(f"{src}: no consolidated.*.pth (Meta's LLaMA weights)")
    shards = [torch.load(p, map_location="cpu", mmap=True, weights_only=True) for p in shard_paths]

    def meta_tensor(name: str) -> np.ndarray:
        return hf_convert.merge_meta_shards(name, [_torch_numpy(s[name]) for s in shards])

    vocab_size = shards[0]["tok_embeddings.weight"].shape[0]
    d_ff = shards[0]["layers.0.feed_forward.w1.weight"].shape[0] * len(shards)
    if "ffn_dim_multiplier" in params_json or "multiple_of" in params_json:
        expected = hf_config.meta_ffn_dim(params_json)
        if expected != d_ff:
            log.warning(
                "params.json implies an MLP width of %d; the weights have %d", expected, d_ff
            )
    fields = hf_config.meta_fields(
        params_json, vocab_size=vocab_size, d_ff=d_ff, source=os.fspath(src / "params.json")
    )
    config = _config_from_fields(fields)
    meta_of_hf = {}
    for name in shards[0]:
        if name not in hf_convert.META_IGNORED:
            meta_of_hf[hf_convert.hf_name_of_meta(name)] = name
    tied = hf_convert.LM_HEAD not in meta_of_hf

    def hf_tensor(name: str) -> np.ndarray:
        return hf_convert.meta_to_hf(
            meta_of_hf[name], meta_tensor(meta_of_hf[name]), config=config
        )[1]

    params = hf_convert.params_from_hf(
        hf_tensor, config=config, tied=tied, dtype=_dtype(dtype), source=os.fspath(src)
    )
    # Meta's download keeps tokenizer.model beside the model folders (llama-2-7b/..).
    tokenizer = next(
        (p for p in (src / TOKENIZER_FILE, src.parent / TOKENIZER_FILE) if p.is_file()), None
    )
    record = _import_record(
        src,
        fmt="meta",
        config_file=src / "params.json",
        files=shard_paths,
        tied=tied,
        params=params,
    )
    return _write_import(
        dst,
        params=params,
        fields=fields,
        record=record,
        config_json=hf_config.hf_config(config, dtype=record["dtype"]),
        tokenizer=tokenizer,
    )


def _source_config(run_info: Mapping[str, Any], *, model_size: str | None) -> LlamaConfig:
    """The `LlamaConfig` a run or import directory trained/holds (its `run.json`), or that of
    `model_size` when given."""
    if model_size:
        return sizes.get_config(model_size)
    if run_info.get("llama_config"):
        return _config_from_fields(run_info["llama_config"])
    model = (run_info.get("fingerprint") or {}).get("model") or {}
    get_config = SIZE_TABLES.get(model.get("family"))
    if get_config is not None and model.get("size"):
        return get_config(model["size"], **dict(model.get("overrides") or {}))
    raise ValueError(
        f"the source records no model of a family it can export ({', '.join(SIZE_TABLES)}; "
        "run.json without fingerprint.model?); pass the shape with --model-size (a size name "
        "or 'hf:<dir>')"
    )


# The token xlscale's language models see first: seqio's decoder-only feature converter shifts
# targets right behind a 0, and `trainer.infer` feeds 0 before the prompt.
START_TOKEN_ID = 0


def _token_ids(tokenizer: Path | None) -> dict[str, int | None]:
    """`TOKEN_ID_KEYS` -> id from a SentencePiece model: bos is the tokenizer's, or
    `START_TOKEN_ID` where it has none (xlscale's own vocabularies); eos and pad are the
    tokenizer's (None: it has none, or there is no tokenizer)."""
    if tokenizer is None:
        return dict(zip(TOKEN_ID_KEYS, (START_TOKEN_ID, None, None), strict=True))
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.fspath(tokenizer))
    ids = (sp.bos_id() if sp.bos_id() >= 0 else START_TOKEN_ID, sp.eos_id(), sp.pad_id())
    return dict(zip(TOKEN_ID_KEYS, (i if i >= 0 else None for i in ids), strict=True))


def _import_dir(run_dir: Path, run_info: Mapping[str, Any]) -> Path | None:
    """The import directory a run's parameters came from: `run_dir` itself, or the end of its
    `INIT_CHECKPOINT` chain (a CPT run of a finetune of an imported model...) when that chain
    starts at an import; None when they were trained from scratch."""
    info, directory = run_info, run_dir
    for _ in range(16):  # a chain of runs, each initialised from the one before
        if info.get("kind") == IMPORT_KIND:
            return directory
        parent = info.get("init_checkpoint")
        if not parent or not records.has_run_json(parent):
            return None
        directory = Path(os.fspath(parent))
        info = records.read_run_json(directory)
    return None


def _special_tokens(
    run_dir: Path, run_info: Mapping[str, Any], tokenizer: Path | None
) -> tuple[dict[str, int | None], dict[str, Any] | None, str]:
    """(token ids for `config.json`, the generation config to ship or None, where they came
    from): the imported model's own (its `config.json` and `generation_config.json`) when the
    parameters came from an import and the export's tokenizer is none or the import's, else
    the tokenizer's."""
    imported = _import_dir(run_dir, run_info)
    if imported is not None:
        own = imported / TOKENIZER_FILE
        same_vocab = tokenizer is None or (
            own.is_file() and own.read_bytes() == tokenizer.read_bytes()
        )
        config_path = imported / hf_config.CONFIG_FILE
        if same_vocab and config_path.is_file():
            config = hf_config.read_json(config_path)
            generation_path = imported / GENERATION_CONFIG_FILE
            generation = hf_config.read_json(generation_path) if generation_path.is_file() else None
            return {k: config.get(k) for k in TOKEN_ID_KEYS}, generation, f"import {imported}"
    ids = _token_ids(tokenizer)
    return ids, None, f"tokenizer {tokenizer}" if tokenizer else "default"


def orbax_to_hf(
    *,
    src: str,
    dst: str | os.PathLike,
    dtype: str = "float32",
    model_size: str | None = None,
    vocab_path: str | os.PathLike | None = None,
    max_shard_bytes: int = safetensors_files.DEFAULT_SHARD_BYTES,
) -> dict[str, Any]:
    """Exports one step of a run (or an import directory) as a Hugging Face model directory.

    Args:
      src: `'<dir>[@step]'` as `INIT_CHECKPOINT` takes it (latest step by default).
      dst: the directory to write: `config.json`, `generation_config.json`, safetensors,
        `tokenizer.model`, `xlscale_export.json` (where the weights and token ids came from).
      dtype: the exported tensors' dtype (`float32`, `bfloat16`, `float16`).
      model_size: the model's shape when `src`'s `run.json` does not record it.
      vocab_path: the SentencePiece model to ship as `tokenizer.model` (default: the run's
        `VOCAB_PATH`, from its fingerprint).

    Returns:
      The export record (also written to `dst/xlscale_export.json`).
    Raises:
      ValueError: the checkpoint's shapes do not match the recorded model (naming the tensor).
    """
    directory, step = init_checkpoints.parse_init_checkpoint(src)  # orbax wants absolute paths
    src = os.fspath(directory.resolve()) + ("" if step is None else f"@{step}")
    directory, step = init_checkpoints.resolve_step(src)
    run_dir = init_checkpoints.model_dir_of(directory)
    run_info = records.read_run_json(run_dir) if records.has_run_json(run_dir) else {}
    config = _source_config(run_info, model_size=model_size)
    params = hf_convert.unstack_layers(init_checkpoints.read_params(directory, step))
    shipped = run_info.get("tokenizer_file")  # an import directory's own tokenizer.model
    vocab = vocab_path or (shipped and run_dir / shipped) or init_checkpoints.source_vocab(run_info)
    tokenizer = Path(vocab) if vocab and Path(vocab).is_file() else None
    token_ids, generation, ids_from = _special_tokens(Path(os.fspath(run_dir)), run_info, tokenizer)
    if generation is None:  # what transformers writes for a model without its own
        generation = {"_from_model_config": True}
        generation.update({k: v for k, v in token_ids.items() if v is not None})
    out_dtype = _dtype(dtype)
    dst = Path(dst).resolve()
    specs = [
        (name, hf_convert.hf_shape(name, config), out_dtype)
        for name in hf_convert.hf_tensor_paths(config)
    ]
    files = safetensors_files.write_checkpoint(
        dst,
        specs=specs,
        tensor=lambda name: hf_convert.hf_tensor(params, name, config=config, dtype=out_dtype),
        max_shard_bytes=max_shard_bytes,
    )
    (dst / hf_config.CONFIG_FILE).write_text(
        json.dumps(
            hf_config.hf_config(
                config,
                dtype=dtype,
                bos_id=token_ids["bos_token_id"],
                eos_id=token_ids["eos_token_id"],
                pad_id=token_ids["pad_token_id"],
            ),
            indent=2,
        )
        + "\n"
    )
    (dst / GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2) + "\n")
    if tokenizer is not None:
        shutil.copyfile(tokenizer, dst / TOKENIZER_FILE)
    record = {
        "source": os.fspath(run_dir),
        "step": step,
        "params_hash": init_checkpoints.params_hash(params),
        "dtype": dtype,
        "files": [p.name for p in files],
        "tokenizer": os.fspath(tokenizer.resolve()) if tokenizer else None,
        "token_ids": {**token_ids, "from": ids_from},
    }
    (dst / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def run_fields(init: Mapping[str, Any]) -> dict[str, Any]:
    """`run.json`'s `init_import` for a run initialised as `init` says (`trainer.train`'s init
    record): the provenance record of an imported `INIT_CHECKPOINT`, else None."""
    spec = init.get("init_checkpoint")
    record = None
    if spec and records.has_run_json(spec):
        try:
            info = records.read_run_json(spec)
        except (OSError, ValueError):
            info = {}
        if info.get("kind") == IMPORT_KIND:
            record = info.get(RUN_FIELD)
    return {RUN_FIELD: record}
