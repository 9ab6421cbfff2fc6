"""Trainer-facing streams: the contract's keys and shapes, packing, per-token component ids,
determinism, exact continuation after a restart, host sharding, and eval batches.

Building a tf.data pipeline costs about a second here, so the decoder stream every test looks
at is built once per module (inside its own emptied registry, like `seqio_registry`)."""

import itertools

import numpy as np
import pytest
import seqio

from pipelines import component_examples, mixtures, streams, tasks

DECODER_KEYS = {
    "decoder_input_tokens",
    "decoder_target_tokens",
    "decoder_loss_weights",
    "decoder_segment_ids",
    "decoder_positions",
    "decoder_task_ids",
}
ENCODER_KEYS = {"encoder_input_tokens", "encoder_segment_ids", "encoder_positions"}
MIX = "cpt_zh_replay_en_30"
LANGS = ["en", "zh", "de"]
# A translation task, unpacked: the finetuning subsets' tests count its examples one by one.
MT_UNPACKED = dict(
    mixture_or_task="mt_en_de",
    split="train",
    sequence_length={"inputs": 64, "targets": 64},
    batch_size=2,
    pack=False,
)


@pytest.fixture(scope="module")
def data(fixture_data):
    return fixture_data(langs=LANGS, vocab_size=700)


def _register(data):
    corpora, v = data
    tasks.register_tasks(vocabulary=v, corpora_dir=corpora, langs=LANGS, pairs=["en-de"])
    mixtures.register_mixtures()


@pytest.fixture
def registered(seqio_registry, data):
    _register(data)


def _take(it, n):
    return list(itertools.islice(it, n))


def _decoder(**kw):
    args = dict(mixture_or_task=MIX, split="train", sequence_length=64, batch_size=4, seed=7)
    args.update(kw)
    return streams.decoder_batches(**args)


@pytest.fixture(scope="module")
def full(data, seqio_state):
    """The first 12 batches of the reference decoder stream."""
    with seqio_state.emptied():
        _register(data)
        return _take(_decoder(), 12)


def _same(a, b):
    return all(
        set(x) == set(y) and all((x[k] == y[k]).all() for k in x) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.slow
def test_decoder_batches_contract(full):
    for b in full:
        assert set(b) == DECODER_KEYS
        assert all(v.shape == (4, 64) and v.dtype == np.int32 for v in b.values())
        real = b["decoder_loss_weights"] == 1
        assert ((b["decoder_target_tokens"] != 0) == real).all()
        assert ((b["decoder_segment_ids"] > 0) == real).all()
        # Component ids: 0/1 on real tokens, -1 exactly on padding.
        assert ((b["decoder_task_ids"] >= 0) == real).all()
        assert set(np.unique(b["decoder_task_ids"][real])) <= {0, 1}
        # Autoregressive inputs: targets shifted right within each segment, 0 at segment starts.
        starts = b["decoder_positions"] == 0
        assert (b["decoder_input_tokens"][starts] == 0).all()
        inner = real & ~starts
        shifted = np.pad(b["decoder_target_tokens"], [(0, 0), (1, 0)])[:, :-1]
        assert (b["decoder_input_tokens"][inner] == shifted[inner]).all()
        # Positions count up within a segment; one component per segment.
        for row in range(4):
            segs = b["decoder_segment_ids"][row]
            for seg in np.unique(segs[segs > 0]):
                where = segs == seg
                assert (b["decoder_positions"][row][where] == np.arange(where.sum())).all()
                assert len(np.unique(b["decoder_task_ids"][row][where])) == 1
    both = np.concatenate([b["decoder_task_ids"].ravel() for b in full])
    assert (both == 0).any() and (both == 1).any()  # lm_en (replay) and lm_zh


@pytest.mark.slow
def test_packing_removes_padding(registered, full):
    unpacked = _take(_decoder(pack=False), 12)
    assert set(unpacked[0]) == DECODER_KEYS  # same keys with or without packing
    frac_packed = np.mean([b["decoder_loss_weights"].mean() for b in full])
    frac_unpacked = np.mean([b["decoder_loss_weights"].mean() for b in unpacked])
    print(
        f"real-token fraction at length 64: packed {frac_packed:.3f}, unpacked {frac_unpacked:.3f}"
    )
    assert frac_packed > 0.9
    assert frac_packed > frac_unpacked + 0.15
    assert max(b["decoder_segment_ids"].max() for b in full) >= 2
    assert all(b["decoder_segment_ids"].max() <= 1 for b in unpacked)


@pytest.mark.slow
def test_same_seed_same_stream_and_exact_continuation(registered, full):
    streams.clear_caches()  # as in a new process
    assert _same(full, _take(_decoder(), 12))
    assert not _same(full[:3], _take(_decoder(seed=8), 3))
    resumed = _take(_decoder(start_step=5), 7)
    assert _same(full[5:], resumed)


@pytest.mark.slow
def test_host_shards_differ(registered, full):
    shard = _take(_decoder(num_shards=2, shard_index=1), 3)
    assert shard[0]["decoder_target_tokens"].shape == (4, 64)  # batch_size rows per host
    assert not _same(full[:3], shard)
    with pytest.raises(ValueError):
        _decoder(num_shards=2, shard_index=2)


@pytest.mark.slow
def test_encdec_batches_contract(registered):
    args = dict(
        mixture_or_task="mix_en_50_de_50",
        split="train",
        sequence_length={"inputs": 64, "targets": 16},
        batch_size=4,
        seed=1,
    )
    batches = _take(streams.encdec_batches(**args), 5)
    for b in batches:
        assert set(b) == DECODER_KEYS | ENCODER_KEYS
        assert b["encoder_input_tokens"].shape == (4, 64) and b["decoder_target_tokens"].shape == (
            4,
            16,
        )
        # Each encoder segment has the decoder segment of the same id.
        for row in range(4):
            enc, dec = b["encoder_segment_ids"][row], b["decoder_segment_ids"][row]
            assert set(np.unique(enc[enc > 0])) == set(np.unique(dec[dec > 0]))
        real = b["decoder_loss_weights"] == 1
        assert ((b["decoder_task_ids"] >= 0) == real).all()
    assert np.mean([(b["encoder_segment_ids"] > 0).mean() for b in batches]) > 0.9


@pytest.mark.slow
def test_token_subset_is_a_fixed_repeated_sample(registered):
    # The MT paper's finetuning sets of size Df: a fixed sample of the task, repeated.
    args = dict(MT_UNPACKED)
    mean = component_examples.mean_target_tokens(
        "mt_en_de", split="train", sequence_length=args["sequence_length"]
    )
    n = component_examples.subset_examples(
        "mt_en_de", split="train", sequence_length=args["sequence_length"], subset_tokens=60
    )
    assert n == int(np.ceil(60 / mean)) and 1 <= n < 20

    def examples(seed, batches):
        rows = _take(streams.encdec_batches(**args, seed=seed, subset_tokens=60), batches)
        return [tuple(r) for b in rows for r in b["encoder_input_tokens"]]

    seen = examples(0, 4 * n)
    assert len(set(seen)) == n  # every example of the subset, and only those
    assert set(examples(1, 4 * n)) == set(seen)  # the run's seed reorders, never resamples
    whole = [
        tuple(r)
        for b in _take(streams.encdec_batches(**args, seed=0), 4 * n)
        for r in b["encoder_input_tokens"]
    ]
    assert len(set(whole)) > n
    with pytest.raises(ValueError, match="single task"):
        component_examples.subset_examples(
            "mix_en_50_de_50", split="train", sequence_length={"inputs": 8}, subset_tokens=60
        )


@pytest.mark.slow
def test_pair_subset_holds_exactly_that_many_examples(registered):
    # The MT paper's Df = pairs × 512: a set of exactly Df / 512 pairs, whatever their lengths;
    # over hosts, the shares add up to it.
    args = dict(MT_UNPACKED)

    def examples(seed, n, **kw):
        rows = _take(streams.encdec_batches(**args, seed=seed, subset_examples=n, **kw), 3 * n)
        return [tuple(r) for b in rows for r in b["encoder_input_tokens"]]

    seen = examples(0, 5)
    assert len(set(seen)) == 5  # exactly 5 pairs, each seen repeatedly
    assert set(examples(1, 5)) == set(seen)  # the run's seed reorders, never resamples
    assert [
        component_examples.shard_examples("mt_en_de", subset_size=7, shard_index=i, num_shards=3)
        for i in range(3)
    ] == [3, 2, 2]
    with pytest.raises(ValueError, match="not both"):
        examples(0, 5, subset_tokens=60)
    with pytest.raises(ValueError, match="single task"):
        component_examples.shard_examples("mix_en_50_de_50", subset_size=5)


def test_wrong_stream_kind_is_refused(registered):
    with pytest.raises(ValueError, match="inputs"):
        _decoder(mixture_or_task="span_en")
    with pytest.raises(ValueError, match="inputs"):
        streams.encdec_batches(
            mixture_or_task="lm_en",
            split="train",
            sequence_length={"inputs": 8, "targets": 8},
            batch_size=2,
            seed=0,
        )


@pytest.mark.slow
def test_eval_batches_finite_deterministic_padded(registered):
    kw = dict(task="lm_zh", split="validation", sequence_length=32, batch_size=4)
    every = streams.eval_batches(max_tokens=None, **kw)
    assert every and _same(every, streams.eval_batches(max_tokens=None, **kw))  # from memory
    total = sum(int(b["decoder_loss_weights"].sum()) for b in every)
    ref = seqio.get_mixture_or_task("lm_zh").get_dataset(
        sequence_length={"targets": 32}, split="validation", shuffle=False, num_epochs=1
    )
    assert total == sum(len(ex["targets"]) for ex in ref.as_numpy_iterator())
    assert all(b["decoder_target_tokens"].shape == (4, 32) for b in every)
    assert (every[-1]["decoder_task_ids"][every[-1]["decoder_loss_weights"] == 0] == -1).all()
    capped = streams.eval_batches(max_tokens=50, **kw)
    assert 1 <= len(capped) < len(every)
    mt = streams.eval_batches(
        task="mt_en_de",
        split="validation",
        sequence_length={"inputs": 64, "targets": 64},
        batch_size=2,
        max_tokens=None,
    )
    assert set(mt[0]) == DECODER_KEYS | ENCODER_KEYS
