"""What the reader does after the prepared (pre-cache) part of a task, per `dataset.postprocess`
kind (`KINDS`): the component-local rows of the by-index training input (`pipelines.prepared.batches`).

A kind is a class built once per mixture component from the dataset's length arrays (no reads):
`KIND(dataset, index=, pool=, lengths=, seed=, eos_id=, vocab_size=)` where `pool` holds the
document ids the component trains on. It has `features` (what its documents hold), `encdec`
(whether its batches are encoder-decoder), `eligible(dataset)` (the documents seqio would keep),
`target_tokens(dataset, lengths)` (per document, for token subsets), and on the instance
`rows_per_epoch`, `target_tokens_per_row` (what turns token fractions into row shares) and
`rows(local, docs)`: component-local row indices -> each row's segments per feature, reading the
documents it needs through one `DocumentCache.fetch`. Every random order is a fresh generator
seeded by `(seed, component, purpose, ...)`, so a row is a function of its index.

- `lm_chunks`: documents plus EOS concatenated in epoch order, cut into rows of `L` tokens.
- `span_corruption`: documents concatenated in epoch order, cut into chunks of
  `span_raw_length(Li, Lt)` tokens, each corrupted into one row (`pipelines.prepared.spans`).
- `pairs`: inputs/targets trimmed plus EOS, packed once (`pipelines.prepared.packing.next_fit`), each
  epoch visiting the packed rows in its own order.

A new kind is one class here and one line in `KINDS`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pipelines.prepared import packing, spans

CACHED_EPOCHS = 2  # a step may straddle two epochs of a component
# Purposes of the stateless seeds `(seed, component, purpose, ...)`.
_EPOCH_ORDER, _PAIR_ORDER, _ROW_ORDER, _SPAN_MASK = range(4)


class DocumentCache:
    """A component's document reads: what one step needs, read in one call; the previous
    call's documents are reused."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.kept: dict[int, dict[str, np.ndarray]] = {}

    def fetch(self, indices) -> dict[int, dict[str, np.ndarray]]:
        """The documents `indices` (by id), reading only those the previous call did not."""
        wanted = sorted({int(i) for i in indices})
        missing = [i for i in wanted if i not in self.kept]
        fresh = dict(zip(missing, self.dataset.read(missing), strict=True)) if missing else {}
        self.kept = {i: self.kept[i] if i in self.kept else fresh[i] for i in wanted}
        return self.kept


class _Epochs:
    """The last `CACHED_EPOCHS` epochs' orders of a component, computed on demand."""

    def __init__(self, make):
        self.make = make
        self.cache: dict[int, Any] = {}

    def __getitem__(self, epoch: int):
        if epoch not in self.cache:
            if len(self.cache) >= CACHED_EPOCHS:
                self.cache.pop(next(iter(self.cache)))
            self.cache[epoch] = self.make(epoch)
        return self.cache[epoch]


def _rng(*words: int) -> np.random.Generator:
    return np.random.default_rng([int(w) for w in words])


class _Chunks:
    """Documents (each plus `extra` EOS tokens) concatenated in epoch order and cut into chunks
    of `chunk` tokens; the shared part of `lm_chunks` and `span_corruption`."""

    features: ClassVar[tuple[str, ...]] = ("targets",)
    extra: ClassVar[int] = 0

    def __init__(self, dataset, *, index, pool, seed, eos_id, chunk):
        self.index, self.seed, self.eos_id, self.chunk = index, seed, eos_id, chunk
        self.pool = pool
        self.doc_tokens = dataset.lengths("targets").astype(np.int64) + self.extra
        self.rows_per_epoch = int(self.doc_tokens[pool].sum()) // chunk
        self.epochs = _Epochs(self._epoch)

    @classmethod
    def eligible(cls, dataset) -> np.ndarray:
        """Documents seqio keeps: tokenisation drops empty ones."""
        return dataset.lengths("targets") > 0

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        order = self.pool[
            _rng(self.seed, self.index, _EPOCH_ORDER, epoch).permutation(len(self.pool))
        ]
        return order, np.cumsum(self.doc_tokens[order])

    def _pieces(self, local: np.ndarray, docs: DocumentCache) -> list[list[np.ndarray]]:
        """Each local row's chunk as the document pieces it is made of."""
        epochs, rows = np.divmod(local, self.rows_per_epoch)
        plans = []
        for epoch, row in zip(epochs.tolist(), rows.tolist(), strict=True):
            order, ends = self.epochs[epoch]
            lo, hi = row * self.chunk, (row + 1) * self.chunk
            first, last = np.searchsorted(ends, [lo, hi - 1], side="right").tolist()
            plans.append((lo, hi, order[first : last + 1], ends[first : last + 1]))
        got = docs.fetch(np.concatenate([p[2] for p in plans]) if plans else [])
        eos = np.full(self.extra, self.eos_id, np.int32)
        # Each document with its EOS once per call (a long one may span many rows).
        full = {
            i: np.concatenate([np.asarray(d["targets"], np.int32), eos]) for i, d in got.items()
        }
        out = []
        for lo, hi, ids, ends in plans:
            pieces = []
            for doc, end in zip(ids.tolist(), ends.tolist(), strict=True):
                tokens = full[doc]
                start = end - len(tokens)
                pieces.append(tokens[max(lo, start) - start : min(hi, end) - start])
            out.append(pieces)
        return out


class LmChunks(_Chunks):
    """`lm_chunks`: rows of `L` tokens of the documents plus EOS; each piece is a segment."""

    encdec: ClassVar[bool] = False
    extra: ClassVar[int] = 1

    def __init__(self, dataset, *, index, pool, lengths, seed, eos_id, vocab_size, extra_ids=None):
        del vocab_size
        super().__init__(
            dataset, index=index, pool=pool, seed=seed, eos_id=eos_id, chunk=lengths["targets"]
        )
        self.target_tokens_per_row = float(lengths["targets"])

    @classmethod
    def target_tokens(cls, dataset, lengths) -> np.ndarray:
        """Target tokens of each document once chunked: its tokens plus EOS."""
        return dataset.lengths("targets").astype(np.int64) + 1

    def rows(self, local: np.ndarray, docs: DocumentCache) -> list[dict[str, list[np.ndarray]]]:
        """Local rows -> `{"targets": [segment, ...]}`."""
        return [{"targets": pieces} for pieces in self._pieces(local, docs)]


class SpanCorruption(_Chunks):
    """`span_corruption`: one corrupted chunk of `span_raw_length(Li, Lt)` tokens per row."""

    encdec: ClassVar[bool] = True

    def __init__(self, dataset, *, index, pool, lengths, seed, eos_id, vocab_size, extra_ids=None):
        raw = spans.span_raw_length(lengths["inputs"], lengths["targets"])
        _, targets, num_spans = spans.span_corruption_lengths(raw)
        if vocab_size is None or vocab_size <= num_spans + max(eos_id, 0):
            raise ValueError(
                f"vocab_size = {vocab_size!r}: span corruption of {raw}-token chunks puts "
                f"{num_spans} sentinels at the top of the vocabulary; allowed: the vocabulary "
                "size with its extra ids (e.g. 32100)"
            )
        if extra_ids is not None:  # known (the run's vocabulary): its sentinels must cover spans
            spans.check_sentinels(raw, extra_ids)
        super().__init__(dataset, index=index, pool=pool, seed=seed, eos_id=eos_id, chunk=raw)
        self.vocab_size = vocab_size
        self.target_tokens_per_row = float(targets)

    @classmethod
    def target_tokens(cls, dataset, lengths) -> np.ndarray:
        """Target tokens a document yields once corrupted, in proportion to its raw tokens."""
        raw = spans.span_raw_length(lengths["inputs"], lengths["targets"])
        per_token = spans.span_corruption_lengths(raw)[1] / raw
        return dataset.lengths("targets").astype(np.float64) * per_token

    def rows(self, local: np.ndarray, docs: DocumentCache) -> list[dict[str, list[np.ndarray]]]:
        """Local rows -> `{"inputs": [inputs], "targets": [targets]}` (one example each)."""
        out = []
        for r, pieces in zip(local.tolist(), self._pieces(local, docs), strict=True):
            rng = _rng(self.seed, self.index, _SPAN_MASK, r)
            inputs, targets = spans.corrupt(
                np.concatenate(pieces), rng=rng, vocab_size=self.vocab_size, eos_id=self.eos_id
            )
            out.append({"inputs": [inputs], "targets": [targets]})
        return out


def _trimmed(length: np.ndarray, limit: int) -> np.ndarray:
    """Tokens of a feature after `append_eos_after_trim`: trimmed to `limit - 1`, plus EOS."""
    return np.minimum(length.astype(np.int64), limit - 1) + 1


class Pairs:
    """`pairs`: inputs/targets examples (each trimmed plus EOS) packed once, in an order seeded
    by `(seed, component)`; every epoch visits the packed rows in its own seeded order."""

    features: ClassVar[tuple[str, ...]] = ("inputs", "targets")
    encdec: ClassVar[bool] = True

    def __init__(self, dataset, *, index, pool, lengths, seed, eos_id, vocab_size, extra_ids=None):
        del vocab_size
        self.index, self.seed, self.eos_id, self.lengths = index, seed, eos_id, lengths
        self.order = pool[_rng(seed, index, _PAIR_ORDER).permutation(len(pool))]
        sizes = np.stack(
            [_trimmed(dataset.lengths(k)[self.order], lengths[k]) for k in self.features], 1
        )
        self.starts = packing.next_fit(sizes, [lengths[k] for k in self.features])
        self.rows_per_epoch = len(self.starts) - 1
        self.target_tokens_per_row = float(sizes[:, 1].sum()) / max(self.rows_per_epoch, 1)
        self.epochs = _Epochs(
            lambda e: _rng(seed, index, _ROW_ORDER, e).permutation(self.rows_per_epoch)
        )

    @classmethod
    def eligible(cls, dataset) -> np.ndarray:
        """Pairs seqio keeps: tokenisation drops an example with an empty feature."""
        return (dataset.lengths("inputs") > 0) & (dataset.lengths("targets") > 0)

    @classmethod
    def target_tokens(cls, dataset, lengths) -> np.ndarray:
        """Target tokens of each pair: trimmed, plus EOS."""
        return _trimmed(dataset.lengths("targets"), lengths["targets"])

    def rows(self, local: np.ndarray, docs: DocumentCache) -> list[dict[str, list[np.ndarray]]]:
        """Local rows -> `{"inputs": [...], "targets": [...]}`, one segment per pair."""
        epochs, rows = np.divmod(local, self.rows_per_epoch)
        packed = [self.epochs[e][r] for e, r in zip(epochs.tolist(), rows.tolist(), strict=True)]
        members = [self.order[self.starts[p] : self.starts[p + 1]] for p in packed]
        got = docs.fetch(np.concatenate(members) if members else [])
        eos = np.array([self.eos_id], np.int32)
        out = []
        for ids in members:
            row = {}
            for k in self.features:
                limit = self.lengths[k] - 1
                row[k] = [
                    np.concatenate([np.asarray(got[i][k], np.int32)[:limit], eos])
                    for i in ids.tolist()
                ]
            out.append(row)
        return out


# What `dataset.postprocess` names -> what the reader does after the prepared (pre-cache) part.
KINDS: dict[str, type] = {
    "lm_chunks": LmChunks,
    "span_corruption": SpanCorruption,
    "pairs": Pairs,
}
