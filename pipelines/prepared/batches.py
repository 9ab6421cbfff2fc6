"""Training batches by index over prepared (tokenized) documents: the global batch of step `s` is
a pure function of `(seed, s)`, so resuming costs the same at any step and each host reads only
the documents of its own rows.

`batches(...)` yields exactly the arrays of `pipelines.streams.batches` (same keys, packing layout,
shifted decoder inputs, loss weights, task ids), from readers of prepared datasets (`features`,
`num_docs`, `postprocess`, `lengths(feature)`, `read(indices)`; `pipelines.prepared.shards`) instead of a
tf.data pipeline replayed from the start. Numpy only: training-time input imports no TensorFlow.

Rows and components. Every row of a global batch belongs to one mixture component. Global row
`n = s × B + j` (row `j` of step `s`) is given to a component by `assign_rows`, a closed form of
`n` alone: component 0 takes the rows where `floor(n·a₀/A)` steps up (Bresenham's even spacing
of `a₀/A` of all rows), its component-local row index being that floor; the rows it leaves are
renumbered and split the same way between component 1 and the rest, and so on. So after any `n`
rows each component has had its share of rows to within a row or two (per component, at every
step), and its rows arrive in order of their local index. (Cumulative bounds `floor(n·W_k) −
floor(n·W_{k−1})` would be shorter, but are not monotone in `n` for small shares: a 1% replay
component would sometimes "give back" a row.) The shares are fractions of *rows* that turn the
mixture's *token* fractions into rows: `fraction / target tokens per row`, where LM rows are full
(`L` target tokens), span-corruption rows hold one chunk (a fixed number of target tokens), and
pair rows hold on average the packed epoch's target tokens over its rows (all known at setup from
the length arrays, no reads). Rows of all components are spread evenly over the step, so any
host's rows carry the mixture too.

Component-local rows, by kind (`pipelines.prepared.postprocess.KINDS`: the seqio steps after the cache
placeholder):

- `lm_chunks` (`lm_<lang>`): each document plus EOS, concatenated in the order of epoch `e`'s
  permutation (seeded by `(seed, component, e)`) and cut into rows of `L` tokens; every document
  piece is a segment (segment ids, positions from 0, decoder inputs shifted right with the start
  id), like seqio's LM chunks packed. An epoch holds `floor(tokens / L)` rows whatever the order,
  so local row `r` is row `r mod R` of epoch `r div R`; the epoch's tail is dropped.
- `span_corruption` (`span_<lang>`): the documents (no EOS, as T5 concatenates them) in epoch
  order, cut into chunks of `span_raw_length(Li, Lt)` tokens; chunk `r` is corrupted with a
  generator seeded by `(seed, component, r)` (`pipelines.prepared.spans`) and fills one row (T5's lengths
  make one chunk fill the inputs), EOS after both features.
- `pairs` (`mt_<src>_<tgt>`): inputs and targets each trimmed and given EOS (seqio's
  `append_eos_after_trim`), packed in order (`pipelines.prepared.packing.next_fit`) once at setup, in an
  order seeded by `(seed, component)`; each epoch visits those packed rows in its own seeded
  order. (Packing once fixes the rows per epoch, which keeps local row -> epoch a division; the
  examples sharing a row never attend to each other, only the batch composition changes by
  epoch.) `subset_examples=n`: the component's documents are the first `n` of a permutation
  seeded by `SUBSET_SEED`, the same for every run seed (the MT paper's finetuning set of Df/512
  pairs); `subset_tokens`: the shortest such prefix reaching that many target tokens.

Cost. Setup is O(documents) numpy (lengths, one permutation and prefix sum per epoch in use,
cached two epochs at a time), independent of `start_step`; a step reads only the documents that
overlap this host's rows (documents of the previous step are kept, so a long document spanning
many rows is read once per step at most), and builds `B/hosts` rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pipelines.prepared import packing
from pipelines.prepared.postprocess import KINDS, DocumentCache

SUBSET_SEED = 1234  # which documents form a subset does not vary with the run's seed (as streams)
SHARE_SCALE = 1 << 24  # component row shares are integers out of this (exact arithmetic)
MAX_ROWS = 1 << 38  # global row indices stay below this, so `row × share` fits in int64
# Steps whose documents are read in one call: a reader call has a fixed cost (~0.6 ms for
# ArrayRecord, measured in benchmarks/data_pipeline.py) that a step of short documents would
# pay per shard; the rows themselves do not depend on it.
READ_AHEAD_STEPS = 8


@dataclasses.dataclass(frozen=True)
class Component:
    """One mixture component.

    Attributes:
      name: the task name (e.g. `lm_en`); the component's index in `components` is its
        `decoder_task_ids` value (list them in `pipelines.mixtures.component_names` order for
        the ids of `pipelines.streams`).
      dataset: a prepared-dataset reader (`pipelines.prepared.shards`, or anything with its interface).
      fraction: its share of the mixture's target tokens (fractions are normalised).
    """

    name: str
    dataset: Any
    fraction: float


def assign_rows(rows: np.ndarray, shares: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Gives global rows to components: a closed form of each row's index.

    Component 0 takes row `n` when `floor(n·a₀/A)` steps up between `n` and `n + 1` (rows evenly
    spaced at rate `a₀/A`, `A = sum(shares)`), as its local row `floor(n·a₀/A)`; the other rows,
    renumbered `n − floor(n·a₀/A)`, are split the same way between component 1 (rate
    `a₁/(A − a₀)`) and the rest, and so on. Every component's row count after any `n` rows is
    within a row or two of `n·a_k/A` and never decreases; local indices run 0, 1, 2, ... in row
    order.

    Args:
      rows: global row indices (step × global batch + row), int64 below `MAX_ROWS`.
      shares: non-negative integer shares of the components (sum below 2**24 or so).

    Returns:
      `(component, local)`: int64 arrays like `rows`.
    """
    m = np.asarray(rows, np.int64).copy()
    component = np.full(m.shape, -1, np.int64)
    local = np.zeros(m.shape, np.int64)
    open_ = np.ones(m.shape, bool)
    remaining = int(sum(shares))
    for k, share in enumerate(int(a) for a in shares):
        if share == 0:
            continue
        if share == remaining:
            component[open_], local[open_] = k, m[open_]
            break
        before, after = m * share // remaining, (m + 1) * share // remaining
        take = open_ & (after > before)
        component[take], local[take] = k, before[take]
        m = np.where(take, m, m - before)
        open_ &= ~take
        remaining -= share
    return component, local


def _integer_shares(weights: Sequence[float]) -> list[int]:
    """Weights as integers summing to `SHARE_SCALE` (largest remainders; positive stays > 0)."""
    w = np.asarray(weights, np.float64)
    exact = w / w.sum() * SHARE_SCALE
    out = np.floor(exact).astype(np.int64)
    out[(w > 0) & (out == 0)] = 1
    rest = SHARE_SCALE - int(out.sum())
    for k in np.argsort(-(exact - out))[: max(rest, 0)]:
        out[k] += 1
    return out.tolist()


def _feature_lengths(sequence_length) -> dict[str, int]:
    if isinstance(sequence_length, Mapping):
        if set(sequence_length) not in ({"targets"}, {"inputs", "targets"}):
            raise ValueError(
                f"sequence_length = {dict(sequence_length)!r}; allowed: an int or {{'targets': "
                "L}} (decoder-only), or {'inputs': Li, 'targets': Lt} (encoder-decoder)"
            )
        lengths = {k: int(v) for k, v in sequence_length.items()}
    else:
        lengths = {"targets": int(sequence_length)}
    if any(v < 1 for v in lengths.values()):
        raise ValueError(f"sequence_length = {sequence_length!r}; allowed: positive lengths")
    return lengths


def _host_positions(host_rows, batch: int) -> np.ndarray:
    if host_rows is None:
        return np.arange(batch, dtype=np.int64)
    ranges = [tuple(int(x) for x in r) for r in host_rows]
    if any(len(r) != 2 or not 0 <= r[0] <= r[1] <= batch for r in ranges):
        raise ValueError(
            f"host_rows = {host_rows!r}; allowed: (start, stop) ranges with 0 <= start <= stop "
            f"<= global_batch_size ({batch})"
        )
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges] or [[]]).astype(
        np.int64
    )


def _pool(i, component, kind, lengths, subset_examples, subset_tokens, single: bool) -> np.ndarray:
    """The documents a component trains on: those seqio keeps, or a fixed subset of them."""
    eligible = kind.eligible(component.dataset)
    ids = np.flatnonzero(eligible).astype(np.int32 if len(eligible) < 2**31 else np.int64)
    if subset_examples is None and subset_tokens is None:
        return ids
    if not single:
        raise ValueError(
            f"subset_examples/subset_tokens with {i + 1}+ components; allowed: one component "
            "(a finetuning set of one task)"
        )
    order = ids[np.random.default_rng(SUBSET_SEED).permutation(len(ids))]
    if subset_examples is not None:
        n = int(subset_examples)
        if not 0 < n <= len(ids):
            raise ValueError(
                f"subset_examples = {subset_examples!r}; allowed: 1 to {len(ids)} (the examples "
                f"of {component.name!r})"
            )
    else:
        totals = np.cumsum(kind.target_tokens(component.dataset, lengths)[order])
        if not 0 < subset_tokens <= (totals[-1] if len(totals) else 0):
            raise ValueError(
                f"subset_tokens = {subset_tokens!r}; allowed: 1 to {int(totals[-1]) if len(totals) else 0} "
                f"(the target tokens of {component.name!r})"
            )
        n = int(np.searchsorted(totals, subset_tokens, side="left")) + 1
    return np.sort(order[:n])


def _sources(
    components, lengths, *, seed, eos_id, vocab_size, extra_ids, subset_examples, subset_tokens
):
    """Checks every component and sets up the ones with a positive fraction."""
    encdec = "inputs" in lengths
    out = []
    for i, c in enumerate(components):
        where = f"components[{i}] ({c.name!r})"
        kind = KINDS.get(c.dataset.postprocess)
        if kind is None:
            raise ValueError(
                f"{where}: dataset.postprocess = {c.dataset.postprocess!r}; allowed: "
                f"{', '.join(map(repr, KINDS))}"
            )
        if tuple(c.dataset.features) != kind.features:
            raise ValueError(
                f"{where}: dataset.features = {tuple(c.dataset.features)!r} for "
                f"{c.dataset.postprocess!r}; allowed: {kind.features!r}"
            )
        if kind.encdec != encdec:
            shape = "{'inputs': Li, 'targets': Lt}" if kind.encdec else "an int or {'targets': L}"
            raise ValueError(
                f"{where}: sequence_length = {lengths if encdec else lengths['targets']!r} but "
                f"{c.dataset.postprocess!r} makes {'encoder-decoder' if kind.encdec else 'decoder-only'}"
                f" batches; allowed: {shape}"
            )
        if not c.fraction > 0:
            out.append(None)
            continue
        pool = _pool(
            i, c, kind, lengths, subset_examples, subset_tokens, single=len(components) == 1
        )
        source = kind(
            c.dataset,
            index=i,
            pool=pool,
            lengths=lengths,
            seed=seed,
            eos_id=eos_id,
            vocab_size=vocab_size,
            extra_ids=extra_ids,
        )
        if source.rows_per_epoch < 1:
            raise ValueError(
                f"{where}: fraction {c.fraction} but its {len(pool)} documents (of "
                f"{c.dataset.num_docs}) make no row at sequence_length = {lengths}; allowed: a "
                "component with documents, or fraction 0"
            )
        out.append(source)
    return out


def batches(
    *,
    components: Sequence[Component],
    sequence_length: int | Mapping[str, int],
    global_batch_size: int,
    seed: int,
    start_step: int = 0,
    host_rows: Sequence[tuple[int, int]] | None = None,
    start_id: int = 0,
    eos_id: int = 1,
    vocab_size: int | None = None,
    extra_ids: int | None = None,
    subset_examples: int | None = None,
    subset_tokens: int | None = None,
    read_ahead_steps: int = READ_AHEAD_STEPS,
) -> Iterator[dict[str, np.ndarray]]:
    """This host's rows of the global batches of steps `start_step, start_step + 1, ...`, each
    a function of `(seed, step)` alone (module docstring: the design).

    Args:
      components: the mixture (a single task is one component with fraction 1); a component's
        index is its `decoder_task_ids`.
      sequence_length: the targets length, an int or `{"targets": L}` (decoder-only,
        `lm_chunks` components), or `{"inputs": Li, "targets": Lt}` (encoder-decoder:
        `span_corruption`, `pairs`), as `trainer.data.DataConfig.task_feature_lengths`.
      global_batch_size: rows per global batch (`B`).
      seed: seeds every order and mask (a non-negative int).
      start_step: the first step yielded; any step costs the same.
      host_rows: the `[start, stop)` ranges of global rows this host holds, concatenated in
        order (`trainer.data.even_rows`, `Partitioner.host_rows`); None: all rows.
      start_id: the decoder's start token (`pipelines.streams.decoder_start_id`).
      eos_id: the vocabulary's EOS, appended by the reader (prepared documents carry none).
      vocab_size: the vocabulary size with extra ids (sentinels; span corruption needs it).
      extra_ids: how many of those are sentinel (extra) ids, checked against the spans of span
        corruption as the seqio preprocessor does; None: not known, not checked.
      subset_examples: train one component on a fixed sample of exactly this many documents
        (the same for every seed), repeated; not with `subset_tokens`.
      subset_tokens: the same, the shortest sample of at least this many target tokens.
      read_ahead_steps: steps whose documents are read together (fewer, larger reads); the
        batches do not depend on it.

    Returns:
      An endless iterator of dicts of int32 arrays, `[rows, Lt]` `decoder_input_tokens,
      decoder_target_tokens, decoder_loss_weights, decoder_segment_ids, decoder_positions,
      decoder_task_ids` (the component index, -1 on padding), plus `[rows, Li]`
      `encoder_input_tokens, encoder_segment_ids, encoder_positions` for an encoder-decoder;
      `rows` is the length of `host_rows`' ranges together.

    Raises:
      ValueError: a bad argument, naming it with its value and what is allowed: no positive
        fraction, an unknown postprocess kind, features or sequence length not matching the
        kind, a component with a fraction and no rows, span lengths too short, a missing
        vocab size, a bad subset or host row range.
    """
    if not components:
        raise ValueError("components = []; allowed: one or more Component")
    if read_ahead_steps < 1:
        raise ValueError(f"read_ahead_steps = {read_ahead_steps!r}; allowed: an int >= 1")
    fractions = [float(c.fraction) for c in components]
    if any(not f >= 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(
            f"component fractions = {fractions}; allowed: non-negative, at least one positive"
        )
    if int(global_batch_size) < 1:
        raise ValueError(f"global_batch_size = {global_batch_size!r}; allowed: a positive int")
    if int(seed) < 0 or int(start_step) < 0:
        raise ValueError(f"seed = {seed!r}, start_step = {start_step!r}; allowed: ints >= 0")
    if subset_examples is not None and subset_tokens is not None:
        raise ValueError("subset_examples and subset_tokens are both set; allowed: one of them")
    batch = int(global_batch_size)
    lengths = _feature_lengths(sequence_length)
    positions = _host_positions(host_rows, batch)
    sources = _sources(
        components,
        lengths,
        seed=int(seed),
        eos_id=int(eos_id),
        vocab_size=vocab_size,
        extra_ids=extra_ids,
        subset_examples=subset_examples,
        subset_tokens=subset_tokens,
    )
    weights = [
        f / s.target_tokens_per_row if s is not None else 0.0
        for f, s in zip(fractions, sources, strict=True)
    ]
    shares = _integer_shares(weights)
    docs = [DocumentCache(c.dataset) for c in components]
    return _steps(
        sources,
        docs,
        shares,
        lengths,
        positions,
        batch,
        int(start_step),
        int(start_id),
        int(read_ahead_steps),
    )


def _steps(sources, docs, shares, lengths, positions, batch, step, start_id, ahead):
    """The endless per-step loop of `batches` (a generator, so that `batches` checks eagerly).

    The rows of `READ_AHEAD_STEPS` steps are made together, so that each component's documents
    for them are read in one call; every row is still a function of its global index alone."""
    while True:
        if (step + ahead) * batch > MAX_ROWS:
            raise ValueError(f"step {step} × global batch {batch} passes MAX_ROWS ({MAX_ROWS})")
        steps = step + np.arange(ahead, dtype=np.int64)
        rows_at = (steps[:, None] * batch + positions[None, :]).reshape(-1)
        component, local = assign_rows(rows_at, shares)
        rows: list[Any] = [None] * len(rows_at)
        for k in np.unique(component).tolist():
            at = np.flatnonzero(component == k)
            for j, row in zip(at.tolist(), sources[k].rows(local[at], docs[k]), strict=True):
                rows[j] = row
        n = len(positions)
        for i in range(ahead):
            mine = rows[i * n : (i + 1) * n]
            packed = {
                key: packing.pack([row[key] for row in mine], length)
                for key, length in lengths.items()
            }
            yield packing.model_features(packed, component[i * n : (i + 1) * n], start_id)
        step += ahead
