"""The by-index training input (`pipelines.prepared.batches`): the batch of a step is a function of (seed,
step), resume reads as little at step 10^6 as at 0, hosts read only their rows, mixtures hold
their token fractions, subsets are fixed across seeds, and rows are laid out as the seqio path
lays them (a frozen reference for LM rows; T5 span corruption that reconstructs its chunk; parity
with `pipelines.preprocessors`' feature conversion and span arithmetic).

One test runs over tasks prepared from the UDHR fixture by `pipelines.prepared.prepare` and read by
`pipelines.prepared.shards.PreparedDataset`, against the corpus lines and seqio's own examples. The other
datasets are in memory (`MemoryDataset`, the reader interface of `pipelines.prepared.shards`) with
random token ids in [2, 1000): 0 is padding, 1 EOS, and a 1100-id vocabulary leaves the top 100
for sentinels.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from conftest import imported_with

from pipelines.prepared import batches as pb
from pipelines.prepared import packing, spans

VOCAB = 1100
LM_LEN = 32
ENCDEC = {"inputs": 48, "targets": 16}


class MemoryDataset:
    """A prepared dataset held in memory: `features`, `num_docs`, `postprocess`, `lengths`,
    `read` and a count of documents read (`reads`)."""

    def __init__(self, docs, postprocess):
        self.docs = docs
        self.features = tuple(docs[0]) if docs else ("targets",)
        self.postprocess = postprocess
        self.reads = 0

    @property
    def num_docs(self):
        return len(self.docs)

    def lengths(self, feature):
        return np.array([len(d[feature]) for d in self.docs], np.int32)

    def read(self, indices):
        self.reads += len(indices)
        return [self.docs[i] for i in indices]


def random_docs(n, *, low, high, seed, features=("targets",)):
    rng = np.random.default_rng(seed)
    return [
        {k: rng.integers(2, 1000, rng.integers(low, high + 1)).astype(np.int32) for k in features}
        for _ in range(n)
    ]


def lm(n=60, seed=0, low=1, high=40):
    return MemoryDataset(random_docs(n, low=low, high=high, seed=seed), "lm_chunks")


def span(n=40, seed=1):
    return MemoryDataset(random_docs(n, low=5, high=120, seed=seed), "span_corruption")


def pairs(n=80, seed=2):
    docs = random_docs(n, low=1, high=20, seed=seed, features=("inputs", "targets"))
    return MemoryDataset(docs, "pairs")


def run(components, *, steps, sequence_length=LM_LEN, batch=8, seed=7, **kw):
    kw.setdefault("vocab_size", VOCAB)
    it = pb.batches(
        components=components,
        sequence_length=sequence_length,
        global_batch_size=batch,
        seed=seed,
        **kw,
    )
    return [next(it) for _ in range(steps)]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def mixture(kind):
    """Fresh datasets (read counts at 0) of a mixture of `kind`, with its sequence length."""
    if kind == "lm":
        return [pb.Component("lm_fr", lm(), 0.75), pb.Component("lm_en", lm(seed=5), 0.25)], LM_LEN
    if kind == "span":
        return [pb.Component("span_en", span(), 1.0)], ENCDEC
    return [pb.Component("span_en", span(), 0.5), pb.Component("mt_en_de", pairs(), 0.5)], ENCDEC


KINDS = ["lm", "span", "encdec_mix"]


@pytest.mark.parametrize("kind", KINDS)
def test_resume_continues_the_uninterrupted_run(kind):
    comps, length = mixture(kind)
    whole = run(comps, steps=14, sequence_length=length)
    comps, length = mixture(kind)
    if length == LM_LEN:
        length = {"targets": LM_LEN}  # the trainer's task_feature_lengths work as well
    resumed = run(comps, steps=6, sequence_length=length, start_step=8)
    assert_same(resumed, whole[8:])


def test_resume_at_a_million_reads_what_step_zero_reads():
    # doc + EOS = L/2: every row holds two whole documents, so every step reads 2B documents.
    docs = [{"targets": np.full(LM_LEN // 2 - 1, 3 + i, np.int32)} for i in range(50)]
    reads = {}
    for step in (0, 10**6):
        ds = MemoryDataset(docs, "lm_chunks")
        it = pb.batches(
            components=[pb.Component("lm_en", ds, 1.0)],
            sequence_length=LM_LEN,
            global_batch_size=8,
            seed=3,
            start_step=step,
            read_ahead_steps=1,  # count one step's reads
        )
        assert ds.reads == 0  # setup reads lengths only
        next(it)
        reads[step] = ds.reads
    assert reads == {0: 16, 10**6: 16}


def test_resume_far_reads_only_its_rows():
    comps, _ = mixture("lm")
    bound = 8 * (LM_LEN + 2)  # a row of L tokens overlaps at most L + 1 documents (>= 1 token)
    next(
        pb.batches(
            components=comps,
            sequence_length=LM_LEN,
            global_batch_size=8,
            seed=1,
            start_step=123_456_789,
        )
    )
    assert 0 < sum(c.dataset.reads for c in comps) <= bound


@pytest.mark.parametrize("kind", KINDS)
def test_two_hosts_read_the_global_batch_and_only_their_documents(kind):
    steps = 5
    comps, length = mixture(kind)
    one = run(comps, steps=steps, sequence_length=length)
    one_reads = sum(c.dataset.reads for c in comps)
    halves, host_reads = [], []
    for rows in (((0, 4),), ((4, 8),)):
        comps, length = mixture(kind)
        halves.append(run(comps, steps=steps, sequence_length=length, host_rows=rows))
        host_reads.append(sum(c.dataset.reads for c in comps))
    joined = [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(*halves, strict=True)]
    assert_same(joined, one)
    assert all(r < one_reads for r in host_reads)
    # Documents spanning both hosts' rows are read by both.
    assert one_reads <= sum(host_reads) <= one_reads + steps * 8
    comps, length = mixture(kind)
    mixed = run(comps, steps=2, sequence_length=length, host_rows=((6, 8), (0, 2)))
    assert_same(mixed, [{k: np.concatenate([b[k][6:8], b[k][0:2]]) for k in b} for b in one[:2]])


def token_fractions(stream, components):
    weights = collections.Counter()
    for b in stream:
        for k in range(components):
            weights[k] += int(b["decoder_loss_weights"][b["decoder_task_ids"] == k].sum())
    total = sum(weights.values())
    return [weights[k] / total for k in range(components)]


def test_replay_fraction_holds():
    comps = [pb.Component("lm_fr", lm(), 0.75), pb.Component("lm_en", lm(seed=5), 0.25)]
    fractions = token_fractions(run(comps, steps=200), 2)
    assert abs(fractions[1] - 0.25) <= 0.01


def test_encdec_mixture_fraction_holds():
    # Span rows hold a fixed number of target tokens, pair rows a varying one: the row shares
    # turn token fractions into rows by the mean target tokens per row.
    comps = [pb.Component("span_en", span(), 0.3), pb.Component("mt_en_de", pairs(), 0.7)]
    fractions = token_fractions(run(comps, steps=200, sequence_length=ENCDEC), 2)
    assert abs(fractions[0] - 0.3) <= 0.02


def test_rows_are_assigned_evenly_and_monotonically():
    shares = pb._integer_shares([0.01, 0.29, 0.7])
    rows = np.arange(100_000, dtype=np.int64)
    component, local = pb.assign_rows(rows, shares)
    for k, w in enumerate((0.01, 0.29, 0.7)):
        mine = component == k
        counts = np.cumsum(mine)
        assert np.all(np.abs(counts - (rows + 1) * w) <= 2)
        np.testing.assert_array_equal(local[mine], np.arange(mine.sum()))
    # Any window of rows gives the same assignment as the whole range (a closed form of n).
    c2, l2 = pb.assign_rows(rows[77_777:77_800], shares)
    np.testing.assert_array_equal(c2, component[77_777:77_800])
    np.testing.assert_array_equal(l2, local[77_777:77_800])


def seen_pairs(stream, docs):
    """Indices of the pairs whose targets appear in the stream."""
    limit = ENCDEC["targets"] - 1  # targets are trimmed before EOS
    index = {tuple(d["targets"][:limit].tolist()): i for i, d in enumerate(docs)}
    seen = set()
    for b in stream:
        for targets, segs in zip(b["decoder_target_tokens"], b["decoder_segment_ids"], strict=True):
            for s in range(1, segs.max() + 1):
                seen.add(index[tuple(targets[segs == s][:-1].tolist())])
    return seen


def test_subset_examples_is_fixed_across_seeds():
    found = []
    for seed in (1, 2):
        ds = pairs(n=200)
        stream = run(
            [pb.Component("mt_en_de", ds, 1.0)],
            steps=12,
            sequence_length=ENCDEC,
            seed=seed,
            subset_examples=13,
        )
        found.append(seen_pairs(stream, ds.docs))
    assert len(found[0]) == 13
    assert found[0] == found[1]


def test_subset_tokens_is_the_shortest_prefix():
    ds = pairs(n=200)
    target = (np.minimum(ds.lengths("targets"), ENCDEC["targets"] - 1) + 1).astype(int)
    stream = run(
        [pb.Component("mt_en_de", ds, 1.0)], steps=30, sequence_length=ENCDEC, subset_tokens=100
    )
    seen = seen_pairs(stream, ds.docs)
    order = np.random.default_rng(pb.SUBSET_SEED).permutation(200)
    n = len(seen)
    assert seen == set(order[:n].tolist())
    assert target[order[:n]].sum() >= 100 > target[order[: n - 1]].sum()


def reference_lm_rows(docs_in_order, length, start_id, eos):
    """Frozen reference: documents plus EOS, concatenated and cut into rows, one segment per
    piece, positions from 0, inputs shifted right with the start id at every segment start."""
    stream, segment_of = [], []
    for i, doc in enumerate(docs_in_order):
        stream += [*doc.tolist(), eos]
        segment_of += [i] * (len(doc) + 1)
    out = collections.defaultdict(list)
    for r in range(len(stream) // length):
        toks = stream[r * length : (r + 1) * length]
        owner = segment_of[r * length : (r + 1) * length]
        seg, pos, inp = [], [], []
        for j, (_tok, o) in enumerate(zip(toks, owner, strict=True)):
            new = j == 0 or owner[j - 1] != o
            seg.append(1 if j == 0 else seg[-1] + new)
            pos.append(0 if new else pos[-1] + 1)
            inp.append(start_id if new else toks[j - 1])
        out["decoder_target_tokens"].append(toks)
        out["decoder_segment_ids"].append(seg)
        out["decoder_positions"].append(pos)
        out["decoder_input_tokens"].append(inp)
    return {k: np.array(v, np.int32) for k, v in out.items()}


def split_docs(stream, docs, *, eos):
    """The documents `stream` is a concatenation of (matching on whole documents), in order."""
    by_start = collections.defaultdict(list)
    for i, d in enumerate(docs):
        by_start[tuple(d["targets"][:3].tolist())].append(i)
    order, at = [], 0
    while at < len(stream):
        for i in by_start[tuple(stream[at : at + 3].tolist())]:
            doc = docs[i]["targets"]
            n = len(doc)
            full = at + n + (eos is not None) <= len(stream)
            if full and np.array_equal(stream[at : at + n], doc):
                order.append(i)
                at += n + (eos is not None)
                break
        else:
            return order, stream[at:]
    return order, stream[at:]


def test_lm_rows_match_the_reference_and_cover_each_document_once_per_epoch():
    ds = lm(n=40, low=3, high=50)
    total = int(ds.lengths("targets").sum()) + ds.num_docs
    rows_per_epoch = total // LM_LEN
    steps = rows_per_epoch // 4
    stream = run([pb.Component("lm_en", ds, 1.0)], steps=steps, batch=4, start_id=5)
    got = {k: np.concatenate([b[k] for b in stream]) for k in stream[0]}
    order, rest = split_docs(got["decoder_target_tokens"].reshape(-1), ds.docs, eos=1)
    assert len(set(order)) == len(order) and len(rest) < 51  # each once; the rest is partial
    ref = reference_lm_rows([ds.docs[i]["targets"] for i in order] + [rest], LM_LEN, 5, 1)
    for key, value in ref.items():
        np.testing.assert_array_equal(got[key][: len(value)], value, err_msg=key)
    n = len(ref["decoder_target_tokens"])
    assert n >= len(got["decoder_target_tokens"]) - 1
    assert np.all(got["decoder_loss_weights"] == 1) and np.all(got["decoder_task_ids"] == 0)


def unspan(inputs, targets, vocab):
    """Puts the noise spans of `targets` back in place of the sentinels of `inputs`."""
    sentinel = lambda x: x >= vocab - 100  # noqa: E731
    pieces, current = {}, None
    for tok in targets[:-1].tolist():
        if sentinel(tok):
            current = tok
            pieces[current] = []
        else:
            pieces[current].append(tok)
    out = []
    for tok in inputs[:-1].tolist():
        out += pieces[tok] if sentinel(tok) else [tok]
    return np.array(out, np.int32), sorted(pieces, reverse=True)


def test_span_corruption_reconstructs_its_chunks():
    ds = span(n=60)
    raw = spans.span_raw_length(ENCDEC["inputs"], ENCDEC["targets"])
    li, lt, num_spans = spans.span_corruption_lengths(raw)
    stream = run([pb.Component("span_en", ds, 1.0)], steps=6, sequence_length=ENCDEC)
    chunks = []
    for b in stream:
        for r in range(8):
            inputs = b["encoder_input_tokens"][r][b["encoder_segment_ids"][r] == 1]
            targets = b["decoder_target_tokens"][r][b["decoder_segment_ids"][r] == 1]
            assert (len(inputs), len(targets)) == (li, lt)
            assert li <= ENCDEC["inputs"] and lt <= ENCDEC["targets"]
            assert inputs[-1] == targets[-1] == 1
            chunk, sentinels = unspan(inputs, targets, VOCAB)
            assert sentinels == [VOCAB - 1 - k for k in range(num_spans)]
            chunks.append(chunk)
            assert len(chunk) == raw
    # The chunks in order are the documents of the epoch, concatenated.
    order, rest = split_docs(np.concatenate(chunks), ds.docs, eos=None)
    assert len(order) == len(set(order)) > 3 and len(rest) < 120


def test_span_corruption_refuses_a_vocabulary_without_enough_sentinels():
    """Without extra ids the top pieces of the vocabulary are ordinary tokens: refused, as the
    seqio preprocessor refuses it (one check, `spans.check_sentinels`)."""
    raw = spans.span_raw_length(ENCDEC["inputs"], ENCDEC["targets"])
    needed = spans.span_corruption_lengths(raw)[2]
    component = [pb.Component("span_en", span(n=20), 1.0)]
    with pytest.raises(ValueError, match=f"needs {needed} sentinel ids.*extra_ids=0"):
        run(component, steps=1, sequence_length=ENCDEC, extra_ids=0)
    assert run(component, steps=1, sequence_length=ENCDEC, extra_ids=needed)


def test_same_seed_same_batches_other_seed_different():
    for kind in KINDS:
        a = run(*mixture(kind)[:1], steps=3, sequence_length=mixture(kind)[1], seed=11)
        b = run(*mixture(kind)[:1], steps=3, sequence_length=mixture(kind)[1], seed=11)
        c = run(*mixture(kind)[:1], steps=3, sequence_length=mixture(kind)[1], seed=12)
        assert_same(a, b)
        assert any(
            not np.array_equal(x["decoder_target_tokens"], y["decoder_target_tokens"])
            for x, y in zip(a, c, strict=True)
        )


def test_parity_with_the_seqio_path():
    """The numpy feature conversion equals `pipelines.preprocessors`'."""
    import tensorflow as tf

    from pipelines import preprocessors as prep

    # The span arithmetic itself has one definition (`pipelines.prepared.spans`), which the seqio
    # preprocessors import: what is compared here is the batches built from it.
    for kind in ("lm", "encdec_mix"):
        comps, length = mixture(kind)
        b = run(comps, steps=1, sequence_length=length, start_id=3)[0]
        rows = {
            "targets": b["decoder_target_tokens"],
            "targets_segment_ids": b["decoder_segment_ids"],
            "targets_positions": b["decoder_positions"],
            "component": np.where(b["decoder_segment_ids"] > 0, b["decoder_task_ids"] + 1, 0),
        }
        convert = prep._decoder_rows
        if "encoder_input_tokens" in b:
            convert = prep._encdec_rows
            rows.update(
                inputs=b["encoder_input_tokens"],
                inputs_segment_ids=b["encoder_segment_ids"],
                inputs_positions=b["encoder_positions"],
            )
        want = convert({k: tf.constant(v) for k, v in rows.items()}, 3)
        assert set(want) == set(b)
        for key, value in want.items():
            np.testing.assert_array_equal(b[key], value.numpy(), err_msg=key)


def test_next_fit_packs_in_order():
    lengths = np.array([[3, 2], [4, 1], [2, 2], [5, 5], [1, 1]])
    np.testing.assert_array_equal(packing.next_fit(lengths, [8, 4]), [0, 2, 3, 4, 5])


def bad(**changes):
    kw = dict(
        components=[pb.Component("lm_en", lm(), 1.0)],
        sequence_length=LM_LEN,
        global_batch_size=8,
        seed=0,
    )
    kw.update(changes)
    return kw


EMPTY = MemoryDataset([{"targets": np.zeros(0, np.int32)}], "lm_chunks")


@pytest.mark.parametrize(
    "kw, match",
    [
        (bad(components=[pb.Component("lm_en", EMPTY, 1.0)]), r"components\[0\].*no row"),
        (
            bad(components=[pb.Component("x", MemoryDataset(span().docs, "lm"), 1.0)]),
            "postprocess = 'lm'.*allowed",
        ),
        (
            bad(components=[pb.Component("mt", MemoryDataset(pairs().docs, "lm_chunks"), 1.0)]),
            "features.*allowed",
        ),
        (bad(sequence_length=ENCDEC), "sequence_length.*decoder-only.*allowed: an int"),
        (bad(sequence_length={"inputs": 8}), "sequence_length.*allowed"),
        (
            bad(
                components=[pb.Component("s", span(), 1.0)],
                sequence_length={"inputs": 3, "targets": 2},
                vocab_size=VOCAB,
            ),
            "too short",
        ),
        (bad(components=[pb.Component("s", span(), 1.0)], sequence_length=ENCDEC), "vocab_size"),
        (bad(host_rows=((4, 9),)), "host_rows.*allowed"),
        (bad(components=[pb.Component("a", lm(), 0.0)]), "fractions.*allowed"),
        (bad(subset_examples=1000), "subset_examples = 1000; allowed: 1 to 60"),
        (bad(subset_examples=2, subset_tokens=3), "subset_examples and subset_tokens"),
        (
            bad(
                components=[pb.Component("a", lm(), 0.5), pb.Component("b", lm(), 0.5)],
                subset_examples=3,
            ),
            "one component",
        ),
    ],
)
def test_bad_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        pb.batches(**kw)


def test_zero_fraction_component_with_no_documents_is_fine():
    comps = [pb.Component("lm_fr", lm(), 1.0), pb.Component("lm_en", EMPTY, 0.0)]
    (b,) = run(comps, steps=1)
    assert set(np.unique(b["decoder_task_ids"])) == {0}


@pytest.mark.slow
def test_over_real_prepared_tasks(tiny_data, seqio_registry, tmp_path):
    """Tasks prepared by `pipelines.prepared.prepare` from the UDHR fixture and read by
    `pipelines.prepared.shards.PreparedDataset`: LM rows are the corpus lines, tokenized, with EOS; one
    epoch of pairs holds exactly seqio's examples (trimmed, EOS after); hosts and resume as in
    memory."""
    import seqio

    from pipelines import tasks, vocab
    from pipelines.corpora import paths
    from pipelines.prepared import prepare, shards

    vocabulary = vocab.load_vocab(tiny_data["vocab"], extra_ids=100)
    tasks.register_tasks(
        vocabulary=vocabulary, corpora_dir=tiny_data["corpora"], langs=["en"], pairs=["en-fr"]
    )
    for name in ("lm_en", "mt_en_fr"):
        prepare.prepare(
            task_name=name, split="train", out_dir=tmp_path, num_shards=2, workers=1, log=print
        )
    opened = lambda name: shards.PreparedDataset.open(tmp_path / name)  # noqa: E731
    eos = vocabulary.eos_id
    kw = dict(batch=4, seed=5, eos_id=eos, vocab_size=vocabulary.vocab_size)

    ds = opened("lm_en")
    rows = (int(ds.lengths("targets").sum()) + ds.num_docs) // LM_LEN  # the first epoch
    batches = run([pb.Component("lm_en", ds, 1.0)], steps=rows // 4, **kw)
    stream = np.concatenate([b["decoder_target_tokens"] for b in batches])
    *docs, _ = np.split(stream.reshape(-1), np.flatnonzero(stream.reshape(-1) == eos) + 1)
    lines = paths.mono_file(tiny_data["corpora"], "en", "train").read_text().splitlines()
    encoded = {tuple(vocabulary.encode(line)) + (eos,) for line in lines}
    # Each document once; the dropped tail (< L tokens) holds at most 3 (all have >= 11 tokens).
    assert min(ds.lengths("targets")) >= 11
    assert len(docs) == len({tuple(d) for d in docs}) >= ds.num_docs - 3
    assert {tuple(d.tolist()) for d in docs} <= encoded

    lengths = {"inputs": 64, "targets": 32}
    want = seqio.get_mixture_or_task("mt_en_fr").get_dataset(lengths, split="train", shuffle=False)
    want = {(tuple(e["inputs"]), tuple(e["targets"])) for e in want.as_numpy_iterator()}
    comps = [pb.Component("mt_en_fr", opened("mt_en_fr"), 1.0)]
    got = set()
    for b in run(comps, steps=len(want), sequence_length=lengths, **kw):
        for r in range(4):
            enc, dec = b["encoder_segment_ids"][r], b["decoder_segment_ids"][r]
            for s in range(1, dec.max() + 1):
                got.add(
                    (
                        tuple(b["encoder_input_tokens"][r][enc == s]),
                        tuple(b["decoder_target_tokens"][r][dec == s]),
                    )
                )
    assert got == want

    # Articles are longer than the rows: one pair per row, so each host reads its rows' pairs
    # (three steps' worth, read one step at a time).
    kw["sequence_length"] = lengths
    kw["read_ahead_steps"] = 1
    comps = [pb.Component("mt_en_fr", opened("mt_en_fr"), 1.0)]
    whole = run(comps, steps=3, start_step=2, **kw)
    one_reads = comps[0].dataset.reads
    halves, reads = [], []
    for host in (((0, 2),), ((2, 4),)):
        comps = [pb.Component("mt_en_fr", opened("mt_en_fr"), 1.0)]
        halves.append(run(comps, steps=3, start_step=2, host_rows=host, **kw))
        reads.append(comps[0].dataset.reads)
    assert_same(
        [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(*halves, strict=True)], whole
    )
    assert reads == [6, 6] and one_reads == 12


def test_importing_the_input_imports_no_tensorflow():
    assert imported_with("pipelines.prepared.batches", ("tensorflow", "seqio")) == []


def test_reading_ahead_changes_the_reads_not_the_batches():
    comps, _ = mixture("lm")
    one = run(comps, steps=5, start_step=3, read_ahead_steps=1)
    comps, _ = mixture("lm")
    ahead = run(comps, steps=5, start_step=3, read_ahead_steps=4)
    assert_same(one, ahead)
