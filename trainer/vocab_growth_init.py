"""An `INIT_CHECKPOINT` for continual pre-training with an extended vocabulary.

`grow_checkpoint` reads one step of a source run (`'<dir>[@step]'`, as `INIT_CHECKPOINT` takes
it), checks that the extended vocabulary starts with the source run's own (`VOCAB_PATH` of its
fingerprint; the extension's base tokenizer when the run does not record one), grows the
embedding and output matrices (`llama_jax.vocab_growth`: old rows bit-identical, new rows the
mean of their subword rows) and writes a run-like directory:

    DST/checkpoints/<step>/{params, train_state, checksums}   what INIT_CHECKPOINT restores
    DST/run.json   {"kind": "xlscale.grown_init", "model", "family", "vocab_size",
                    "init_vocab_extension": {...}}

Then `INIT_CHECKPOINT=DST` with `VOCAB_PATH=<extended .model>` and the model's `vocab_size`
override set to the grown size starts the CPT run; its `run.json` copies the record as
`init_vocab_extension` (`run_fields`, called once by `trainer.train`), beside `init_params_hash`,
which equals the record's `params_hash`. DST holds no optimizer state: it initialises runs, it is
not a run to resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from llama_jax import vocab_growth
from pipelines import vocab_extend
from trainer import checkpoint_manifest
from trainer import checkpoints as ckpt_lib
from trainer import metrics as metrics_lib

GROWN_KIND = "xlscale.grown_init"
RUN_FIELD = "init_vocab_extension"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_dir_of(checkpoints_directory: Path) -> Path:
    """A run's MODEL_DIR from its checkpoints directory (as `trainer.train` records it)."""
    if checkpoints_directory.name == ckpt_lib.CHECKPOINTS_SUBDIR:
        return checkpoints_directory.parent
    return checkpoints_directory


def source_vocab(run_info: Mapping[str, Any]) -> str | None:
    """The `VOCAB_PATH` a run trained with, from its fingerprint."""
    return (run_info.get("fingerprint") or {}).get("data", {}).get("vocab_path")


def read_params(store: ckpt_lib.CheckpointStore, step: int) -> dict[str, Any]:
    """A step's params as host numpy arrays, whatever mesh saved them."""
    device = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    abstract = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device),
        store.params_metadata(step),
    )
    params = store.restore_params(step, abstract_params=abstract)
    return jax.tree.map(np.asarray, params)


def write_params(directory: Path, *, step: int, params: Any, train_state: dict) -> None:
    """Writes `directory/<step>/{params, train_state}` in `CheckpointStore`'s layout, with
    checksums."""
    manager = ocp.CheckpointManager(
        os.fspath(directory),
        options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False),
        item_handlers={
            "params": ocp.StandardCheckpointHandler(),
            "train_state": ocp.JsonCheckpointHandler(),
        },
    )
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                train_state=ocp.args.JsonSave(train_state),
            ),
            force=True,
        )
        manager.wait_until_finished()
    finally:
        manager.close()
    checkpoint_manifest.write_manifest(directory / str(step))


def grow_checkpoint(
    *,
    source: str,
    vocab_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    vocab_size: int | None = None,
    method: str = "subword_mean",
    old_vocab_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Writes `out_dir`, an `INIT_CHECKPOINT` directory holding `source`'s params grown to the
    extended vocabulary `vocab_path` (see the module docstring).

    Args:
      source: `'<dir>[@step]'`: a run's MODEL_DIR or checkpoints directory (latest step by
        default).
      vocab_path: the extended SentencePiece `.model` (`xlscale tokenizer extend`; its sidecar,
        when present, is recorded).
      out_dir: the directory to write (must not hold checkpoints yet).
      vocab_size: rows of the grown tables; default: the larger of the checkpoint's rows and
        the extended vocabulary's size.
      method: a key of `llama_jax.vocab_growth.INIT_METHODS`.
      old_vocab_path: the tokenizer the source run trained with; default: its `VOCAB_PATH`
        (from its `run.json`), else the extension's recorded base model.

    Returns:
      The extension record written to `out_dir/run.json` as `init_vocab_extension`.
    Raises:
      pipelines.vocab_extend.VocabPrefixError: the new vocabulary does not start with the old
        one (naming the first differing id).
      ValueError: the checkpoint's vocabulary rows do not fit the old tokenizer, or
        `vocab_size` is smaller than the new vocabulary.
      FileNotFoundError: no checkpoint, no old vocabulary to check against.
    """
    out_dir, vocab_path = Path(out_dir), Path(vocab_path)
    target = ckpt_lib.checkpoints_dir(out_dir)
    if target.is_dir() and any(target.iterdir()):
        raise FileExistsError(f"{target} already holds checkpoints; choose an empty --out")
    directory, _ = ckpt_lib.parse_init_checkpoint(source)
    run_dir = model_dir_of(directory)
    run_info = (
        metrics_lib.read_run_json(run_dir) if (run_dir / metrics_lib.RUN_FILE).exists() else {}
    )
    sidecar = None  # an extension's record (another tool's extension may have none)
    if vocab_path.with_suffix(".json").exists():
        with contextlib.suppress(ValueError):
            sidecar = vocab_extend.read_extension_info(vocab_path)
    old_vocab = old_vocab_path or source_vocab(run_info) or (sidecar or {}).get("base_model")
    if not old_vocab or not Path(old_vocab).exists():
        raise FileNotFoundError(
            f"the tokenizer {source!r} was trained with is unknown or missing ({old_vocab!r}); "
            "pass it as old_vocab_path (--old-vocab)"
        )
    old_vocab = Path(old_vocab)
    new_pieces = vocab_extend.old_ids_of_new_pieces(old=old_vocab, new=vocab_path)
    base_size = vocab_extend.check_prefix(old=old_vocab, new=vocab_path)
    new_size = base_size + len(new_pieces)

    directory, step = ckpt_lib.check_init_checkpoint(source, abstract_params={})
    store = ckpt_lib.CheckpointStore(directory, ckpt_lib.CheckpointConfig(), read_only=True)
    try:
        params = read_params(store, step)
    finally:
        store.close()
    old_rows = vocab_growth.vocab_rows(params)
    if old_rows < base_size:
        raise ValueError(
            f"vocab size mismatch: checkpoint {source!r} step {step} has {old_rows} vocabulary "
            f"rows but its tokenizer {old_vocab} has {base_size} pieces; the checkpoint was "
            "trained with another vocabulary"
        )
    rows = max(old_rows, new_size) if vocab_size is None else int(vocab_size)
    if rows < new_size or rows < old_rows:
        raise ValueError(
            f"vocab_size {rows} is smaller than the extended vocabulary ({new_size} pieces) or "
            f"the checkpoint's table ({old_rows} rows)"
        )
    grown = vocab_growth.grow_params(
        params, new_vocab_size=rows, base_size=base_size, new_pieces=new_pieces, method=method
    )
    record = {
        "source_run": os.fspath(run_dir),
        "source_step": step,
        "source_params_hash": ckpt_lib.params_hash(params),
        "params_hash": ckpt_lib.params_hash(grown),
        "old_vocab": os.fspath(old_vocab),
        "old_vocab_sha256": _sha256(old_vocab),
        "vocab": os.fspath(vocab_path),
        "vocab_sha256": _sha256(vocab_path),
        "lang": (sidecar or {}).get("lang"),
        "base_size": base_size,
        "new_size": new_size,
        "added_pieces": len(new_pieces),
        "old_vocab_rows": old_rows,
        "vocab_size": rows,
        "method": method,
        "out_dir": os.fspath(out_dir),
    }
    write_params(target, step=step, params=grown, train_state={"step": step, RUN_FIELD: record})
    info = {
        "kind": GROWN_KIND,
        "model": run_info.get("model"),
        "family": run_info.get("family"),
        "vocab_size": rows,
        RUN_FIELD: record,
    }
    metrics_lib.write_run_json(out_dir, info)
    return record


def run_fields(init: Mapping[str, Any]) -> dict[str, Any]:
    """`run.json`'s `init_vocab_extension` for a run initialised as `init` says (`trainer.train`'s
    init record): the extension record of a grown `INIT_CHECKPOINT`, else None."""
    spec = init.get("init_checkpoint")
    record = None
    if spec and Path(spec, metrics_lib.RUN_FILE).is_file():
        try:
            record = metrics_lib.read_run_json(spec).get(RUN_FIELD)
        except (OSError, ValueError):
            record = None
    return {RUN_FIELD: record}
