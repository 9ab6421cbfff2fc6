"""seqio preprocessors of xlscale's tasks: parsing, tokenisation, LM chunking, translation
prompts, T5 span corruption, packing, and the feature converters that carry each token's mixture
component (`decoder_task_ids`).

Span corruption follows T5 (Raffel et al. 2020; `t5.data.preprocessors.span_corruption`): the
tokenised documents are concatenated in groups and split into chunks of `raw_length` tokens, a
random noise mask (density 0.15, mean span length 3) is drawn per chunk, each noise span is
replaced in `inputs` by one sentinel, and `targets` holds every noise span preceded by its
sentinel. Sentinels count down from the top of the vocabulary (`<extra_id_0>` = the largest id of
a `seqio.SentencePieceVocabulary(extra_ids=...)`). `raw_length` is the largest chunk whose
corrupted inputs *and* targets (plus EOS) fit the task's sequence lengths.

Packing (`pack_first_fit`) produces seqio's packed format (`<key>`, `<key>_segment_ids`,
`<key>_positions`, 0 = padding) like `seqio.utils.trim_and_pack_dataset`, but places each
example in the first of the 16 most recent rows of its window (256 examples) where all its
features still fit, instead of only in the last row (fewer padding tokens), and writes the rows
with one vectorised scatter per window instead of a per-example `tf.while_loop` of
concatenations (several times faster).

Tokenisation (`tokenize`) is seqio's, but a thousand texts per tokenizer call; LM chunking and
span corruption also work on blocks of documents.

Randomness comes only from seqio's stateless seeds (`seqio.map_over_dataset(num_seeds=...)`),
which seqio derives from the `seed` passed to `get_dataset`: the same seed gives the same masks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from pipelines import features

# First-fit packing is numpy, shared with the prepared eval reader (one definition).
from pipelines.prepared.packing import MAX_OPEN_ROWS, PACK_WINDOW, first_fit  # noqa: F401

# The span arithmetic lives in the TF-free module the by-index input shares (one definition).
from pipelines.prepared.spans import (
    MEAN_NOISE_SPAN_LENGTH,
    NOISE_DENSITY,
    check_sentinels,
    span_raw_length,
)

# tf.data runs AutoGraph's rewrite of a mapped function's Python source each time a pipeline is
# built (each trainer process builds several): ~4% of a translation sweep's CPU. The functions it
# maps here are plain graph code (their Python control flow depends on settings, never on tensor
# values), so they are marked to be traced as written.
graph_code = tf.autograph.experimental.do_not_convert

CONCAT_BATCH = 128  # documents concatenated before chunking (T5 uses 128)
TOKENIZE_BATCH = 1024  # texts per tokenizer call
CHUNK_BLOCK = 256  # documents chunked per op


# ----------------------------------------------------------------------------- parsing


def parse_tsv(dataset: tf.data.Dataset, *, field_names: Sequence[str]) -> tf.data.Dataset:
    """Splits text lines `"a\\tb"` into `{field_names[0]: "a", field_names[1]: "b"}`."""
    names = tuple(field_names)

    @graph_code
    def _parse(line):
        fields = tf.strings.split(line, "\t", maxsplit=len(names) - 1)
        fields = tf.concat([fields, tf.fill([len(names)], "")], 0)[: len(names)]
        return {name: fields[i] for i, name in enumerate(names)}

    return dataset.map(_parse, num_parallel_calls=tf.data.AUTOTUNE)


def lines_to_targets(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Maps text lines to `{"targets": line}` (monolingual text for LM and span corruption)."""
    return dataset.map(
        graph_code(lambda line: {"targets": line}), num_parallel_calls=tf.data.AUTOTUNE
    )


def translation_prompt(src_name: str, tgt_name: str) -> str:
    """Returns T5's prefix, e.g. `translate English to German: `."""
    return f"translate {src_name} to {tgt_name}: "


def to_translation(
    dataset: tf.data.Dataset, *, src: str, tgt: str, src_name: str, tgt_name: str
) -> tf.data.Dataset:
    """Maps `{src: ..., tgt: ...}` to `{"inputs": "translate <Src> to <Tgt>: ...", "targets"}`."""
    prefix = translation_prompt(src_name, tgt_name)

    @graph_code
    def _fn(ex):
        return {"inputs": tf.strings.join([prefix, ex[src]]), "targets": ex[tgt]}

    return dataset.map(_fn, num_parallel_calls=tf.data.AUTOTUNE)


def tokenize(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, seqio.Feature],
    *,
    batch_size: int = TOKENIZE_BATCH,
) -> tf.data.Dataset:
    """`seqio.preprocessors.tokenize` (without `*_pretokenized` copies), `batch_size` texts per
    tokenizer call instead of one, which is several times faster for short documents. Examples
    where a tokenised feature comes out empty are dropped."""
    keys = [
        k
        for k in output_features
        if k in dataset.element_spec and dataset.element_spec[k].dtype == tf.string
    ]

    @graph_code
    def _tokenize(batch):
        out = dict(batch)
        for k in keys:
            out[k] = tf.cast(output_features[k].vocabulary.encode_tf(batch[k]), tf.int32)
        keep = tf.reduce_all(tf.stack([out[k].row_lengths() > 0 for k in keys]), axis=0)
        return {
            k: tf.ragged.boolean_mask(v, keep)
            if isinstance(v, tf.RaggedTensor)
            else tf.boolean_mask(v, keep)
            for k, v in out.items()
        }

    return dataset.batch(batch_size).map(_tokenize, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


# ----------------------------------------------------------------------------- LM


def lm_chunks(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int] | None = None,
    output_features: Mapping[str, seqio.Feature] | None = None,
) -> tf.data.Dataset:
    """Appends EOS to each tokenised document and splits it into chunks of at most
    `sequence_length["targets"]` tokens (no token is lost to truncation; the last chunk of a
    document ends with EOS). Without a sequence length the document is kept whole. Works on
    blocks of `CHUNK_BLOCK` documents with flat index arithmetic."""
    eos = output_features["targets"].vocabulary.eos_id if output_features else 1
    length = (sequence_length or {}).get("targets")

    @graph_code
    def _chunks(block):
        docs = block["targets"]
        values = docs.flat_values
        n_docs = tf.cast(docs.nrows(), tf.int32)
        lengths = tf.cast(docs.row_lengths(), tf.int32) + 1  # with EOS
        doc = tf.cast(docs.value_rowids(), tf.int32)
        # Token j of document i moves right by i (the EOS of the i documents before it).
        total = tf.size(values) + n_docs
        limits = tf.cumsum(lengths)
        moved = tf.range(tf.size(values)) + doc
        values = tf.scatter_nd(moved[:, None], values, [total])
        values = tf.tensor_scatter_nd_update(
            values, (limits - 1)[:, None], tf.fill([n_docs], tf.constant(eos, values.dtype))
        )
        starts = limits - lengths
        if length:
            pieces = (lengths + length - 1) // length
            owner = tf.repeat(tf.range(n_docs), pieces)
            first_piece = tf.repeat(tf.cumsum(pieces, exclusive=True), pieces)
            starts = tf.gather(starts, owner) + (tf.range(tf.size(owner)) - first_piece) * length
        return {"targets": tf.RaggedTensor.from_row_starts(values, starts, validate=False)}

    blocks = dataset.map(graph_code(lambda ex: {"targets": ex["targets"]})).ragged_batch(
        CHUNK_BLOCK
    )
    return blocks.map(_chunks, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


# ----------------------------------------------------------------------------- span corruption


def random_segmentation(batch: tf.Tensor, num_items: tf.Tensor, num_segments: tf.Tensor, seed):
    """Partitions `num_items` into `num_segments` random non-empty segments, independently for
    each of `batch` rows (a stateless shuffle of the segment starts). Returns `[batch,
    num_segments]` segment lengths."""
    is_start = tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32)
    order = tf.argsort(tf.random.stateless_uniform([batch, num_items - 1], seed=seed), axis=1)
    first_in_segment = tf.pad(tf.gather(is_start, order), [[0, 0], [1, 0]])
    segment_id = tf.cumsum(first_in_segment, axis=1)
    offset = tf.range(batch)[:, None] * num_segments
    lengths = tf.math.unsorted_segment_sum(
        tf.ones_like(segment_id), segment_id + offset, batch * num_segments
    )
    return tf.reshape(lengths, [batch, num_segments])


def random_spans_noise_mask(
    batch: tf.Tensor,
    length: tf.Tensor,
    seeds,
    *,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> tf.Tensor:
    """T5's noise mask for `batch` chunks of `length` tokens: `[batch, length]` booleans with
    `round(density * length)` noise tokens in `round(noise / mean_span)` spans, alternating
    with non-noise spans and starting with a non-noise one (`t5.data.random_spans_noise_mask`,
    vectorised over rows; every row gets its own draw)."""
    orig_length = length
    length = tf.maximum(length, 2)
    num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise = tf.minimum(tf.maximum(num_noise, 1), length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32)
    num_spans = tf.maximum(num_spans, 1)
    noise_lengths = random_segmentation(batch, num_noise, num_spans, seeds[0])
    nonnoise_lengths = random_segmentation(batch, length - num_noise, num_spans, seeds[1])
    interleaved = tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=2), [batch, -1])
    span_starts = tf.cumsum(interleaved, axis=1)[:, :-1]
    positions = tf.tile(tf.range(length)[None, :], [batch, 1])
    span_num = tf.searchsorted(span_starts, positions, side="right")
    is_noise = tf.equal(tf.math.floormod(span_num, 2), 1)
    return is_noise[:, :orig_length]


def spans_to_sentinels(
    tokens: tf.Tensor, mask: tf.Tensor, first_sentinel: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """Replaces each run of `mask` in every row of `tokens` by one sentinel, counting down from
    `first_sentinel`; returns the shortened rows as `(flat values, row lengths)`."""
    prev = tf.pad(mask, [[0, 0], [1, 0]])[:, :-1]
    first = tf.logical_and(mask, tf.logical_not(prev))
    keep = tf.logical_not(tf.logical_and(mask, prev))
    sentinel = first_sentinel + 1 - tf.cumsum(tf.cast(first, tokens.dtype), axis=1)
    values = tf.boolean_mask(tf.where(first, sentinel, tokens), keep)
    return values, tf.reduce_sum(tf.cast(keep, tf.int64), axis=1)


def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> tf.data.Dataset:
    """T5 span corruption of tokenised `targets` into `inputs`/`targets` (EOS is added after, by
    `seqio.preprocessors.append_eos_after_trim`).

    Documents are concatenated `CONCAT_BATCH` at a time and cut into chunks of `raw_length`
    tokens (the last chunk of a group is shorter); all chunks of a group are corrupted in one
    vectorised step with the group's stateless seeds.

    Raises:
      ValueError: if the vocabulary has fewer sentinel (extra) ids than a chunk needs.
    """
    vocab = output_features["targets"].vocabulary
    lengths_kw = {
        "noise_density": noise_density,
        "mean_noise_span_length": mean_noise_span_length,
    }
    raw_length = span_raw_length(
        sequence_length["inputs"], sequence_length["targets"], **lengths_kw
    )
    check_sentinels(raw_length, getattr(vocab, "extra_ids", 0), **lengths_kw)
    first_sentinel = vocab.vocab_size - 1

    def _corrupt(tokens, seeds):
        batch, length = tf.shape(tokens)[0], tf.shape(tokens)[1]
        mask = random_spans_noise_mask(batch, length, seeds, **lengths_kw)
        return (
            spans_to_sentinels(tokens, mask, first_sentinel),
            spans_to_sentinels(tokens, tf.logical_not(mask), first_sentinel),
        )

    @seqio.map_over_dataset(num_seeds=2)
    @graph_code
    def _corrupt_group(group, seeds):
        flat = group["targets"].flat_values
        n_full = tf.size(flat) // raw_length
        full = tf.reshape(flat[: n_full * raw_length], [n_full, raw_length])
        tail = flat[n_full * raw_length :][None, :]
        tail_seeds = [tf.random.experimental.stateless_fold_in(s, 1) for s in seeds]
        out = {}
        for key, full_part, tail_part in zip(
            ("inputs", "targets"), _corrupt(full, seeds), _corrupt(tail, tail_seeds), strict=True
        ):
            out[key] = tf.RaggedTensor.from_row_lengths(
                tf.concat([full_part[0], tail_part[0]], 0),
                tf.concat([full_part[1], tail_part[1]], 0),
                validate=False,
            )
        return out

    groups = dataset.map(graph_code(lambda ex: {"targets": ex["targets"]})).ragged_batch(
        CONCAT_BATCH
    )
    chunks = _corrupt_group(groups).unbatch()
    return chunks.filter(lambda ex: tf.size(ex["inputs"]) > 0)


# ----------------------------------------------------------------------------- packing


def _base_key(key: str) -> str:
    for suffix in ("_segment_ids", "_positions"):
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


def pack_windows(
    dataset: tf.data.Dataset,
    feature_lengths: Mapping[str, int],
    *,
    spread: Mapping[str, str] | None = None,
    window: int = PACK_WINDOW,
) -> tf.data.Dataset:
    """Packs each window of `window` examples into rows; yields one dict of `[rows, length]`
    tensors per window (the keys of `pack_first_fit`).

    Args:
      dataset: examples with 1-D int features named in `feature_lengths` (trimmed to them) and
        the scalar int features named in `spread`; other features are dropped, and so are
        examples with an empty feature.
      feature_lengths: packed row length per 1-D feature.
      spread: scalar feature -> 1-D feature: the scalar plus one is written on every token of
        that feature (so 0 still marks padding), e.g. `{"component": "targets"}`.
      window: examples packed together.
    """
    spread = dict(spread or {})
    keys = list(feature_lengths)
    wanted = keys + list(spread)
    if set(dataset.element_spec) != set(wanted):
        dataset = dataset.map(graph_code(lambda ex: {k: ex[k] for k in wanted}))
    limits = np.array([feature_lengths[k] for k in keys], np.int32)
    place = functools.partial(first_fit, limits=limits)

    @graph_code
    def _pack(batch):
        # Flat arithmetic on each ragged feature: example of every token, its position, the
        # trimmed length of every example; examples with an empty feature are left out.
        flat = {}
        for k in keys:
            rt = batch[k]
            example = tf.cast(rt.value_rowids(), tf.int32)
            position = tf.range(tf.size(rt.flat_values)) - tf.gather(
                tf.cast(rt.row_starts(), tf.int32), example
            )
            length = tf.minimum(tf.cast(rt.row_lengths(), tf.int32), feature_lengths[k])
            flat[k] = (tf.cast(rt.flat_values, tf.int32), example, position, length)
        lengths = tf.stack([flat[k][3] for k in keys], axis=1)
        lengths *= tf.cast(tf.reduce_all(lengths > 0, axis=1, keepdims=True), tf.int32)
        rows, offsets = tf.numpy_function(place, [lengths], (tf.int32, tf.int32), stateful=False)
        rows.set_shape([None])
        offsets.set_shape([None, len(keys)])
        num_rows = tf.reduce_max(tf.concat([rows, [-1]], 0)) + 1
        onehot = tf.one_hot(rows, num_rows, dtype=tf.int32)  # all zero for left-out examples
        segment = tf.reduce_sum(tf.cumsum(onehot, axis=0) * onehot, axis=1)
        out, placed = {}, {}
        for j, k in enumerate(keys):
            values, example, position, _ = flat[k]
            row = tf.gather(rows, example)
            kept = tf.logical_and(row >= 0, position < feature_lengths[k])
            values, example, position, row = (
                tf.boolean_mask(x, kept) for x in (values, example, position, row)
            )
            index = tf.stack([row, tf.gather(offsets[:, j], example) + position], axis=1)
            shape = tf.stack([num_rows, feature_lengths[k]])
            placed[k] = (index, example, shape)
            out[k] = tf.scatter_nd(index, values, shape)
            out[f"{k}_segment_ids"] = tf.scatter_nd(index, tf.gather(segment, example), shape)
            out[f"{k}_positions"] = tf.scatter_nd(index, position, shape)
        for k, base in spread.items():
            index, example, shape = placed[base]
            values = tf.gather(tf.cast(batch[k], tf.int32), example) + 1
            out[k] = tf.scatter_nd(index, values, shape)
        for k, v in out.items():
            v.set_shape([None, feature_lengths[spread.get(k, _base_key(k))]])
        return out

    return dataset.ragged_batch(window).map(_pack, num_parallel_calls=tf.data.AUTOTUNE)


def pack_first_fit(
    dataset: tf.data.Dataset,
    feature_lengths: Mapping[str, int],
    *,
    spread: Mapping[str, str] | None = None,
    window: int = PACK_WINDOW,
) -> tf.data.Dataset:
    """Trims each feature to `feature_lengths` and packs examples into rows (first fit).

    Args:
      dataset: examples with 1-D int features named in `feature_lengths` (others are dropped).
      feature_lengths: packed row length per feature.
      spread: scalar features to copy onto the tokens of a 1-D feature (see `pack_windows`).
      window: examples considered together; each window starts new rows.

    Returns:
      Rows with `<key>`, `<key>_segment_ids` (1, 2, ... per example, 0 on padding) and
      `<key>_positions` for every key, each of shape `[feature_lengths[key]]`, plus the spread
      features.
    """
    return pack_windows(dataset, feature_lengths, spread=spread, window=window).unbatch()


# ----------------------------------------------------------------------------- feature conversion

_FeatureSpec = seqio.FeatureConverter.FeatureSpec


def _shift_right(x: tf.Tensor) -> tf.Tensor:
    return tf.pad(x, [[0, 0], [1, 0]])[:, :-1]


def _decoder_rows(rows: Mapping[str, tf.Tensor], bos_id: int) -> dict[str, tf.Tensor]:
    """Decoder model features of packed `[rows, length]` targets, as `seqio`'s converters make
    them one row at a time: inputs are the targets shifted right with BOS at every segment
    start (`seqio.utils.make_autoregressive_inputs`), loss on non-padding."""
    targets = rows["targets"]
    segments = rows["targets_segment_ids"]
    first = tf.not_equal(segments, _shift_right(segments))
    return {
        features.DECODER_TARGET_TOKENS: targets,
        features.DECODER_INPUT_TOKENS: tf.where(
            first, tf.cast(bos_id, targets.dtype), _shift_right(targets)
        ),
        features.DECODER_LOSS_WEIGHTS: tf.cast(tf.not_equal(targets, 0), tf.int32),
        features.DECODER_SEGMENT_IDS: segments,
        features.DECODER_POSITIONS: rows["targets_positions"],
        features.DECODER_TASK_IDS: rows["component"] - 1,
    }


def _encdec_rows(rows: Mapping[str, tf.Tensor], bos_id: int) -> dict[str, tf.Tensor]:
    """`_decoder_rows` plus the encoder features of packed `inputs`."""
    out = _decoder_rows(rows, bos_id)
    out[features.ENCODER_INPUT_TOKENS] = rows["inputs"]
    out[features.ENCODER_SEGMENT_IDS] = rows["inputs_segment_ids"]
    out[features.ENCODER_POSITIONS] = rows["inputs_positions"]
    return out


def _unpacked_rows(batch: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Segment ids (1 on tokens), positions and per-token components for padded rows that hold
    one example each."""
    out = dict(batch)
    for key in ("inputs", "targets"):
        if key in batch:
            real = tf.cast(tf.not_equal(batch[key], 0), tf.int32)
            out[f"{key}_segment_ids"] = real
            out[f"{key}_positions"] = (tf.cumsum(real, axis=1) - 1) * real
    out["component"] = (batch["component"][:, None] + 1) * out["targets_segment_ids"]
    return out


class _TaskIdsConverter(seqio.FeatureConverter):
    """Shared conversion: examples -> (packed or padded) rows, converted window by window with
    vectorised ops (`_decoder_rows`). Every model feature is present with or without packing,
    so the trainer always sees the keys of docs/interfaces.md. `component` is a scalar per
    example (its mixture component); it becomes the per-token `decoder_task_ids`."""

    PACKING_FEATURE_DTYPES = {}
    _ROWS = staticmethod(_decoder_rows)

    def _convert_features(self, ds, task_feature_lengths):
        lengths = {k: v for k, v in task_feature_lengths.items() if k != "component"}
        if self.pack:
            windows = pack_windows(ds, lengths, spread={"component": "targets"})
        else:
            windows = seqio.utils.trim_and_pad_dataset(ds, lengths)
            windows = windows.batch(PACK_WINDOW).map(graph_code(_unpacked_rows))
        convert = graph_code(functools.partial(self._ROWS, bos_id=self.bos_id))
        return windows.map(convert, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    def get_model_feature_lengths(self, task_feature_lengths):
        """Every model feature of the decoder (and encoder) has its side's length."""
        return {
            key: length
            for key, length in features.batch_lengths(task_feature_lengths).items()
            if key in self.MODEL_FEATURES
        }


class DecoderTaskIdsFeatureConverter(_TaskIdsConverter):
    """Decoder-only features as `seqio.DecoderFeatureConverter(pack=True)` gives them for
    targets-only tasks (its `LMFeatureConverter`), plus `decoder_task_ids`: the mixture component
    of every target token, -1 on padding."""

    TASK_FEATURES = {
        "targets": _FeatureSpec(dtype=tf.int32),
        "component": _FeatureSpec(dtype=tf.int32, rank=0),
    }
    MODEL_FEATURES = {key: _FeatureSpec(dtype=tf.int32) for key in features.DECODER_KEYS}


class EncDecTaskIdsFeatureConverter(_TaskIdsConverter):
    """Encoder-decoder features as `seqio.EncDecFeatureConverter(pack=True)` gives them, plus
    `decoder_task_ids` (the component of every target token, -1 on padding)."""

    TASK_FEATURES = {
        "inputs": _FeatureSpec(dtype=tf.int32),
        "targets": _FeatureSpec(dtype=tf.int32),
        "component": _FeatureSpec(dtype=tf.int32, rank=0),
    }
    MODEL_FEATURES = {
        key: _FeatureSpec(dtype=tf.int32)
        for key in (*features.DECODER_KEYS, *features.ENCODER_KEYS)
    }
    _ROWS = staticmethod(_encdec_rows)
