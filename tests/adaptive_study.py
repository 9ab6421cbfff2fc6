"""The tiny adaptive study: five tiny from-scratch runs (French, the fixture corpora) of the
sizes in `SIZES`; `manifest_text` is its sweep manifest."""

from __future__ import annotations

import json

SIZES = {  # name -> (d_model, num_layers): 4k to 100k non-embedding parameters
    "a_d16": (16, 1),
    "b_d32": (32, 1),
    "c_d32x2": (32, 2),
    "d_d48x2": (48, 2),
    "e_d64x2": (64, 2),
}
MANIFEST = """
[sweep]
name = "adaptive_tiny"
description = "five tiny scratch runs (fr) for the adaptive sweep"
family = "llama2"
runs_dir = "RUNS_DIR"
seq_len = 64
gin_files = ["experiments/tiny.gin"]

[vars]
DATA_DIR = ""
VOCAB_PATH = ""

[gin]
DATA_DIR = "${DATA_DIR}"
VOCAB_PATH = "${VOCAB_PATH}"
MODEL_OVERRIDES = { vocab_size = 512, max_len = 128 }
SEQUENCE_LENGTH = 64
PEAK_LR = 3e-3
EVAL_PERIOD = 6
EVAL_MAX_TOKENS = 1024
LOG_EVERY = 3
CHECKPOINT_PERIOD = 12

[axes]
sizes = SIZE_NAMES
target_langs = ["fr"]
seeds = [0]

[[grid]]
strategies = ["scratch"]

[budget]
steps = 24
batch_size = 8
"""


def manifest_text(runs_dir) -> str:
    """The tiny study's manifest with its runs in `runs_dir` and its sizes' sections."""
    text = MANIFEST.replace("RUNS_DIR", str(runs_dir))
    text = text.replace("SIZE_NAMES", json.dumps(list(SIZES)))
    for name, (width, layers) in SIZES.items():
        text += (
            f'\n[sizes.{name}]\nbase = "llama2_cpu_d64"\nd_model = {width}\n'
            f"d_ff = {4 * width}\nnum_heads = 2\nnum_layers = {layers}\n"
        )
    return text
