"""The trainer's view of the data: the gin-bound data and eval settings, and a run's batches.

Everything about corpora, vocabularies and mixtures lives in `pipelines`; this module only wires
it to a run. It holds the settings gin files bind (`DataConfig`, `EvalConfig`: `@data.DataConfig`
in `t5x_configs/`) and the three entry points the jobs call, which pick a path per run:
`register` (the run's vocabulary), `train_batches` (this host's rows of the training stream from
the checkpointed position; by default every host builds the global stream, so the batches do not
depend on the host count, `DataConfig.host_sharding`) and `eval_batches` (fixed-shape eval
batches). The paths have their own modules: the seqio path, registering tasks and reading
their streams (`trainer.seqio_data`); the prepared-data path, reading batches by index after
checking the data (`trainer.prepared_data`); the lookups both ask (vocabulary, its size,
mixture components: `trainer.task_lookup`); and a host's rows of a global batch
(`trainer.host_rows`). Their public names are re-exported here, where the jobs and tests read
them. The batches hold the model features `pipelines.features` declares; the name helpers gin
files compute with are `trainer.recipes`.

seqio, TensorFlow and the `pipelines` modules that import them are imported inside the functions
that need them: the trainer's jobs import this module in processes that never read seqio data
(`tests/test_import_hygiene.py`). A run on prepared data (`PREPARED_DATA` with `VOCAB_PATH`)
imports neither: its vocabulary is read with SentencePiece (`pipelines.vocab.vocab_info`), its
mixture from `pipelines.mixture_tables`, and its train and eval batches from prepared splits
(`pipelines.prepared`); only decoding tasks (`trainer.downstream`) still register seqio tasks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pipelines import features
from trainer import eval_schedule, validation
from trainer.host_rows import even_rows, take_rows
from trainer.prepared_data import (
    check_prepared_eval,
    prepared_datasets,
    prepared_eval_batches,
    prepared_eval_dataset,
    prepared_input,
    prepared_stream,
)
from trainer.seqio_data import HOST_SHARDINGS, register_seqio, seqio_eval_batches
from trainer.task_lookup import (
    components,
    prepared_vocabulary,
    registered_names,
    seqio_free,
    vocab_size,
)

__all__ = [
    "HOST_SHARDINGS",
    "DataConfig",
    "EvalConfig",
    "check_prepared_eval",
    "components",
    "eval_batches",
    "even_rows",
    "prepared_datasets",
    "prepared_eval_dataset",
    "prepared_input",
    "prepared_vocabulary",
    "register",
    "register_seqio",
    "registered_names",
    "seqio_free",
    "take_rows",
    "train_batches",
    "vocab_size",
]


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Training data of a run.

    Attributes:
      mixture_or_task: a seqio task or mixture name (`MIXTURE_OR_TASK_NAME`).
      task_feature_lengths: `{"targets": L}` for decoder-only models, `{"inputs": Li,
        "targets": Lt}` for encoder-decoders (`TASK_FEATURE_LENGTHS`).
      batch_size: global batch in sequences (`BATCH_SIZE`); each host reads its share.
      vocab_path: SentencePiece model to register the tasks with (`VOCAB_PATH`); None: the tasks
        are registered already (by the caller).
      corpora_dir: the `corpora/` directory (`DATA_DIR`); None: `$XLSCALE_DATA/corpora`.
      source: a key of `pipelines.tasks.SOURCES`: `local` corpora, `tfds` (mC4/WMT), or the
        papers' corpora as Hugging Face files, `hf` (mC4 + WMT) and `hf_cpt` (RedPajama, SkyPile +
        WuDao, mC4; `pipelines.corpora.hf_sources`).
      langs: languages to register (None: all present).
      pairs: language pairs to register translation tasks for (None: all present).
      extra_ids: sentinel ids appended to the vocabulary (span corruption needs 100).
      pack: pack several documents per row.
      shuffle: shuffle the training stream (seeded).
      subset_tokens: train on a fixed sample of about this many target tokens of the task,
        repeated (a finetuning set of Df target tokens, `FINETUNE_TOKENS` with `FINETUNE_UNIT =
        'target'`); None: the whole split (or `subset_examples`).
      subset_examples: train on a fixed sample of exactly this many examples of the task,
        repeated (the MT paper's finetuning set of Df / 512 pairs, `FINETUNE_TOKENS` with
        `FINETUNE_UNIT = 'paper'`); None: the whole split (or `subset_tokens`).
      host_sharding: how hosts split the input (`HOST_SHARDING`, a key of `HOST_SHARDINGS`):
        `"global"` builds the one global stream on every host and each host keeps its rows of
        every batch, so the global batches are those of one host whatever the host count;
        `"per_host"` packs a separate seqio shard on each host (the input pipeline costs 1/n
        per host, for input-bound scale), whose batches differ from one host's.
      prepared_dir: a directory of prepared tasks (`PREPARED_DATA`; `xlscale data prepare`
        writes `<dir>/<task>/`, and `<dir>/<task>@validation/` for `--split validation`):
        training batches are read by index from them (`pipelines.prepared.batches`), so resume
        at any step costs what step 0 costs and each host reads only its rows, whatever
        `host_sharding` says, and eval batches from the prepared validation splits
        (`pipelines.prepared.eval_batches`, the batches of the seqio path); None: the seqio
        pipeline.
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
    subset_tokens: int | None = None
    subset_examples: int | None = None
    host_sharding: str = "global"
    prepared_dir: str | None = None

    def __post_init__(self):
        if self.subset_tokens is not None and self.subset_examples is not None:
            raise validation.ConfigError(
                "data.DataConfig: set subset_tokens or subset_examples, not both (a finetuning "
                "set is sized in target tokens or in pairs; FINETUNE_UNIT picks one)"
            )
        validation.check_choice(
            name="HOST_SHARDING (data.DataConfig.host_sharding)",
            value=self.host_sharding,
            allowed=tuple(HOST_SHARDINGS),
        )
        # Prepared input always packs documents into rows and shuffles them per epoch: a run asking
        # otherwise would record settings its batches do not follow.
        unpassable = [f"{k}=False" for k in ("pack", "shuffle") if not getattr(self, k)]
        if self.prepared_dir is not None and unpassable:
            raise validation.ConfigError(
                f"data.DataConfig {', '.join(unpassable)} with PREPARED_DATA = "
                f"{self.prepared_dir!r}: prepared input reads packed rows of epoch-shuffled "
                "documents by index; allowed: pack=True, shuffle=True, or PREPARED_DATA = None "
                "(the seqio pipeline)"
            )

    @property
    def seq_len(self) -> int:
        """Length of a decoder row (the `targets` feature length)."""
        return int(self.task_feature_lengths["targets"])

    @property
    def has_inputs(self) -> bool:
        """Whether the run reads inputs/targets tasks (an encoder-decoder)."""
        return "inputs" in self.task_feature_lengths


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
      at_start: also evaluate the initial parameters (step 0, before the first update;
        `EVAL_AT_START`): the CPT transfer starting point, the source model on the target.
      schedule: `EVAL_SCHEDULE`, a name of `trainer.eval_schedule.SCHEDULES`: 'periodic' (every
        `period` steps) or 'log' (those plus `log_points` steps log-spaced from `log_start` of
        the run to its end: dense early, where the papers' early effects are).
      log_points: `EVAL_LOG_POINTS`, the log-spaced steps of the 'log' schedule.
      log_start: `EVAL_LOG_START`, the first log-spaced step as a fraction of the run's steps.
      decoding: downstream scores by decoding (a `trainer.downstream.DecodeConfig`: BLEU,
        chrF++, ROUGE-L, COMET on a held-out split; encoder-decoders), or None.
    """

    tasks: Sequence[str] = ()
    period: int = 1000
    max_tokens: int = 1_000_000
    batch_size: int | None = None
    split: str = "validation"
    at_start: bool = False
    decoding: Any = None
    schedule: str = "periodic"
    log_points: int = 20
    log_start: float = 0.001

    def __post_init__(self):
        if self.schedule not in eval_schedule.SCHEDULES:
            raise ValueError(
                f"EVAL_SCHEDULE = {self.schedule!r} (data.EvalConfig.schedule); allowed: "
                f"{', '.join(map(repr, eval_schedule.SCHEDULES))}"
            )
        if self.log_points < 1 or not 0 < self.log_start <= 1:
            raise ValueError(
                f"EVAL_LOG_POINTS = {self.log_points}, EVAL_LOG_START = {self.log_start}: allowed "
                "a positive count and a fraction of the run in (0, 1]"
            )

    @property
    def enabled(self) -> bool:
        """Whether anything is evaluated at all (cross-entropy or decoding)."""
        return bool(self.tasks) or bool(self.decoding is not None and self.decoding.tasks)


def register(config: DataConfig) -> Any:
    """Registers the tasks and mixtures of `config.vocab_path`; returns the vocabulary (or None
    when `vocab_path` is None and the caller registered the tasks). A run on prepared data
    (`seqio_free`) registers nothing: it returns the vocabulary's `pipelines.vocab.VocabInfo`
    (read with SentencePiece), after the same checks of `VOCAB_PATH`.

    Raises:
      trainer.validation.ConfigError: `vocab_path` does not exist or holds no usable vocabulary
        (naming `VOCAB_PATH` and the file), or the corpora directory has no training data for
        `mixture_or_task` (naming `DATA_DIR` and the directory).
    """
    if config.vocab_path is None:
        return None
    if seqio_free(config):
        return prepared_vocabulary(config)
    return register_seqio(config)


def train_batches(
    config: DataConfig,
    *,
    seed: int,
    start_step: int,
    shard_index: int,
    num_shards: int,
    host_rows: Sequence[tuple[int, int]] | None = None,
    prepared: Mapping[str, Any] | None = None,
    vocabulary: Any = None,
) -> Iterator[dict[str, np.ndarray]]:
    """This host's rows of each global batch, starting after `start_step` batches (encoder-
    decoder batches when the feature lengths have `inputs`), split as `config.host_sharding`
    says, or read by index from `prepared` datasets.

    Args:
      shard_index, num_shards: this host (`jax.process_index()`) of how many.
      host_rows: the `[start, stop)` row ranges of the global batch that this host's devices
        hold (`Partitioner.host_rows`), for `"global"` sharding and prepared input; None:
        `even_rows`.
      prepared: `prepared_datasets(config, ...)` when `config.prepared_dir` is set.
      vocabulary: the run's vocabulary (`register`), for prepared input (start, EOS and
        sentinel ids).
    """
    if config.prepared_dir is not None:
        rows = host_rows or even_rows(
            batch_size=config.batch_size, shard_index=shard_index, num_shards=num_shards
        )
        return prepared_stream(
            config,
            seed=seed,
            start_step=start_step,
            host_rows=rows,
            datasets=prepared
            if prepared is not None
            else prepared_datasets(config, vocab_hash=None),
            vocabulary=vocabulary,
        )
    return HOST_SHARDINGS[config.host_sharding](
        config,
        seed=seed,
        start_step=start_step,
        shard_index=shard_index,
        num_shards=num_shards,
        host_rows=host_rows,
    )


def eval_batches(
    *,
    task: str,
    split: str,
    seq_len: int | Mapping[str, int],
    batch_size: int,
    max_tokens: int,
    shard_index: int,
    num_shards: int,
    host_rows: Sequence[tuple[int, int]] | None = None,
    config: DataConfig | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Fixed-shape eval batches of `task` (this host's rows); the last one is padded with rows of
    zero weight, so every batch compiles to the same program. `seq_len` is the targets length,
    or the feature lengths `{"inputs": Li, "targets": Lt}` of an inputs/targets task.

    Every host reads the same global batches (whatever the host count) and keeps its rows
    (`host_rows`, as in `train_batches`), so the token-weighted loss summed over the global batch
    does not depend on the host count. A run on prepared data (`config`, `seqio_free`) reads
    the prepared split (`prepared_eval_dataset`), whose batches are those of the seqio path."""
    lengths = dict(seq_len) if isinstance(seq_len, Mapping) else seq_len
    read = (
        functools.partial(prepared_eval_batches, config)
        if config is not None and seqio_free(config)
        else seqio_eval_batches
    )
    for batch in read(
        task=task, split=split, seq_len=lengths, batch_size=batch_size, max_tokens=max_tokens
    ):
        batch = features.model_arrays(batch)
        rows = next(iter(batch.values())).shape[0]
        if rows < batch_size:
            batch = {
                k: np.concatenate([v, np.zeros((batch_size - rows,) + v.shape[1:], v.dtype)])
                for k, v in batch.items()
            }
        yield take_rows(
            batch,
            host_rows
            or even_rows(batch_size=batch_size, shard_index=shard_index, num_shards=num_shards),
        )
