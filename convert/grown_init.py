"""An `INIT_CHECKPOINT` for continual pre-training with an extended vocabulary.

`grow_checkpoint` reads one step of a source run (`'<dir>[@step]'`, as `INIT_CHECKPOINT` takes
it), checks that the extended vocabulary starts with the source run's own (`VOCAB_PATH` of its
fingerprint; the extension's base tokenizer when the run does not record one), grows the
embedding and output matrices (`llama_jax.embedding_growth`: old rows bit-identical, new rows the
mean of their subword rows) and writes a run-like directory:

    DST/checkpoints/<step>/{params, train_state, checksums}   what INIT_CHECKPOINT restores
    DST/run.json   {"kind": "xlscale.grown_init", "model", "family", "vocab_size",
                    "init_vocab_extension": {...}}

Then `INIT_CHECKPOINT=DST` with `VOCAB_PATH=<extended .model>` and the model's `vocab_size`
override set to the grown size starts the CPT run; its `run.json` copies the record as
`init_vocab_extension` (`run_fields`, called once by `trainer.train`), beside `init_params_hash`,
which equals the record's `params_hash`. DST holds no optimizer state: it initialises runs, it is
not a run to resume.

Reading and writing the params-only steps is `convert.init_checkpoints`'; this module imports it,
`convert.hf_cache` (a source may be `'hf:<dir>'`), `llama_jax`, `pipelines` and `rundir`, never
`trainer`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from convert import hf_cache, init_checkpoints
from llama_jax import embedding_growth
from pipelines import vocab_extend
from rundir import names, records, storage

GROWN_KIND = "xlscale.grown_init"
RUN_FIELD = "init_vocab_extension"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
      method: a key of `llama_jax.embedding_growth.INIT_METHODS`.
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
    out_dir, vocab_path = storage.as_path(out_dir, name="--out"), Path(vocab_path)
    target = out_dir / names.CHECKPOINTS_SUBDIR
    if target.is_dir() and any(target.iterdir()):
        raise FileExistsError(f"{target} already holds checkpoints; choose an empty --out")
    directory, _ = init_checkpoints.parse_init_checkpoint(source)
    run_dir = init_checkpoints.model_dir_of(directory)
    run_info = records.read_run_json(run_dir) if records.has_run_json(run_dir) else {}
    sidecar = None  # an extension's record (another tool's extension may have none)
    if vocab_path.with_suffix(".json").exists():
        with contextlib.suppress(ValueError):
            sidecar = vocab_extend.read_extension_info(vocab_path)
    old_vocab = (
        old_vocab_path
        or init_checkpoints.source_vocab(run_info)
        or (sidecar or {}).get("base_model")
    )
    if not old_vocab or not Path(old_vocab).exists():
        raise FileNotFoundError(
            f"the tokenizer {source!r} was trained with is unknown or missing ({old_vocab!r}); "
            "pass it as old_vocab_path (--old-vocab)"
        )
    old_vocab = Path(old_vocab)
    new_pieces = vocab_extend.old_ids_of_new_pieces(old=old_vocab, new=vocab_path)
    base_size = vocab_extend.check_prefix(old=old_vocab, new=vocab_path)
    new_size = base_size + len(new_pieces)

    directory, step = init_checkpoints.resolve_step(hf_cache.local_init_spec(source))
    params = init_checkpoints.read_params(directory, step)
    old_rows = embedding_growth.vocab_rows(params)
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
    grown = embedding_growth.grow_params(
        params, new_vocab_size=rows, base_size=base_size, new_pieces=new_pieces, method=method
    )
    record = {
        "source_run": os.fspath(run_dir),
        "source_step": step,
        "source_params_hash": init_checkpoints.params_hash(params),
        "params_hash": init_checkpoints.params_hash(grown),
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
    init_checkpoints.write_params(
        target, step=step, params=grown, train_state={"step": step, RUN_FIELD: record}
    )
    info = {
        "kind": GROWN_KIND,
        "model": run_info.get("model"),
        "family": run_info.get("family"),
        "vocab_size": rows,
        RUN_FIELD: record,
    }
    records.write_run_json(out_dir, info)
    return record


def run_fields(init: Mapping[str, Any]) -> dict[str, Any]:
    """`run.json`'s `init_vocab_extension` for a run initialised as `init` says (`trainer.train`'s
    init record): the extension record of a grown `INIT_CHECKPOINT`, else None."""
    spec = init.get("init_checkpoint")
    record = None
    if spec and records.has_run_json(spec):
        try:
            record = records.read_run_json(spec).get(RUN_FIELD)
        except (OSError, ValueError):
            record = None
    return {RUN_FIELD: record}
