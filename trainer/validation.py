"""Configuration checks that run before anything is compiled.

Each check raises `ConfigError` whose message names the gin binding to change (the macro of the
run files and the library argument it feeds) and the values that would be allowed. The library
knows no gin: the names below are only strings for messages.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

# Library argument -> the gin macro that sets it in `t5x_configs/runs/*.gin`.
BINDINGS: dict[str, str] = {
    "model_dir": "MODEL_DIR (train.model_dir)",
    "model_size": "MODEL_SIZE (models.ModelSpec.size)",
    "batch_size": "BATCH_SIZE (data.DataConfig.batch_size)",
    "feature_lengths": "TASK_FEATURE_LENGTHS (data.DataConfig.task_feature_lengths)",
    "vocab_path": "VOCAB_PATH (data.DataConfig.vocab_path)",
    "vocab_size": "MODEL_OVERRIDES['vocab_size'] (models.ModelSpec.overrides)",
    "mixture_or_task": "MIXTURE_OR_TASK_NAME (data.DataConfig.mixture_or_task)",
    "eval_tasks": "EVAL_TASKS (data.EvalConfig.tasks)",
    "train_steps": "TRAIN_STEPS (train.train_steps)",
    "checkpoint_period": "CHECKPOINT_PERIOD (checkpoints.CheckpointConfig.period)",
    "tokens_per_param": "TOKENS_PER_PARAM (train.tokens_per_param)",
    "param_basis": "PARAM_BASIS (train.param_basis)",
    "init_checkpoint": "INIT_CHECKPOINT (train.init_checkpoint)",
    "num_microbatches": "NUM_MICROBATCHES (steps.StepConfig.num_microbatches)",
    "mesh": "partitioning.MeshConfig (data, fsdp, model)",
    "device_memory": "partitioning.MeshConfig.device_memory_gib",
    "on_nonfinite": "ON_NONFINITE (loop.LoopConfig.on_nonfinite)",
    "keep_best_mode": "KEEP_BEST_MODE (checkpoints.CheckpointConfig.keep_best_mode)",
    "max_skipped_fraction": "MAX_SKIPPED_FRACTION (loop.LoopConfig.max_skipped_fraction)",
    "decode_tasks": "DECODE_TASKS (downstream.DecodeConfig.tasks)",
    "replay_ratio": "REPLAY_RATIO (train.RunInfo.replay_ratio)",
    "corpora_dir": "DATA_DIR (data.DataConfig.corpora_dir)",
}


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which binding to change and how."""


def check_required(values: Mapping[str, Any]) -> None:
    """Every macro in `values` must be set.

    Args:
      values: macro name -> value as resolved from the gin config (None = not set).
    """
    missing = [name for name, value in values.items() if value is None]
    if missing:
        hints = ", ".join(f"--gin.{name}=..." for name in missing)
        raise ConfigError(f"required gin macros not set: {', '.join(missing)}; pass {hints}")


def check_model_size(
    *, family: str, size: str, allowed: Sequence[str], prefixes: Sequence[str] = ()
) -> None:
    """The size name must be in the family's table or start with one of `prefixes` (sizes the
    family resolves elsewhere, e.g. LLaMA2's `'hf:<dir>'`)."""
    if size not in allowed and not any(size.startswith(p) for p in prefixes):
        imported = f", or {' / '.join(p + '...' for p in prefixes)}" if prefixes else ""
        raise ConfigError(
            f"unknown {family} size {size!r} for {BINDINGS['model_size']}; "
            f"allowed: {', '.join(allowed)}{imported}"
        )


def check_batch_size(
    *,
    batch_size: int,
    data_parallel_size: int,
    num_microbatches: int = 1,
    process_count: int = 1,
) -> None:
    """The global batch must split evenly over data-parallel devices, hosts and microbatches."""
    if batch_size <= 0:
        raise ConfigError(f"{BINDINGS['batch_size']} = {batch_size}: must be a positive integer")
    if num_microbatches <= 0:
        raise ConfigError(
            f"{BINDINGS['num_microbatches']} = {num_microbatches}: must be a positive integer"
        )
    unit = math.lcm(data_parallel_size * num_microbatches, process_count)
    if batch_size % unit:
        raise ConfigError(
            f"{BINDINGS['batch_size']} = {batch_size} is not divisible by the data-parallel size "
            f"{data_parallel_size} (mesh data × fsdp, {BINDINGS['mesh']})"
            + (f" × {num_microbatches} microbatches" if num_microbatches > 1 else "")
            + (f" and {process_count} hosts" if process_count > 1 else "")
            + f"; allowed: multiples of {unit}, e.g. {max(unit, batch_size // unit * unit)}"
        )


def check_feature_lengths(
    *, feature_lengths: Mapping[str, int], max_len: int, required: Sequence[str], model: str
) -> None:
    """Each feature length must be present, positive and at most the model's maximum length."""
    missing = [key for key in required if key not in feature_lengths]
    if missing:
        raise ConfigError(
            f"{BINDINGS['feature_lengths']} = {dict(feature_lengths)} lacks {missing}; "
            f"allowed keys: {list(required)}"
        )
    for key, length in feature_lengths.items():
        if not 0 < int(length) <= max_len:
            raise ConfigError(
                f"TASK_FEATURE_LENGTHS[{key!r}] = {length} (data.DataConfig.task_feature_lengths) "
                f"is outside the model's range for {model} (max_len {max_len}); "
                f"allowed: 1..{max_len}"
            )


def check_model_features(
    *, feature_lengths: Mapping[str, int], feature_keys: Sequence[str], family: str
) -> None:
    """The feature lengths must name exactly the features the model reads (an `inputs` length
    makes the batches encoder-decoder ones)."""
    if sorted(feature_lengths) != sorted(feature_keys):
        raise ConfigError(
            f"{BINDINGS['feature_lengths']} = {dict(feature_lengths)} does not fit a {family} "
            f"model; allowed keys: exactly {list(feature_keys)}"
        )


def check_decoding(*, tasks: Sequence[str], allowed: Sequence[str], feature_keys: Sequence[str]):
    """Tasks to decode and score must be registered, and the model must be an encoder-decoder."""
    if not tasks:
        return
    if "inputs" not in feature_keys:
        raise ConfigError(
            f"{BINDINGS['decode_tasks']} = {list(tasks)} needs an encoder-decoder model (one with "
            "an inputs feature); allowed for this model: []"
        )
    for task in tasks:
        check_task(name=task, allowed=allowed, binding="decode_tasks")


def check_vocab(*, vocab_size: int, model_vocab_size: int, vocab_path: str | None) -> None:
    """The data's vocabulary must fit in the model's embedding table."""
    if vocab_size > model_vocab_size:
        raise ConfigError(
            f"the vocabulary at {BINDINGS['vocab_path']} = {vocab_path!r} has {vocab_size} ids, "
            f"more than the model's vocab_size {model_vocab_size} ({BINDINGS['vocab_size']}); "
            f"allowed: a vocabulary of at most {model_vocab_size} ids, or vocab_size >= {vocab_size}"
        )


def check_steps(*, train_steps: int | None, tokens_per_param: float | None) -> None:
    """A step count or a token budget must be given (the step count wins): the count a positive
    integer (10.5 steps is refused, not truncated), the budget a positive number."""
    if train_steps is None and tokens_per_param is None:
        raise ConfigError(
            f"set {BINDINGS['train_steps']} or {BINDINGS['tokens_per_param']}; "
            "allowed: a positive number for either (TRAIN_STEPS wins when both are set)"
        )
    if train_steps is not None:
        check_positive_int(name="train_steps", value=train_steps)
        return
    value = tokens_per_param
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise ConfigError(f"{BINDINGS['tokens_per_param']} = {value!r}; allowed: a positive number")


def check_positive_int(*, name: str, value: Any) -> None:
    """A count (steps, a period) must be a positive integer: 10.5 steps is not a count to round,
    and a period of 0 or less never comes."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ConfigError(f"{BINDINGS.get(name, name)} = {value!r}; allowed: a positive integer")


def check_init_vocab(
    *, init_checkpoint: str, source_hash: str, vocab_path: str, vocab_hash: str
) -> None:
    """A run initialised from a checkpoint must read text with the vocabulary the checkpoint
    was trained on (or grown to): with another one every embedding row means another piece.

    Args:
      init_checkpoint: `INIT_CHECKPOINT` as given.
      source_hash: the SHA-256 of the vocabulary its run.json records.
      vocab_path, vocab_hash: this run's `VOCAB_PATH` and the SHA-256 of its contents.
    """
    if source_hash != vocab_hash:
        raise ConfigError(
            f"{BINDINGS['init_checkpoint']} = {_short_path(init_checkpoint)!r} was trained on "
            f"vocabulary sha256 {source_hash[:12]}, but {BINDINGS['vocab_path']} = "
            f"{_short_path(vocab_path)!r} is sha256 {vocab_hash[:12]}: give the source run's "
            "VOCAB_PATH, or grow the checkpoint to the new vocabulary (`xlscale tokenizer extend`, "
            "then `xlscale tokenizer grow-checkpoint`, convert.grown_init) and start from that"
        )


def _short_path(path: str, keep: int = 2) -> str:
    """The last `keep` components of a path, after '…/' when some were left out."""
    parts = str(path).rstrip("/").split("/")
    return str(path) if len(parts) <= keep else "…/" + "/".join(parts[-keep:])


def check_task(*, name: str, allowed: Sequence[str], binding: str = "mixture_or_task") -> None:
    """A task or mixture name must be registered with seqio."""
    if name not in allowed:
        raise ConfigError(
            f"{BINDINGS[binding]} = {name!r} is not a registered task or mixture; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


# MT strategies that start from a pretraining checkpoint (True) or must not (False).
NEEDS_INIT_CHECKPOINT: dict[str, bool] = {"finetune": True, "finetune_scratch": False}


def check_init_for_strategy(*, strategy: str, init_checkpoint: str | None) -> None:
    """Finetuning needs `INIT_CHECKPOINT`; the non-pretrained baseline must not have one (a
    baseline silently initialised from a checkpoint would corrupt the comparison)."""
    needs = NEEDS_INIT_CHECKPOINT.get(strategy)
    if needs and not init_checkpoint:
        raise ConfigError(
            f"strategy {strategy!r} starts from a checkpoint: set INIT_CHECKPOINT "
            "(train.init_checkpoint) to '<model_dir>[@step]'"
        )
    if needs is False and init_checkpoint:
        raise ConfigError(
            f"strategy {strategy!r} trains from random initialisation, but INIT_CHECKPOINT = "
            f"{init_checkpoint!r} (train.init_checkpoint); allowed: None"
        )


def check_replay_ratio(
    *, replay_ratio: float, applied: float, mixture_or_task: str, replay_choices: Sequence[float]
) -> None:
    """The recorded replay ratio must be the one the data applies (`applied`, the source
    language's share of `mixture_or_task`): `run.json` carries it to fitting's replay curves, so a
    ratio that was asked for but not applied would place the run where it does not belong.

    Args:
      replay_choices: the ratios a replay mixture offers (for the message).
    """
    if abs(float(replay_ratio) - applied) <= 1e-9:
        return
    choices = ", ".join(f"{r:g}" for r in replay_choices)
    raise ConfigError(
        f"{BINDINGS['replay_ratio']} = {replay_ratio!r} is not what this run trains on: "
        f"{BINDINGS['mixture_or_task']} = {mixture_or_task!r} replays {applied:g} of the source "
        f"language; allowed: {applied:g} here, or CPT with replay (experiments/cpt_replay.gin, "
        f"REPLAY_RATIO one of {choices}), which trains on the replay mixture of that ratio"
    )


def check_fraction(*, name: str, value: float) -> None:
    """A fraction option must be a number in [0, 1]."""
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{BINDINGS.get(name, name)} = {value!r}; allowed: a number in [0, 1]")


def registry_entry(registry: Mapping[str, Any], *, key: str, what: str, binding: str) -> Any:
    """`registry[key]` (a builder of a gin-named option); ValueError naming the gin `binding` and
    listing the known keys when there is none."""
    if key not in registry:
        raise ValueError(f"unknown {what} {key!r} ({binding}); choose one of {sorted(registry)}")
    return registry[key]


def check_choice(*, name: str, value: str, allowed: Sequence[str]) -> None:
    """A string option must be one of `allowed`."""
    if value not in allowed:
        raise ConfigError(
            f"{BINDINGS.get(name, name)} = {value!r}; allowed: {', '.join(map(repr, allowed))}"
        )


def check_step_memory(*, size: str, estimate: Any, limit: int, advice: str) -> None:
    """A train step whose estimated per-device bytes exceed the device's memory cannot run.

    Args:
      size: the model size (`MODEL_SIZE`).
      estimate: its `modeling.memory.MemoryEstimate`.
      limit: the device's memory in bytes.
      advice: what to change (`modeling.memory.advice`).
    """
    if estimate.total > limit:
        gib = 2**30
        raise ConfigError(
            f"{size}: the train step needs an estimated {estimate.total / gib:.1f} GiB per "
            f"device (remat_policy={estimate.remat_policy!r}, {estimate.num_microbatches} "
            f"microbatch(es), attention {estimate.kernel}) but the device has "
            f"{limit / gib:.1f} GiB ({BINDINGS['device_memory']}); {advice}"
        )
