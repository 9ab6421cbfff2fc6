"""The examples of a mixture's components and their interleaving in token proportion.

`task_dataset` reads one seqio task (local text files: all lines held in memory and shuffled
globally every epoch), `mixed_examples` tags each component's examples with its index and
interleaves them by a deterministic low-discrepancy sequence (`weighted_choices`) at the example
rates `fraction / mean target tokens` (`example_weights`, `mean_target_tokens`), optionally
restricted to a fixed subset (`subset_examples`, `shard_examples`). `pipelines.streams` packs
and batches what this module yields; see its docstring for the whole pipeline.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np
import seqio
import tensorflow as tf

from pipelines import tasks
from pipelines.mixtures import component_names, token_fractions
from pipelines.preprocessors import graph_code

MEASURE_DOCS = 20_000
CHOICE_BLOCK = 4096  # mixture choices computed per op
SUBSET_SEED = (
    1234  # which examples form a subset (`subset_tokens`) does not vary with the run's seed
)
CACHE_MAX_DOCS = 5_000_000  # local splits up to this many lines are held and shuffled in memory


def shard_info(shard_index: int, num_shards: int) -> seqio.ShardInfo | None:
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} not in [0, {num_shards})")
    return seqio.ShardInfo(index=shard_index, num_shards=num_shards) if num_shards > 1 else None


def task_features(task: seqio.Task) -> tuple[str, ...]:
    return tuple(k for k in ("inputs", "targets") if k in task.output_features)


def _local_text(task: seqio.Task, split: str) -> bool:
    """Local text-file tasks small enough to hold their raw lines in memory."""
    n = task.source.num_input_examples(split) if split in task.source.splits else None
    return (
        isinstance(task.source, seqio.TextLineDataSource) and n is not None and n <= CACHE_MAX_DOCS
    )


def task_dataset(
    task: seqio.Task,
    *,
    split: str,
    sequence_length: Mapping[str, int],
    seed: int | None,
    shard_info: seqio.ShardInfo | None,
    shuffle: bool,
    repeat: bool,
    max_examples: int | None = None,
) -> tf.data.Dataset:
    """A task's preprocessed examples: `task.get_dataset(...)`, except for local text tasks,
    which hold their raw lines in memory and shuffle *all* documents every epoch.

    `max_examples` restricts the split to a fixed subset of that many examples (a seeded sample
    of this host's shard, the same for every seed of the run), which is then shuffled and
    repeated like the whole split: the MT paper's finetuning sets of size Df.

    Local path: the host's shard of the lines is cached in memory, globally shuffled per epoch
    (seeded; a shuffle buffer only mixes neighbours, and the corpora files are ordered by
    source), repeated, then run through all the task's preprocessors with seqio's seeds
    (`Task.preprocess_precache` and `Task.preprocess_postcache`: parsing, batched tokenisation,
    chunking or span corruption) and seqio's example shuffle buffer. Tokenising after the
    shuffle costs a little per epoch but starts at once, where caching tokens would first have
    to tokenise the whole split before the global shuffle could emit anything. Features are not
    trimmed here (packing or padding trims).
    """
    if not _local_text(task, split):
        if max_examples is not None:
            ds = task.get_dataset(
                sequence_length=dict(sequence_length),
                split=split,
                shuffle=False,
                shard_info=shard_info,
                num_epochs=1,
            ).take(max_examples)
            ds = ds.cache()
            if shuffle:
                ds = ds.shuffle(max_examples, seed=seed, reshuffle_each_iteration=True)
            return ds.repeat() if repeat else ds
        return task.get_dataset(
            sequence_length=dict(sequence_length),
            split=split,
            shuffle=shuffle,
            seed=seed,
            shard_info=shard_info,
            num_epochs=None if repeat else 1,
        )
    ds = task.source.get_dataset(split=split, shuffle=False)
    if shard_info is not None:
        ds = ds.shard(shard_info.num_shards, shard_info.index)
    docs = task.source.num_input_examples(split)
    if max_examples is not None:
        # A sample, not a prefix: the corpora files are ordered by source.
        ds = ds.shuffle(max(1, docs), seed=SUBSET_SEED, reshuffle_each_iteration=False)
        ds = ds.take(max_examples)
        docs = min(docs, max_examples)
    ds = ds.cache()
    if shuffle:
        ds = ds.shuffle(max(1, docs), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = task.preprocess_precache(ds, seed=seed)
    ds = task.preprocess_postcache(ds, sequence_length=dict(sequence_length), seed=seed)
    if shuffle:
        # Documents are already shuffled; this separates the chunks of long ones. A buffer
        # longer than an epoch would only mix epochs (and slow the start).
        buffer = task.shuffle_buffer_size or tasks.SHUFFLE_BUFFER_SIZE
        ds = ds.shuffle(min(buffer, max(64, docs)), seed=seed)
    return ds


def tag_component(ds: tf.data.Dataset, task: seqio.Task, index: int) -> tf.data.Dataset:
    """A task's examples (`inputs`/`targets`) plus the scalar `component` feature `index`."""
    keys = task_features(task)

    @graph_code
    def _tag(ex):
        out = {k: ex[k] for k in keys}
        out["component"] = tf.constant(index, tf.int32)
        return out

    return ds.map(_tag, num_parallel_calls=tf.data.AUTOTUNE)


_MEAN_TOKENS: dict[tuple, float] = {}


def task_identity(task: seqio.Task, split: str) -> tuple:
    """What a task's examples depend on: name (its preprocessing), source, files, vocabulary."""
    files = []
    if isinstance(task.source, seqio.FileDataSource) and split in task.source.splits:
        for path in task.source.list_shards(split):
            st = os.stat(path)
            files.append((path, st.st_size, st.st_mtime_ns))
    vocabulary = task.output_features["targets"].vocabulary
    return (task.name, repr(task.source), str(vocabulary), tuple(files), split)


def mean_target_tokens(
    task_name: str,
    *,
    split: str,
    sequence_length: Mapping[str, int],
    shard_index: int = 0,
    num_shards: int = 1,
) -> float:
    """Mean target tokens per example of a task at `sequence_length`, measured on every k-th
    document of the host's shard (about `MEASURE_DOCS` documents; the first `MEASURE_DOCS` when
    the source cannot count its documents, as JSON-lines corpora cannot). Memoised per process,
    keyed by the task's name, source files (and their size and mtime) and vocabulary."""
    task = seqio.TaskRegistry.get(task_name)
    key = (
        task_identity(task, split),
        tuple(sorted(sequence_length.items())),
        shard_index,
        num_shards,
    )
    if key in _MEAN_TOKENS:
        return _MEAN_TOKENS[key]
    n_docs = task.source.num_input_examples(split) or 0
    stride = max(1, n_docs // (num_shards * MEASURE_DOCS))
    shard = shard_info(shard_index, num_shards * stride) if num_shards * stride > 1 else None
    ds = task.get_dataset(
        sequence_length=dict(sequence_length),
        split=split,
        shuffle=False,
        seed=0,
        shard_info=shard,
        num_epochs=1,
    )
    if not n_docs:  # a source that cannot count its documents (JSON lines): the first ones
        ds = ds.take(MEASURE_DOCS)
    sizes = ds.map(
        graph_code(lambda ex: tf.size(ex["targets"])),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    total = count = 0
    for batch in sizes.batch(4096).as_numpy_iterator():
        total += int(batch.sum())
        count += len(batch)
    if count == 0:
        raise ValueError(f"task {task_name!r} has no examples in split {split!r}")
    _MEAN_TOKENS[key] = total / count
    return _MEAN_TOKENS[key]


def example_weights(
    fractions: Mapping[str, float], mean_tokens: Mapping[str, float]
) -> list[float]:
    """Turns token fractions into normalised example rates: `fraction / mean tokens`."""
    raw = [
        fractions[name] / mean_tokens[name] if fractions[name] > 0 else 0.0 for name in fractions
    ]
    total = sum(raw)
    return [r / total for r in raw]


def weighted_choices(weights: list[float], *, block: int = CHOICE_BLOCK) -> tf.data.Dataset:
    """An endless, deterministic, low-discrepancy stream of component indices with the given
    frequencies: step `n` picks the component whose cumulative-weight interval holds
    `frac(n / golden ratio)` (a Weyl sequence), so after any `n` steps every component's count
    is within a few examples of `n * weight` and the choices are evenly spread. Computed
    `block` steps at a time."""
    bounds = np.cumsum(np.asarray(weights, np.float64) / np.sum(weights))
    bounds[-1] = np.inf
    bounds_t = tf.constant(bounds, tf.float64)
    inv_phi = (np.sqrt(5.0) - 1.0) / 2.0

    @graph_code
    def _block(start):
        n = start + tf.range(block, dtype=tf.int64)
        u = tf.math.floormod(tf.cast(tf.math.floormod(n, 2**32), tf.float64) * inv_phi, 1.0)
        return tf.searchsorted(bounds_t, u, side="right", out_type=tf.int64)

    return tf.data.Dataset.range(0, 2**62, block).map(_block).unbatch()


def subset_examples(
    task_name: str,
    *,
    split: str,
    sequence_length: Mapping[str, int],
    subset_tokens: int,
    shard_index: int = 0,
    num_shards: int = 1,
) -> int:
    """Examples of this host's shard that make a subset of about `subset_tokens` target tokens
    (the global budget split evenly over hosts), from the task's measured mean example length.

    Raises:
      ValueError: a mixture (subsets are for single tasks, e.g. finetuning sets), or a
        non-positive budget.
    """
    if subset_tokens <= 0:
        raise ValueError(f"subset_tokens = {subset_tokens}: allowed: a positive token count")
    names = component_names(task_name)
    if names != [task_name]:
        raise ValueError(
            f"a token subset needs a single task, got mixture {task_name!r} of {names}"
        )
    mean = mean_target_tokens(
        task_name,
        split=split,
        sequence_length=sequence_length,
        shard_index=shard_index,
        num_shards=num_shards,
    )
    return max(1, math.ceil(subset_tokens / num_shards / max(mean, 1e-9)))


def shard_examples(
    task_name: str, *, subset_size: int, shard_index: int = 0, num_shards: int = 1
) -> int:
    """This host's share of a subset of exactly `subset_size` examples of a single task: the
    shares of all hosts add up to `subset_size` (the first `subset_size % num_shards` hosts take
    one more).

    Raises:
      ValueError: a mixture, a non-positive size, or fewer examples than hosts.
    """
    if subset_size < num_shards or subset_size <= 0:
        raise ValueError(
            f"subset of {subset_size} examples: allowed: a positive count, at least one per host "
            f"({num_shards})"
        )
    names = component_names(task_name)
    if names != [task_name]:
        raise ValueError(f"a subset needs a single task, got mixture {task_name!r} of {names}")
    return subset_size // num_shards + int(shard_index < subset_size % num_shards)


def mixed_examples(
    mixture_or_task: str,
    *,
    split: str,
    sequence_length: Mapping[str, int],
    seed: int | None,
    shard_index: int = 0,
    num_shards: int = 1,
    shuffle: bool = True,
    repeat: bool = True,
    subset_tokens: int | None = None,
    subset_size: int | None = None,
) -> tf.data.Dataset:
    """Unpacked examples of a mixture (or task) in the token proportions of its rates, each with
    the scalar `component` feature (its index into `component_names(...)`).

    `subset_tokens` (tasks only) restricts the split to a fixed sample of about that many target
    tokens (`subset_examples`), `subset_size` to one of exactly that many examples over all
    hosts (`shard_examples`; the MT paper's Df pairs); either is shuffled and repeated like the
    whole split.
    """
    names = component_names(mixture_or_task)
    fractions = token_fractions(mixture_or_task)
    shard = shard_info(shard_index, num_shards)
    max_examples = None
    if subset_tokens is not None and subset_size is not None:
        raise ValueError("give subset_tokens or subset_size (examples), not both")
    if subset_tokens is not None:
        max_examples = subset_examples(
            mixture_or_task,
            split=split,
            sequence_length=sequence_length,
            subset_tokens=subset_tokens,
            shard_index=shard_index,
            num_shards=num_shards,
        )
    if subset_size is not None:
        max_examples = shard_examples(
            mixture_or_task, subset_size=subset_size, shard_index=shard_index, num_shards=num_shards
        )
    datasets = []
    for i, name in enumerate(names):
        task = seqio.TaskRegistry.get(name)
        ds = task_dataset(
            task,
            split=split,
            sequence_length=sequence_length,
            seed=seed,
            shard_info=shard,
            shuffle=shuffle,
            repeat=repeat,
            max_examples=max_examples,
        )
        datasets.append(tag_component(ds, task, i))
    if len(names) == 1:
        return datasets[0]
    means = {
        name: mean_target_tokens(
            name,
            split=split,
            sequence_length=sequence_length,
            shard_index=shard_index,
            num_shards=num_shards,
        )
        for name in names
        if fractions[name] > 0
    }
    weights = example_weights({n: fractions[n] for n in names}, means)
    return tf.data.Dataset.choose_from_datasets(
        datasets, weighted_choices(weights), stop_on_empty_dataset=True
    )


def clear_mean_tokens() -> None:
    """Forgets the memoised mean token counts of this process."""
    _MEAN_TOKENS.clear()
