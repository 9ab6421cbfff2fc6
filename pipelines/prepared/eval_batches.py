"""Eval batches from a prepared validation split, in numpy: exactly the batches of the seqio
path (`pipelines.streams.eval_batches`) for the same task, split, lengths, batch and token budget.

The seqio path reads the split unshuffled, through the task's post-cache preprocessors, packs the
examples first fit in windows of `PACK_WINDOW` (`pipelines.preprocessors.pack_windows`), converts
them to model features, batches the rows in order and stops once `max_tokens` target tokens are
covered, padding the last batch with rows of weight 0 and task id -1. Here the same steps run on
the prepared documents, which are the split's pre-cache output in its order (one shard):

- `lm_chunks` (`lm_<lang>`): each document plus EOS, cut into pieces of at most `L` tokens (per
  document: evaluation does not concatenate documents, as seqio's `lm_chunks` does not);
- `pairs` (`mt_<src>_<tgt>`): inputs and targets each trimmed to their length minus one, plus
  EOS (seqio's `append_eos_after_trim`).

Span corruption draws its masks from seqio's stateless TensorFlow seeds, which numpy does not
reproduce; its tasks have no prepared eval kind here (`EVAL_KINDS`), and the trainer refuses them
while it plans. Documents are read in blocks (`READ_BLOCK`), and only as far as the budget needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from pipelines import features
from pipelines.prepared import packing

READ_BLOCK = 1024  # documents read per reader call


def _lm_examples(doc: Mapping[str, np.ndarray], lengths, eos_id: int) -> list[dict]:
    """A document plus EOS in pieces of at most `L` target tokens (seqio's `lm_chunks`)."""
    length = lengths["targets"]
    tokens = np.concatenate([np.asarray(doc["targets"], np.int32), np.int32([eos_id])])
    return [{"targets": tokens[i : i + length]} for i in range(0, len(tokens), length)]


def _pair_examples(doc: Mapping[str, np.ndarray], lengths, eos_id: int) -> list[dict]:
    """One example: each feature trimmed to its length minus one, plus EOS."""
    eos = np.int32([eos_id])
    return [
        {
            k: np.concatenate([np.asarray(doc[k], np.int32)[: lengths[k] - 1], eos])
            for k in ("inputs", "targets")
        }
    ]


# What a prepared split's `postprocess` kind makes of one document at eval time: its examples.
EVAL_KINDS: dict[str, Callable[..., list[dict]]] = {
    "lm_chunks": _lm_examples,
    "pairs": _pair_examples,
}


def _examples(dataset, lengths, eos_id: int) -> Iterator[dict]:
    """The split's examples in order; examples with an empty feature are left out, as seqio's
    tokenizer and packer leave them out."""
    make = EVAL_KINDS[dataset.postprocess]
    for start in range(0, dataset.num_docs, READ_BLOCK):
        stop = min(start + READ_BLOCK, dataset.num_docs)
        for doc in dataset.read(np.arange(start, stop)):
            if any(len(doc[k]) == 0 for k in dataset.features):
                continue
            yield from make(doc, lengths, eos_id)


def _windows(examples: Iterator[dict], window: int) -> Iterator[list[dict]]:
    block: list[dict] = []
    for example in examples:
        block.append(example)
        if len(block) == window:
            yield block
            block = []
    if block:
        yield block


def _rows(dataset, lengths, *, eos_id: int, start_id: int) -> Iterator[dict[str, np.ndarray]]:
    """Packed model-feature rows (one dict of `[length]` arrays per row), in the seqio path's
    order: each window of `PACK_WINDOW` examples packed first fit into rows of its own."""
    keys = list(lengths)
    limits = np.array([lengths[k] for k in keys], np.int32)
    for block in _windows(_examples(dataset, lengths, eos_id), packing.PACK_WINDOW):
        trimmed = [{k: ex[k][: lengths[k]] for k in keys} for ex in block]
        sizes = np.array([[len(ex[k]) for k in keys] for ex in trimmed], np.int32)
        sizes *= np.all(sizes > 0, axis=1, keepdims=True)
        row_of, _ = packing.first_fit(sizes, limits)
        count = int(row_of.max()) + 1 if len(row_of) else 0
        segments: list[dict[str, list[np.ndarray]]] = [{k: [] for k in keys} for _ in range(count)]
        for ex, row in zip(trimmed, row_of.tolist(), strict=True):
            if row < 0:
                continue
            for k in keys:  # arrival order within a row is first fit's offset order
                segments[row][k].append(ex[k])
        packed = {k: packing.pack([r[k] for r in segments], lengths[k]) for k in keys}
        rows = packing.model_features(packed, np.zeros(count, np.int64), start_id)
        for i in range(count):
            yield {key: value[i] for key, value in rows.items()}


def _pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    short = rows - len(next(iter(batch.values())))
    if short <= 0:
        return batch
    return {
        key: np.concatenate(
            [value, np.full((short, *value.shape[1:]), features.padding_value(key), value.dtype)]
        )
        for key, value in batch.items()
    }


def eval_batches(
    dataset,
    *,
    sequence_length: int | Mapping[str, int],
    batch_size: int,
    max_tokens: int | None,
    eos_id: int,
    start_id: int = 0,
) -> list[dict[str, np.ndarray]]:
    """Finite, unshuffled, packed eval batches of a prepared split: those of
    `pipelines.streams.eval_batches` for its task (module docstring).

    Args:
      dataset: the prepared split (`pipelines.prepared.shards.PreparedDataset`, one shard, so
        its documents are in the split's order), of a kind in `EVAL_KINDS`.
      sequence_length: the targets length (decoder batches of `lm_chunks`), or `{"inputs": Li,
        "targets": Lt}` (encoder-decoder batches of `pairs`).
      batch_size: rows per batch.
      max_tokens: batches are produced until at least this many target tokens are covered or
        the split ends (None: the whole split).
      eos_id: the vocabulary's EOS (prepared documents carry none).
      start_id: the decoder's start token (`pipelines.vocab.start_id`).

    Returns:
      A list of dicts of int32 `[batch_size, length]` arrays (read-only), the last batch padded
      with rows of loss weight 0 and task id -1; `decoder_task_ids` is 0 on real tokens.

    Raises:
      ValueError: a kind with no prepared eval (span corruption), or lengths that do not match
        the kind (naming what is allowed).
    """
    kind = dataset.postprocess
    if kind not in EVAL_KINDS:
        raise ValueError(
            f"{dataset.directory}: prepared kind {kind!r} has no numpy eval (its seqio masks are "
            f"drawn by TensorFlow); allowed: {', '.join(map(repr, EVAL_KINDS))}"
        )
    encdec = isinstance(sequence_length, Mapping)
    if encdec != (kind == "pairs"):
        shape = "{'inputs': Li, 'targets': Lt}" if kind == "pairs" else "an int"
        raise ValueError(
            f"{dataset.directory}: sequence_length = {sequence_length!r} for kind {kind!r}; "
            f"allowed: {shape}"
        )
    if encdec:
        lengths = {k: int(sequence_length[k]) for k in ("inputs", "targets")}
    else:
        lengths = {"targets": int(sequence_length)}
    limit = math.inf if max_tokens is None else max_tokens
    batches: list[dict[str, np.ndarray]] = []
    tokens = 0
    pending: list[dict[str, np.ndarray]] = []

    def flush() -> None:
        nonlocal tokens
        batch = {key: np.stack([row[key] for row in pending]) for key in pending[0]}
        batch = _pad_rows(batch, batch_size)
        for value in batch.values():
            value.setflags(write=False)
        batches.append(batch)
        tokens += int(batch[features.DECODER_LOSS_WEIGHTS].sum())
        pending.clear()

    for row in _rows(dataset, lengths, eos_id=int(eos_id), start_id=int(start_id)):
        if tokens >= limit:
            break
        pending.append(row)
        if len(pending) == batch_size:
            flush()
    if pending and tokens < limit:
        flush()
    return batches
