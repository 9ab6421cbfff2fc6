"""T5 span corruption of one chunk in numpy, for the by-index training input (`pipelines.prepared.batches`).

The same corruption as `pipelines.preprocessors.span_corruption` (T5's
`random_spans_noise_mask` + `noise_span_to_unique_sentinel` / `nonnoise_span_to_unique_sentinel`,
then `append_eos_after_trim`), one chunk at a time and without TensorFlow, so that training-time
input needs no TF: `round(density × length)` noise tokens in `round(noise / mean span)` spans,
alternating with as many non-noise spans and starting with a non-noise one; `inputs` keeps the
non-noise tokens with one sentinel per noise span, `targets` holds every noise span after its
sentinel; sentinels count down from the top of the vocabulary (`<extra_id_k>` = `vocab_size - 1 -
k`); EOS ends both. Randomness is a `numpy.random.Generator` the caller seeds statelessly per
example, so an example's corruption is a function of its index.

`span_corruption_lengths` and `span_raw_length` are defined here, without TensorFlow, and
`pipelines.preprocessors` (the seqio path) imports them: both paths cut chunks alike.
"""

from __future__ import annotations

import numpy as np

NOISE_DENSITY = 0.15
MEAN_NOISE_SPAN_LENGTH = 3.0


def span_corruption_lengths(
    raw_length: int,
    *,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> tuple[int, int, int]:
    """Returns `(inputs_length, targets_length, num_spans)` of a corrupted chunk of `raw_length`
    tokens, EOS included (the same arithmetic as T5's mask)."""
    length = max(raw_length, 2)
    noise = min(max(round(length * noise_density), 1), length - 1)
    spans = max(round(noise / mean_noise_span_length), 1)
    if raw_length < 2:
        return raw_length + 1, raw_length + 1, 1
    return raw_length - noise + spans + 1, noise + spans + 1, spans


def check_sentinels(
    raw_length: int,
    extra_ids: int,
    *,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> None:
    """Refuses a vocabulary with fewer sentinel (extra) ids than a corrupted chunk of
    `raw_length` tokens needs: sentinels count down from the top of the vocabulary, so without
    extra ids they would silently replace ordinary pieces. One check for the seqio preprocessor
    and the prepared reader.

    Raises:
      ValueError: `extra_ids` < the chunk's number of noise spans.
    """
    _, _, spans = span_corruption_lengths(
        raw_length, noise_density=noise_density, mean_noise_span_length=mean_noise_span_length
    )
    if extra_ids < spans:
        raise ValueError(
            f"span corruption of {raw_length}-token chunks needs {spans} sentinel ids; the "
            f"vocabulary has extra_ids={extra_ids} "
            "(use pipelines.vocab.load_vocab(..., extra_ids=100))"
        )


def span_raw_length(
    inputs_length: int,
    targets_length: int,
    *,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> int:
    """Returns the largest chunk whose corrupted inputs and targets (with EOS) fit the lengths
    (T5's `random_spans_helper`, extended to respect the targets length too).

    Raises:
      ValueError: no chunk of at least 2 tokens fits.
    """
    best = 0
    for n in range(2, 4 * (inputs_length + targets_length)):
        li, lt, _ = span_corruption_lengths(
            n, noise_density=noise_density, mean_noise_span_length=mean_noise_span_length
        )
        if li <= inputs_length and lt <= targets_length:
            best = n
        elif li > inputs_length:
            break
    if best < 2:
        raise ValueError(
            f"sequence_length inputs={inputs_length}, targets={targets_length} is too short for "
            "span corruption; allowed: lengths that fit a corrupted chunk of at least 2 tokens "
            "(e.g. inputs=512, targets=114)"
        )
    return best


def _segment_lengths(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """`num_items` split into `num_segments` random non-empty segments (uniform over the cut
    points, as T5's shuffle of segment starts)."""
    cuts = np.sort(rng.choice(num_items - 1, num_segments - 1, replace=False)) + 1
    return np.diff(np.concatenate([[0], cuts, [num_items]]))


def noise_mask(
    length: int,
    rng: np.random.Generator,
    *,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> np.ndarray:
    """T5's random spans noise mask of one chunk: `[length]` booleans, non-noise first."""
    n = max(length, 2)
    noise = min(max(round(n * noise_density), 1), n - 1)
    spans = max(round(noise / mean_noise_span_length), 1)
    noise_lengths = _segment_lengths(noise, spans, rng)
    nonnoise_lengths = _segment_lengths(n - noise, spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)
    span_index = np.repeat(np.arange(2 * spans), interleaved)
    return (span_index % 2 == 1)[:length]


def _spans_to_sentinels(tokens: np.ndarray, mask: np.ndarray, first_sentinel: int) -> np.ndarray:
    """Each run of `mask` replaced by one sentinel, counting down from `first_sentinel`."""
    prev = np.concatenate([[False], mask[:-1]])
    first = mask & ~prev
    sentinel = first_sentinel + 1 - np.cumsum(first)
    out = np.where(first, sentinel, tokens)
    return out[~(mask & prev)]


def corrupt(
    tokens: np.ndarray, *, rng: np.random.Generator, vocab_size: int, eos_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Span-corrupts one chunk: returns int32 `(inputs, targets)`, each ending with `eos_id`.

    Args:
      tokens: the raw chunk (1-D ints, no EOS).
      rng: the example's generator (seeded from the run seed and the example's index).
      vocab_size: the vocabulary size, extra ids included; sentinel k is `vocab_size - 1 - k`.
      eos_id: appended to both features.
    """
    tokens = np.asarray(tokens, np.int32)
    mask = noise_mask(len(tokens), rng)
    first = vocab_size - 1
    eos = np.array([eos_id], np.int32)
    inputs = _spans_to_sentinels(tokens, mask, first).astype(np.int32)
    targets = _spans_to_sentinels(tokens, ~mask, first).astype(np.int32)
    return np.concatenate([inputs, eos]), np.concatenate([targets, eos])
