"""seqio tasks: registration (explicit, idempotent, no import side effects), output shapes of the
LM, span-corruption and translation tasks, span-corruption invariants, and the TFDS variant."""

import importlib

import numpy as np
import pytest
import seqio
import tensorflow as tf
from conftest import SIX_LANGS

from pipelines import preprocessors as prep
from pipelines import tasks, vocab
from pipelines.prepared import spans as span_arithmetic

SPAN_LENGTHS = {"inputs": 64, "targets": 16}


@pytest.fixture
def registered(seqio_registry, six_langs):
    corpora, v = six_langs
    return tasks.register_tasks(vocabulary=v, corpora_dir=corpora)


def _examples(name, split="train", lengths=None, seed=0, n=None):
    ds = seqio.get_mixture_or_task(name).get_dataset(
        sequence_length=lengths, split=split, shuffle=False, seed=seed, num_epochs=1
    )
    if n:
        ds = ds.take(n)
    return list(ds.as_numpy_iterator())


def _reconstruct(inputs, targets, sentinels):
    """Inverse of span corruption: put each target span back in place of its sentinel."""
    spans, current = {}, None
    for tok in targets:
        if tok in sentinels:
            current = spans.setdefault(tok, [])
        else:
            current.append(tok)
    out = []
    for tok in inputs:
        out.extend(spans[tok] if tok in sentinels else [tok])
    return out


def test_importing_registers_nothing(seqio_registry):
    importlib.reload(tasks)
    importlib.reload(importlib.import_module("pipelines.mixtures"))
    assert not list(seqio.TaskRegistry.names())
    assert not list(seqio.MixtureRegistry.names())


def test_registers_every_task_and_split(registered):
    expected = {f"{kind}_{lang}" for kind in ("lm", "span") for lang in SIX_LANGS}
    for pair in ("de", "fr", "ro", "zh", "ru"):
        expected |= {f"mt_en_{pair}", f"mt_{pair}_en"}
    assert set(registered) == expected
    assert set(seqio.TaskRegistry.names()) == expected
    assert set(seqio.get_mixture_or_task("lm_en").splits) == {"train", "validation"}
    assert set(seqio.get_mixture_or_task("mt_en_de").splits) == {"train", "validation", "test"}


def test_registration_is_idempotent_and_selectable(seqio_registry, six_langs):
    corpora, v = six_langs
    first = tasks.register_tasks(vocabulary=v, corpora_dir=corpora, langs=["en"], pairs=["en-de"])
    again = tasks.register_tasks(vocabulary=v, corpora_dir=corpora, langs=["en"], pairs=["en-de"])
    assert first == again == ["lm_en", "span_en", "mt_en_de", "mt_de_en"]
    assert sorted(seqio.TaskRegistry.names()) == sorted(first)
    with pytest.raises(ValueError):
        tasks.register_tasks(vocabulary=v, corpora_dir=corpora, langs=["xx"])
    with pytest.raises(FileNotFoundError):
        tasks.register_tasks(vocabulary=v, corpora_dir=corpora.parent / "nowhere", langs=["en"])


@pytest.mark.slow
def test_lm_task_chunks_documents_without_losing_tokens(registered, six_langs):
    _, v = six_langs
    whole = _examples("lm_de", split="validation")  # no sequence length: whole documents + EOS
    chunks = _examples("lm_de", split="validation", lengths={"targets": 32})
    assert all(ex["targets"][-1] == 1 for ex in whole)
    assert all(1 <= len(ex["targets"]) <= 32 for ex in chunks)
    assert sum(len(ex["targets"]) for ex in chunks) == sum(len(ex["targets"]) for ex in whole)
    joined = np.concatenate([ex["targets"] for ex in chunks])
    assert joined.tolist() == np.concatenate([ex["targets"] for ex in whole]).tolist()
    assert set(chunks[0]) == {"targets"}
    assert chunks[0]["targets"].dtype == np.int32


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,prompt",
    [("mt_en_de", "translate English to German: "), ("mt_zh_en", "translate Chinese to English: ")],
)
def test_translation_task_prompt_and_shapes(registered, six_langs, name, prompt):
    _, v = six_langs
    exs = _examples(name, split="validation", lengths={"inputs": 512, "targets": 512})
    assert exs
    for ex in exs:
        assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1  # EOS
        assert ex["inputs"].ndim == ex["targets"].ndim == 1
    text = v.decode(exs[0]["inputs"][:-1].tolist())
    assert text.startswith(prompt)
    trimmed = _examples(name, split="test", lengths={"inputs": 20, "targets": 10})
    assert all(len(ex["inputs"]) <= 20 and len(ex["targets"]) <= 10 for ex in trimmed)


def test_translation_metrics_attached(registered):
    task = seqio.get_mixture_or_task("mt_en_zh")
    out = task.predict_metric_fns[0](["人人有权"], ["人人有权"])
    assert out["bleu"] == pytest.approx(100.0) and out["rougeL"] == pytest.approx(100.0)


@pytest.mark.slow
def test_span_corruption_invariants(registered, six_langs):
    _, v = six_langs
    raw_length = span_arithmetic.span_raw_length(SPAN_LENGTHS["inputs"], SPAN_LENGTHS["targets"])
    li, lt, spans = span_arithmetic.span_corruption_lengths(raw_length)
    assert li <= SPAN_LENGTHS["inputs"] and lt <= SPAN_LENGTHS["targets"]
    sentinels = set(range(v.vocab_size - 100, v.vocab_size))
    exs = _examples("span_fr", lengths=SPAN_LENGTHS, seed=3)
    # Ground truth: the tokenised documents, concatenated (span corruption chunks them in order).
    docs = seqio.get_mixture_or_task("lm_fr").get_dataset(
        sequence_length=None, split="train", shuffle=False, num_epochs=1
    )
    original = np.concatenate([d["targets"][:-1] for d in docs.as_numpy_iterator()]).tolist()
    rebuilt = []
    full = 0
    for ex in exs:
        inputs, targets = ex["inputs"].tolist(), ex["targets"].tolist()
        assert inputs[-1] == 1 and targets[-1] == 1
        inputs, targets = inputs[:-1], targets[:-1]
        in_s = [t for t in inputs if t in sentinels]
        tg_s = [t for t in targets if t in sentinels]
        # Sentinels count down from the top of the vocabulary, in the same order on both sides.
        assert in_s == tg_s == list(range(v.vocab_size - 1, v.vocab_size - 1 - len(in_s), -1))
        assert targets[0] == v.vocab_size - 1  # targets start with <extra_id_0>
        piece = _reconstruct(inputs, targets, sentinels)
        if len(piece) == raw_length:
            full += 1
            assert len(ex["inputs"]) == li and len(ex["targets"]) == lt and len(in_s) == spans
            noise = sum(1 for t in targets if t not in sentinels)
            assert noise == round(0.15 * raw_length)
        rebuilt.extend(piece)
    assert full >= len(exs) - 2  # only group tails are shorter
    assert rebuilt == original


@pytest.mark.slow
def test_span_corruption_is_seeded(registered):
    a = _examples("span_en", lengths=SPAN_LENGTHS, seed=1, n=5)
    b = _examples("span_en", lengths=SPAN_LENGTHS, seed=1, n=5)
    c = _examples("span_en", lengths=SPAN_LENGTHS, seed=2, n=5)
    assert all((x["inputs"] == y["inputs"]).all() for x, y in zip(a, b, strict=True))
    assert any(x["inputs"].tolist() != y["inputs"].tolist() for x, y in zip(a, c, strict=True))
    # Rows of one group get different masks.
    assert len({tuple(x["targets"][:4]) for x in a}) > 1


def test_noise_mask_matches_t5_statistics():
    seeds = [tf.constant([5, 6], tf.int64), tf.constant([7, 8], tf.int64)]
    mask = prep.random_spans_noise_mask(tf.constant(64), tf.constant(114), seeds).numpy()
    assert mask.shape == (64, 114)
    assert (mask.sum(1) == 17).all()  # round(0.15 * 114)
    starts = mask[:, 1:] & ~mask[:, :-1]
    assert (starts.sum(1) == 6).all()  # round(17 / 3) spans, none at position 0
    assert not mask[:, 0].any()


def test_span_needs_sentinels(seqio_registry, six_langs):
    corpora, _ = six_langs
    plain = vocab.load_vocab(six_langs[1].sentencepiece_model_file)  # no extra ids
    tasks.register_tasks(vocabulary=plain, corpora_dir=corpora, langs=["en"], pairs=[])
    with pytest.raises(ValueError, match="sentinel"):
        _examples("span_en", lengths=SPAN_LENGTHS, n=1)


def test_tfds_variant_is_constructed_without_network(seqio_registry, six_langs):
    _, v = six_langs
    names = tasks.register_tasks(
        vocabulary=v, corpora_dir=None, langs=["en", "de"], pairs=["en-de", "en-ro"], source="tfds"
    )
    assert "mt_ro_en" in names and "lm_de" in names
    assert isinstance(seqio.get_mixture_or_task("lm_de").source, seqio.TfdsDataSource)
    assert "c4/multilingual" in str(seqio.get_mixture_or_task("span_en").source)
    assert "wmt17_translate/de-en" in str(seqio.get_mixture_or_task("mt_en_de").source)
    assert "wmt16_translate/ro-en" in str(seqio.get_mixture_or_task("mt_ro_en").source)
    with pytest.raises(ValueError):
        tasks.register_tasks(vocabulary=v, corpora_dir=None, source="hdfs")
