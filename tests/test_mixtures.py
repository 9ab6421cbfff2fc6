"""Mixtures: one ratios mapping, both papers' names, and realised *token* ratios that match the
requested ones (seqio mixes examples; the streams correct for tokens per example)."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from pipelines import component_examples, mixtures, streams, tasks


@pytest.fixture
def registered(seqio_registry, six_langs):
    corpora, v = six_langs
    tasks.register_tasks(vocabulary=v, corpora_dir=corpora, pairs=[])
    return mixtures.register_mixtures()


def _token_shares(batches, n_components):
    counts = np.zeros(n_components)
    for b in batches:
        ids = b["decoder_task_ids"]
        counts += np.bincount(ids[ids >= 0], minlength=n_components)
    return counts / counts.sum(), counts


def test_ratios_mapping_has_both_papers():
    r = mixtures.RATIOS
    for name in (
        "mix_en_50_de_50",
        "mix_en_30_fr_70",
        "mix_en_70_fr_30",
        "mix_en_100",
        "mix_ro_100",
    ):
        assert name in r
    assert r["mix_en_30_fr_70"] == {"span_en": 0.3, "span_fr": 0.7}
    for target in ("zh", "fr", "ru"):
        for pct in (0, 1, 5, 10, 20, 30, 50, 80):
            fr = r[f"cpt_{target}_replay_en_{pct}"]
            assert fr == {
                f"lm_{target}": pytest.approx(1 - pct / 100),
                "lm_en": pytest.approx(pct / 100),
            }
    assert all(sum(f.values()) == pytest.approx(1.0) for f in r.values())


def test_register_and_components(registered):
    assert set(registered) == set(mixtures.RATIOS)
    assert mixtures.component_names("cpt_zh_replay_en_5") == ["lm_en", "lm_zh"]
    assert mixtures.component_names("lm_ru") == ["lm_ru"]
    assert mixtures.token_fractions("cpt_zh_replay_en_5") == pytest.approx(
        {"lm_en": 0.05, "lm_zh": 0.95}
    )
    assert mixtures.component_names("cpt_ru_replay_en_0") == ["lm_en", "lm_ru"]


def test_missing_tasks_skip_defaults_but_fail_explicit(seqio_registry, six_langs):
    corpora, v = six_langs
    tasks.register_tasks(vocabulary=v, corpora_dir=corpora, langs=["en", "zh"], pairs=[])
    names = mixtures.register_mixtures()
    assert "cpt_zh_replay_en_10" in names and "cpt_fr_replay_en_10" not in names
    with pytest.raises(ValueError, match="not registered"):
        mixtures.register_mixtures(ratios={"m": {"lm_en": 0.5, "lm_de": 0.5}})
    with pytest.raises(ValueError, match="sum to 1"):
        mixtures.register_mixtures(ratios={"m": {"lm_en": 0.5, "lm_zh": 0.6}})
    assert mixtures.register_mixtures(ratios={"m": {"lm_en": 0.25, "lm_zh": 0.75}}) == ["m"]


def _example_token_shares(name, lengths, n=10_240):
    """Token shares per component over the first `n` mixed examples (before packing, which
    neither adds nor drops tokens)."""
    ds = component_examples.mixed_examples(
        name, split="train", sequence_length=lengths, seed=0
    ).take(n)
    ds = ds.map(lambda ex: (ex["component"], tf.size(ex["targets"]))).batch(4096)
    comp, size = (np.concatenate(x) for x in zip(*ds.as_numpy_iterator(), strict=True))
    counts = np.bincount(comp, weights=size, minlength=len(mixtures.component_names(name)))
    return counts / counts.sum(), np.bincount(comp) / len(comp)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cpt_ru_replay_en_50", "cpt_zh_replay_en_5"])
def test_realised_token_ratio_within_two_percent(registered, name):
    names = mixtures.component_names(name)
    fractions = mixtures.token_fractions(name)
    lengths = {"targets": 256}
    shares, example_shares = _example_token_shares(name, lengths)
    means = {
        n: component_examples.mean_target_tokens(n, split="train", sequence_length=lengths)
        for n in names
    }
    for i, n in enumerate(names):
        assert shares[i] == pytest.approx(fractions[n], abs=0.02), (n, shares)
        assert shares[i] == pytest.approx(fractions[n], rel=0.05), (n, shares)
    # The correction matters: mean tokens per example differ by a third between languages, so
    # sampling examples at the token fractions would miss by several points.
    naive = {n: fractions[n] * means[n] for n in names}
    naive_share = naive[names[0]] / sum(naive.values())
    assert abs(naive_share - fractions[names[0]]) > 0.02 or fractions[names[0]] < 0.1
    assert example_shares[0] != pytest.approx(fractions[names[0]], abs=0.005)


@pytest.mark.slow
def test_span_mixture_token_ratio(registered):
    shares, _ = _example_token_shares("mix_en_30_fr_70", {"inputs": 64, "targets": 16}, n=4096)
    assert shares == pytest.approx([0.3, 0.7], abs=0.02)


@pytest.mark.slow
def test_replay_zero_has_no_source_tokens(registered):
    batches = streams.batches(
        mixture_or_task="cpt_fr_replay_en_0",
        split="train",
        sequence_length=64,
        batch_size=32,
        seed=0,
    )
    shares, counts = _token_shares(itertools.islice(batches, 40), 2)
    assert mixtures.component_names("cpt_fr_replay_en_0")[0] == "lm_en"
    assert counts[0] == 0 and counts[1] > 0


def test_example_weights_and_choices():
    w = component_examples.example_weights({"a": 0.25, "b": 0.75, "c": 0.0}, {"a": 10.0, "b": 60.0})
    assert w == pytest.approx([2 / 3, 1 / 3, 0.0])
    choices = np.array(
        list(component_examples.weighted_choices([0.7, 0.3, 0.0], block=64).take(10_000))
    )
    for n in (37, 1000, 10_000):
        counts = np.bincount(choices[:n], minlength=3)
        assert abs(counts[0] - 0.7 * n) <= 2 and counts[2] == 0, (n, counts)
    rare = np.array(list(component_examples.weighted_choices([0.99, 0.01]).take(1000)))
    assert rare.sum() == 10 and np.diff(np.flatnonzero(rare)).min() >= 50  # spread out
