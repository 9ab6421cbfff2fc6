"""Conversion time and peak memory of a ~1B LLaMA between Hugging Face safetensors and orbax.

    .venv/bin/python benchmarks/hf_convert.py --dir DIR [--size llama2_1085m]
        [--vocab-size 32000] [--dtype bfloat16]

Three phases, each in its own process so that each peak resident set (`ru_maxrss` of the child)
belongs to that phase alone:

1. `write`: a random HF-layout checkpoint of the size's shape (untied, `--dtype`, sharded at
   2 GiB, with an index) written tensor by tensor with `convert.safetensors_files` (no torch);
2. `import`: `convert.hf_checkpoints.hf_to_orbax` to orbax (what INIT_CHECKPOINT reads), stored
   in the checkpoint's dtype or `--store-dtype`;
3. `export`: `orbax_to_hf` back to `--dtype` safetensors.

Prints one JSON line per phase: seconds, peak RSS, bytes on disk; and checks that the export
equals the written checkpoint bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _write(args) -> dict:
    from convert import hf_checkpoints, safetensors_files
    from llama_jax import hf_config, hf_convert, sizes

    config = sizes.get_config(args.size, vocab_size=args.vocab_size)
    out = Path(args.dir) / "hf"
    dtype = hf_checkpoints.DTYPES[args.dtype]
    rng = np.random.default_rng(0)

    def tensor(name):
        shape = hf_convert.hf_shape(name, config)
        return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(dtype)

    specs = [(n, hf_convert.hf_shape(n, config), dtype) for n in hf_convert.hf_tensor_paths(config)]
    safetensors_files.write_checkpoint(out, specs=specs, tensor=tensor)
    (out / hf_config.CONFIG_FILE).write_text(
        json.dumps(hf_config.hf_config(config, dtype=args.dtype), indent=2)
    )
    return {"params": sum(int(np.prod(s)) for _, s, _ in specs)}


def _import(args) -> dict:
    from convert import hf_checkpoints

    record = hf_checkpoints.hf_to_orbax(
        src=Path(args.dir) / "hf", dst=Path(args.dir) / "orbax", dtype=args.store_dtype
    )
    return {"params_hash": record["params_hash"][:12]}


def _export(args) -> dict:
    from convert import hf_checkpoints

    record = hf_checkpoints.orbax_to_hf(
        src=os.fspath(Path(args.dir) / "orbax"), dst=Path(args.dir) / "export", dtype=args.dtype
    )
    return {"files": record["files"]}


PHASES = {"write": _write, "import": _import, "export": _export}


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _same_checkpoint(a: Path, b: Path) -> bool:
    from convert import safetensors_files

    left, right = safetensors_files.CheckpointFiles(a), safetensors_files.CheckpointFiles(b)
    return sorted(left.names()) == sorted(right.names()) and all(
        np.array_equal(left.get(n), right.get(n)) for n in left.names()
    )


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO))  # this checkout's packages, also in a git worktree
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="scratch directory (emptied first)")
    parser.add_argument("--size", default="llama2_1085m")
    parser.add_argument("--vocab-size", type=int, default=32000, help="LLaMA2's 32,000")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument(
        "--store-dtype", default=None, choices=["bfloat16", "float32"], help="orbax dtype (keep)"
    )
    parser.add_argument("--phase", choices=sorted(PHASES), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:  # a child: run one phase and report it
        start = time.perf_counter()
        extra = PHASES[args.phase](args)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(
            json.dumps(
                {"phase": args.phase, "seconds": round(seconds, 1), "peak_rss": peak, **extra}
            )
        )
        return 0
    shutil.rmtree(args.dir, ignore_errors=True)
    Path(args.dir).mkdir(parents=True)
    for phase in PHASES:
        command = [sys.executable, __file__, *(argv or sys.argv[1:]), "--phase", phase]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        done = subprocess.run(
            command, check=True, capture_output=True, text=True, cwd=REPO, env=env
        )
        line = done.stdout.strip().splitlines()[-1]
        record = json.loads(line)
        folder = {"write": "hf", "import": "orbax", "export": "export"}[phase]
        record["disk_bytes"] = _disk_bytes(Path(args.dir) / folder)
        print(json.dumps(record), flush=True)
    same = _same_checkpoint(Path(args.dir) / "hf", Path(args.dir) / "export")
    print(json.dumps({"export_equals_source": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
