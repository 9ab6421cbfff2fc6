"""Gin values as the experiment tests read them: the command-line bindings every CPT (`BASE`)
and MT (`MT_BASE`, `parse_mt`) experiment needs, and macros resolved as gin would (`resolve`,
`evaluate`)."""

from __future__ import annotations

from trainer import gin_entry

BASE = [
    "--gin.MODEL_DIR='/xl/run'",
    "--gin.MODEL_SIZE='llama2_49m'",
    "--gin.VOCAB_PATH='/xl/vocab.model'",
    "--gin.INIT_CHECKPOINT='/xl/source@100'",
]

MT_BASE = [
    "--gin.MODEL_DIR='/xl/run'",
    "--gin.MODEL_SIZE='t5_3b'",
    "--gin.VOCAB_PATH='/xl/vocab.model'",
]


def parse_mt(experiment: str, *extra: str, tiny: bool = False):
    files = [f"--gin_file=experiments/{experiment}"]
    base = MT_BASE
    if tiny:  # the overlay sets MODEL_SIZE itself; a command-line binding would win over it
        files.append("--gin_file=experiments/t5_tiny.gin")
        base = [b for b in MT_BASE if "MODEL_SIZE" not in b] + ["--gin.DATA_DIR='/xl/data'"]
    return gin_entry.parse([*files, *base, *extra], job="train")


def resolve(name: str):
    """A macro's value, evaluating configurable references (`@fn()`) as gin would."""
    return evaluate(gin_entry.macro_value(name))


def evaluate(value):
    if hasattr(value, "scoped_configurable_fn"):
        return value.scoped_configurable_fn()
    if isinstance(value, dict):
        return {k: evaluate(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(evaluate(v) for v in value)
    return value
