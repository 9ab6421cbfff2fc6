"""The seqio path of a run's data: registering its tasks and mixtures, and reading them as batches.

A run that does not read prepared data (`trainer.task_lookup.seqio_free`) registers the tasks and
mixtures of its vocabulary (`register_seqio`, checking that the corpora directory holds the
training mixture's text) and reads packed training batches from the seqio stream, split across
hosts as `DataConfig.host_sharding` says (`HOST_SHARDINGS`), and eval batches from
`pipelines.streams`. Decoding tasks of any run are registered here too. A process that trains
several runs on the same stream (a study's worker process) replays the batches it read before
instead of building the tf.data pipeline again (`_PREFIXES`).

seqio, TensorFlow and the `pipelines` modules that import them are imported inside the functions
that need them: the trainer imports this module in processes that never read seqio data
(`tests/test_import_hygiene.py`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

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


# The first batches of the training streams this process read, by everything a stream depends
# on (`_prefix_key`), most recently used last. A sweep trained in one process (the studies' worker
# processes) starts many runs on the same data: every finetuning run of one Df reads the same
# batches whatever checkpoint it starts from. Building the tf.data pipeline (tracing its
# functions) costs seconds of CPU per run, far more than the few steps of a small run; the
# stream is deterministic (`pipelines.streams`: the same arguments give the same batches, bit
# for bit), so a run replays the batches read before and builds the pipeline only for what lies
# beyond them. Bounded in batches' bytes per stream and in streams, so a long run keeps at most
# its first few megabytes.
_PREFIXES: collections.OrderedDict = collections.OrderedDict()
_MAX_PREFIXES = 8
_MAX_PREFIX_BYTES = 16 << 20


@dataclasses.dataclass
class _Prefix:
    """A stream's first `len(batches)` batches (copies, never handed out) and their bytes."""

    batches: list = dataclasses.field(default_factory=list)
    nbytes: int = 0


def clear_prefixes() -> None:
    """Forgets the training batches this process memoised (`_PREFIXES`), e.g. after a test
    rewrote a corpus file in place within one mtime tick."""
    _PREFIXES.clear()


def _prefix_key(config, *, seed, start_step, shard) -> tuple | None:
    """Everything the packed stream of `config` depends on: the tasks' identities (sources,
    files, vocabulary) and mixture rates (`pipelines.streams.stream_key`), and every argument
    `_packed_stream` passes to the stream. None when a component is not registered: such a
    stream is not memoised, and building its pipeline says what is missing as it always did."""
    from pipelines import streams

    lengths = (
        tuple(sorted(dict(config.task_feature_lengths).items()))
        if config.has_inputs
        else config.seq_len
    )
    try:
        identity = streams.stream_key(config.mixture_or_task, "train")
    except (KeyError, ValueError):
        return None
    return (
        identity,
        config.mixture_or_task,
        lengths,
        config.batch_size,
        seed,
        tuple(shard),
        start_step,
        config.shuffle,
        config.pack,
        config.subset_tokens,
        config.subset_examples,
    )


def _copy(batch: dict) -> dict:
    """A batch's arrays copied, each as writeable as its original (the pipeline's arrays are
    read-only views of TensorFlow's tensors), so a replayed batch is handed over as a fresh one
    is and nothing a run does to it reaches the memo."""
    out = {}
    for key, value in batch.items():
        copy = np.array(value, copy=True)
        copy.flags.writeable = value.flags.writeable
        out[key] = copy
    return out


def _packed_stream(config, *, seed, start_step, shard):
    """The packed training batches of `config` from `start_step` on: the memoised first batches
    of the same stream (`_PREFIXES`), then the tf.data pipeline built to continue after them
    (`start_step` + the batches replayed: the same stream with those dropped). Batches read from
    the pipeline extend the memo while it is within its byte budget."""
    key = _prefix_key(config, seed=seed, start_step=start_step, shard=shard)
    prefix = None if key is None else _PREFIXES.get(key)
    if prefix is None:
        prefix = _Prefix()
        if key is not None:
            _PREFIXES[key] = prefix
            while len(_PREFIXES) > _MAX_PREFIXES:
                _PREFIXES.popitem(last=False)
    else:
        _PREFIXES.move_to_end(key)
    read = 0
    while read < len(prefix.batches):
        yield _copy(prefix.batches[read])
        read += 1
    for batch in _pipeline_stream(config, seed=seed, start_step=start_step + read, shard=shard):
        arrays = features.model_arrays(batch)
        size = sum(a.nbytes for a in arrays.values())
        if len(prefix.batches) == read and prefix.nbytes + size <= _MAX_PREFIX_BYTES:
            prefix.batches.append(_copy(arrays))
            prefix.nbytes += size
        read += 1
        yield arrays


def _pipeline_stream(config, *, seed, start_step, shard):
    """The packed training batches of `config` from `start_step` on, from a tf.data pipeline
    built for this call (`pipelines.streams.batches`)."""
    from pipelines import streams

    shard_index, num_shards = shard
    make = streams.encdec_batches if config.has_inputs else streams.decoder_batches
    return make(
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
