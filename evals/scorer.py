"""Scoring token sequences with a run's checkpoint: the JAX side of the `xlscale` lm-eval model.

A request is a pair `(context_ids, continuation_ids)`: the log-likelihood of the continuation
given the context, and whether greedy decoding would produce it (lm-evaluation-harness's
`loglikelihood` contract, in tokens). Contexts begin with the start token the trainer's decoder
inputs begin with (`Scorer.start_id`, `pipelines.vocab.start_id`: 0 for the project's
vocabularies, `<s>` for a published LLaMA's), so a continuation after an empty context is scored
exactly as the first tokens of a training document, and a document scored whole equals the trainer's eval loss on it
(`modeling.models.TransformerModel.token_scores` is `score_batch`'s computation).

Requests are sorted by length (longest first, so an out-of-memory shows at once), cut into
batches of `batch_size` rows, and each batch is padded on the right to a bucket length (powers
of two up to the model's context), so few programs are compiled and little padding is scored;
`bucket=False` pads every batch to the full context, for comparison. Batches go through one
`jax.jit` sharded like the trainer's eval step (parameters as trained, batch over the
data-parallel axes). Right padding needs no mask: the attention is causal.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rundir import names, records, storage

log = logging.getLogger(__name__)

PAD_ID = 0  # padding of batch rows (weight 0; causal attention never looks right)
MIN_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What loading a run's checkpoint needs, read from its `run.json`.

    Attributes:
      model_dir: the run directory.
      model: the `trainer.model_spec.ModelSpec` it was trained as.
      vocab_path: its SentencePiece model.
      seq_len: its context length (the longest row scored).
      languages: the run's languages, target first.
    """

    model_dir: str
    model: Any
    vocab_path: str
    seq_len: int
    languages: tuple[str, ...]


def read_run_spec(model_dir: str | os.PathLike, *, vocab_path: str | None = None) -> RunSpec:
    """The model, vocabulary and context of the run in `model_dir` (its `run.json`
    fingerprint, which the trainer writes for every run).

    Raises:
      FileNotFoundError: no `run.json`, or the vocabulary file is missing (naming it and the
        `vocab_path=` model argument that overrides it).
    """
    from trainer.model_spec import ModelSpec

    if not records.has_run_json(model_dir):
        raise FileNotFoundError(f"model_dir={model_dir}: no {names.RUN_FILE} (not a run dir)")
    info = records.read_run_record(model_dir)
    fingerprint = info.fingerprint or {}
    model = fingerprint.get("model") or {"family": info.family, "size": info.model}
    spec = ModelSpec(
        family=str(model["family"]),
        size=str(model["size"]),
        overrides=dict(model.get("overrides") or {}),
        dropout_rate=model.get("dropout_rate"),
    )
    vocab = vocab_path or (fingerprint.get("data") or {}).get("vocab_path")
    if not vocab or not storage.as_path(vocab).is_file():
        raise FileNotFoundError(
            f"model_dir={model_dir}: vocabulary {vocab!r} from run.json not found; pass "
            "vocab_path=<the run's SentencePiece .model> (xlscale zeroshot --vocab-path)"
        )
    return RunSpec(
        model_dir=os.fspath(model_dir),
        model=spec,
        vocab_path=os.fspath(vocab),
        seq_len=int(info.seq_len or 0),
        languages=info.all_languages,
    )


def bucket_length(length: int, *, max_len: int, bucket: bool) -> int:
    """The padded row length of a batch whose longest row has `length` tokens: the next power
    of two (at least `MIN_BUCKET`, at most `max_len`) with `bucket`, else `max_len`."""
    if not bucket:
        return max_len
    padded = MIN_BUCKET
    while padded < length:
        padded *= 2
    return min(padded, max_len)


def request_row(
    context: Sequence[int], continuation: Sequence[int], *, max_len: int
) -> tuple[list[int], list[int], int]:
    """The model row of one request: (inputs, targets, number of scored tokens at the end).

    `context + continuation` is cut on the left to `max_len + 1` tokens (the context gives way,
    as in lm-eval's HF model); inputs are all but the last token, targets all but the first,
    and the last `len(continuation)` targets are scored.

    Raises:
      ValueError: an empty context (it must hold at least the start token) or continuation.
    """
    if not context or not continuation:
        raise ValueError(
            f"a request needs a non-empty context (at least the start token) and continuation; "
            f"got {len(context)} and {len(continuation)} tokens"
        )
    tokens = [*context, *continuation][-(max_len + 1) :]
    return tokens[:-1], tokens[1:], min(len(continuation), len(tokens) - 1)


@dataclasses.dataclass
class ScoreStats:
    """What scoring cost, for the log and the results JSON."""

    requests: int = 0
    batches: int = 0
    tokens_scored: int = 0  # real (unpadded) row tokens through the model
    tokens_padded: int = 0  # row tokens including padding
    seconds: float = 0.0
    shapes: set = dataclasses.field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        """Counts, requests per second and the padding fraction."""
        return {
            "requests": self.requests,
            "batches": self.batches,
            "tokens_scored": self.tokens_scored,
            "tokens_padded": self.tokens_padded,
            "padding_fraction": 1 - self.tokens_scored / self.tokens_padded
            if self.tokens_padded
            else 0.0,
            "seconds": round(self.seconds, 3),
            "requests_per_s": self.requests / self.seconds if self.seconds else None,
            "compiled_shapes": sorted(self.shapes),
        }


class Scorer:
    """A run's checkpoint, restored with the trainer's shardings, that scores and generates.

    Args:
      spec: the run (`read_run_spec`).
      step: the checkpoint step (None: the latest kept).
      batch_size: rows per batch (rounded up to a multiple of the data-parallel size).
      bucket: pad batches to power-of-two lengths (True) or to the full context (False).
      mesh: mesh axis sizes (`trainer.partitioning.MeshConfig`; default: data parallel).
      progress: called with a line of progress (count, rate, ETA) during long scoring.

    Raises:
      ValueError: an encoder-decoder run (its continuations are not scored this way).
    """

    def __init__(
        self,
        spec: RunSpec,
        *,
        step: int | None = None,
        batch_size: int = 16,
        bucket: bool = True,
        mesh: Any = None,
        progress: Callable[[str], None] | None = None,
    ):
        from pipelines import vocab as vocab_lib
        from trainer import restore
        from trainer.jobs import build_partitioned_model
        from trainer.partitioning import MeshConfig

        self.spec = spec
        self.wrapper, self.partitioner, abstract = build_partitioned_model(
            spec.model, mesh or MeshConfig()
        )
        if "inputs" in self.wrapper.feature_keys:
            raise ValueError(
                f"model_dir={spec.model_dir}: {spec.model.family} {spec.model.size} is an "
                "encoder-decoder; zero-shot scoring of continuations needs a decoder-only model"
            )
        self.max_len = spec.seq_len or int(self.wrapper.max_len)
        checkpoint = spec.model_dir if step is None else f"{spec.model_dir}@{int(step)}"
        restored = restore.restore_params(checkpoint, abstract_params=abstract, flag="model_dir")
        self.params, self.step = restored.params, restored.step
        # Encoded and decoded in Python: SentencePiece alone, no seqio or TensorFlow import.
        self.vocabulary = vocab_lib.load_plain_vocab(spec.vocab_path)
        self.eos_id = int(self.vocabulary.eos_id)
        self.start_id = vocab_lib.start_id(self.vocabulary)
        dp = self.partitioner.data_parallel_size
        self.rows = -(-max(1, int(batch_size)) // dp) * dp
        self.bucket = bucket
        self.progress = progress or log.info
        self.stats = ScoreStats()
        self._params_shardings = jax.tree.map(lambda a: a.sharding, abstract)
        with self.partitioner.context():
            self._score = jax.jit(
                self.wrapper.token_scores,
                in_shardings=(self._params_shardings, self.partitioner.batch_sharding()),
                out_shardings=self.partitioner.replicated(),
            )

    def encode(self, text: str) -> list[int]:
        """SentencePiece ids of `text` (no start or end token)."""
        return [int(i) for i in self.vocabulary.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`."""
        return self.vocabulary.decode([int(i) for i in ids])

    def _batch(self, rows: Sequence[tuple[list[int], list[int], int]]) -> dict[str, jax.Array]:
        length = bucket_length(
            max(len(r[0]) for r in rows), max_len=self.max_len, bucket=self.bucket
        )
        arrays = {
            "decoder_input_tokens": np.zeros((self.rows, length), np.int32),
            "decoder_target_tokens": np.zeros((self.rows, length), np.int32),
            "decoder_loss_weights": np.zeros((self.rows, length), np.int32),
        }
        for i, (inputs, targets, scored) in enumerate(rows):
            n = len(inputs)
            arrays["decoder_input_tokens"][i, :n] = inputs
            arrays["decoder_target_tokens"][i, :n] = targets
            arrays["decoder_loss_weights"][i, n - scored : n] = 1
        self.stats.tokens_scored += sum(len(r[0]) for r in rows)
        self.stats.tokens_padded += self.rows * length
        self.stats.shapes.add(length)
        sharding = self.partitioner.batch_sharding()
        return {
            key: jax.make_array_from_callback(value.shape, sharding, lambda idx, v=value: v[idx])
            for key, value in arrays.items()
        }

    def score(
        self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[tuple[float, bool]]:
        """`(log-likelihood, is_greedy)` of each `(context_ids, continuation_ids)`, in order."""
        rows = [request_row(c, x, max_len=self.max_len) for c, x in requests]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        t0 = time.monotonic()
        last_report = t0
        with self.partitioner.context():
            for start in range(0, len(order), self.rows):
                chunk = order[start : start + self.rows]
                logprob, greedy = jax.device_get(
                    self._score(self.params, self._batch([rows[i] for i in chunk]))
                )
                for j, i in enumerate(chunk):
                    out[i] = (float(logprob[j]), bool(greedy[j]))
                self.stats.batches += 1
                now = time.monotonic()
                done = start + len(chunk)
                if now - last_report > 10 and done < len(order):
                    rate = done / (now - t0)
                    self.progress(
                        f"[zeroshot] scored {done}/{len(order)} requests ({rate:.1f}/s, "
                        f"ETA {(len(order) - done) / rate:.0f} s)"
                    )
                    last_report = now
        self.stats.requests += len(rows)
        self.stats.seconds += time.monotonic() - t0
        return out  # type: ignore[return-value]

    def generate(
        self, contexts: Sequence[Sequence[int]], *, max_new_tokens: int
    ) -> list[list[int]]:
        """Greedy continuations (ids, up to and excluding EOS) of each context, through the
        model's cached decoder (`predict_batch`, as `trainer.infer` decodes). Contexts are ids
        without the start token (the decoder puts it in front); longer ones than the room left
        are cut on the left."""
        from trainer.infer import continuation_ids

        total = min(self.max_len, max(len(c) for c in contexts) + max_new_tokens)
        keep = max(1, total - max_new_tokens)
        with self.partitioner.context():
            predict = jax.jit(
                lambda p, x: self.wrapper.predict_batch(
                    p, x, max_decode_len=total, eos_id=self.eos_id, start_id=self.start_id
                ),
                in_shardings=(self._params_shardings, self.partitioner.batch_sharding()),
                out_shardings=self.partitioner.replicated(),
            )
            results = []
            for start in range(0, len(contexts), self.rows):
                chunk = [list(c)[-keep:] for c in contexts[start : start + self.rows]]
                padded = np.zeros((self.rows, total), np.int32)
                for i, ids in enumerate(chunk):
                    padded[i, : len(ids)] = ids
                batch = jax.make_array_from_callback(
                    padded.shape, self.partitioner.batch_sharding(), lambda idx, x=padded: x[idx]
                )
                out = np.asarray(jax.device_get(predict(self.params, batch)))
                for i, ids in enumerate(chunk):
                    results.append(
                        continuation_ids(out[i], prompt_len=len(ids), eos_id=self.eos_id)
                    )
        return results
