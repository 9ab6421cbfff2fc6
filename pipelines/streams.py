"""Trainer-facing batch streams: packed, per-host, deterministic and resumable.

`batches` (also named `decoder_batches` and `encdec_batches`) and `eval_batches` implement
"Batches for the trainer" of docs/interfaces.md: iterators of numpy dicts of int32
`[batch_size, length]` arrays, where `batch_size` is this host's share of the global batch
(global batch / `num_shards`) and `shard_index`/`num_shards` select this host's
`seqio.ShardInfo` shard of every component.

Pipeline. Each mixture component `i` (a seqio task) gives its examples (`task_dataset`: seqio's
`Task.get_dataset`, or for local text files the same preprocessors over all lines held in memory
and shuffled globally every epoch), tagged with the scalar `component = i`; the components are
interleaved in token proportion (below), packed and converted by a seqio feature converter that
spreads the component over the example's target tokens (`decoder_task_ids`, -1 on padding;
`DecoderTaskIdsFeatureConverter`, `EncDecTaskIdsFeatureConverter`), batched, and skipped to
`start_step`. Packing is first fit over windows of 256 examples (`preprocessors.pack_windows`);
the heavy steps (tokenisation, LM chunking, span corruption, packing, feature conversion) run
on blocks of examples, so per-example tf.data overhead stays small.

Token ratios. Mixture rates are fractions of tokens (`pipelines.mixtures`). Each component's mean
target tokens per example is measured at the stream's sequence length on a spread-out subsample
of its split (every k-th document, about `MEASURE_DOCS` documents; memoised per process), and
its example rate is `fraction / mean_tokens`. Components are then chosen by a deterministic
low-discrepancy sequence (`weighted_choices`) rather than by random sampling, so example counts
stay within a few examples of their rates at every step; what remains is the spread of example
lengths, which averages out. Target tokens are what the trainer counts per component
(`tokens_by_task`), so they are what the ratio fixes.

Determinism and resumption. Every random choice is seeded from `seed`: the shuffles (`tf.data`
with op seeds) and seqio's stateless per-example seeds (span corruption); the choice sequence
and the packing are deterministic, and tf.data keeps element order. So the same arguments give
the same stream, bit for bit. `start_step=k` builds that same stream afresh and drops its first
`k` batches (`Dataset.skip` at the batch level), so a restarted job continues exactly as the
uninterrupted one would; the trainer only records the step. The cost is re-running the input
pipeline for `k` batches, cheap here because the pipeline runs many times faster than the
trainer consumes (`benchmarks/pipeline.py`); at TPU scale one would checkpoint the tf.data
iterator instead. (A built pipeline is never reused: a tf.data shuffle reshuffles when its
dataset is iterated again.)
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf

from pipelines import features, tasks
from pipelines import preprocessors as prep
from pipelines.mixtures import component_names, token_fractions

MEASURE_DOCS = 20_000
CHOICE_BLOCK = 4096  # mixture choices computed per op
MAX_CACHED = 16  # eval batch lists kept per process (LRU)
SUBSET_SEED = (
    1234  # which examples form a subset (`subset_tokens`) does not vary with the run's seed
)
CACHE_MAX_DOCS = 5_000_000  # local splits up to this many lines are held and shuffled in memory


# --------------------------------------------------------------------------- components


def _shard(shard_index: int, num_shards: int) -> seqio.ShardInfo | None:
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} not in [0, {num_shards})")
    return seqio.ShardInfo(index=shard_index, num_shards=num_shards) if num_shards > 1 else None


def _task_features(task: seqio.Task) -> tuple[str, ...]:
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


def component_dataset(
    task_name: str,
    index: int,
    *,
    split: str,
    sequence_length: Mapping[str, int],
    seed: int | None,
    shard_info: seqio.ShardInfo | None,
    shuffle: bool,
    repeat: bool,
    max_examples: int | None = None,
) -> tf.data.Dataset:
    """One task's preprocessed examples (`inputs`/`targets`; trimmed when packed or padded)
    plus the scalar `component` feature `index` (`max_examples`: see `task_dataset`)."""
    task = seqio.TaskRegistry.get(task_name)
    keys = _task_features(task)
    ds = task_dataset(
        task,
        split=split,
        sequence_length=sequence_length,
        seed=seed,
        shard_info=shard_info,
        shuffle=shuffle,
        repeat=repeat,
        max_examples=max_examples,
    )

    def _tag(ex):
        out = {k: ex[k] for k in keys}
        out["component"] = tf.constant(index, tf.int32)
        return out

    return ds.map(_tag, num_parallel_calls=tf.data.AUTOTUNE)


_MEAN_TOKENS: dict[tuple, float] = {}
_EVAL: collections.OrderedDict = collections.OrderedDict()


def _identity(task: seqio.Task, split: str) -> tuple:
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
        _identity(task, split),
        tuple(sorted(sequence_length.items())),
        shard_index,
        num_shards,
    )
    if key in _MEAN_TOKENS:
        return _MEAN_TOKENS[key]
    n_docs = task.source.num_input_examples(split) or 0
    stride = max(1, n_docs // (num_shards * MEASURE_DOCS))
    shard = _shard(shard_index, num_shards * stride) if num_shards * stride > 1 else None
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
    sizes = ds.map(lambda ex: tf.size(ex["targets"]), num_parallel_calls=tf.data.AUTOTUNE)
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
    shard_info = _shard(shard_index, num_shards)
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
    datasets = [
        component_dataset(
            name,
            i,
            split=split,
            sequence_length=sequence_length,
            seed=seed,
            shard_info=shard_info,
            shuffle=shuffle,
            repeat=repeat,
            max_examples=max_examples,
        )
        for i, name in enumerate(names)
    ]
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


# --------------------------------------------------------------------------- batches


def _options(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options)


def _check_features(mixture_or_task: str, *, encdec: bool) -> None:
    for name in component_names(mixture_or_task):
        keys = _task_features(seqio.TaskRegistry.get(name))
        if encdec and keys != ("inputs", "targets"):
            raise ValueError(f"{name!r} has no inputs; encoder-decoder streams need inputs/targets")
        if not encdec and keys != ("targets",):
            raise ValueError(f"{name!r} has inputs; decoder-only streams take targets-only tasks")


def _stream_key(mixture_or_task: str, split: str, *args) -> tuple:
    names = component_names(mixture_or_task)
    identities = tuple(_identity(seqio.TaskRegistry.get(n), split) for n in names)
    return (identities, tuple(sorted(token_fractions(mixture_or_task).items())), split, *args)


def _remember(cache: collections.OrderedDict, key, value):
    cache[key] = value
    while len(cache) > MAX_CACHED:
        cache.popitem(last=False)
    return value


def clear_caches() -> None:
    """Forgets the memoised eval batches and mean token counts of this process."""
    _EVAL.clear()
    _MEAN_TOKENS.clear()


def _task_lengths(sequence_length: int | Mapping[str, int], *, encdec: bool) -> dict[str, int]:
    if encdec:
        return {k: int(sequence_length[k]) for k in ("inputs", "targets")}
    return {"targets": int(sequence_length)}


def decoder_start_id(mixture_or_task: str) -> int:
    """The start token of the decoder inputs of a task or mixture: `pipelines.vocab.start_id` of
    its targets vocabulary (0 for T5-layout vocabularies, a published LLaMA's `<s>` for its own
    tokenizer)."""
    from pipelines import vocab as vocab_lib

    provider = seqio.get_mixture_or_task(mixture_or_task)
    return vocab_lib.start_id(provider.output_features["targets"].vocabulary)


def _converted(
    ds: tf.data.Dataset, lengths: Mapping[str, int], *, pack: bool, start_id: int = 0
) -> tf.data.Dataset:
    """Examples -> packed model features, with `decoder_task_ids` from the `component` feature
    and `start_id` in front of every segment's decoder inputs."""
    encdec = "inputs" in lengths
    converter = (
        prep.EncDecTaskIdsFeatureConverter if encdec else prep.DecoderTaskIdsFeatureConverter
    )
    return converter(pack=pack, apply_length_check=False, bos_id=start_id)(
        ds, {**lengths, "component": lengths["targets"]}
    )


def batches(
    *,
    mixture_or_task: str,
    split: str,
    sequence_length: int | Mapping[str, int],
    batch_size: int,
    seed: int | None,
    shard_index: int = 0,
    num_shards: int = 1,
    start_step: int = 0,
    shuffle: bool = True,
    repeat: bool = True,
    pack: bool = True,
    subset_tokens: int | None = None,
    subset_examples: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Packed training batches of a mixture or task: decoder-only or encoder-decoder, as
    `sequence_length` says.

    The pipeline is built afresh on every call, since a tf.data shuffle reshuffles when its
    dataset is iterated again.

    Args:
      mixture_or_task: a registered seqio mixture or task: of `lm_*` tasks (targets only) for an
        int `sequence_length`, of inputs/targets tasks (`span_*`, `mt_*`) for a mapping.
      split: `"train"`, `"validation"`, ...
      sequence_length: the targets length (decoder-only batches), or `{"inputs": Li,
        "targets": Lt}` (encoder-decoder batches).
      batch_size: rows per batch on this host (the global batch divided by `num_shards`).
      seed: seeds every random choice; the same seed gives the same stream.
      shard_index, num_shards: this host's shard (`seqio.ShardInfo`).
      start_step: number of batches already consumed; the stream continues from there.
      shuffle, repeat, pack: as in seqio.
      subset_tokens: train on a fixed sample of about this many target tokens of a single task
        (a finetuning set of Df target tokens), repeated; None: the whole split.
      subset_examples: train on a fixed sample of exactly this many examples of a single task,
        over all hosts (the MT paper's finetuning set of Df / 512 pairs), repeated; None: the
        whole split. Not with `subset_tokens`.

    Returns:
      An iterator of dicts with int32 `[batch, Lt]` arrays `decoder_input_tokens,
      decoder_target_tokens, decoder_loss_weights, decoder_segment_ids, decoder_positions,
      decoder_task_ids` (the last is the component index, -1 on padding); encoder-decoder
      batches add `encoder_input_tokens, encoder_segment_ids, encoder_positions` (`[batch, Li]`).

    Raises:
      ValueError: a component's features do not match the kind (`inputs` or not).
    """
    encdec = isinstance(sequence_length, Mapping)
    _check_features(mixture_or_task, encdec=encdec)
    lengths = _task_lengths(sequence_length, encdec=encdec)
    ds = mixed_examples(
        mixture_or_task,
        split=split,
        sequence_length=lengths,
        seed=seed,
        shard_index=shard_index,
        num_shards=num_shards,
        shuffle=shuffle,
        repeat=repeat,
        subset_tokens=subset_tokens,
        subset_size=subset_examples,
    )
    start = decoder_start_id(mixture_or_task)
    ds = _converted(ds, lengths, pack=pack, start_id=start).batch(batch_size, drop_remainder=True)
    if start_step:
        ds = ds.skip(start_step)
    return _options(ds.prefetch(tf.data.AUTOTUNE)).as_numpy_iterator()


# The names of docs/interfaces.md ("Batches for the trainer"): one builder, whose kind follows
# `sequence_length` (an int: decoder-only; a mapping: encoder-decoder).
decoder_batches = batches
encdec_batches = batches


def _pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    short = rows - len(next(iter(batch.values())))
    if short <= 0:
        return batch
    out = {}
    for key, value in batch.items():
        pad = np.full((short, *value.shape[1:]), features.padding_value(key), value.dtype)
        out[key] = np.concatenate([value, pad])
    return out


def eval_batches(
    *,
    task: str,
    split: str = "validation",
    sequence_length: int | Mapping[str, int],
    batch_size: int,
    max_tokens: int | None,
) -> list[dict[str, np.ndarray]]:
    """Finite, deterministic, unshuffled packed batches of one task's split, for evaluation.

    A targets-only task gives decoder batches (`sequence_length` an int); an inputs/targets task
    gives encoder-decoder batches (`sequence_length` a dict). Batches are produced in order until
    at least `max_tokens` target tokens are covered or the split ends (`None`: the whole split);
    the last batch is padded to `batch_size` rows (loss weight 0, task id -1). Span corruption
    uses a fixed seed, so its masks are the same at every evaluation.

    The batches of a given task, split and size are computed once per process and then
    served from memory (read-only arrays), so periodic evaluation costs no pipeline time.

    Returns:
      A list (re-iterable) of dicts as in `batches`, with
      `decoder_task_ids` 0 on real tokens.
    """
    encdec = "inputs" in seqio.TaskRegistry.get(task).output_features
    lengths = _task_lengths(sequence_length, encdec=encdec)
    _check_features(task, encdec=encdec)
    key = _stream_key(task, split, tuple(sorted(lengths.items())), batch_size, max_tokens)
    if key in _EVAL:
        return list(_EVAL[key])
    ds = component_dataset(
        task,
        0,
        split=split,
        sequence_length=lengths,
        seed=0,
        shard_info=None,
        shuffle=False,
        repeat=False,
    )
    ds = _converted(ds, lengths, pack=True, start_id=decoder_start_id(task))
    ds = ds.batch(batch_size, drop_remainder=False)
    ds = _options(ds.prefetch(tf.data.AUTOTUNE))
    batches, tokens = [], 0
    limit = math.inf if max_tokens is None else max_tokens
    for batch in ds.as_numpy_iterator():
        if tokens >= limit:
            break
        batch = _pad_rows(batch, batch_size)
        for value in batch.values():
            value.setflags(write=False)
        batches.append(batch)
        tokens += int(batch[features.DECODER_LOSS_WEIGHTS].sum())
    return list(_remember(_EVAL, key, batches))
