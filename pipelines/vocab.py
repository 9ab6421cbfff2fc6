"""SentencePiece vocabularies with T5 ids, trained on a weighted multilingual sample.

A vocabulary is two files side by side (docs/interfaces.md, "Data on disk"):

- `<prefix>.model`: a SentencePiece model with T5's special ids (pad 0, eos 1, unk 2, no bos),
  byte fallback (so every string round-trips, including characters never seen in training) and
  identity normalisation (what you encode is what you decode);
- `<prefix>.json`: the training settings, the per-language sample that went in, and the measured
  *tokens per character* of every language on its held-out validation text. The CPT paper notes
  that LLaMA2's tokenizer over-slices Chinese; this number is how we see the same effect here.

Training is deterministic for given corpora, settings and seed: the sample is drawn by a seeded
`random.Random`, fed in a fixed order, SentencePiece's own generator is seeded, and the thread
count is a constant (the unigram EM sums per-thread statistics, so it is part of the result).

Sample weighting. `lang_weights` are fractions of *characters* in the sample (default: equal).
Each language's lines are shuffled by the seed and language `l` gets
`n_l ∝ weight_l / mean_chars_per_line_l` lines, scaled so that the whole sample has at most
`max_sentences` lines; a language with fewer lines than its share contributes all it has (the
JSON records what each language actually contributed).

Character coverage is 0.9995 with Chinese and 1.0 without (as T5/mT5). A vocabulary too small
for the characters of its sample (SentencePiece needs a piece for each required character)
trains on a sample restricted to its most frequent characters, at most half of the non-byte
pieces (`limit_alphabet`); the others are encoded as bytes. This is what lets a 512-piece CPU
vocabulary cover all six languages; the JSON records what was left out.

This module imports only SentencePiece at load time; `load_vocab` imports seqio (and so
TensorFlow) when called. `vocab_info` reads what a run on prepared data needs of a vocabulary
(ids, size, sha256) with SentencePiece alone.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import json
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from pipelines.corpora import paths
from rundir import storage

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# Special-id layouts `load_vocab` accepts, as (pad, eos, unk) ids. `train_vocab` writes T5's;
# LLaMA's `tokenizer.model` (unk 0, bos 1, eos 2, no pad) lets a published checkpoint keep its
# own vocabulary. seqio pads with 0 and masks the loss where targets are 0, so with
# LLaMA's layout id 0 (`<unk>`, which byte fallback makes rare) doubles as padding; its `<s>` is
# the start token that targets are shifted behind (`start_id`).
ID_LAYOUTS: dict[str, tuple[int, int, int]] = {"t5": (PAD_ID, EOS_ID, UNK_ID), "llama": (-1, 2, 0)}
MODEL_TYPES = ("unigram", "bpe")
DEFAULT_MAX_SENTENCES = 300_000
# Fixed, not os.cpu_count(): the unigram trainer's result depends on how work is split.
NUM_THREADS = 4
# SentencePiece skips longer lines by default (4192 bytes); our paragraphs can be long.
MAX_SENTENCE_BYTES = 1 << 16
NUM_META_PIECES = 3 + 256  # pad, eos, unk and the byte-fallback pieces


def default_character_coverage(langs: Sequence[str]) -> float:
    """Returns 0.9995 when Chinese is among `langs` (thousands of rare Han characters), else 1.0."""
    return 0.9995 if "zh" in langs else 1.0


def limit_alphabet(lines: Sequence[str], *, max_chars: int) -> tuple[list[str], dict[str, int]]:
    """Keeps the `max_chars` most frequent characters of the sample and deletes the others.

    A tiny vocabulary cannot hold the ~500 Han characters that 0.9995 coverage of Chinese needs
    (SentencePiece refuses coverage below 0.98), so the rarest characters are taken out of the
    *training sample*; when encoding, they fall back to bytes.

    Returns:
      `(lines, stats)` with `stats = {"distinct_chars", "kept_chars", "removed_occurrences"}`.
    """
    counts = collections.Counter("".join(lines))
    counts.pop(" ", None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    stats = {"distinct_chars": len(ranked), "kept_chars": len(ranked), "removed_occurrences": 0}
    if len(ranked) <= max_chars:
        return list(lines), stats
    removed = {ch for ch, _ in ranked[max_chars:]}
    table = str.maketrans(dict.fromkeys(removed))
    stats["kept_chars"] = max_chars
    stats["removed_occurrences"] = sum(c for ch, c in ranked[max_chars:])
    return [line.translate(table) for line in lines], stats


def _read_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def sample_training_lines(
    *,
    corpora_dir: str | os.PathLike,
    langs: Sequence[str],
    lang_weights: Mapping[str, float] | None = None,
    seed: int = 0,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Draws the weighted multilingual training sample from `mono/<lang>/train.txt`.

    Args:
      corpora_dir: the `corpora/` directory of the on-disk layout.
      langs: languages to include.
      lang_weights: fraction of characters per language (normalised; default equal).
      seed: seed of the line shuffle.
      max_sentences: upper bound on the number of lines in the sample.

    Returns:
      `(lines, stats)`: the sample (languages interleaved in a seeded order) and, per language,
      `{"weight", "lines", "chars", "available_lines"}`.
    """
    weights = {lang: 1.0 for lang in langs} if lang_weights is None else dict(lang_weights)
    missing = [lang for lang in langs if lang not in weights]
    if missing:
        raise ValueError(f"lang_weights has no weight for {missing}")
    total_w = sum(weights[lang] for lang in langs)
    if total_w <= 0:
        raise ValueError("lang_weights must have a positive sum")
    rng = random.Random(seed)
    pools: dict[str, list[str]] = {}
    for lang in langs:
        lines = _read_lines(paths.mono_file(corpora_dir, lang, "train"))
        if not lines:
            raise FileNotFoundError(
                f"no training text for {lang!r} in {paths.mono_file(corpora_dir, lang, 'train')}"
            )
        rng.shuffle(lines)
        pools[lang] = lines
    # Lines per language proportional to weight / mean line length (so that chars ∝ weight).
    mean_chars = {lang: sum(map(len, pools[lang])) / len(pools[lang]) for lang in langs}
    raw = {lang: weights[lang] / total_w / mean_chars[lang] for lang in langs}
    scale = max_sentences / sum(raw.values())
    stats: dict[str, dict[str, Any]] = {}
    sample: list[str] = []
    for lang in langs:
        n = min(len(pools[lang]), max(1, round(raw[lang] * scale)))
        taken = pools[lang][:n]
        sample.extend(taken)
        stats[lang] = {
            "weight": weights[lang] / total_w,
            "lines": n,
            "chars": sum(map(len, taken)),
            "available_lines": len(pools[lang]),
        }
    rng.shuffle(sample)
    return sample, stats


def tokens_per_char(
    processor: spm.SentencePieceProcessor, texts: Sequence[str]
) -> dict[str, float | int]:
    """Measures how finely `processor` slices `texts`.

    Returns:
      `{"tokens_per_char", "tokens", "chars", "byte_fallback_fraction"}` where tokens exclude EOS
      and byte_fallback_fraction is the share of tokens that are raw-byte pieces.
    """
    tokens = processor.encode(list(texts))
    n_tokens = sum(len(t) for t in tokens)
    n_chars = sum(len(t) for t in texts)
    n_bytes = sum(1 for ids in tokens for i in ids if processor.is_byte(i))
    return {
        "tokens_per_char": n_tokens / max(n_chars, 1),
        "tokens": n_tokens,
        "chars": n_chars,
        "byte_fallback_fraction": n_bytes / max(n_tokens, 1),
    }


def train_vocab(
    *,
    corpora_dir: str | os.PathLike,
    langs: Sequence[str],
    out_prefix: str | os.PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    lang_weights: Mapping[str, float] | None = None,
    seed: int = 0,
    character_coverage: float | None = None,
    max_sentences: int = DEFAULT_MAX_SENTENCES,
) -> Path:
    """Trains a SentencePiece vocabulary with T5 ids and writes `<out_prefix>.{model,json}`.

    Args:
      corpora_dir: the `corpora/` directory (reads `mono/<lang>/{train,validation}.txt`).
      langs: languages of the sample, e.g. `("en", "zh")`.
      out_prefix: output path without extension.
      vocab_size: number of pieces, including pad/eos/unk and the 256 byte-fallback pieces.
      model_type: `"unigram"` or `"bpe"`.
      lang_weights: fraction of sample characters per language (default equal).
      seed: seed of the sample and of SentencePiece's generator.
      character_coverage: default 0.9995 when `zh` is in `langs`, else 1.0.
      max_sentences: upper bound on sample lines.

    Returns:
      The path of the written `.model` file.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    langs = list(langs)
    if vocab_size < NUM_META_PIECES + 16:
        raise ValueError(f"vocab_size must be at least {NUM_META_PIECES + 16} (byte fallback)")
    lines, sample_stats = sample_training_lines(
        corpora_dir=corpora_dir,
        langs=langs,
        lang_weights=lang_weights,
        seed=seed,
        max_sentences=max_sentences,
    )
    coverage = (
        default_character_coverage(langs) if character_coverage is None else character_coverage
    )
    lines, alphabet = limit_alphabet(lines, max_chars=(vocab_size - NUM_META_PIECES) // 2)
    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "character_coverage": coverage,
        "pad_id": PAD_ID,
        "eos_id": EOS_ID,
        "unk_id": UNK_ID,
        "bos_id": -1,
        "byte_fallback": True,
        "split_digits": True,
        "normalization_rule_name": "identity",
        "max_sentence_length": MAX_SENTENCE_BYTES,
        "num_threads": NUM_THREADS,
        "shuffle_input_sentence": False,
        "input_sentence_size": 0,
    }
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, minloglevel=2, **settings
    )
    out_prefix = Path(out_prefix)
    model_path = out_prefix.with_name(out_prefix.name + ".model")
    storage.write_bytes(model_path, model.getvalue())

    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    measured = {}
    for lang in langs:
        texts = _read_lines(paths.mono_file(corpora_dir, lang, "validation"))
        source = "validation"
        if not texts:
            texts, source = _read_lines(paths.mono_file(corpora_dir, lang, "train")), "train"
        measured[lang] = {**tokens_per_char(processor, texts), "measured_on": source}
    info = {
        "model": model_path.name,
        "model_sha256": hashlib.sha256(model.getvalue()).hexdigest(),
        "langs": langs,
        "seed": seed,
        "max_sentences": max_sentences,
        "settings": settings,
        "sample": sample_stats,
        "alphabet": alphabet,
        "tokens_per_char": {lang: m["tokens_per_char"] for lang, m in measured.items()},
        "measurements": measured,
        "corpora_dir": str(corpora_dir),
    }
    json_path = out_prefix.with_name(out_prefix.name + ".json")
    storage.write_bytes(
        json_path,
        (json.dumps(info, ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode("utf-8"),
    )
    return model_path


def read_vocab_info(model_path: str | os.PathLike) -> dict[str, Any]:
    """Returns the JSON written beside `model_path` by `train_vocab`."""
    return json.loads(Path(model_path).with_suffix(".json").read_text(encoding="utf-8"))


def start_id(vocabulary) -> int:
    """The decoder's start token for `vocabulary`: its BOS where it has one (LLaMA's `<s>`, 1:
    a published LLaMA saw it in front of every document), else 0 (T5X's shift-right token, which
    is also the padding id). Training batches put it at every segment start, decoding in front of
    the prompt, and zero-shot scoring in front of every context. `vocabulary` is a seqio
    vocabulary or a `VocabInfo`."""
    if isinstance(vocabulary, VocabInfo):
        return vocabulary.start_id
    bos = int(vocabulary.tokenizer.bos_id())
    return bos if bos >= 0 else 0


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """What a reader of prepared data needs of a vocabulary, read without seqio or TensorFlow
    (`vocab_info`); the attributes a seqio vocabulary has by the same names agree with it.

    Attributes:
      path: the `.model` file as given (`VOCAB_PATH`).
      sha256: hex sha256 of its bytes (what a prepared manifest records as `vocab_hash`).
      vocab_size: SentencePiece pieces plus `extra_ids` (seqio's `vocab_size`).
      extra_ids: sentinel ids appended at the top.
      eos_id, pad_id, unk_id, bos_id: the model's special ids (-1 where it has none).
    """

    path: str
    sha256: str
    vocab_size: int
    extra_ids: int
    eos_id: int
    pad_id: int
    unk_id: int
    bos_id: int

    @property
    def start_id(self) -> int:
        """The decoder's start token (`start_id`): BOS where the model has one, else 0."""
        return self.bos_id if self.bos_id >= 0 else 0


def _check_layout(model_path, tok) -> None:
    """VocabularyFileError unless the model's pad/eos/unk ids are one of `ID_LAYOUTS`."""
    ids = (tok.pad_id(), tok.eos_id(), tok.unk_id())
    if ids not in ID_LAYOUTS.values():
        allowed = "; ".join(f"{name} {v[0]}/{v[1]}/{v[2]}" for name, v in ID_LAYOUTS.items())
        raise VocabularyFileError(
            f"{model_path}: special ids pad/eos/unk = {ids[0]}/{ids[1]}/{ids[2]} are no known "
            f"layout; allowed: {allowed}"
        )


def _unusable(model_path, e: Exception) -> VocabularyFileError:
    return VocabularyFileError(
        f"{os.fspath(model_path)}: not a SentencePiece model ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else 'unreadable'}); the file is damaged or of "
        "another kind"
    )


def _read_model(model_path) -> tuple[bytes, spm.SentencePieceProcessor]:
    """The model's bytes and its SentencePiece processor, read with SentencePiece alone;
    VocabularyFileError when it is no SentencePiece model or has no known id layout."""
    data = Path(local_model_file(model_path)).read_bytes()
    try:
        tok = spm.SentencePieceProcessor(model_proto=data)
    except Exception as e:  # protobuf's DecodeError, SentencePiece's RuntimeError/OSError
        raise _unusable(model_path, e) from e
    _check_layout(model_path, tok)
    return data, tok


def vocab_info(model_path: str | os.PathLike, *, extra_ids: int = 0) -> VocabInfo:
    """The ids, size and sha256 of a SentencePiece model, read with SentencePiece alone: what a
    run on prepared data needs (start, EOS, size, sentinels), without the seqio vocabulary and
    the TensorFlow it brings. Agrees with `load_vocab(model_path, extra_ids=...)`.

    Raises:
      VocabularyFileError: as `load_vocab` (not a SentencePiece model, or no known id layout).
    """
    data, tok = _read_model(model_path)
    return VocabInfo(
        path=os.fspath(model_path),
        sha256=hashlib.sha256(data).hexdigest(),
        vocab_size=int(tok.get_piece_size()) + int(extra_ids),
        extra_ids=int(extra_ids),
        eos_id=int(tok.eos_id()),
        pad_id=int(tok.pad_id()),
        unk_id=int(tok.unk_id()),
        bos_id=int(tok.bos_id()),
    )


class PlainVocabulary:
    """A SentencePiece model read with SentencePiece alone, with the Python side of the seqio
    vocabulary `load_vocab` returns without sentinels (`encode`, `decode`, `eos_id`, `unk_id`,
    `vocab_size`, `tokenizer`): for work that encodes and decodes text in Python and builds no
    tf.data pipeline (zero-shot scoring of decoder-only models), which then imports neither
    seqio nor TensorFlow (~4 s of a process's start). Its ids and texts are seqio's: `decode`
    reads an id at or past the pieces as UNK and stops after the first EOS, as
    `seqio.Vocabulary.decode` does."""

    extra_ids = 0

    def __init__(self, tokenizer: spm.SentencePieceProcessor):
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_id())
        self.unk_id = int(tokenizer.unk_id())
        self.vocab_size = int(tokenizer.get_piece_size())

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (no EOS), as seqio's `encode`."""
        return list(self.tokenizer.EncodeAsIds(text))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` up to and with the first EOS, as seqio's `decode`."""
        pieces = self.tokenizer.get_piece_size()
        clean = [self.unk_id if int(i) >= pieces else int(i) for i in ids]
        if self.eos_id in clean:
            clean = clean[: clean.index(self.eos_id) + 1]
        return self.tokenizer.DecodeIds(clean)


def load_plain_vocab(model_path: str | os.PathLike) -> PlainVocabulary:
    """`load_vocab` (no sentinels) without seqio or TensorFlow (`PlainVocabulary`), with the
    same checks.

    Raises:
      VocabularyFileError: as `load_vocab` (not a SentencePiece model, or no known id layout).
    """
    return PlainVocabulary(_read_model(model_path)[1])


def local_model_file(model_path: str | os.PathLike) -> str:
    """A local file holding the SentencePiece model at `model_path` (`VOCAB_PATH`): a local path
    as it is; a URL (`gs://...`) copied once, through the project's storage layer, into
    `$XDG_CACHE_HOME/xlscale/vocab/<sha256>.model` (SentencePiece and tf_text read local files;
    TensorFlow's own GCS client is not used)."""
    if not storage.is_remote(model_path):
        return os.fspath(model_path)
    data = storage.as_path(model_path, name="VOCAB_PATH").read_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xlscale" / "vocab"
    local = cache / f"{hashlib.sha256(data).hexdigest()}.model"
    if not local.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f"{local.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, local)
    return os.fspath(local)


class VocabularyFileError(ValueError):
    """A vocabulary file that cannot be used (the message names the file and why)."""


def load_vocab(model_path: str | os.PathLike, *, extra_ids: int = 0):
    """Loads a trained model as a `seqio.SentencePieceVocabulary`.

    Args:
      model_path: the `.model` file.
      extra_ids: number of sentinel ids appended at the vocabulary end (T5 span corruption uses
        100; `<extra_id_0>` is the largest id).

    Returns:
      A `seqio.SentencePieceVocabulary`; its `vocab_size` includes the extra ids.

    Raises:
      VocabularyFileError: the file is no SentencePiece model (naming it), or its special ids
        are in no known layout.

    Loading and Python-side encoding print nothing (training passes SentencePiece's
    `minloglevel`). seqio's `encode_tf`, which task pipelines use, runs tf_text's own statically
    linked SentencePiece, which prints `normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty`
    when it loads an identity-normalised model like ours: the vocabulary returned builds that
    tokenizer once, with the line kept off the terminal (`pipelines.sentencepiece_vocabulary`).
    """
    from pipelines import sentencepiece_vocabulary

    vocab = sentencepiece_vocabulary.SentencePieceVocabulary(
        local_model_file(model_path), extra_ids=extra_ids
    )
    try:
        tok = vocab.tokenizer
    except Exception as e:  # protobuf's DecodeError, SentencePiece's RuntimeError/OSError
        raise _unusable(model_path, e) from e
    _check_layout(model_path, tok)
    return vocab
