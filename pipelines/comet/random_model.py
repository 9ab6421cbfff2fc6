"""A small, randomly initialised COMET model of the real architecture, built offline.

Proves the COMET wiring (side environment, worker, 0-100 scale, reports) without downloading
Unbabel/wmt22-comet-da: the same estimator class (`comet.models.RegressionMetric`, the
`regression_metric` of wmt22-comet-da's hparams, with its Sigmoid output, sparsemax layer mix
and average pooling) on a tiny XLM-RoBERTa encoder whose SentencePiece vocabulary is trained here
on the given text. Its scores are random-weight outputs: NOT a measure of translation quality.

Runs in COMET's side environment (`make comet-env`) and imports nothing of the project:

    .comet-venv/bin/python -I pipelines/comet/random_model.py --text a.txt [b.txt ...] --out DIR

`DIR` is laid out as a downloaded COMET model, so `comet.load_from_checkpoint` reads it:
`DIR/hparams.yaml` (COMET reads the class from it), `DIR/checkpoints/model.ckpt` (a Lightning
checkpoint: state dict and hyper-parameters), `DIR/encoder/` (the encoder's `config.json` and
tokenizer, named by absolute path in the hyper-parameters' `pretrained_model`, since COMET builds
the encoder from it before loading weights), and `DIR/xlscale_random_model.json` (`RANDOM_MARKER`:
what was built, so that reports can say the scores are not meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

RANDOM_MARKER = "xlscale_random_model.json"
# The real model and the encoder its hyper-parameters name, as the hub names them.
HUB_MODEL = "Unbabel/wmt22-comet-da"
HUB_ENCODER = "xlm-roberta-large"
HUB_REVISION = "0" * 40  # any commit hash: refs/main names it
# wmt22-comet-da's hparams.yaml, except the sizes (its encoder is xlm-roberta-large, its
# feed-forward [3072, 1024]).
ESTIMATOR = {
    "activations": "Tanh",
    "batch_size": 16,
    "dropout": 0.1,
    "encoder_learning_rate": 1.0e-06,
    "encoder_model": "XLM-RoBERTa",
    "final_activation": "Sigmoid",
    "keep_embeddings_frozen": True,
    "layer": "mix",
    "layer_norm": False,
    "layer_transformation": "sparsemax",
    "layerwise_decay": 0.95,
    "learning_rate": 1.5e-05,
    "loss": "mse",
    "nr_frozen_epochs": 0.3,
    "optimizer": "AdamW",
    "pool": "avg",
    "warmup_steps": 0,
    "hidden_sizes": [64, 32],
}


def train_tokenizer(texts: list[Path], out: Path, *, vocab_size: int, max_length: int) -> int:
    """Trains a SentencePiece unigram model on `texts` and saves it as an XLM-R tokenizer.

    The piece ids follow XLM-R's SentencePiece model (`<unk>` 0, `<s>` 1, `</s>` 2), which
    `XLMRobertaTokenizerFast` maps to fairseq's ids; returns the tokenizer's vocabulary size.
    """
    import sentencepiece as spm
    from transformers import XLMRobertaTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    prefix = out / "sentencepiece.bpe"
    spm.SentencePieceTrainer.train(
        input=",".join(os.fspath(p) for p in texts),
        model_prefix=os.fspath(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    tokenizer = XLMRobertaTokenizerFast(vocab_file=f"{prefix}.model")
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(os.fspath(out))
    return len(tokenizer)


def build(
    texts: list[Path],
    out: Path,
    *,
    vocab_size: int = 400,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 2,
    max_length: int = 128,
    seed: int = 0,
) -> Path:
    """Builds the random COMET model under `out`; returns its `checkpoints/model.ckpt`.

    Args:
      texts: plain-text files the encoder's SentencePiece vocabulary is trained on.
      out: the model directory (created).
      vocab_size: SentencePiece pieces (a soft limit: small corpora may give fewer).
      hidden_size, layers, heads: the XLM-R encoder's width, depth and attention heads.
      max_length: longest input in tokens (the encoder's positions are this + 2, as XLM-R's).
      seed: torch's seed for the random weights.
    """
    import pytorch_lightning
    import torch
    import yaml
    from comet.models import RegressionMetric
    from transformers import XLMRobertaConfig

    out = out.resolve()
    encoder_dir = out / "encoder"
    vocab = train_tokenizer(texts, encoder_dir, vocab_size=vocab_size, max_length=max_length)
    XLMRobertaConfig(
        vocab_size=vocab,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden_size,
        max_position_embeddings=max_length + 2,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    ).save_pretrained(os.fspath(encoder_dir))
    torch.manual_seed(seed)
    model = RegressionMetric(
        **ESTIMATOR,
        pretrained_model=os.fspath(encoder_dir),
        load_pretrained_weights=False,
        local_files_only=True,
    )
    hparams = {**dict(model.hparams), "load_pretrained_weights": False}
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    (out / "hparams.yaml").write_text(yaml.safe_dump(hparams, sort_keys=True))
    ckpt = out / "checkpoints" / "model.ckpt"
    torch.save(
        {
            "state_dict": model.state_dict(),
            "hyper_parameters": hparams,
            "pytorch-lightning_version": pytorch_lightning.__version__,
            "epoch": 0,
            "global_step": 0,
        },
        ckpt,
    )
    marker = {
        "random_init": True,
        "what": "randomly initialised COMET (RegressionMetric, wmt22-comet-da's estimator) on a "
        "tiny XLM-R encoder: a wiring test, its scores are not a translation-quality measure",
        "seed": seed,
        "encoder": {"vocab": vocab, "hidden": hidden_size, "layers": layers, "heads": heads},
        "texts": [os.fspath(p) for p in texts],
    }
    (out / RANDOM_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return ckpt


def _snapshot(cache: Path, repo: str, files: dict[str, bytes]) -> Path:
    """Writes `files` as the Hugging Face hub cache holds a download of `repo`:
    `<cache>/models--<org>--<name>/snapshots/<revision>/...` and `refs/main` naming the revision."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / HUB_REVISION
    for name, data in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(data)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(HUB_REVISION)
    return snapshot


def as_hub_download(model_dir: Path, cache: Path) -> Path:
    """Lays out a model built by `build` as the real Unbabel/wmt22-comet-da sits offline: in the
    Hugging Face hub cache `cache` (`$HF_HUB_CACHE`, by default `~/.cache/huggingface/hub`),
    `models--Unbabel--wmt22-comet-da/snapshots/<rev>/{hparams.yaml, checkpoints/model.ckpt}` whose
    hyper-parameters name the encoder `xlm-roberta-large` (as the real checkpoint's do), and
    `models--xlm-roberta-large/snapshots/<rev>/` with that encoder's `config.json` and tokenizer
    (`sentencepiece.bpe.model`, `tokenizer.json`, ...) but no weights: COMET builds the encoder from
    its config and loads every weight from its own checkpoint. Returns the checkpoint's path (what
    `COMET_MODEL` names)."""
    import torch
    import yaml

    model_dir, cache = model_dir.resolve(), cache.resolve()
    ckpt = torch.load(
        model_dir / "checkpoints" / "model.ckpt", map_location="cpu", weights_only=False
    )
    ckpt["hyper_parameters"] = {**ckpt["hyper_parameters"], "pretrained_model": HUB_ENCODER}
    encoder = model_dir / "encoder"
    _snapshot(
        cache, HUB_ENCODER, {p.name: p.read_bytes() for p in encoder.iterdir() if p.is_file()}
    )
    hparams = yaml.safe_load((model_dir / "hparams.yaml").read_text())
    hparams["pretrained_model"] = HUB_ENCODER
    snapshot = _snapshot(
        cache,
        HUB_MODEL,
        {
            "hparams.yaml": yaml.safe_dump(hparams, sort_keys=True).encode(),
            RANDOM_MARKER: (model_dir / RANDOM_MARKER).read_bytes(),
        },
    )
    out = snapshot / "checkpoints" / "model.ckpt"
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: `--text FILE... --out DIR [--seed N]`, or `--hub-cache CACHE --from DIR` (the
    model at DIR laid out as the real wmt22-comet-da in a hub cache); prints the checkpoint's
    path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", nargs="+", type=Path, help="training text")
    parser.add_argument("--out", type=Path, help="model directory to create")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=400)
    parser.add_argument("--hub-cache", type=Path, help="a Hugging Face hub cache to lay out")
    parser.add_argument("--from", dest="source", type=Path, help="a model this script built")
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    if args.hub_cache or args.source:
        if not (args.hub_cache and args.source and (args.source / RANDOM_MARKER).is_file()):
            parser.error("--hub-cache and --from (a model directory this script built) go together")
        print(as_hub_download(args.source, args.hub_cache))
        return 0
    if not (args.text and args.out):
        parser.error("--text and --out are required")
    missing = [p for p in args.text if not p.is_file()]
    if missing:
        parser.error(f"--text: no such file: {', '.join(map(str, missing))}")
    print(build(args.text, args.out, vocab_size=args.vocab_size, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
