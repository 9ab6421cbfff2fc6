"""Rows of the by-index training input in numpy: packing pairs, and packed rows to model features.

`next_fit` packs examples in their given order into rows: an example joins the current row while
all its features still fit, else starts the next one. Unlike first-fit it needs no search over
open rows, so it is computed for a whole epoch at once: for every example the start of the row
that would follow a row starting there (`searchsorted` over prefix sums, vectorised), then one
integer chase from 0 through those starts (one Python step per row, not per example).

`pack` lays rows given as lists of segments into `[rows, length]` arrays with seqio's packed
layout (`<key>`, `<key>_segment_ids` 1, 2, ... per segment and 0 on padding, `<key>_positions`
restarting at 0 per segment), and `model_features` turns those into exactly the features of
`pipelines.preprocessors._decoder_rows` / `_encdec_rows` (decoder inputs shifted right with the
start id at every segment start, loss weights on non-zero targets, the component of every placed
target token and -1 on padding).

`first_fit` is the packing of the seqio path (`pipelines.preprocessors.pack_windows`): each
example in the first of the `MAX_OPEN_ROWS` most recent rows of its window where it fits. It is
defined here, without TensorFlow, so that the prepared eval reader
(`pipelines.prepared.eval_batches`) packs exactly as the seqio path does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pipelines import features


def next_fit(lengths: np.ndarray, limits: Sequence[int]) -> np.ndarray:
    """Packs examples in order: an example joins the current row if every feature still fits.

    Args:
      lengths: `[examples, features]` token counts, each between 1 and its limit.
      limits: the row length of each feature.

    Returns:
      int64 row boundaries `[rows + 1]`: row `r` holds examples `[starts[r], starts[r + 1])`.
    """
    lengths = np.asarray(lengths, np.int64)
    n = len(lengths)
    if n == 0:
        return np.zeros(1, np.int64)
    prefix = np.concatenate([np.zeros((1, lengths.shape[1]), np.int64), np.cumsum(lengths, 0)])
    # after[i]: the first example that no longer fits a row starting at example i.
    after = np.full(n, n, np.int64)
    for j, limit in enumerate(limits):
        ends = np.searchsorted(prefix[:, j], prefix[:-1, j] + int(limit), side="right") - 1
        after = np.minimum(after, ends)
    after = np.maximum(after, np.arange(n) + 1)
    starts = [0]
    while starts[-1] < n:
        starts.append(int(after[starts[-1]]))
    return np.asarray(starts, np.int64)


def pack(rows: Sequence[Sequence[np.ndarray]], length: int) -> dict[str, np.ndarray]:
    """Lays each row's segments (1-D token arrays, at most `length` tokens in all) side by side.

    Returns:
      int32 `[rows, length]` arrays `tokens`, `segment_ids` (1, 2, ... per segment, 0 on
      padding) and `positions` (0, 1, ... within each segment, 0 on padding).
    """
    tokens = np.zeros((len(rows), length), np.int32)
    segment_ids = np.zeros_like(tokens)
    positions = np.zeros_like(tokens)
    for i, segments in enumerate(rows):
        if not len(segments):
            continue
        sizes = np.fromiter((len(x) for x in segments), np.int64, len(segments))
        n = int(sizes.sum())
        if n > length:
            raise AssertionError(f"row {i} overflows {length} tokens")
        # One concatenation per row; ids and positions from the segment sizes.
        tokens[i, :n] = np.concatenate(segments)
        segment_ids[i, :n] = np.repeat(np.arange(1, len(sizes) + 1, dtype=np.int32), sizes)
        starts = np.cumsum(sizes) - sizes
        positions[i, :n] = np.arange(n) - np.repeat(starts, sizes)
    return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions}


def _shift_right(x: np.ndarray) -> np.ndarray:
    return np.pad(x, [(0, 0), (1, 0)])[:, :-1]


def model_features(
    packed: Mapping[str, Mapping[str, np.ndarray]], components: np.ndarray, start_id: int
) -> dict[str, np.ndarray]:
    """The model features of packed rows, as `pipelines.preprocessors._decoder_rows` (and
    `_encdec_rows` when `packed` has `inputs`) make them from seqio's packed layout.

    Args:
      packed: `{"targets": pack(...)}`, plus `"inputs"` for an encoder-decoder.
      components: `[rows]` the mixture component of each row.
      start_id: the decoder's start token, put at every segment start of the decoder inputs.
    """
    targets = packed["targets"]["tokens"]
    segments = packed["targets"]["segment_ids"]
    first = segments != _shift_right(segments)
    out = {
        features.DECODER_INPUT_TOKENS: np.where(first, np.int32(start_id), _shift_right(targets)),
        features.DECODER_TARGET_TOKENS: targets,
        features.DECODER_LOSS_WEIGHTS: (targets != 0).astype(np.int32),
        features.DECODER_SEGMENT_IDS: segments,
        features.DECODER_POSITIONS: packed["targets"]["positions"],
        features.DECODER_TASK_IDS: np.where(
            segments > 0, components[:, None], features.TASK_ID_PADDING
        ),
    }
    if "inputs" in packed:
        out[features.ENCODER_INPUT_TOKENS] = packed["inputs"]["tokens"]
        out[features.ENCODER_SEGMENT_IDS] = packed["inputs"]["segment_ids"]
        out[features.ENCODER_POSITIONS] = packed["inputs"]["positions"]
    return {key: value.astype(features.DTYPE) for key, value in out.items()}


PACK_WINDOW = 256
MAX_OPEN_ROWS = 16  # first fit among the 16 most recent rows: near-optimal and O(n)


def first_fit(lengths: np.ndarray, limits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Places examples (rows of `lengths`, one column per feature) in arrival order into the
    first of the `MAX_OPEN_ROWS` most recent packed rows where every feature still fits under
    `limits`, else into a new row.

    Returns:
      `(rows, offsets)`: each example's row index (-1 for an example whose lengths are all 0)
      and its start offset per feature (int32).
    """
    n, k = lengths.shape
    if k == 1:
        return _first_fit_1d(lengths[:, 0].tolist(), int(limits[0]))
    room = [int(x) for x in limits]
    used: list[list[int]] = []  # per row, tokens used per feature
    open_rows: list[int] = []  # rows still considered, oldest first
    rows = np.zeros(n, np.int32)
    offsets = np.zeros((n, k), np.int32)
    for i, ln in enumerate(lengths.tolist()):
        if not any(ln):
            rows[i] = -1
            continue
        for r in open_rows:
            u = used[r]
            if all(u[j] + ln[j] <= room[j] for j in range(k)):
                break
        else:
            r = len(used)
            used.append([0] * k)
            open_rows.append(r)
            if len(open_rows) > MAX_OPEN_ROWS:
                open_rows.pop(0)
        rows[i] = r
        offsets[i] = used[r]
        used[r] = [a + b for a, b in zip(used[r], ln, strict=True)]
    return rows, offsets


def _first_fit_1d(lengths: list[int], limit: int) -> tuple[np.ndarray, np.ndarray]:
    used: list[int] = []
    open_rows: list[int] = []
    rows, offsets = [], []
    for ln in lengths:
        if not ln:
            rows.append(-1)
            offsets.append(0)
            continue
        for r in open_rows:
            if used[r] + ln <= limit:
                break
        else:
            r = len(used)
            used.append(0)
            open_rows.append(r)
            if len(open_rows) > MAX_OPEN_ROWS:
                open_rows.pop(0)
        rows.append(r)
        offsets.append(used[r])
        used[r] += ln
    return np.asarray(rows, np.int32), np.asarray(offsets, np.int32).reshape(-1, 1)
