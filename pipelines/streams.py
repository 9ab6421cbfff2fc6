"""Trainer-facing batch streams: packed, per-host, deterministic and resumable.

`batches` (also named `decoder_batches` and `encdec_batches`) and `eval_batches` implement
"Batches for the trainer" of docs/interfaces.md: iterators of numpy dicts of int32
`[batch_size, length]` arrays, where `batch_size` is this host's share of the global batch
(global batch / `num_shards`) and `shard_index`/`num_shards` select this host's
`seqio.ShardInfo` shard of every component.

Pipeline. Each mixture component `i` (a seqio task) gives its examples
(`component_examples.task_dataset`: seqio's `Task.get_dataset`, or for local text files the same
preprocessors over all lines held in memory and shuffled globally every epoch), tagged with the scalar `component = i`; the components are
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
from collections.abc import Iterator, Mapping

import numpy as np
import seqio
import tensorflow as tf

from pipelines import component_examples, features
from pipelines import preprocessors as prep
from pipelines.mixtures import component_names, token_fractions

MAX_CACHED = 16  # eval batch lists kept per process (LRU)
_EVAL: collections.OrderedDict = collections.OrderedDict()


# --------------------------------------------------------------------------- batches


def _options(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options)


def _check_features(mixture_or_task: str, *, encdec: bool) -> None:
    for name in component_names(mixture_or_task):
        keys = component_examples.task_features(seqio.TaskRegistry.get(name))
        if encdec and keys != ("inputs", "targets"):
            raise ValueError(f"{name!r} has no inputs; encoder-decoder streams need inputs/targets")
        if not encdec and keys != ("targets",):
            raise ValueError(f"{name!r} has inputs; decoder-only streams take targets-only tasks")


def stream_key(mixture_or_task: str, split: str, *args) -> tuple:
    """What a stream of a mixture or task's `split` depends on, plus `args` (the caller's
    settings): each component's identity (name, source, files with their size and mtime,
    vocabulary) and the mixture's token fractions. Equal keys give equal streams, so callers
    memoise on it (eval batches here, training batches in `trainer.seqio_data`)."""
    names = component_names(mixture_or_task)
    identities = tuple(
        component_examples.task_identity(seqio.TaskRegistry.get(n), split) for n in names
    )
    return (identities, tuple(sorted(token_fractions(mixture_or_task).items())), split, *args)


def _remember(cache: collections.OrderedDict, key, value):
    cache[key] = value
    while len(cache) > MAX_CACHED:
        cache.popitem(last=False)
    return value


def clear_caches() -> None:
    """Forgets the memoised eval batches and mean token counts of this process."""
    _EVAL.clear()
    component_examples.clear_mean_tokens()


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
    ds = component_examples.mixed_examples(
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
    `pipelines.prepared.eval_batches` makes the same batches from a prepared split in numpy.

    Returns:
      A list (re-iterable) of dicts as in `batches`, with
      `decoder_task_ids` 0 on real tokens.
    """
    encdec = "inputs" in seqio.TaskRegistry.get(task).output_features
    lengths = _task_lengths(sequence_length, encdec=encdec)
    _check_features(task, encdec=encdec)
    key = stream_key(task, split, tuple(sorted(lengths.items())), batch_size, max_tokens)
    if key in _EVAL:
        return list(_EVAL[key])
    source = seqio.TaskRegistry.get(task)
    ds = component_examples.task_dataset(
        source,
        split=split,
        sequence_length=lengths,
        seed=0,
        shard_info=None,
        shuffle=False,
        repeat=False,
    )
    ds = component_examples.tag_component(ds, source, 0)
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
