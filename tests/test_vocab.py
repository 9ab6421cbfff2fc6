"""SentencePiece vocabularies: T5 ids, exact round trips in all six languages, determinism, the
recorded tokens-per-character, sentinels at the vocabulary end, and the CLI."""

import json

import pytest

from pipelines import vocab
from pipelines.corpora import paths
from pipelines.corpora.fixture import write_fixture_corpora

LANGS = ["en", "zh", "fr", "ru", "de", "ro"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    return write_fixture_corpora(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def model(corpora, tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab") / "six"
    return vocab.train_vocab(corpora_dir=corpora, langs=LANGS, out_prefix=out, vocab_size=1000)


def _validation_lines(corpora, lang):
    return paths.mono_file(corpora, lang, "validation").read_text(encoding="utf-8").splitlines()


def test_t5_special_ids_and_byte_fallback(model):
    sp = vocab.load_vocab(model).tokenizer
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
    assert sp.get_piece_size() == 1000
    assert sum(sp.is_byte(i) for i in range(sp.get_piece_size())) == 256


@pytest.mark.parametrize("lang", LANGS)
def test_round_trip_in_every_language(model, corpora, lang):
    import tensorflow as tf

    v = vocab.load_vocab(model)
    lines = _validation_lines(corpora, lang)
    assert lines
    for line in lines:
        ids = v.encode(line)
        assert 0 not in ids and 2 not in ids  # no padding, nothing unknown (byte fallback)
        assert v.decode(ids) == line
    # The TF tokenizer the tasks use agrees with the Python one.
    assert v.encode_tf(tf.constant(lines[0])).numpy().tolist() == v.encode(lines[0])


def test_unseen_characters_round_trip_through_bytes(model):
    v = vocab.load_vocab(model)
    text = "emoji 🙂 and a rare character 龘 survive"
    assert v.decode(v.encode(text)) == text


def test_deterministic_for_same_inputs_and_seed(corpora, tmp_path):
    kwargs = dict(corpora_dir=corpora, langs=["en", "zh"], vocab_size=600)
    a = vocab.train_vocab(out_prefix=tmp_path / "a", **kwargs)
    b = vocab.train_vocab(out_prefix=tmp_path / "b", **kwargs)
    c = vocab.train_vocab(out_prefix=tmp_path / "c", seed=1, **kwargs)
    assert a.read_bytes() == b.read_bytes()
    info_a, info_b = vocab.read_vocab_info(a), vocab.read_vocab_info(b)
    assert info_a["model_sha256"] == info_b["model_sha256"]
    assert vocab.read_vocab_info(c)["seed"] == 1


def test_json_records_settings_and_tokens_per_char(model):
    info = json.loads(model.with_suffix(".json").read_text(encoding="utf-8"))
    assert info["settings"]["character_coverage"] == 0.9995  # zh is in
    assert info["settings"]["byte_fallback"] is True
    assert set(info["tokens_per_char"]) == set(LANGS)
    tpc = info["tokens_per_char"]
    assert all(0 < x < 4 for x in tpc.values())
    # Han characters carry more information each than Latin letters: more tokens per char.
    assert tpc["zh"] > tpc["en"]
    assert info["measurements"]["en"]["measured_on"] == "validation"


def test_character_coverage_is_one_without_chinese(corpora, tmp_path):
    m = vocab.train_vocab(
        corpora_dir=corpora, langs=["en", "de"], out_prefix=tmp_path / "ende", vocab_size=400
    )
    assert vocab.read_vocab_info(m)["settings"]["character_coverage"] == 1.0


def test_tiny_vocabulary_covers_chinese_by_bytes(corpora, tmp_path):
    m = vocab.train_vocab(
        corpora_dir=corpora, langs=LANGS, out_prefix=tmp_path / "tiny", vocab_size=512
    )
    info = vocab.read_vocab_info(m)
    assert info["alphabet"]["kept_chars"] < info["alphabet"]["distinct_chars"]
    v = vocab.load_vocab(m)
    line = _validation_lines(corpora, "zh")[0]
    assert v.decode(v.encode(line)) == line
    assert info["measurements"]["zh"]["byte_fallback_fraction"] > 0


def test_language_weights_shift_the_sample(corpora):
    _, even = vocab.sample_training_lines(corpora_dir=corpora, langs=["en", "de"])
    _, skew = vocab.sample_training_lines(
        corpora_dir=corpora,
        langs=["en", "de"],
        lang_weights={"en": 0.8, "de": 0.2},
        max_sentences=40,
    )
    assert even["en"]["weight"] == pytest.approx(0.5)
    assert skew["en"]["lines"] > skew["de"]["lines"]
    with pytest.raises(ValueError):
        vocab.sample_training_lines(corpora_dir=corpora, langs=["en"], lang_weights={"de": 1.0})


def test_bpe_model_type(corpora, tmp_path):
    m = vocab.train_vocab(
        corpora_dir=corpora,
        langs=["en", "fr"],
        out_prefix=tmp_path / "bpe",
        vocab_size=500,
        model_type="bpe",
    )
    v = vocab.load_vocab(m)
    line = _validation_lines(corpora, "fr")[0]
    assert v.decode(v.encode(line)) == line
    with pytest.raises(ValueError):
        vocab.train_vocab(
            corpora_dir=corpora,
            langs=["en"],
            out_prefix=tmp_path / "x",
            vocab_size=500,
            model_type="wordpiece",
        )


def test_sentinels_at_the_vocabulary_end(model):
    v = vocab.load_vocab(model, extra_ids=100)
    assert v.vocab_size == 1100
    assert v.tokenizer.id_to_piece(1099) == "▁<extra_id_0>"
    assert v.tokenizer.id_to_piece(1000) == "▁<extra_id_99>"


def test_the_plain_vocabulary_encodes_and_decodes_as_seqios(model, corpora, tmp_path):
    seqio_vocab = vocab.load_vocab(model)
    plain = vocab.load_plain_vocab(model)
    for name in ("eos_id", "unk_id", "vocab_size", "extra_ids"):
        assert getattr(plain, name) == getattr(seqio_vocab, name), name
    assert vocab.start_id(plain) == vocab.start_id(seqio_vocab)
    texts = [line for lang in LANGS for line in _validation_lines(corpora, lang)[:3]]
    for text in [*texts, "", "unseen ✓ 字"]:
        ids = plain.encode(text)
        assert ids == list(seqio_vocab.encode(text))
        assert plain.decode(ids) == seqio_vocab.decode(ids)
    # An id past the pieces reads as UNK, and the text stops after the first EOS.
    ids = [*plain.encode(texts[0]), 1000, 1099, 1, *plain.encode(texts[1])]
    assert plain.decode(ids) == seqio_vocab.decode(ids)
    assert plain.decode(ids) == plain.decode([*ids, *plain.encode(texts[2])])
    broken = tmp_path / "broken.model"
    broken.write_bytes(b"not a model")
    with pytest.raises(vocab.VocabularyFileError, match="broken.model: not a SentencePiece"):
        vocab.load_plain_vocab(broken)


def test_cli_trains_and_prints(corpora, tmp_path, capsys):
    from xlscale_cli.main import main

    out = tmp_path / "cli"
    rc = main(
        [
            "tokenizer",
            "train",
            "--langs",
            "en",
            "zh",
            "--vocab-size",
            "700",
            "--out",
            str(out),
            "--data-dir",
            str(corpora.parent),
        ]
    )
    assert rc == 0
    assert out.with_suffix(".model").exists() and out.with_suffix(".json").exists()
    printed = capsys.readouterr().out
    assert "tokens/char" in printed and "zh" in printed


def test_training_and_loading_print_no_sentencepiece_logs(corpora, tmp_path, capfd):
    # SentencePiece logs at INFO unless told not to (absl lines from `sentencepiece_trainer.cc`
    # and `trainer_interface.cc` when training, `normalizer.cc(51) LOG(INFO) precompiled_charsmap
    # is empty` when loading an identity-normalised model); a run's output must not drown in them.
    # (tf_text's own copy of SentencePiece, which seqio's `encode_tf` uses, has no such switch.)
    path = vocab.train_vocab(
        corpora_dir=corpora, langs=["en", "fr"], out_prefix=tmp_path / "v", vocab_size=400
    )
    loaded = vocab.load_vocab(path, extra_ids=100)
    assert loaded.decode(loaded.encode("Hello, world")) == "Hello, world"
    err = capfd.readouterr().err
    for marker in (
        "sentencepiece_trainer.cc",
        "trainer_interface.cc",
        "normalizer.cc",
        "LOG(INFO)",
    ):
        assert marker not in err, err[:2000]
