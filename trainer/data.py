"""The trainer's view of the data: registering seqio tasks, and per-host train and eval batches.

Everything about corpora, vocabularies and mixtures lives in `pipelines`; this module only wires
it to a run: it registers the tasks and mixtures a run names (from `VOCAB_PATH` and `DATA_DIR`),
opens this host's shard of the training stream at the checkpointed position, and produces
fixed-shape eval batches. The name helpers are what gin files use to build task names from macros
(`TARGET_LANG`, `REPLAY_RATIO`), since gin cannot format strings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

DECODER_KEYS = (
    "decoder_input_tokens",
    "decoder_target_tokens",
    "decoder_loss_weights",
    "decoder_segment_ids",
    "decoder_positions",
    "decoder_task_ids",
)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Training data of a run.

    Attributes:
      mixture_or_task: a seqio task or mixture name (`MIXTURE_OR_TASK_NAME`).
      task_feature_lengths: `{"targets": L}` for decoder-only models (`TASK_FEATURE_LENGTHS`).
      batch_size: global batch in sequences (`BATCH_SIZE`); each host reads its share.
      vocab_path: SentencePiece model to register the tasks with (`VOCAB_PATH`); None: the tasks
        are registered already (by the caller).
      corpora_dir: the `corpora/` directory (`DATA_DIR`); None: `$XLSCALE_DATA/corpora`.
      source: `local` corpora or `tfds` (mC4/WMT at paper scale).
      langs: languages to register (None: all present).
      pairs: language pairs to register translation tasks for (None: all present).
      extra_ids: sentinel ids appended to the vocabulary (span corruption needs 100).
      pack: pack several documents per row.
      shuffle: shuffle the training stream (seeded).
    """

    mixture_or_task: str = ""
    task_feature_lengths: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"targets": 2048}
    )
    batch_size: int = 512
    vocab_path: str | None = None
    corpora_dir: str | None = None
    source: str = "local"
    langs: Sequence[str] | None = None
    pairs: Sequence[str] | None = ()
    extra_ids: int = 0
    pack: bool = True
    shuffle: bool = True

    @property
    def seq_len(self) -> int:
        """Length of a decoder row (the `targets` feature length)."""
        return int(self.task_feature_lengths["targets"])


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Periodic evaluation: token-weighted cross-entropy on each task's validation split.

    Attributes:
      tasks: task names (`EVAL_TASKS`); CPT runs list the target and the source language.
      period: evaluate every `period` steps and at the last step (`EVAL_PERIOD`); 0 = only at
        the end.
      max_tokens: evaluate on (up to) this many target tokens per task; the CPT paper holds out
        1M tokens per language.
      batch_size: eval batch in sequences (None: the training batch size).
      split: the split to evaluate on.
      at_start: also evaluate the initial parameters (step 0; the CPT transfer starting point).
    """

    tasks: Sequence[str] = ()
    period: int = 1000
    max_tokens: int = 1_000_000
    batch_size: int | None = None
    split: str = "validation"
    at_start: bool = False


def lm_task(*, lang: str) -> str:
    """The language-modelling task of `lang` (`lm_<lang>`)."""
    from pipelines import tasks

    return tasks.lm_task_name(lang)


def lm_tasks(*, langs: Sequence[str]) -> list[str]:
    """`lm_<lang>` for each language, duplicates dropped (for `EVAL_TASKS`)."""
    return list(dict.fromkeys(lm_task(lang=lang) for lang in langs))


def replay_mixture(*, target_lang: str, source_lang: str, replay_ratio: float) -> str:
    """The CPT replay mixture `cpt_<target>_replay_<source>_<pct>`: `replay_ratio` (0-1) of the
    tokens from the source language, the rest from the target."""
    from pipelines import mixtures

    pct = round(100 * replay_ratio)
    if abs(pct - 100 * replay_ratio) > 1e-6 or not 0 <= pct <= 100:
        raise ValueError(f"REPLAY_RATIO = {replay_ratio}: allowed: a whole percentage in [0, 1]")
    return mixtures.cpt_name(target_lang, source_lang, pct)


def paper_batch_size(*, model_size: str, seq_len: int) -> int:
    """The CPT paper's batch (in sequences of `seq_len`) for a size: 1M, 2M or 4M tokens by
    parameter band (its Table 1; `llama_jax.sizes.paper_recipe`)."""
    from llama_jax import sizes
    from trainer import validation

    validation.check_model_size(family="llama2", size=model_size, allowed=list(sizes.SIZES))
    return sizes.paper_recipe(model_size, seq_len=seq_len).batch_size


def register(config: DataConfig) -> Any:
    """Registers the tasks and mixtures of `config.vocab_path`; returns the vocabulary (or None
    when `vocab_path` is None and the caller registered the tasks)."""
    if config.vocab_path is None:
        return None
    from pipelines import mixtures, tasks, vocab

    vocabulary = vocab.load_vocab(config.vocab_path, extra_ids=config.extra_ids)
    tasks.register_tasks(
        vocabulary=vocabulary,
        corpora_dir=config.corpora_dir,
        langs=config.langs,
        pairs=config.pairs,
        source=config.source,
    )
    mixtures.register_mixtures()
    return vocabulary


def registered_names() -> list[str]:
    """All registered seqio task and mixture names."""
    import seqio

    return sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))


def vocab_size(name: str) -> int:
    """Vocabulary size (extra ids included) of a task's or mixture's `targets` feature."""
    import seqio

    provider = seqio.get_mixture_or_task(name)
    return int(provider.output_features["targets"].vocabulary.vocab_size)


def components(name: str) -> list[str]:
    """Mixture components (a task gives `[task]`), in the order of `decoder_task_ids`."""
    from pipelines import mixtures

    return list(mixtures.component_names(name))


def train_batches(
    config: DataConfig,
    *,
    seed: int,
    start_step: int,
    shard_index: int,
    num_shards: int,
) -> Iterator[dict[str, np.ndarray]]:
    """This host's rows of each global batch, starting after `start_step` batches."""
    from pipelines import streams

    stream = streams.decoder_batches(
        mixture_or_task=config.mixture_or_task,
        split="train",
        sequence_length=config.seq_len,
        batch_size=config.batch_size // num_shards,
        seed=seed,
        shard_index=shard_index,
        num_shards=num_shards,
        start_step=start_step,
        shuffle=config.shuffle,
        repeat=True,
        pack=config.pack,
    )
    for batch in stream:
        yield _decoder_arrays(batch)


def _decoder_arrays(batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The decoder features of a batch as int32 arrays (other keys dropped)."""
    return {key: np.asarray(batch[key], np.int32) for key in DECODER_KEYS if key in batch}


def eval_batches(
    *,
    task: str,
    split: str,
    seq_len: int,
    batch_size: int,
    max_tokens: int,
    shard_index: int,
    num_shards: int,
) -> Iterator[dict[str, np.ndarray]]:
    """Fixed-shape eval batches of `task` (this host's rows); the last one is padded with rows of
    zero weight, so every batch compiles to the same program."""
    from pipelines import streams

    for batch in streams.eval_batches(
        task=task,
        split=split,
        sequence_length=seq_len,
        batch_size=batch_size,
        max_tokens=max_tokens,
    ):
        batch = _decoder_arrays(batch)
        rows = next(iter(batch.values())).shape[0]
        if rows < batch_size:
            batch = {
                k: np.concatenate([v, np.zeros((batch_size - rows,) + v.shape[1:], v.dtype)])
                for k, v in batch.items()
            }
        per_host = batch_size // num_shards
        yield {
            k: v[shard_index * per_host : (shard_index + 1) * per_host] for k, v in batch.items()
        }
