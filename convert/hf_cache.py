"""`INIT_CHECKPOINT='hf:<dir>'`: a Hugging Face model directory, converted once and cached.

`cached_import` converts `<dir>` with `convert.hf_checkpoints.hf_to_orbax` on first use into a
cache directory (`$XLSCALE_HF_CACHE`, default `~/.cache/xlscale/hf_init`), keyed by the source's
path, config and weight files' sizes and modification times, and reuses it after. An entry is
reused only when complete: its `run.json` written last, its step committed with its integrity
record (`rundir.checksums`); one written by older code without a record is converted again.
`local_init_spec` is the one place an `INIT_CHECKPOINT` spec is resolved to an orbax directory:
`trainer.checkpoints` and `convert.grown_init` call it. This module imports
`convert.hf_checkpoints` and below, never `trainer`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from convert import hf_checkpoints, safetensors_files
from llama_jax import hf_config
from rundir import checksums, names, records

log = logging.getLogger(__name__)

CACHE_ENV = "XLSCALE_HF_CACHE"
HF_PREFIX = hf_checkpoints.HF_PREFIX


def cache_root() -> Path:
    """Where on-the-fly imports are kept: `$XLSCALE_HF_CACHE` or `~/.cache/xlscale/hf_init`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "xlscale" / "hf_init")


def _source_key(src: Path) -> str:
    """A key that changes when the source's path, config or weight files change."""
    digest = hashlib.sha256(os.fspath(src).encode())
    digest.update((src / hf_config.CONFIG_FILE).read_bytes())
    for path in safetensors_files.CheckpointFiles(src).files():
        digest.update(json.dumps(hf_checkpoints.file_record(path)).encode())
    return digest.hexdigest()[:16]


def _complete(entry: Path) -> bool:
    """Whether a cache entry is a finished conversion whose step carries its integrity record."""
    step_dir = entry / names.CHECKPOINTS_SUBDIR / str(hf_checkpoints.IMPORT_STEP)
    return records.has_run_json(entry) and checksums.has_manifest(step_dir)


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
    if _complete(entry):
        return entry
    if entry.exists():  # written before conversions were recorded: converted again
        log.info("INIT_CHECKPOINT %s: %s has no integrity record; converting again", spec, entry)
        shutil.rmtree(entry, ignore_errors=True)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        log.info("INIT_CHECKPOINT %s: converting to %s", spec, entry)
        hf_checkpoints.hf_to_orbax(src=src, dst=tmp)
        try:
            os.replace(tmp, entry)
        except OSError:  # another process finished first
            if not _complete(entry):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def local_init_spec(spec: str) -> str:
    """`INIT_CHECKPOINT` as an orbax `'<dir>[@step]'`: `'hf:<dir>'` becomes its cached
    conversion; any other spec is returned unchanged."""
    return os.fspath(cached_import(spec)) if spec.startswith(HF_PREFIX) else spec
