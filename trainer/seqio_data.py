"""The seqio path of a run's data: registering its tasks and mixtures, and reading them as batches.

A run that does not read prepared data (`trainer.task_lookup.seqio_free`) registers the tasks and
mixtures of its vocabulary (`register_seqio`, checking that the corpora directory holds the
training mixture's text) and reads packed training batches from the seqio stream, split across
hosts as `DataConfig.host_sharding` says (`HOST_SHARDINGS`), and eval batches from
`pipelines.streams`. Decoding tasks of any run are registered here too.

seqio, TensorFlow and the `pipelines` modules that import them are imported inside the functions
that need them: the trainer imports this module in processes that never read seqio data
(`tests/test_import_hygiene.py`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipelines import features, mixture_tables
from pipelines import vocab as vocab_lib
from pipelines.corpora import paths
from trainer import task_lookup, validation
from trainer.host_rows import even_rows, take_rows

if TYPE_CHECKING:
    from trainer.data import DataConfig


def register_seqio(config: DataConfig) -> Any:
    """`trainer.data.register` through seqio: registers the tasks and mixtures of
    `config.vocab_path` (the seqio path, and decoding tasks of any run); returns the seqio
    vocabulary."""
    from pipelines import mixtures, tasks

    task_lookup.check_vocab_file(config)
    try:
        vocabulary = vocab_lib.load_vocab(config.vocab_path, extra_ids=config.extra_ids)
    except vocab_lib.VocabularyFileError as e:
        raise task_lookup.vocab_file_error(config, e) from e
    try:
        registered = tasks.register_tasks(
            vocabulary=vocabulary,
            corpora_dir=config.corpora_dir,
            langs=config.langs,
            pairs=config.pairs,
            source=config.source,
        )
    except FileNotFoundError as e:
        raise validation.ConfigError(
            f"{validation.BINDINGS['corpora_dir']} = {config.corpora_dir!r}: {e}; allowed: a "
            "corpora/ directory with that language's text (xlscale data build | fixture)"
        ) from e
    mixtures.register_mixtures()
    if config.source == "local":
        _check_corpora(config, registered=registered)
    return vocabulary


def _check_corpora(config: DataConfig, *, registered: Sequence[str]) -> None:
    """The training mixture's tasks must have found their text under the corpora directory; a
    missing or empty `DATA_DIR` otherwise surfaces as an unregistered task with nothing allowed."""
    name = config.mixture_or_task
    wanted = list(mixture_tables.RATIOS.get(name, {name: 1.0}))
    missing = [t for t in wanted if t.split("_", 1)[0] in _CORPUS_TASKS and t not in registered]
    if not missing:
        return
    root = paths.corpora_dir() if config.corpora_dir is None else config.corpora_dir
    where = "" if os.path.isdir(root) else " (no such directory)"
    default = " (DATA_DIR unset: $XLSCALE_DATA/corpora)" if config.corpora_dir is None else ""
    raise validation.ConfigError(
        f"{validation.BINDINGS['mixture_or_task']} = {name!r} needs {', '.join(missing)}, which "
        f"found no training text under {validation.BINDINGS['corpora_dir']} = "
        f"{os.fspath(root)!r}{where}{default}; allowed: a corpora/ directory holding them "
        f"(xlscale data build | fixture); found there: {', '.join(sorted(registered)) or 'nothing'}"
    )


# Task kinds whose text comes from the corpora directory (`pipelines.tasks`).
_CORPUS_TASKS = ("lm", "span", "mt")


def _global_stream(config, *, seed, start_step, shard_index, num_shards, host_rows):
    """Every host builds the one-host stream and keeps its rows of each global batch."""
    rows = host_rows or even_rows(
        batch_size=config.batch_size, shard_index=shard_index, num_shards=num_shards
    )
    for batch in _packed_stream(config, seed=seed, start_step=start_step, shard=(0, 1)):
        yield take_rows(batch, rows)


def _per_host_stream(config, *, seed, start_step, shard_index, num_shards, host_rows):
    """Each host packs its own seqio shard into batches of `batch_size / num_shards` rows."""
    del host_rows
    yield from _packed_stream(
        config, seed=seed, start_step=start_step, shard=(shard_index, num_shards)
    )


# How hosts split the training input (`DataConfig.host_sharding`).
HOST_SHARDINGS = {"global": _global_stream, "per_host": _per_host_stream}


def _packed_stream(config, *, seed, start_step, shard):
    from pipelines import streams

    shard_index, num_shards = shard
    make = streams.encdec_batches if config.has_inputs else streams.decoder_batches
    stream = make(
        mixture_or_task=config.mixture_or_task,
        split="train",
        sequence_length=dict(config.task_feature_lengths) if config.has_inputs else config.seq_len,
        batch_size=config.batch_size // num_shards,
        seed=seed,
        shard_index=shard_index,
        num_shards=num_shards,
        start_step=start_step,
        shuffle=config.shuffle,
        repeat=True,
        pack=config.pack,
        subset_tokens=config.subset_tokens,
        subset_examples=config.subset_examples,
    )
    for batch in stream:
        yield features.model_arrays(batch)


def seqio_eval_batches(*, task, split, seq_len, batch_size, max_tokens):
    """`pipelines.streams.eval_batches` of a registered task's `split` (the seqio path of
    `trainer.data.eval_batches`)."""
    from pipelines import streams

    return streams.eval_batches(
        task=task,
        split=split,
        sequence_length=seq_len,
        batch_size=batch_size,
        max_tokens=max_tokens,
    )
