"""Run directories written by real T5X (`python -m t5x.train`), read as xlscale runs.

A T5X `MODEL_DIR` holds no `run.json` and no `metrics.jsonl`. What they would say is read from
what T5X writes (names checked against google-research/t5x at commit
cc342d419ec3e3e9c4bf1df33c82330cafdc1e16; seqio's `TensorBoardLogger`):

- `config.gin`: the operative gin config (`gin_utils.summarize_gin_config`): macros
  (`MIXTURE_OR_TASK_NAME`, `TASK_FEATURE_LENGTHS`, `BATCH_SIZE`, `TRAIN_STEPS`,
  `TRAIN_STEPS_RELATIVE`, `INITIAL_CHECKPOINT_PATH`) and scoped bindings
  (`train/utils.DatasetConfig.batch_size`, `utils.RestoreCheckpointConfig.path`, the model's
  dimensions, `EncoderDecoderModel.loss_normalizing_factor`). → `meta` (`run.json`'s fields).
- `train/events.out.tfevents.*` (`MetricsManager("train")`): `loss`, `cross_ent_loss`,
  `cross_ent_loss_per_all_target_tokens`, `non_padding_fraction/loss_weights`, `accuracy`,
  `learning_rate`, `timing/*`. → `train/loss` (per-token cross-entropy, see `CE_RULES`),
  `learning_rate`.
- `training_eval/<task>/events.*` (`MetricsManager(f"training_eval/{task}")`, the same metric
  names on the validation split). → `eval/<task>/loss` (not its teacher-forced `accuracy`, which
  xlscale does not log and which `fitting` would take for a downstream score).
- `inference_eval/<task>/events.*` (seqio's logger, tags `eval/<metric>`: the task's metric
  functions, e.g. `bleu`, `chrf`, `rougeL`). → `eval/<task>/<metric>` with xlscale's names
  (`METRIC_NAMES`: `rougeL` → `rouge_l`).
- `checkpoint_<step>/` directories (`checkpoints_utils.get_checkpoint_dir`). → one record per
  kept step (so a finetune's Dp is read at exactly its step) and `meta["checkpoint_steps"]`.

Token counts: T5X logs none, so records get `tokens` = steps × batch × targets length × the
logged `non_padding_fraction/loss_weights` of each window (real target tokens, as xlscale counts
them) and `tokens_paper` = steps × batch × inputs length, the MT paper's Dp
(`rundir.paper_units`); a finetune counts its steps from its checkpoint's. A finetune restores the step of its
`INITIAL_CHECKPOINT_PATH` and counts `TRAIN_STEPS` from there (T5X's finetune.gin), so its
`train_steps` is `TRAIN_STEPS` − that step.

`config.gin` is parsed with gin's own `config_parser` (pure Python, already a dependency): it is
gin's exact grammar (line continuations, multi-line containers, scopes, `%MACRO` and
`@configurable()` references) without registering or importing any configurable, so neither T5X
nor TensorFlow is needed here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fitting.checks import FitInputError
from fitting.readers.event_files import read_tensorboard
from fitting.readers.run_data import RunData
from pipelines import names
from rundir import paper_units, storage
from rundir.run_record import Strategy

CONFIG_FILE = "config.gin"
TRAIN_DIR = "train"
TRAINING_EVAL_DIR = "training_eval"
INFERENCE_EVAL_DIR = "inference_eval"
_CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+)$")
# seqio metric names (the mt_* tasks' `pipelines.text_metrics.translation_metrics`) -> xlscale's.
METRIC_NAMES: Mapping[str, str] = {"rougeL": "rouge_l", "rougeLsum": "rouge_l"}
_MODEL_FIELDS = (
    "d_model",
    "d_ff",
    "num_heads",
    "head_dim",
    "num_encoder_layers",
    "num_decoder_layers",
    "mlp_activations",
    "logits_via_embedding",
)
# T5X's `network.T5Config` names for the fields it names differently from xlscale's
# `t5_jax.config.T5Config`.
_T5X_RENAMED: Mapping[str, str] = {"emb_dim": "d_model", "mlp_dim": "d_ff"}
# Every T5X / xlscale size-table field a config.gin may bind -> xlscale's name (xlscale names map
# to themselves).
_T5X_FIELDS: Mapping[str, str] = {
    **_T5X_RENAMED,
    **{f: f for f in _MODEL_FIELDS if f not in _T5X_RENAMED.values()},
    "vocab_size": "vocab_size",
}


@dataclasses.dataclass(frozen=True)
class Ref:
    """A gin reference in config.gin: `%MACRO` (macro=True) or `@name` / `@name()`."""

    name: str
    macro: bool = False
    evaluate: bool = False


class _Delegate:
    """gin's parser delegate: references stay names (nothing is looked up or called)."""

    def configurable_reference(self, scoped_configurable_name, evaluate):
        return Ref(scoped_configurable_name, evaluate=bool(evaluate))

    def macro(self, macro_name):
        return Ref(macro_name, macro=True)


@dataclasses.dataclass(frozen=True)
class GinConfig:
    """A parsed operative config: `bindings` maps `MACRO` or `scope/selector.param` to values."""

    bindings: Mapping[str, Any]

    def value(self, key: str, default: Any = None) -> Any:
        """The value bound to `key`, macros followed (`%BATCH_SIZE` → its value)."""
        seen = set()
        value = self.bindings.get(key, default)
        while isinstance(value, Ref) and value.macro and value.name not in seen:
            seen.add(value.name)
            value = self.bindings.get(value.name, default)
        return value

    def find(self, selector_suffix: str, param: str, default: Any = None) -> Any:
        """The value of `param` of the first binding whose selector ends with
        `selector_suffix` (any scope or module prefix), macros followed."""
        for key in self.bindings:
            selector, _, name = key.rpartition(".")
            bare = selector.rsplit("/", 1)[-1]
            if name == param and (bare == selector_suffix or bare.endswith("." + selector_suffix)):
                return self.value(key)
        return default


def parse_config(text: str, *, where: str = CONFIG_FILE) -> GinConfig:
    """Parses an operative `config.gin` (imports and includes are skipped).

    Raises:
      FitInputError: text gin cannot parse, naming `where` and gin's message.
    """
    from gin import config_parser

    bindings: dict[str, Any] = {}
    try:
        for statement in config_parser.ConfigParser(text, _Delegate()):
            if not isinstance(statement, config_parser.BindingStatement):
                continue
            selector = f"{statement.scope}/{statement.selector}" if statement.scope else ""
            selector = selector or statement.selector
            key = f"{selector}.{statement.arg_name}" if statement.arg_name else selector
            bindings[key] = statement.value
    except SyntaxError as e:
        raise FitInputError(f"{where}: not a gin config ({e})") from e
    return GinConfig(bindings)


# --- the model -----------------------------------------------------------------------------------


def _model_from_size_name(config: GinConfig) -> tuple[str, dict[str, Any]] | None:
    """A macro or binding naming a size of `t5_jax.sizes` (`MODEL_SIZE = 't5_770m'`, which
    `t5x_configs/t5x/models/t5.gin` passes to `sizes.get_config.name`), with the `vocab_size`
    given to `sizes.get_config` (the embedding rows: part of the total count)."""
    from t5_jax import sizes

    for key in ("MODEL_SIZE", *config.bindings):
        value = config.value(key)
        if isinstance(value, str) and value in sizes.SIZES:
            vocab = config.find("get_config", "vocab_size")
            return value, {} if vocab is None else {"vocab_size": int(vocab)}
    return None


def _model_from_dims(config: GinConfig) -> tuple[str, dict[str, Any]] | None:
    """The model dimensions bound on a `T5Config` (T5X's `network.T5Config` or xlscale's): the
    size-table row with the same shape, else `t5x_custom`."""
    from t5_jax import sizes

    fields = {}
    for key in config.bindings:
        selector, _, param = key.rpartition(".")
        if selector.rsplit("/", 1)[-1].split(".")[-1] == "T5Config" and param in {
            *_T5X_FIELDS,
            *_T5X_FIELDS.values(),
        }:
            value = config.value(key)
            if isinstance(value, list):
                value = tuple(value)
            fields[_T5X_FIELDS.get(param, param)] = value
    if not {"d_model", "num_heads", "num_encoder_layers"} <= set(fields):
        return None
    for name, row in sizes.SIZES.items():
        if all(fields.get(f, getattr(row, f)) == getattr(row, f) for f in _MODEL_FIELDS):
            return name, {"vocab_size": fields["vocab_size"]} if "vocab_size" in fields else {}
    return "t5x_custom", fields


# How a config.gin names its model, tried in order: a size name, else the bound dimensions.
MODEL_READERS: tuple[Callable[[GinConfig], tuple[str, dict[str, Any]] | None], ...] = (
    _model_from_size_name,
    _model_from_dims,
)


def model_meta(config: GinConfig) -> dict[str, Any]:
    """run.json's `model`, `family` and parameter counts (`t5_jax.counting`) of a config.gin;
    only `family` where the model cannot be told."""
    from t5_jax import counting, sizes
    from t5_jax.config import T5Config

    for reader in MODEL_READERS:
        found = reader(config)
        if found is None:
            continue
        name, fields = found
        if name in sizes.SIZES:
            cfg = sizes.get_config(name, **fields)
        else:
            cfg = T5Config(**fields)
        counts = counting.param_counts(cfg)
        return {
            "model": name,
            "family": "t5",
            "params_total": counts.total,
            "params_non_embedding": counts.non_embedding,
            "vocab_size": cfg.vocab_size,
        }
    return {"family": "t5"}


# --- run.json's fields ---------------------------------------------------------------------------


def _checkpoint_path(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        value = value[0] if value else None
    return str(value) if value else None


def run_meta(config: GinConfig, *, text: str, checkpoint_steps: list[int]) -> dict[str, Any]:
    """What run.json would hold for a T5X run (docs/interfaces.md), from its config.gin."""
    task = config.value("MIXTURE_OR_TASK_NAME") or config.find(
        "DatasetConfig", "mixture_or_task_name"
    )
    task = str(task or "")
    lengths = config.value("TASK_FEATURE_LENGTHS") or config.find(
        "DatasetConfig", "task_feature_lengths"
    )
    lengths = {str(k): int(v) for k, v in dict(lengths or {}).items()}
    batch = config.value("train/utils.DatasetConfig.batch_size", config.value("BATCH_SIZE"))
    init = _checkpoint_path(
        config.value("INITIAL_CHECKPOINT_PATH", config.find("RestoreCheckpointConfig", "path"))
    )
    init_dir = init_step = None
    if init:
        head, _, leaf = init.rstrip("/").rpartition("/")
        match = _CHECKPOINT_DIR.match(leaf)
        init_dir, init_step = (head, int(match.group(1))) if match else (init, None)
    pair = names.mt_pair(task)
    strategy = (
        (Strategy.FINETUNE if init else Strategy.FINETUNE_SCRATCH) if pair else Strategy.PRETRAIN
    )
    total = config.value("TRAIN_STEPS")
    relative = config.value("TRAIN_STEPS_RELATIVE")
    if relative is not None:
        train_steps = int(relative)
    elif total is not None:
        train_steps = int(total) - (init_step or 0)
    else:
        train_steps = None
    shares = names.mixture_shares(task)
    components = [f"span_{lang}" for lang in shares] if shares else [task]
    langs = names.task_languages(task)
    df = config.value("FINETUNE_TOKENS")  # bound by `launch.t5x_runner` for a Df grid
    meta: dict[str, Any] = {
        "runner": "t5x",
        **model_meta(config),
        "strategy": strategy,
        "mixture_or_task": task,
        "components": components,
        "languages": langs,
        "source_lang": pair[0] if pair else None,
        "target_lang": pair[1] if pair else (langs[0] if len(langs) == 1 else None),
        "replay_ratio": 0.0,
        "init_checkpoint": f"{init_dir}@{init_step}" if init_step is not None else init_dir,
        "init_step": init_step,
        "batch_size": int(batch) if batch is not None else None,
        "task_feature_lengths": lengths,
        "seq_len": lengths.get("targets"),
        "train_steps": train_steps,
        "finetune_tokens": int(df) if df is not None else None,
        "finetune_unit": config.value("FINETUNE_UNIT") or "target",
        "checkpoint_steps": checkpoint_steps,
        "loss_normalizing_factor": _normalizer(config),
        "gin_config": text,
    }
    # The paper-unit fields exactly as the trainer records them (`rundir.paper_units`): the
    # task module holds Df / 512 pairs (rounded, at least one), so Df is recorded as pairs × 512.
    subset = None
    if df is not None and meta["finetune_unit"] == "paper":
        subset = paper_units.pairs_for(int(df))
    if meta["batch_size"] and lengths.get("targets"):
        meta.update(
            paper_units.run_fields(
                batch_size=meta["batch_size"],
                task_feature_lengths=lengths,
                subset_examples=subset,
                finetune_unit=meta["finetune_unit"],
            )
        )
    elif subset is not None:
        meta["finetune_pairs"] = subset
        meta["finetune_tokens_paper"] = subset * paper_units.PAIR_TOKENS
    return meta


# --- per-token cross-entropy ---------------------------------------------------------------------


def _normalizer(config: GinConfig) -> Any:
    value = config.find("EncoderDecoderModel", "loss_normalizing_factor")
    if value is None:
        value = config.value("LOSS_NORMALIZING_FACTOR")
    return value


def _per_all_tokens(scale: float) -> Callable[[Mapping[str, float]], float | None]:
    """Summed losses (÷ a constant `scale`): Σ cross-entropy ÷ Σ real target tokens."""

    def rule(m: Mapping[str, float]) -> float | None:
        ce, frac = (
            m.get("cross_ent_loss_per_all_target_tokens"),
            m.get("non_padding_fraction/loss_weights"),
        )
        if ce is not None and frac:
            return ce * scale / frac
        return m.get("loss_per_nonpadding_target_token") if scale == 1.0 else None

    return rule


def _per_batch_mean(m: Mapping[str, float]) -> float | None:
    """Per-batch mean losses: their average over steps (`cross_ent_loss`, z-loss excluded)."""
    return m.get("cross_ent_loss", m.get("loss"))


def _per_total_tokens(m: Mapping[str, float]) -> float | None:
    """Losses ÷ all target positions per batch: rescaled to the real (non-padding) tokens."""
    ce, frac = m.get("cross_ent_loss"), m.get("non_padding_fraction/loss_weights")
    return ce / frac if ce is not None and frac else None


# EncoderDecoderModel.loss_normalizing_factor -> how T5X's metrics give the per-token
# cross-entropy (nats per real target token) that xlscale logs as `train/loss` / eval loss.
# T5X's `loss` is the step's loss as normalised, plus the z-loss; a number K divides the sum by K.
CE_RULES: Mapping[str, Callable[[Mapping[str, float]], float | None]] = {
    "None": _per_all_tokens(1.0),
    "NUM_REAL_TARGET_TOKENS": _per_batch_mean,
    "NUM_TOTAL_TARGET_TOKENS": _per_total_tokens,
}


def _ce_rule(normalizer: Any, *, run_id: str) -> Callable[[Mapping[str, float]], float | None]:
    if isinstance(normalizer, int | float) and not isinstance(normalizer, bool):
        return _per_all_tokens(float(normalizer))
    key = "None" if normalizer is None else str(getattr(normalizer, "name", normalizer))
    key = key.rsplit(".", 1)[-1]  # @losses.SpecialLossNormalizingFactor.NUM_REAL_TARGET_TOKENS
    if key not in CE_RULES:
        raise FitInputError(
            f"run {run_id!r}: {CONFIG_FILE} loss_normalizing_factor = {normalizer!r} has no "
            f"per-token cross-entropy rule; allowed: a number, {', '.join(CE_RULES)}"
        )
    return CE_RULES[key]


# --- the run -------------------------------------------------------------------------------------


def is_t5x_run(path: Path) -> bool:
    """A T5X MODEL_DIR: `config.gin` beside T5X's `train/` summaries or `checkpoint_<step>` dirs."""
    return (path / CONFIG_FILE).is_file() and (
        (path / TRAIN_DIR).is_dir() or any(_CHECKPOINT_DIR.match(p.name) for p in path.iterdir())
    )


def checkpoint_steps(path: Path) -> list[int]:
    """Steps of the `checkpoint_<step>` directories of a T5X MODEL_DIR, sorted."""
    return sorted(
        int(m.group(1))
        for p in path.iterdir()
        if p.is_dir() and (m := _CHECKPOINT_DIR.match(p.name))
    )


def _by_step(scalars: Mapping[str, list[tuple[int, float]]]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for tag, points in scalars.items():
        for step, value in points:
            out.setdefault(int(step), {})[tag] = value
    return out


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []


def records(path: Path, meta: Mapping[str, Any], *, run_id: str) -> list[dict[str, Any]]:
    """metrics.jsonl-like records of a T5X MODEL_DIR (see the module docstring)."""
    ce = _ce_rule(meta.get("loss_normalizing_factor"), run_id=run_id)
    by_step: dict[int, dict[str, Any]] = {}

    def put(step: int, key: str, value: Any) -> None:
        by_step.setdefault(step, {"step": step})[key] = value

    for step, m in _by_step(read_tensorboard(path / TRAIN_DIR)).items():
        loss = ce(m)
        if loss is not None:
            put(step, "train/loss", loss)
        if "learning_rate" in m:
            put(step, "learning_rate", m["learning_rate"])
    for task_dir in _subdirs(path / TRAINING_EVAL_DIR):
        for step, m in _by_step(read_tensorboard(task_dir)).items():
            loss = ce(m)
            if loss is not None:
                put(step, f"eval/{task_dir.name}/loss", loss)
    for task_dir in _subdirs(path / INFERENCE_EVAL_DIR):
        for step, m in _by_step(read_tensorboard(task_dir)).items():
            for tag, value in m.items():
                metric = tag.removeprefix("eval/")
                put(step, f"eval/{task_dir.name}/{METRIC_NAMES.get(metric, metric)}", value)
    for step in meta.get("checkpoint_steps") or ():
        by_step.setdefault(step, {"step": step})
    batch, lengths = meta.get("batch_size"), meta.get("task_feature_lengths") or {}
    start = int(meta.get("init_step") or 0)  # a finetune's steps go on from its checkpoint's
    windows = _loss_weight_windows(path, start=start)
    for step, rec in by_step.items():
        if batch and lengths.get("targets"):
            rec["tokens"] = _real_rows(windows, start=start, step=step) * batch * lengths["targets"]
        if meta.get("tokens_paper_per_step"):
            rec["tokens_paper"] = float(max(step - start, 0) * meta["tokens_paper_per_step"])
    return [by_step[s] for s in sorted(by_step)]


def _loss_weight_windows(path: Path, *, start: int) -> list[tuple[int, int, float]]:
    """(first step, last step, non-padding fraction of the targets) of each logged training
    window: T5X's `non_padding_fraction/loss_weights`, averaged over the steps since the last."""
    points = read_tensorboard(path / TRAIN_DIR).get("non_padding_fraction/loss_weights", [])
    out, prev = [], start
    for step, frac in points:
        if step > prev:
            out.append((prev, int(step), float(frac)))
            prev = int(step)
    return out


def _real_rows(windows: list[tuple[int, int, float]], *, start: int, step: int) -> float:
    """Target rows' worth of real (loss-carrying) tokens from `start` to `step`: the steps of each
    window × its non-padding fraction (the last window's past its end; 1 with no summaries)."""
    total, last_end, frac = 0.0, start, 1.0
    for lo, hi, frac in windows:
        if step <= lo:
            break
        total += (min(step, hi) - lo) * frac
        last_end = hi
    if step > last_end and (not windows or step > windows[-1][1]):
        total += (step - last_end) * frac
    return total


def read_t5x_run(path: str | Path) -> RunData:
    """Reads one T5X MODEL_DIR as a `RunData` (meta from config.gin, records from summaries).

    Raises:
      FitInputError: no or unparsable config.gin, no summaries and no checkpoints, or a
        loss normalisation with no per-token rule (each naming the run).
    """
    path = storage.as_path(path)
    run_id = path.name
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise FitInputError(f"run {run_id!r} ({path}): no {CONFIG_FILE}")
    text = config_file.read_text()
    config = parse_config(text, where=f"run {run_id!r} {config_file}")
    meta = run_meta(config, text=text, checkpoint_steps=checkpoint_steps(path))
    if not meta["mixture_or_task"]:
        raise FitInputError(f"run {run_id!r}: {config_file} binds no MIXTURE_OR_TASK_NAME")
    recs = records(path, meta, run_id=run_id)
    if not recs:
        raise FitInputError(
            f"run {run_id!r} ({path}): no T5X summaries ({TRAIN_DIR}/, {TRAINING_EVAL_DIR}/, "
            f"{INFERENCE_EVAL_DIR}/) and no checkpoint_<step> directories"
        )
    steps = meta["checkpoint_steps"]
    done = steps and meta["train_steps"] is not None
    done = done and steps[-1] >= (meta["init_step"] or 0) + meta["train_steps"]
    # T5X writes no COMPLETED marker: a checkpoint at the last step says the same.
    completed = {"step": steps[-1], "tokens": recs[-1].get("tokens")} if done else None
    return RunData(run_id, path, meta, tuple(recs), completed)
