"""Inference from a checkpoint: continuations of text prompts (language models) or translations
(encoder-decoders).

    python -m trainer.infer --gin_file=models/llama2.gin --gin_file=runs/infer.gin \\
        --gin.MODEL_DIR="'/runs/cpt_zh_49m'" --gin.MODEL_SIZE="'llama2_49m'" \\
        --gin.VOCAB_PATH="'/data/vocab/cpt.model'" --gin.PROMPTS="['Everyone has the right']"

    python -m trainer.infer --gin_file=models/t5.gin --gin_file=runs/infer.gin \\
        --gin.MODEL_DIR="'/runs/ft'" --gin.MODEL_SIZE="'t5_770m'" --gin.TASK="'mt_en_fr'" \\
        --gin.VOCAB_PATH="'/data/vocab/mt.model'" --gin.DATA_DIR="'/data/corpora'"

Language models: prompts are encoded without EOS and forced token by token; the model then
continues greedily until EOS or `max_decode_len` total tokens. Results, one JSON object per prompt
(`prompt`, `continuation`, `tokens`), go to `MODEL_DIR/<output_file>`.

Encoder-decoders: the examples are a task's held-out split (`task`, `split`; raw text, as
`trainer.downstream` reads it), or the lines of `prompts`/`prompts_file` (`source` or
`source<TAB>reference`; with a `task`, its `translate X to Y: ` prompt is prepended to lines that
lack one). They are decoded with beam search (or greedy) into `MODEL_DIR/<output_file>`, one
`{"inputs", "target", "prediction"}` per example (`target` only where there is a reference); when
every example has a reference, `MODEL_DIR/scores.json` gets BLEU, chrF++, ROUGE-L (and COMET with
a local `comet_model`) as in `trainer.downstream`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import jax
import numpy as np
from etils import epath

from rundir import names, storage
from trainer import gin_entry, model_spec, restore
from trainer import platform as platform_lib
from trainer.partitioning import MeshConfig

INFER_FILE = names.INFER_FILE
SCORES_FILE = names.SCORES_FILE


def encode_prompts(vocabulary, prompts: Sequence[str], *, length: int) -> np.ndarray:
    """`[len(prompts), length]` int32 token ids, right-padded with 0.

    Raises:
      ValueError: a prompt leaves no room for a continuation (naming it and its length).
    """
    rows = np.zeros((len(prompts), length), np.int32)
    for i, prompt in enumerate(prompts):
        ids = list(vocabulary.encode(prompt))
        if len(ids) >= length:
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens, max_decode_len is {length}: "
                "raise InferDecoding.max_decode_len (MAX_DECODE_LEN) or shorten the prompt"
            )
        rows[i, : len(ids)] = ids
    return rows


def continuation_ids(sequence: np.ndarray, *, prompt_len: int, eos_id: int) -> list[int]:
    """The generated ids after the prompt, up to (not including) EOS or padding."""
    out = []
    for token in sequence[prompt_len:]:
        if token in (eos_id, 0):
            break
        out.append(int(token))
    return out


@dataclasses.dataclass(frozen=True)
class InferSource:
    """What to decode.

    Attributes:
      prompts: the prompts (encoder-decoders: `source[<TAB>reference]` lines).
      prompts_file: a file of more prompts, one per non-blank line.
      task: encoder-decoders: a translation task (`TASK`) whose split is decoded when no prompts
        are given, and whose prompt prefixes bare source lines.
      split: the task's split (`DECODE_SPLIT`; `validation` where the task has no such split).
      data_dir: the corpora (`DATA_DIR`) to register `task` from.
      max_examples: decode at most this many examples of the task's split.
    """

    prompts: tuple[str, ...] = ()
    prompts_file: str | None = None
    task: str | None = None
    split: str = "test"
    data_dir: str | None = None
    max_examples: int | None = None

    def __post_init__(self):
        # gin binds PROMPTS as a list; the frozen source keeps a tuple (hashable, unchanged).
        object.__setattr__(self, "prompts", tuple(self.prompts))

    def lines(self) -> list[str]:
        """`prompts` followed by the non-blank lines of `prompts_file`."""
        return _lines(self.prompts, self.prompts_file)


@dataclasses.dataclass(frozen=True)
class InferDecoding:
    """How to decode.

    Attributes:
      max_decode_len: total tokens per row, prompt included (encoder-decoders: output tokens).
      batch_size: rows decoded together (padded to a multiple of the data-parallel size).
      inputs_len: encoder-decoders: inputs are truncated to this many tokens (EOS kept).
      method: encoder-decoders: `beam` (4 beams, length penalty α 0.6) or `greedy`.
      extra_ids: sentinels appended to the vocabulary (None: 100 for encoder-decoders, as in
        span-corruption pretraining; 0 for language models).
    """

    max_decode_len: int = 64
    batch_size: int = 8
    inputs_len: int = 512
    method: str = "beam"
    extra_ids: int | None = None


def infer(
    *,
    model_dir: str | os.PathLike,
    model: model_spec.ModelSpec,
    vocab_path: str,
    source: InferSource = InferSource(),
    decoding: InferDecoding = InferDecoding(),
    checkpoint: str | None = None,
    mesh: MeshConfig = MeshConfig(),
    output_file: str = INFER_FILE,
    comet_model: str | None = None,
    comet_python: str | None = None,
    expect_platform: str | None = None,
) -> list[dict]:
    """Decodes continuations of the source's prompts, or, for an encoder-decoder, translations
    of a task's split or of the given lines; the gin-facing job (`runs/infer.gin` binds each
    argument, `source` and `decoding` whole, as `InferSource` and `InferDecoding`).

    Args:
      model_dir: where the results go (`MODEL_DIR`).
      model: the model the checkpoint was trained as.
      vocab_path: SentencePiece model (`VOCAB_PATH`).
      source: what to decode.
      decoding: how to decode.
      checkpoint: `'<dir>[@step]'` (default: `model_dir`, latest step).
      mesh: mesh axis sizes.
      output_file: file name under `model_dir`.
      comet_model: a local COMET checkpoint for `scores.json` (see `trainer.downstream`).
      comet_python: COMET's side-environment interpreter (`COMET_PYTHON`; see
        `pipelines.comet.scoring`).
      expect_platform: as in `trainer.platform.check` (`EXPECT_PLATFORM`), checked first.

    Returns:
      One dict per prompt: `prompt`, `continuation`, `tokens` (generated ids); encoder-decoders:
      `inputs`, `prediction` and `target` where known.
    """
    platform_lib.check(expect_platform)
    from pipelines import vocab as vocab_lib
    from trainer.jobs import build_partitioned_model

    wrapper, partitioner, abstract = build_partitioned_model(model, mesh)
    if "inputs" in wrapper.feature_keys:
        return _infer_encdec(
            wrapper,
            abstract,
            model_dir=storage.as_path(model_dir, name="MODEL_DIR"),
            checkpoint=os.fspath(checkpoint or model_dir),
            vocab_path=vocab_path,
            source=source,
            decoding=decoding,
            comet_model=comet_model,
            comet_python=comet_python,
            output_file=output_file,
        )
    texts = source.lines()
    if not texts:
        raise ValueError(
            "no prompts: set InferSource.prompts (PROMPTS) or InferSource.prompts_file (PROMPTS_FILE)"
        )
    max_decode_len, batch_size = decoding.max_decode_len, decoding.batch_size
    vocabulary = vocab_lib.load_vocab(vocab_path, extra_ids=decoding.extra_ids or 0)
    params = restore.restore_params(
        os.fspath(checkpoint or model_dir), abstract_params=abstract, flag="CHECKPOINT"
    ).params
    eos_id = int(vocabulary.eos_id)
    start_id = vocab_lib.start_id(vocabulary)
    dp = partitioner.data_parallel_size
    rows = -(-batch_size // dp) * dp
    params_shardings = jax.tree.map(lambda a: a.sharding, abstract)
    with partitioner.context():
        predict = jax.jit(
            lambda p, x: wrapper.predict_batch(
                p, x, max_decode_len=max_decode_len, eos_id=eos_id, start_id=start_id
            ),
            in_shardings=(params_shardings, partitioner.batch_sharding()),
            out_shardings=partitioner.replicated(),
        )
        results = []
        for start in range(0, len(texts), rows):
            chunk = texts[start : start + rows]
            tokens = encode_prompts(vocabulary, chunk, length=max_decode_len)
            padded = np.zeros((rows, max_decode_len), np.int32)
            padded[: len(chunk)] = tokens
            batch = jax.make_array_from_callback(
                padded.shape, partitioner.batch_sharding(), lambda index, x=padded: x[index]
            )
            out = np.asarray(jax.device_get(predict(params, batch)))
            for i, text in enumerate(chunk):
                prompt_len = int((tokens[i] != 0).sum())
                ids = continuation_ids(out[i], prompt_len=prompt_len, eos_id=eos_id)
                results.append(
                    {"prompt": text, "continuation": vocabulary.decode(ids), "tokens": ids}
                )
    if jax.process_index() == 0:
        out_dir = storage.as_path(model_dir, name="MODEL_DIR")
        out_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
        storage.write_text_atomic(out_dir / output_file, text)
    return results


def _lines(prompts: Sequence[str], prompts_file: str | None) -> list[str]:
    texts = list(prompts)
    if prompts_file:
        lines = storage.as_path(prompts_file).read_text(encoding="utf-8").splitlines()
        texts += [line for line in lines if line.strip()]
    return texts


def task_prompt(task: str) -> str:
    """The input prefix of translation task `mt_<src>_<tgt>` (`translate English to French: `)."""
    from pipelines import preprocessors, tasks

    parts = task.split("_")
    if len(parts) != 3 or parts[0] != "mt" or not set(parts[1:]) <= set(tasks.LANG_NAMES):
        raise ValueError(
            f"TASK = {task!r}: allowed: mt_<src>_<tgt> with languages in {sorted(tasks.LANG_NAMES)}"
        )
    return preprocessors.translation_prompt(tasks.LANG_NAMES[parts[1]], tasks.LANG_NAMES[parts[2]])


def _infer_encdec(
    wrapper,
    abstract,
    *,
    model_dir: epath.Path,
    checkpoint: str,
    vocab_path: str,
    source: InferSource,
    decoding: InferDecoding,
    comet_model: str | None,
    comet_python: str | None,
    output_file: str,
) -> list[dict]:
    """`infer` for encoder-decoders: examples, decoding, predictions file and
    `scores.json`."""
    from trainer import data as data_lib
    from trainer import downstream

    lines, task, split = source.lines(), source.task, source.split
    extra_ids = 100 if decoding.extra_ids is None else decoding.extra_ids
    decode_method = decoding.method
    if not lines and not task:
        raise ValueError("nothing to decode: set TASK (infer.task), PROMPTS or PROMPTS_FILE")
    vocabulary = data_lib.register(
        data_lib.DataConfig(
            vocab_path=vocab_path, corpora_dir=source.data_dir, extra_ids=extra_ids, pairs=None
        )
        if task and not lines
        else data_lib.DataConfig(vocab_path=None)
    )
    if vocabulary is None:
        from pipelines import vocab as vocab_lib

        vocabulary = vocab_lib.load_vocab(vocab_path, extra_ids=extra_ids)
    used_split = None
    if lines:
        prefix = task_prompt(task) if task else ""
        examples, has_target = [], True
        for line in lines:
            text, sep, target = line.partition("\t")
            has_target &= bool(sep)
            inputs = text if (not prefix or text.startswith("translate ")) else prefix + text
            examples.append(downstream.TextExample(inputs=inputs, target=target, source=text))
    else:
        used_split = downstream.held_out_split(task, split)
        examples = downstream.text_examples(
            task, split=used_split, max_examples=source.max_examples
        )
        has_target = True
    restored = restore.restore_params(checkpoint, abstract_params=abstract, flag="CHECKPOINT")
    params, directory, step = restored.params, restored.directory, restored.step
    predictions = downstream.predict_texts(
        wrapper,
        params,
        vocabulary,
        [ex.inputs for ex in examples],
        inputs_len=decoding.inputs_len,
        max_decode_len=decoding.max_decode_len,
        method=decode_method,
        batch_size=decoding.batch_size,
    )
    results = []
    for ex, prediction in zip(examples, predictions, strict=True):
        record = {names.PREDICTION_INPUTS: ex.inputs, names.PREDICTION_OUTPUT: prediction}
        if has_target:
            record[names.PREDICTION_TARGET] = ex.target
        results.append(record)
    if jax.process_index() == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
        storage.write_text_atomic(model_dir / output_file, text)
        if has_target and examples:
            scores = downstream.score(
                task or "",
                examples,
                predictions,
                comet_model=comet_model,
                comet_python=comet_python,
            )
            summary = {
                "task": task,
                "split": used_split,
                "checkpoint": os.fspath(directory),
                "step": step,
                "examples": len(examples),
                "decode_method": decode_method,
                **scores,
            }
            storage.write_text_atomic(model_dir / SCORES_FILE, json.dumps(summary, indent=2) + "\n")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainer.infer --gin_file=F [--gin_file=...] [--gin.KEY=VALUE ...]`."""
    return gin_entry.run("infer", argv)


if __name__ == "__main__":
    gin_entry.main("infer")
