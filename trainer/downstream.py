"""Downstream evaluation of encoder-decoders: decode a task's held-out split, score, keep predictions.

The MT paper scores each finetuned checkpoint by translation quality (BLEU, ROUGE, COMET) next to
the downstream cross-entropy. Here, at the end of a finetuning run (and every `period` steps if
asked), each task of `DecodeConfig.tasks` is decoded on its held-out split:

- examples: the raw text of the split in file order (the first `max_examples`; the task's own
  preprocessors up to tokenisation, so `inputs` carry the `translate English to French: ` prompt
  and `target` is the untokenised reference, not a SentencePiece round trip);
- inputs are tokenised with the task's vocabulary, EOS appended, truncated to the `inputs` feature
  length, and decoded in fixed-size batches (one compiled program per run shape) by the model's
  `predict_batch`: T5X beam search (4 beams, length penalty α 0.6) or greedy;
- predictions are detokenised and scored against the references with `pipelines.text_metrics`:
  sacreBLEU BLEU (`13a`; `zh` for Chinese targets) with its brevity penalty and 1-4-gram
  precisions (`pipelines.text_metrics.BLEU_PARTS`, the MT paper's Remark 2), chrF++, Unicode-aware
  ROUGE-L, all 0-100; COMET only when a local COMET checkpoint is configured (`COMET_MODEL`), on
  the MT paper's 0-100 scale (COMET's system score × 100), computed in COMET's own environment
  (`COMET_PYTHON`, `make comet-env`; `pipelines.comet.scoring`);
- `MODEL_DIR/predictions/<task>_<step>.jsonl` gets one `{"inputs", "target", "prediction"}`
  object per example.

Metric keys are `eval/<task>/bleu`, `eval/<task>/bleu_bp`, `eval/<task>/bleu_p1` ... `bleu_p4`,
`eval/<task>/bleu_sys_len`, `eval/<task>/bleu_ref_len`, `eval/<task>/chrf`, `eval/<task>/rouge_l`,
`eval/<task>/comet` (and `eval/<task>/decoded`, the number of examples); `fitting` reads them. The
split is `test` (the held-out Debian/WMT test set) and falls back to `validation` for tasks
without one; the cross-entropy `eval/<task>/loss` comes from `trainer.eval` on `validation`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from pipelines.comet import scoring as comet_scoring
from rundir import names, storage

log = logging.getLogger(__name__)

PREDICTIONS_SUBDIR = names.PREDICTIONS_SUBDIR
DECODE_METHODS = ("greedy", "beam")
_MT_TASK = re.compile(r"^mt_([a-z]{2})_([a-z]{2})$")
_EXAMPLES: dict[tuple, list[TextExample]] = {}
_COMET_HINT_LOGGED = False


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Which tasks to decode and score, how, and on what.

    Attributes:
      tasks: inputs/targets tasks to decode (`DECODE_TASKS`; the finetuning task).
      split: the held-out split to score on (`DECODE_SPLIT`); tasks without it use `validation`.
      method: `beam` (T5X beam search) or `greedy` (`DECODE_METHOD`).
      num_decodes: beams (beam search only).
      alpha: length-penalty exponent `((5 + len) / 6) ** alpha` (GNMT's; T5X names it
        `brevity_penalty`, unrelated to BLEU's brevity penalty; beam search only).
      max_examples: decode at most this many examples per task, in file order
        (`EVAL_DECODE_MAX_EXAMPLES`; None: the whole split). Caps the CPU cost of beam search.
      batch_size: examples decoded together (the last batch is padded, so one program serves all).
      max_decode_len: longest output in tokens (None: the `targets` feature length).
      period: also decode at eval steps that are multiples of this (0: only at the last step).
      comet_model: path of a local COMET checkpoint (`COMET_MODEL`, e.g. `.../checkpoints/
        model.ckpt` of Unbabel/wmt22-comet-da); None: no COMET. Nothing is ever downloaded: the
        Hugging Face hub is offline in COMET's process.
      comet_python: the interpreter of COMET's side environment (`COMET_PYTHON`; None:
        `$COMET_PYTHON`, else `.comet-venv/bin/python`, built by `make comet-env`).
    """

    tasks: Sequence[str] = ()
    split: str = "test"
    method: str = "beam"
    num_decodes: int = 4
    alpha: float = 0.6
    max_examples: int | None = None
    batch_size: int = 32
    max_decode_len: int | None = None
    period: int = 0
    comet_model: str | None = None
    comet_python: str | None = None

    def __post_init__(self):
        if self.method not in DECODE_METHODS:
            raise ValueError(
                f"DECODE_METHOD = {self.method!r} (downstream.DecodeConfig.method); "
                f"allowed: {', '.join(map(repr, DECODE_METHODS))}"
            )
        if self.max_examples is not None and self.max_examples <= 0:
            raise ValueError(
                f"EVAL_DECODE_MAX_EXAMPLES = {self.max_examples}: allowed: a positive number or None"
            )
        if self.batch_size <= 0 or self.num_decodes <= 0:
            raise ValueError("DecodeConfig.batch_size and num_decodes must be positive")


@dataclasses.dataclass(frozen=True)
class TextExample:
    """One held-out example as text: the model's input (prompt included), the reference, and
    the bare source sentence (for COMET)."""

    inputs: str
    target: str
    source: str


def target_lang(task: str) -> str:
    """The target language of `mt_<src>_<tgt>` (BLEU's tokenizer depends on it); `en` for other
    task names."""
    match = _MT_TASK.match(task)
    return match.group(2) if match else "en"


def held_out_split(task: str, split: str) -> str:
    """`split` if the task has it, else `validation` (logged)."""
    import seqio

    splits = seqio.get_mixture_or_task(task).splits
    if split in splits:
        return split
    if "validation" in splits:
        log.info("task %s has no %r split: scoring on 'validation'", task, split)
        return "validation"
    raise ValueError(f"task {task!r} has neither a {split!r} nor a 'validation' split: {splits}")


def text_examples(task: str, *, split: str, max_examples: int | None) -> list[TextExample]:
    """The first `max_examples` examples of a task's split as raw text, in file order.

    Runs the task's preprocessors up to (not including) tokenisation, so the texts are exactly
    what the model is trained to read and write; examples with an empty side are dropped, as
    tokenisation drops them in training. Memoised per process (by task, source and split).
    """
    import seqio

    from pipelines import preprocessors as prep

    provider = seqio.get_mixture_or_task(task)
    key = (task, repr(provider.source), split, max_examples)
    if key in _EXAMPLES:
        return _EXAMPLES[key]
    ds = provider.source.get_dataset(split=split, shuffle=False)
    for preprocessor in provider.preprocessors:
        if getattr(preprocessor, "func", preprocessor) is prep.tokenize:
            break
        ds = preprocessor(ds)
    out = []
    for ex in ds.as_numpy_iterator():
        inputs = ex["inputs"].decode("utf-8")
        target = ex["targets"].decode("utf-8")
        if not inputs.strip() or not target.strip():
            continue
        out.append(
            TextExample(inputs=inputs, target=target, source=comet_scoring.source_of(inputs))
        )
        if max_examples is not None and len(out) >= max_examples:
            break
    _EXAMPLES[key] = out
    return out


def encode_inputs(vocabulary, texts: Sequence[str], *, length: int) -> np.ndarray:
    """`[len(texts), length]` int32 encoder inputs: tokens then EOS, truncated to `length` with
    EOS kept last (seqio's `append_eos_after_trim`), 0-padded."""
    rows = np.zeros((len(texts), length), np.int32)
    eos = int(vocabulary.eos_id)
    for i, text in enumerate(texts):
        ids = list(vocabulary.encode(text))[: length - 1] + [eos]
        rows[i, : len(ids)] = ids
    return rows


def decode_outputs(vocabulary, tokens: np.ndarray) -> list[str]:
    """Detokenises decoder outputs `[n, L]`: ids up to the first EOS (or 0), sentinel ids as
    SentencePiece's unknown piece."""
    eos = int(vocabulary.eos_id)
    texts = []
    for row in np.asarray(tokens):
        stop = np.flatnonzero((row == eos) | (row == 0))
        ids = row[: stop[0]] if stop.size else row
        texts.append(vocabulary.decode([int(i) for i in ids]))
    return texts


def predict_texts(
    model: Any,
    params: Any,
    vocabulary,
    texts: Sequence[str],
    *,
    inputs_len: int,
    max_decode_len: int,
    method: str = "beam",
    num_decodes: int = 4,
    alpha: float = 0.6,
    batch_size: int = 32,
) -> list[str]:
    """Decodes `texts` with `model.predict_batch` in batches of `batch_size` rows (the last one
    padded with empty rows) and returns the detokenised predictions."""
    inputs = encode_inputs(vocabulary, texts, length=inputs_len)
    eos = int(vocabulary.eos_id)
    outputs = []
    for start in range(0, len(texts), batch_size):
        chunk = np.zeros((batch_size, inputs_len), np.int32)
        rows = inputs[start : start + batch_size]
        chunk[: len(rows)] = rows
        tokens = model.predict_batch(
            params,
            chunk,
            max_decode_len=max_decode_len,
            eos_id=eos,
            method=method,
            num_decodes=num_decodes,
            alpha=alpha,
        )
        outputs.append(np.asarray(jax.device_get(tokens))[: len(rows)])
    if not outputs:
        return []
    return decode_outputs(vocabulary, np.concatenate(outputs))


def comet_score(
    model_path: str,
    *,
    sources: Sequence[str],
    predictions: Sequence[str],
    targets: Sequence[str],
    comet_python: str | None = None,
) -> float:
    """System-level COMET of a local checkpoint on the MT paper's 0-100 scale (COMET's own system
    score × 100, as the paper's Figs. 1 and 7 plot it).

    COMET runs in its own environment (`make comet-env`; `pipelines.comet.scoring`), as a
    subprocess with the Hugging Face hub offline, so that neither torch nor COMET's pins enter
    this process and nothing is downloaded.

    Args:
      model_path: `COMET_MODEL`, a local `<model dir>/checkpoints/model.ckpt`.
      sources, predictions, targets: aligned source sentences, translations and references.
      comet_python: `COMET_PYTHON` (None: `$COMET_PYTHON`, else `.comet-venv/bin/python`).

    Raises:
      FileNotFoundError: no file at `model_path` (names COMET_MODEL).
      pipelines.comet.scoring.CometError: no side environment (names COMET_PYTHON and `make
        comet-env`), or COMET failed (its last stderr lines).
    """
    return comet_scoring.score(
        model_path,
        sources=sources,
        predictions=predictions,
        targets=targets,
        python=comet_python,
    ).system


def score(
    task: str,
    examples: Sequence[TextExample],
    predictions: Sequence[str],
    *,
    comet_model: str | None = None,
    comet_python: str | None = None,
) -> dict[str, float]:
    """`{"bleu", "chrf", "rouge_l"}` (0-100) and BLEU's parts (`text_metrics.BLEU_PARTS`) of
    `predictions` against the examples' targets, plus `"comet"` (0-100) when `comet_model` is given
    (a clear one-time log line says how otherwise), scored with `comet_python`'s COMET
    (`comet_score`). A task with its own metrics (`text_metrics.task_scorer`: SuperGLUE) gets
    those instead."""
    from pipelines import text_metrics

    global _COMET_HINT_LOGGED
    targets = [ex.target for ex in examples]
    own = text_metrics.task_scorer(task)  # e.g. SuperGLUE's official metrics
    if own is not None:
        return own([ex.inputs for ex in examples], targets, list(predictions))
    out = {
        **text_metrics.bleu_parts(targets, predictions, target_lang=target_lang(task)),
        "chrf": text_metrics.chrf_pp(targets, predictions),
        "rouge_l": text_metrics.rouge_l(targets, predictions),
    }
    if comet_model:
        out["comet"] = comet_score(
            comet_model,
            sources=[ex.source for ex in examples],
            predictions=predictions,
            targets=targets,
            comet_python=comet_python,
        )
    elif not _COMET_HINT_LOGGED:
        _COMET_HINT_LOGGED = True
        log.info(
            "COMET not computed: no local COMET model. To add eval/<task>/comet, run `make "
            "comet-env` and pass --gin.COMET_MODEL=\"'/path/to/checkpoints/model.ckpt'\" "
            "(e.g. Unbabel/wmt22-comet-da, fetched on a machine with network access; README, "
            "COMET)."
        )
    return out


def write_predictions(
    model_dir: str | os.PathLike,
    task: str,
    step: int,
    examples: Sequence[TextExample],
    predictions: Sequence[str],
) -> epath.Path:
    """Writes `MODEL_DIR/predictions/<task>_<step>.jsonl` (`inputs`, `target`, `prediction`)."""
    directory = storage.as_path(model_dir, name="MODEL_DIR") / PREDICTIONS_SUBDIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / names.predictions_file(task, step)
    lines = (
        json.dumps(
            {
                names.PREDICTION_INPUTS: ex.inputs,
                names.PREDICTION_TARGET: ex.target,
                names.PREDICTION_OUTPUT: p,
            },
            ensure_ascii=False,
        )
        for ex, p in zip(examples, predictions, strict=True)
    )
    storage.write_text_atomic(path, "".join(line + "\n" for line in lines))
    return path


def evaluate(
    model: Any,
    params: Any,
    config: DecodeConfig,
    *,
    feature_lengths: Mapping[str, int],
    step: int,
    model_dir: str | os.PathLike | None,
) -> dict[str, float | int]:
    """Decodes and scores every task of `config`; writes the predictions files (chief only).

    Args:
      model: an encoder-decoder wrapper (`modeling.models.EncoderDecoderModel`).
      params: its parameters.
      config: tasks, split, decoding method and caps.
      feature_lengths: `{"inputs": Li, "targets": Lt}`: inputs are truncated to Li; outputs are
        at most `config.max_decode_len` or Lt tokens.
      step: the training step (names the predictions file).
      model_dir: where `predictions/` goes (None: nothing written).

    Returns:
      `eval/<task>/{bleu,<BLEU_PARTS>,chrf,rouge_l[,comet],decoded}` for every task.

    Raises:
      ValueError: the model has no encoder (`inputs` feature).
    """
    import seqio

    if "inputs" not in model.feature_keys or "inputs" not in feature_lengths:
        raise ValueError(
            f"decoding evaluation (DECODE_TASKS = {list(config.tasks)}) needs an encoder-decoder "
            f"with an 'inputs' feature length; got {model.family} with {dict(feature_lengths)}"
        )
    out: dict[str, float | int] = {}
    for task in config.tasks:
        split = held_out_split(task, config.split)
        examples = text_examples(task, split=split, max_examples=config.max_examples)
        vocabulary = seqio.get_mixture_or_task(task).output_features["targets"].vocabulary
        predictions = predict_texts(
            model,
            params,
            vocabulary,
            [ex.inputs for ex in examples],
            inputs_len=int(feature_lengths["inputs"]),
            max_decode_len=int(config.max_decode_len or feature_lengths["targets"]),
            method=config.method,
            num_decodes=config.num_decodes,
            alpha=config.alpha,
            batch_size=config.batch_size,
        )
        scores = score(
            task,
            examples,
            predictions,
            comet_model=config.comet_model,
            comet_python=config.comet_python,
        )
        out.update({f"eval/{task}/{name}": value for name, value in scores.items()})
        out[f"eval/{task}/decoded"] = len(examples)
        if model_dir is not None and jax.process_index() == 0:
            write_predictions(model_dir, task, step, examples, predictions)
        log.info(
            "step %d %s (%s, %d examples, %s): %s",
            step,
            task,
            split,
            len(examples),
            config.method,
            ", ".join(f"{k} {v:.2f}" for k, v in scores.items()),
        )
    return out


def due(config: DecodeConfig | None, *, step: int, final: bool) -> bool:
    """Whether decoding runs at an eval step: at the last step, and every `period` steps."""
    if config is None or not config.tasks:
        return False
    return final or bool(config.period and step % config.period == 0)
