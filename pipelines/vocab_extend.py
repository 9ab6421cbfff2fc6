"""Vocabulary extension for a new language: merge a target-language SentencePiece model's pieces
into a source tokenizer, keeping every old piece's id.

The usual first step of continual pre-training into, say, Chinese from an English model: the
source tokenizer slices the new language into bytes, so we train a small SentencePiece model on
the target corpus and append its pieces that the source lacks. The merged model is the source's
`ModelProto` with extra pieces at the end, so

- every old piece keeps its id, string, score and type (ids `0 .. base_size-1` unchanged), and
  the model keeps the source's type (unigram or BPE), normaliser and special ids;
- new pieces are `NORMAL` pieces with scores *below every source score* (their order among
  themselves is the target model's). `USER_DEFINED` pieces would be matched greedily before
  segmentation and so change how old text is split wherever their strings occur; a low-scored
  normal piece only wins where the old pieces cannot do better, which keeps old segmentations
  as stable as the algorithm allows. For text in the source's own language (no characters the
  source had to encode as bytes) this leaves the encoding unchanged in practice (the tests check
  the English fixture text); it is not a theorem: a long new piece made of characters the source
  knows can still win a unigram lattice or a late BPE merge. `extend_vocab` reports the measured
  change on the base languages' validation text.

Written beside the merged `<prefix>.model`: `<prefix>.json` (the sidecar: base model path and
SHA-256, the target model's, the added pieces with their ids and scores, old and new sizes, and
tokens per character before and after), and the target model itself as `<prefix>.target.{model,
json}` (`pipelines.vocab.train_vocab`, on the target language alone).

Only SentencePiece (and its protobuf module) is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from pipelines import vocab
from pipelines.corpora import paths
from rundir import storage

NORMAL = model_pb2.ModelProto.SentencePiece.NORMAL
# New pieces score at least this far below the lowest source score.
SCORE_MARGIN = 1.0
SIDECAR_KIND = "xlscale.vocab_extension"


class VocabPrefixError(ValueError):
    """The new vocabulary does not start with the old one (an old id would change meaning)."""


def _proto(model: bytes | str | os.PathLike) -> model_pb2.ModelProto:
    proto = model_pb2.ModelProto()
    proto.ParseFromString(model if isinstance(model, bytes) else Path(model).read_bytes())
    return proto


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def merge_pieces(
    *, base: bytes, target: bytes, max_pieces: int | None = None
) -> tuple[bytes, list[dict[str, Any]]]:
    """Appends the `NORMAL` pieces of `target` that `base` lacks to `base` (both serialized
    `ModelProto`s).

    Args:
      base: the source tokenizer, kept as it is (ids, scores, normaliser, trainer settings).
      target: a model trained on the new language; its control, byte and unknown pieces are
        skipped (the base has its own).
      max_pieces: add at most this many (the target's best-scored first); None: all missing.

    Returns:
      (the merged serialized model, the added pieces as `{"id", "piece", "score",
      "target_score"}` in id order). New scores are `min(base scores) - SCORE_MARGIN -
      (max target score - target score)`: below every old piece, in the target's order.
    """
    merged, tgt = _proto(base), _proto(target)
    known = {p.piece for p in merged.pieces}
    candidates = [p for p in tgt.pieces if p.type == NORMAL and p.piece not in known]
    candidates.sort(key=lambda p: -p.score)  # stable: equal scores keep the target's order
    if max_pieces is not None:
        candidates = candidates[:max_pieces]
    added: list[dict[str, Any]] = []
    if candidates:
        floor = min(p.score for p in merged.pieces if p.type == NORMAL) - SCORE_MARGIN
        top = candidates[0].score
        for piece in candidates:
            new = merged.pieces.add()
            new.piece, new.type = piece.piece, NORMAL
            new.score = floor - (top - piece.score)
            added.append(
                {
                    "id": len(merged.pieces) - 1,
                    "piece": piece.piece,
                    "score": new.score,
                    "target_score": piece.score,
                }
            )
    merged.trainer_spec.vocab_size = len(merged.pieces)
    return merged.SerializeToString(), added


def check_prefix(*, old: bytes | str | os.PathLike, new: bytes | str | os.PathLike) -> int:
    """Checks that the `new` model's first pieces are the `old` model's, id for id (string and
    type), so that a checkpoint trained with `old` reads the same ids under `new`.

    Returns:
      The old model's size.
    Raises:
      VocabPrefixError: naming the first differing id and both pieces, or the sizes when `new`
        is shorter.
    """
    old_p, new_p = _proto(old), _proto(new)
    for i, piece in enumerate(old_p.pieces):
        if i >= len(new_p.pieces):
            raise VocabPrefixError(
                f"the new vocabulary has {len(new_p.pieces)} pieces, fewer than the old one's "
                f"{len(old_p.pieces)}: it cannot extend it"
            )
        other = new_p.pieces[i]
        if (other.piece, other.type) != (piece.piece, piece.type):
            raise VocabPrefixError(
                f"the new vocabulary does not extend the old one: id {i} is {other.piece!r} "
                f"(type {other.type}) in the new and {piece.piece!r} (type {piece.type}) in the "
                "old; an extended vocabulary must keep every old id"
            )
    return len(old_p.pieces)


def _segmenter(base: bytes) -> spm.SentencePieceProcessor:
    """The base model without its dummy prefix or whitespace cleanup: it segments a piece's
    surface string as it is (a piece without '▁' gets none)."""
    proto = _proto(base)
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


def old_ids_of_new_pieces(
    *, old: bytes | str | os.PathLike, new: bytes | str | os.PathLike
) -> dict[int, list[int]]:
    """Maps each piece of `new` beyond `old`'s size to the old ids its string splits into under
    the OLD tokenizer (byte pieces where the old model falls back to bytes) — what
    `llama_jax.embedding_growth` averages to initialise the new embedding rows.

    Raises:
      VocabPrefixError: when `new` does not extend `old` (`check_prefix`).
    """
    old_bytes = old if isinstance(old, bytes) else Path(old).read_bytes()
    size = check_prefix(old=old_bytes, new=new)
    segmenter = _segmenter(old_bytes)
    new_p = _proto(new)
    out = {}
    for i in range(size, len(new_p.pieces)):
        ids = segmenter.encode(new_p.pieces[i].piece.replace("\u2581", " "))
        if not ids:
            raise ValueError(
                f"new piece {i} ({new_p.pieces[i].piece!r}) is empty under the old model"
            )
        out[i] = [int(x) for x in ids]
    return out


def _validation_texts(corpora_dir: str | os.PathLike, lang: str) -> list[str]:
    for split in ("validation", "train"):
        path = paths.mono_file(corpora_dir, lang, split)
        if path.exists():
            lines = [t for t in path.read_text(encoding="utf-8").split("\n") if t.strip()]
            if lines:
                return lines
    return []


def extend_vocab(
    *,
    base_model: str | os.PathLike,
    corpora_dir: str | os.PathLike,
    lang: str,
    pieces: int,
    out_prefix: str | os.PathLike,
    check_langs: Sequence[str] = ("en",),
    seed: int = 0,
    max_sentences: int = vocab.DEFAULT_MAX_SENTENCES,
) -> Path:
    """Trains a `lang` model on `corpora_dir` and writes `base_model` extended with its pieces.

    The target model is trained with `pipelines.vocab.train_vocab` (same model type as the base)
    at `pieces` + its meta pieces; those it has that the base lacks are appended
    (`merge_pieces`), so at most `pieces` are added (fewer when the base already has some).

    Args:
      base_model: the source tokenizer's `.model`.
      corpora_dir: the `corpora/` directory (reads `mono/<lang>/...`).
      lang: the new language (ISO 639-1).
      pieces: number of target pieces to train (the most that can be added).
      out_prefix: writes `<out_prefix>.model`, `<out_prefix>.json` and the target model as
        `<out_prefix>.target.{model,json}`.
      check_langs: languages whose validation text is encoded before and after, to record how
        much the old segmentation moved (those without text in `corpora_dir` are skipped).
      seed, max_sentences: of the target model's training sample.

    Returns:
      The path of the merged `.model`.
    """
    if pieces < 1:
        raise ValueError(f"pieces = {pieces}: allowed: a positive number of pieces to add")
    base_path = Path(base_model)
    base = base_path.read_bytes()
    base_proto = _proto(base)
    model_type = model_pb2.TrainerSpec.ModelType.Name(base_proto.trainer_spec.model_type).lower()
    if model_type not in vocab.MODEL_TYPES:
        raise ValueError(f"{base_path}: model type {model_type!r}; allowed: {vocab.MODEL_TYPES}")
    out_prefix = Path(out_prefix)
    target_path = vocab.train_vocab(
        corpora_dir=corpora_dir,
        langs=[lang],
        out_prefix=out_prefix.with_name(out_prefix.name + ".target"),
        vocab_size=vocab.NUM_META_PIECES + pieces,
        model_type=model_type,
        seed=seed,
        max_sentences=max_sentences,
    )
    target = target_path.read_bytes()
    merged, added = merge_pieces(base=base, target=target)
    old_ids = old_ids_of_new_pieces(old=base, new=merged)
    for entry in added:
        entry["old_ids"] = old_ids[entry["id"]]
    model_path = out_prefix.with_name(out_prefix.name + ".model")
    storage.write_bytes(model_path, merged)

    before = spm.SentencePieceProcessor(model_proto=base)
    after = spm.SentencePieceProcessor(model_proto=merged)
    measured = {}
    for code in dict.fromkeys([lang, *check_langs]):
        texts = _validation_texts(corpora_dir, code)
        if texts:
            changed = sum(
                a != b for a, b in zip(before.encode(texts), after.encode(texts), strict=True)
            )
            measured[code] = {
                "tokens_per_char_before": vocab.tokens_per_char(before, texts)["tokens_per_char"],
                "tokens_per_char_after": vocab.tokens_per_char(after, texts)["tokens_per_char"],
                "lines": len(texts),
                "lines_encoded_differently": changed,
            }
    info = {
        "kind": SIDECAR_KIND,
        "model": model_path.name,
        "model_sha256": _sha256(merged),
        "base_model": os.fspath(base_path),
        "base_sha256": _sha256(base),
        "base_size": len(base_proto.pieces),
        "target_model": target_path.name,
        "target_sha256": _sha256(target),
        "lang": lang,
        "pieces_requested": pieces,
        "new_size": len(base_proto.pieces) + len(added),
        "model_type": model_type,
        "score_rule": f"min(base scores) - {SCORE_MARGIN} - (max target score - target score)",
        "added": added,
        "measurements": measured,
        "corpora_dir": os.fspath(corpora_dir),
        "seed": seed,
    }
    storage.write_bytes(
        model_path.with_suffix(".json"),
        (json.dumps(info, ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode("utf-8"),
    )
    return model_path


def read_extension_info(model_path: str | os.PathLike) -> dict[str, Any]:
    """The sidecar `extend_vocab` wrote beside `model_path`.

    Raises:
      FileNotFoundError: without a sidecar; ValueError: when it is not an extension's sidecar.
    """
    sidecar = Path(model_path).with_suffix(".json")
    if not sidecar.exists():
        raise FileNotFoundError(
            f"{model_path}: no {sidecar.name} beside it; an extended vocabulary is written by "
            "`xlscale tokenizer extend` (pipelines.vocab_extend.extend_vocab)"
        )
    info = json.loads(sidecar.read_text(encoding="utf-8"))
    if info.get("kind") != SIDECAR_KIND:
        raise ValueError(
            f"{sidecar} is not a vocabulary extension's record (kind {info.get('kind')!r}); "
            "write one with `xlscale tokenizer extend`"
        )
    return info
