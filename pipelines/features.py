"""The model features of a training batch, declared once (as seqio's `MODEL_FEATURES` and T5X's
`FEATURE_CONVERTER_CLS` declare them).

A decoder-only batch (a `{"targets": L}` task) holds the `DECODER_KEYS` arrays `[batch, L]`; an
encoder-decoder batch (`{"inputs": Li, "targets": Lt}`) adds the `ENCODER_KEYS` arrays
`[batch, Li]`. Every array is int32 (`DTYPE`) in seqio's packed layout: segment ids 1, 2, ... per
packed example and 0 on padding, positions restarting at 0 per segment, decoder inputs the
targets shifted right with the start id at every segment start, loss weights 1 on real target
tokens, and task ids the mixture component of every target token (`TASK_ID_PADDING` on padding).

The seqio converters (`pipelines.preprocessors`), the by-index packer
(`pipelines.prepared.packing`), the streams, the trainer's step and the benchmarks all read these
names. numpy only: TensorFlow-free processes (training hosts, the accelerator benchmark) import it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

DECODER_INPUT_TOKENS = "decoder_input_tokens"
DECODER_TARGET_TOKENS = "decoder_target_tokens"
DECODER_LOSS_WEIGHTS = "decoder_loss_weights"
DECODER_SEGMENT_IDS = "decoder_segment_ids"
DECODER_POSITIONS = "decoder_positions"
DECODER_TASK_IDS = "decoder_task_ids"
ENCODER_INPUT_TOKENS = "encoder_input_tokens"
ENCODER_SEGMENT_IDS = "encoder_segment_ids"
ENCODER_POSITIONS = "encoder_positions"

DECODER_KEYS = (
    DECODER_INPUT_TOKENS,
    DECODER_TARGET_TOKENS,
    DECODER_LOSS_WEIGHTS,
    DECODER_SEGMENT_IDS,
    DECODER_POSITIONS,
    DECODER_TASK_IDS,
)
ENCODER_KEYS = (ENCODER_INPUT_TOKENS, ENCODER_SEGMENT_IDS, ENCODER_POSITIONS)

# The dtype of every model feature.
DTYPE = np.int32
# `decoder_task_ids` of a padding token (no mixture component); every other feature pads with 0.
TASK_ID_PADDING = -1


def padding_value(key: str) -> int:
    """What feature `key` holds on a padding token or row."""
    return TASK_ID_PADDING if key == DECODER_TASK_IDS else 0


def batch_lengths(task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
    """Each batch array's row length: decoder keys take `targets`; with an `inputs` length (an
    encoder-decoder), the encoder keys take it."""
    lengths = {key: int(task_feature_lengths["targets"]) for key in DECODER_KEYS}
    if "inputs" in task_feature_lengths:
        lengths.update({key: int(task_feature_lengths["inputs"]) for key in ENCODER_KEYS})
    return lengths


def model_arrays(batch: Mapping[str, object]) -> dict[str, np.ndarray]:
    """The model features of a batch (decoder, and encoder where present) as int32 arrays
    (other keys dropped)."""
    keys = (*ENCODER_KEYS, *DECODER_KEYS)
    return {key: np.asarray(batch[key], DTYPE) for key in keys if key in batch}


def _one_document(batch_size: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    segments = np.ones((batch_size, length), DTYPE)
    positions = np.broadcast_to(np.arange(length, dtype=DTYPE), (batch_size, length)).copy()
    return segments, positions


def synthetic_batch(
    task_feature_lengths: Mapping[str, int],
    *,
    batch_size: int,
    tokens: Mapping[str, np.ndarray] | None = None,
    layouts: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    decoder_inputs: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """A batch with every position real, of the features `batch_lengths(task_feature_lengths)`
    names (benchmarks and tests; the input pipelines make real ones).

    Args:
      task_feature_lengths: `{"targets": Lt}`, plus `"inputs": Li` for an encoder-decoder.
      batch_size: rows.
      tokens: `[batch_size, length]` token ids per task feature (`"targets"`, `"inputs"`); a
        feature absent here holds zeros (with no `tokens`, a zero batch of that shape).
      layouts: `(segment ids, positions)` per task feature, for packed rows; a feature absent
        here holds one document per row (segment 1, positions 0 .. length - 1).
      decoder_inputs: the decoder input tokens; None: the targets shifted right after a 0.

    Returns:
      int32 arrays: loss weights 1 and task ids 0 everywhere.

    Raises:
      ValueError: an array whose shape is not `[batch_size, length]` of its feature.
    """
    tokens = tokens or {}
    layouts = layouts or {}
    out = {}
    for feature, (tokens_key, segments_key, positions_key) in (
        ("targets", (DECODER_TARGET_TOKENS, DECODER_SEGMENT_IDS, DECODER_POSITIONS)),
        ("inputs", (ENCODER_INPUT_TOKENS, ENCODER_SEGMENT_IDS, ENCODER_POSITIONS)),
    ):
        if feature not in task_feature_lengths:
            continue
        shape = (batch_size, int(task_feature_lengths[feature]))
        ids = tokens.get(feature, np.zeros(shape, DTYPE))
        segments, positions = layouts.get(feature) or _one_document(*shape)
        for name, array in (("tokens", ids), ("segment ids", segments), ("positions", positions)):
            if np.shape(array) != shape:
                raise ValueError(f"{feature} {name} of shape {np.shape(array)}; expected {shape}")
        out.update({tokens_key: ids, segments_key: segments, positions_key: positions})
    targets = out[DECODER_TARGET_TOKENS]
    if decoder_inputs is None:
        decoder_inputs = np.pad(targets[:, :-1], ((0, 0), (1, 0)))
    elif np.shape(decoder_inputs) != targets.shape:
        raise ValueError(
            f"decoder inputs of shape {np.shape(decoder_inputs)}; expected {targets.shape}"
        )
    out[DECODER_INPUT_TOKENS] = decoder_inputs
    out[DECODER_LOSS_WEIGHTS] = np.ones(targets.shape, DTYPE)
    out[DECODER_TASK_IDS] = np.zeros(targets.shape, DTYPE)
    return {
        key: np.asarray(out[key], DTYPE) for key in (*DECODER_KEYS, *ENCODER_KEYS) if key in out
    }
