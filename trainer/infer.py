"""Inference: greedy continuations of text prompts from a checkpoint.

    python -m trainer.infer --gin_file=models/llama2.gin --gin_file=runs/infer.gin \\
        --gin.MODEL_DIR="'/runs/cpt_zh_49m'" --gin.MODEL_SIZE="'llama2_49m'" \\
        --gin.VOCAB_PATH="'/data/vocab/cpt.model'" --gin.PROMPTS="['Everyone has the right']"

Prompts are encoded without EOS and forced token by token; the model then continues greedily
until EOS or `max_decode_len` total tokens. Results, one JSON object per prompt
(`prompt`, `continuation`, `tokens`), go to `MODEL_DIR/<output_file>`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from trainer import checkpoints as ckpt_lib
from trainer import models
from trainer.partitioning import MeshConfig

INFER_FILE = "infer.jsonl"


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
                "raise infer.max_decode_len or shorten the prompt"
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


def infer(
    *,
    model_dir: str | os.PathLike,
    model: models.ModelSpec,
    vocab_path: str,
    prompts: Sequence[str] = (),
    prompts_file: str | None = None,
    checkpoint: str | None = None,
    max_decode_len: int = 64,
    batch_size: int = 8,
    output_file: str = INFER_FILE,
    mesh: MeshConfig = MeshConfig(),
) -> list[dict]:
    """Decodes continuations of `prompts` (and of each line of `prompts_file`).

    Args:
      model_dir: where the results go (`MODEL_DIR`).
      model: the model the checkpoint was trained as.
      vocab_path: SentencePiece model (`VOCAB_PATH`).
      prompts, prompts_file: the prompts.
      checkpoint: `'<dir>[@step]'` (default: `model_dir`, latest step).
      max_decode_len: total tokens per row, prompt included.
      batch_size: rows decoded together (padded to a multiple of the data-parallel size).
      output_file: file name under `model_dir`.
      mesh: mesh axis sizes.

    Returns:
      One dict per prompt: `prompt`, `continuation`, `tokens` (generated ids).
    """
    from pipelines import vocab as vocab_lib
    from trainer.setup import build_model

    texts = list(prompts)
    if prompts_file:
        texts += [line for line in Path(prompts_file).read_text().splitlines() if line.strip()]
    if not texts:
        raise ValueError("no prompts: set infer.prompts (PROMPTS) or infer.prompts_file")
    vocabulary = vocab_lib.load_vocab(vocab_path)
    wrapper, partitioner, abstract = build_model(model, mesh)
    params, _, _ = ckpt_lib.restore_init_params(
        os.fspath(checkpoint or model_dir), abstract_params=abstract
    )
    eos_id = int(vocabulary.eos_id)
    dp = partitioner.data_parallel_size
    rows = -(-batch_size // dp) * dp
    params_shardings = jax.tree.map(lambda a: a.sharding, abstract)
    with partitioner.context():
        predict = jax.jit(
            lambda p, x: wrapper.predict_batch(p, x, max_decode_len=max_decode_len, eos_id=eos_id),
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
        Path(model_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(model_dir) / output_file, "w", encoding="utf-8") as f:
            for record in results:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainer.infer --gin_file=F [--gin.KEY=VALUE ...]`."""
    from trainer import gin_entry
    from trainer import infer as lib

    config = gin_entry.parse(sys.argv[1:] if argv is None else argv, job="infer")
    gin_entry.call(lib.infer, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
