"""Published LLaMA checkpoints in and out of xlscale: Hugging Face and Meta -> orbax, orbax -> HF.

`hf_to_orbax(src=HF_DIR, dst=DST)` and `meta_to_orbax(src=META_DIR, dst=DST)` write a directory
`INIT_CHECKPOINT` accepts, in the layout `trainer.vocab_growth_init` writes:

    DST/checkpoints/0/{params, train_state, checksums}   what INIT_CHECKPOINT restores
    DST/run.json      {"kind": "xlscale.hf_import", "model": "hf:<src>", "family": "llama2",
                       "llama_config": {...}, "init_import": {source, format, files, params_hash}}
    DST/config.json   the source's config (so MODEL_SIZE='hf:DST' names the shape too)
    DST/tokenizer.model  the source's SentencePiece model, when it has one

`INIT_CHECKPOINT='hf:<dir>'` converts on first use into a cache directory
(`$XLSCALE_HF_CACHE`, default `~/.cache/xlscale/hf_init`), keyed by the source's path, config and
weight files' sizes and modification times, and reuses it after; a run's `run.json` then records
`init_checkpoint` (the cache directory), `init_params_hash` (equal to the record's `params_hash`)
and `init_import` (where the weights came from).

`orbax_to_hf(src='<run dir>[@step]', dst=DST)` writes `config.json`, safetensors (sharded above
`max_shard_bytes`) and the run's `VOCAB_PATH` as `tokenizer.model`: a directory
`transformers.LlamaForCausalLM.from_pretrained` loads.

Memory: HF tensors are read one at a time (memory-mapped, `trainer.safetensors_files`) and written
one at a time, but orbax saves and restores a whole params tree at once, so a conversion holds the
model once in the stored dtype (the checkpoint's own by default: bf16, 2 bytes per parameter)
plus orbax's write buffers. Orbax casts on restore, so a float32 run restores bf16-stored params
exactly; the record's `params_hash` is that of the float32 values, as a float32 run's
`init_params_hash` is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np

from llama_jax import hf_config, hf_convert
from llama_jax.config import LlamaConfig
from trainer import checkpoints as ckpt_lib
from trainer import metrics as metrics_lib
from trainer import safetensors_files, vocab_growth_init

log = logging.getLogger(__name__)

IMPORT_KIND = "xlscale.hf_import"
RUN_FIELD = "init_import"
HF_PREFIX = hf_config.HF_SIZE_PREFIX
TOKENIZER_FILE = "tokenizer.model"
EXPORT_RECORD = "xlscale_export.json"
CACHE_ENV = "XLSCALE_HF_CACHE"
IMPORT_STEP = 0
# Stored dtype name (of converted params, of exported tensors) -> numpy dtype.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}


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


def _file_record(path: Path) -> dict[str, Any]:
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
) -> dict[str, Any]:
    """Writes `dst` (see the module docstring) and returns the completed provenance record."""
    target = ckpt_lib.checkpoints_dir(dst)
    if target.is_dir() and any(target.iterdir()):
        raise FileExistsError(f"{target} already holds checkpoints; choose an empty destination")
    # What a float32 run restores (orbax casts on restore), so it equals its init_params_hash.
    record = {**record, "params_hash": ckpt_lib.params_hash(params, as_dtype=np.float32)}
    _to_cpu_arrays(params)
    vocab_growth_init.write_params(
        target,
        step=IMPORT_STEP,
        params=params,
        train_state={"step": IMPORT_STEP, RUN_FIELD: record},
    )
    (dst / hf_config.CONFIG_FILE).write_text(json.dumps(dict(config_json), indent=2) + "\n")
    if tokenizer is not None:
        shutil.copyfile(tokenizer, dst / TOKENIZER_FILE)
    info = {
        "kind": IMPORT_KIND,
        "model": f"{HF_PREFIX}{record['source']}",
        "family": "llama2",
        "vocab_size": fields["vocab_size"],
        "llama_config": dict(fields),
        "tokenizer_file": TOKENIZER_FILE if tokenizer is not None else None,  # beside run.json
        RUN_FIELD: record,
    }
    metrics_lib.write_run_json(dst, info)
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
        "files": [_file_record(p) for p in files],
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
    from llama_jax import sizes

    if model_size:
        return sizes.get_config(model_size)
    if run_info.get("llama_config"):
        return _config_from_fields(run_info["llama_config"])
    model = (run_info.get("fingerprint") or {}).get("model") or {}
    if model.get("family") == "llama2" and model.get("size"):
        return sizes.get_config(model["size"], **dict(model.get("overrides") or {}))
    raise ValueError(
        "the source records no llama2 model (run.json without fingerprint.model); pass the "
        "shape with --model-size (a size name or 'hf:<dir>')"
    )


# The token xlscale's language models see first: seqio's decoder-only feature converter shifts
# targets right behind a 0, and `trainer.infer` feeds 0 before the prompt.
START_TOKEN_ID = 0


def _token_ids(tokenizer: Path | None) -> tuple[int, int | None]:
    """(bos, eos) ids for `config.json`: bos is the tokenizer's, or `START_TOKEN_ID` where it has
    none (xlscale's own vocabularies); eos is the tokenizer's (None: unknown)."""
    if tokenizer is None:
        return START_TOKEN_ID, None
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.fspath(tokenizer))
    bos = sp.bos_id() if sp.bos_id() >= 0 else START_TOKEN_ID
    return bos, (sp.eos_id() if sp.eos_id() >= 0 else None)


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
      dst: the directory to write: `config.json`, safetensors, `tokenizer.model`,
        `xlscale_export.json` (where the weights came from).
      dtype: the exported tensors' dtype (`float32`, `bfloat16`, `float16`).
      model_size: the model's shape when `src`'s `run.json` does not record it.
      vocab_path: the SentencePiece model to ship as `tokenizer.model` (default: the run's
        `VOCAB_PATH`, from its fingerprint).

    Returns:
      The export record (also written to `dst/xlscale_export.json`).
    Raises:
      ValueError: the checkpoint's shapes do not match the recorded model (naming the tensor).
    """
    directory, step = ckpt_lib.parse_init_checkpoint(src)  # orbax wants absolute paths
    src = os.fspath(directory.resolve()) + ("" if step is None else f"@{step}")
    directory, step = ckpt_lib.check_init_checkpoint(src, abstract_params={})
    run_dir = vocab_growth_init.model_dir_of(directory)
    run_info = (
        metrics_lib.read_run_json(run_dir) if (run_dir / metrics_lib.RUN_FILE).exists() else {}
    )
    config = _source_config(run_info, model_size=model_size)
    store = ckpt_lib.CheckpointStore(directory, ckpt_lib.CheckpointConfig(), read_only=True)
    try:
        params = vocab_growth_init.read_params(store, step)
    finally:
        store.close()
    params = hf_convert.unstack_layers(params)
    shipped = run_info.get("tokenizer_file")  # an import directory's own tokenizer.model
    vocab = (
        vocab_path or (shipped and run_dir / shipped) or vocab_growth_init.source_vocab(run_info)
    )
    tokenizer = Path(vocab) if vocab and Path(vocab).is_file() else None
    bos, eos = _token_ids(tokenizer)
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
        json.dumps(hf_config.hf_config(config, dtype=dtype, bos_id=bos, eos_id=eos), indent=2)
        + "\n"
    )
    if tokenizer is not None:
        shutil.copyfile(tokenizer, dst / TOKENIZER_FILE)
    record = {
        "source": os.fspath(run_dir),
        "step": step,
        "params_hash": ckpt_lib.params_hash(params),
        "dtype": dtype,
        "files": [p.name for p in files],
        "tokenizer": os.fspath(tokenizer.resolve()) if tokenizer else None,
    }
    (dst / EXPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


# --- INIT_CHECKPOINT='hf:<dir>' -------------------------------------------------------------


def cache_root() -> Path:
    """Where on-the-fly imports are kept: `$XLSCALE_HF_CACHE` or `~/.cache/xlscale/hf_init`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "xlscale" / "hf_init")


def _source_key(src: Path) -> str:
    """A key that changes when the source's path, config or weight files change."""
    digest = hashlib.sha256(os.fspath(src).encode())
    digest.update((src / hf_config.CONFIG_FILE).read_bytes())
    for path in safetensors_files.CheckpointFiles(src).files():
        digest.update(json.dumps(_file_record(path)).encode())
    return digest.hexdigest()[:16]


def cached_import(spec: str) -> Path:
    """The orbax directory of `INIT_CHECKPOINT` `'hf:<dir>'`, converting `<dir>` on first use.

    The conversion is written to a temporary directory beside the cache entry and renamed into
    place once complete, so a killed conversion is never mistaken for a finished one.

    Raises:
      FileNotFoundError: `<dir>` is not an HF model directory (naming the flag and the path).
    """
    src = Path(spec[len(HF_PREFIX) :]).expanduser().resolve()
    if not (src / hf_config.CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"INIT_CHECKPOINT {spec!r}: no {hf_config.CONFIG_FILE} in {src} (expected a "
            "Hugging Face LlamaForCausalLM directory)"
        )
    entry = cache_root() / f"{src.name}-{_source_key(src)}"
    if (entry / metrics_lib.RUN_FILE).is_file():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        log.info("INIT_CHECKPOINT %s: converting to %s", spec, entry)
        hf_to_orbax(src=src, dst=tmp)
        try:
            os.replace(tmp, entry)
        except OSError:  # another process finished first
            if not (entry / metrics_lib.RUN_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def local_init_spec(spec: str) -> str:
    """`INIT_CHECKPOINT` as a local orbax spec: `'hf:<dir>'` becomes its cached conversion;
    any other spec is returned unchanged."""
    return os.fspath(cached_import(spec)) if spec.startswith(HF_PREFIX) else spec


def run_fields(init: Mapping[str, Any]) -> dict[str, Any]:
    """`run.json`'s `init_import` for a run initialised as `init` says (`trainer.train`'s init
    record): the provenance record of an imported `INIT_CHECKPOINT`, else None."""
    spec = init.get("init_checkpoint")
    record = None
    if spec and Path(spec, metrics_lib.RUN_FILE).is_file():
        try:
            info = metrics_lib.read_run_json(spec)
        except (OSError, ValueError):
            info = {}
        if info.get("kind") == IMPORT_KIND:
            record = info.get(RUN_FIELD)
    return {RUN_FIELD: record}
