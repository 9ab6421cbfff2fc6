"""`xlscale convert`: published LLaMA checkpoints in and out of xlscale (`convert.hf_checkpoints`).

    xlscale convert hf-to-orbax HF_DIR DST [--dtype float32|bfloat16]   (default: as stored)
    xlscale convert meta-to-orbax META_DIR DST [--dtype float32|bfloat16]
    xlscale convert orbax-to-hf RUN_DIR[@STEP] DST [--dtype float32|bfloat16|float16]
    xlscale convert record CHECKPOINT_DIR[@STEP]

`hf-to-orbax` and `meta-to-orbax` write DST, a directory `INIT_CHECKPOINT` accepts (and whose
`config.json` `MODEL_SIZE='hf:DST'` reads); `orbax-to-hf` writes a directory transformers'
`LlamaForCausalLM.from_pretrained` loads, with the run's `VOCAB_PATH` as `tokenizer.model`.
`record` writes the integrity record (`rundir.checksums`) of an orbax step written by another tool,
from its files as they are now, so that `INIT_CHECKPOINT` and the evaluations accept it.
"""

from __future__ import annotations

import argparse
import os
import sys


def _common(
    parser: argparse.ArgumentParser, *, src_help: str, dtypes: list[str], default: str | None
) -> None:
    parser.add_argument("src", help=src_help)
    parser.add_argument("dst", help="directory to write")
    parser.add_argument(
        "--dtype", choices=dtypes, default=default, help=f"stored dtype (default {default})"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the directions and their arguments."""
    directions = parser.add_subparsers(dest="direction", required=True)
    hf = directions.add_parser("hf-to-orbax", help="HF LlamaForCausalLM dir -> INIT_CHECKPOINT")
    _common(
        hf,
        src_help="Hugging Face model directory (config.json + safetensors)",
        dtypes=["float32", "bfloat16"],
        default=None,  # the checkpoint's own
    )
    hf.add_argument("--scan-layers", action="store_true", help="for runs with scan_layers=True")
    _common(
        directions.add_parser("meta-to-orbax", help="Meta consolidated.*.pth -> INIT_CHECKPOINT"),
        src_help="Meta LLaMA directory (params.json, consolidated.*.pth)",
        dtypes=["float32", "bfloat16"],
        default=None,
    )
    export = directions.add_parser("orbax-to-hf", help="run checkpoint -> HF model directory")
    _common(
        export,
        src_help="a run's MODEL_DIR or checkpoints dir, optionally @STEP (default latest)",
        dtypes=["float32", "bfloat16", "float16"],
        default="float32",
    )
    export.add_argument("--model-size", default=None, help="shape, if run.json records none")
    export.add_argument(
        "--vocab", default=None, help="tokenizer.model to ship (default VOCAB_PATH)"
    )
    record = directions.add_parser(
        "record", help="write the integrity record of a checkpoint written by another tool"
    )
    record.add_argument(
        "checkpoint", help="MODEL_DIR or checkpoints dir, optionally @STEP (default latest)"
    )


def _import(args: argparse.Namespace) -> str:
    from convert import hf_checkpoints

    if args.direction == "hf-to-orbax":
        record = hf_checkpoints.hf_to_orbax(
            src=args.src, dst=args.dst, dtype=args.dtype, scan_layers=args.scan_layers
        )
    else:
        record = hf_checkpoints.meta_to_orbax(src=args.src, dst=args.dst, dtype=args.dtype)
    dst = _absolute(args.dst)  # the advice must work from any directory (orbax wants it absolute)
    return (
        f"wrote {dst} (params_hash {record['params_hash'][:12]}); train with "
        f"INIT_CHECKPOINT='{dst}' MODEL_SIZE='hf:{dst}'"
    )


def _absolute(path: str) -> str:
    from rundir import storage

    return os.fspath(storage.as_path(path, name="DST"))


def _export(args: argparse.Namespace) -> str:
    from convert import hf_checkpoints

    record = hf_checkpoints.orbax_to_hf(
        src=args.src,
        dst=args.dst,
        dtype=args.dtype,
        model_size=args.model_size,
        vocab_path=args.vocab,
    )
    return f"wrote {_absolute(args.dst)} from {record['source']} step {record['step']}"


def _record(args: argparse.Namespace) -> str:
    from convert import init_checkpoints

    directory, step, written = init_checkpoints.record_step(args.checkpoint)
    done = "recorded" if written else "already recorded, left as it was:"
    return f"{done} {directory}/{step}; INIT_CHECKPOINT='{directory}@{step}' verifies it now"


# direction -> what runs it (returns the line to print).
DIRECTIONS = {
    "hf-to-orbax": _import,
    "meta-to-orbax": _import,
    "orbax-to-hf": _export,
    "record": _record,
}


def run(args: argparse.Namespace) -> int:
    """Runs the chosen direction; a missing or unusable source is reported without a traceback."""
    try:
        print(DIRECTIONS[args.direction](args))
    except (FileNotFoundError, FileExistsError, KeyError, ValueError, ImportError) as e:
        print(f"xlscale convert {args.direction}: {e}", file=sys.stderr)
        return 2
    return 0
