"""The papers' corpora as HF `datasets` files (`pipelines.corpora.hf_sources`): small files in
each corpus' real layout (names, columns, compression, splits), read in order, tokenised by the
`lm_`/`mt_` tasks like direct tokenisation, sharded by file, and clear errors on bad input."""

from __future__ import annotations

import gzip
import io
import json
import os
import pathlib
import tomllib

import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest
import seqio

from pipelines import tasks, vocab
from pipelines.corpora import hf_catalog, hf_sources
from rundir import storage

REPO = pathlib.Path(__file__).resolve().parent.parent


def _docs(tag: str, n: int) -> list[str]:
    return [f"{tag} document {i}: the rights of every person, number {i}." for i in range(n)]


def _jsonl(records) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _arrow_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _mc4(docs):
    return gzip.compress(
        _jsonl({"text": t, "timestamp": "2019-04-25T12:57:54Z", "url": "https://x"} for t in docs)
    )


def _wmt(pairs, other="de"):
    return _parquet(pa.table({"translation": [{other: b, "en": a} for a, b in pairs]}))


def _layout() -> dict[str, tuple[bytes, list]]:
    """Relative path -> (bytes, the documents or pairs it holds), in each corpus' real layout."""
    files = {}
    mc4 = "allenai/c4/multilingual"
    for i in range(3):
        docs = _docs(f"fr{i}", 3)
        files[f"{mc4}/c4-fr.tfrecord-0000{i}-of-00003.json.gz"] = (_mc4(docs), docs)
    docs = _docs("frval", 2)
    files[f"{mc4}/c4-fr-validation.tfrecord-00000-of-00001.json.gz"] = (_mc4(docs), docs)
    # mC4 de as `datasets.save_to_disk` writes a split: arrow IPC stream files.
    docs = _docs("de", 4)
    table = pa.table({"text": docs, "timestamp": ["t"] * 4, "url": ["u"] * 4})
    files["allenai/c4/de/train/data-00000-of-00001.arrow"] = (_arrow_stream(table), docs)
    rp = "togethercomputer/RedPajama-Data-1T"
    for name in ("book/book.jsonl", "c4/c4-train.00000-of-01024.jsonl"):
        docs = _docs(name.split("/")[0], 2)
        files[f"{rp}/{name}"] = (_jsonl({"text": t, "meta": {"src": name}} for t in docs), docs)
    docs = _docs("c4held", 2)
    files[f"{rp}/c4/c4-train.00001-of-01024.jsonl"] = (
        _jsonl({"text": t, "meta": {}} for t in docs),
        docs,
    )
    docs = _docs("cc", 3)
    files[f"{rp}/common_crawl/2019-30/en_head_0000.json.gz.dedup.classifier.jsonl.zst"] = (
        _zstd(_jsonl({"text": t, "meta": {"source": "cc"}} for t in docs)),
        docs,
    )
    for i in range(2):
        docs = [f"中文网页 {i}-{j}" for j in range(2)]
        path = f"Skywork/SkyPile-150B/data/2020-40_zh_head_000{i}.jsonl"
        files[path] = (_jsonl({"text": t} for t in docs), docs)
    for i in range(2):
        recs = [
            {
                "id": j,
                "uniqueKey": "k",
                "titleUkey": "t",
                "dataType": "新闻",
                "title": f"标题{i}{j}",
                "content": f"正文 {i} {j}",
            }
            for j in range(2)
        ]
        path = f"WuDaoCorpus2.0_base_200G/part-202100933{i}.json"
        files[path] = (
            json.dumps(recs, ensure_ascii=False).encode(),
            [f"标题{i}{j}\n正文 {i} {j}" for j in range(2)],
        )
    for split, n in (
        ("train-00000-of-00002", 3),
        ("train-00001-of-00002", 2),
        ("validation-00000-of-00001", 2),
        ("test-00000-of-00001", 2),
    ):
        pairs = [(f"{split} english {i}.", f"{split} deutsch {i}.") for i in range(n)]
        files[f"wmt/wmt17/de-en/{split}.parquet"] = (_wmt(pairs), pairs)
    return files


LAYOUT = _layout()


def _write(root: pathlib.Path, files=LAYOUT) -> str:
    for rel, (data, _) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return os.fspath(root)


def _held(prefix: str) -> list:
    return [x for rel, (_, docs) in sorted(LAYOUT.items()) if rel.startswith(prefix) for x in docs]


def _texts(source, split="train", **kwargs) -> list[str]:
    ds = source.get_dataset(split=split, shuffle=False, **kwargs)
    return [ex["text"].decode() for ex in ds.as_numpy_iterator()]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def v(tiny_data):
    return vocab.load_vocab(tiny_data["vocab"], extra_ids=100)


@pytest.mark.slow
def test_documents_come_out_in_file_order_with_the_papers_splits(root):
    mc4 = "allenai/c4/multilingual/c4-fr"
    fr = hf_sources.mono_source(root, "fr", source="hf")
    assert _texts(fr) == _held(f"{mc4}.tfrecord")
    assert _texts(fr, "validation") == _held(f"{mc4}-validation")
    assert _texts(hf_sources.mono_source(root, "de", source="hf")) == _held("allenai/c4/de/")
    # CPT English: RedPajama subsets in order; c4's last file held out as validation.
    rp = "togethercomputer/RedPajama-Data-1T/"
    en = hf_sources.mono_source(root, "en", source="hf_cpt")
    assert _texts(en) == (
        _held(rp + "book/") + _held(rp + "c4/c4-train.00000") + _held(rp + "common_crawl/")
    )
    assert _texts(en, "validation") == _held(rp + "c4/c4-train.00001")
    # CPT Chinese: Common Crawl (SkyPile) then WuDao (title + content), each holding out a file.
    zh = hf_sources.mono_source(root, "zh", source="hf_cpt")
    assert _texts(zh) == ["中文网页 0-0", "中文网页 0-1", "标题00\n正文 0 0", "标题01\n正文 0 1"]
    assert _texts(zh, "validation") == [
        "中文网页 1-0",
        "中文网页 1-1",
        "标题10\n正文 1 0",
        "标题11\n正文 1 1",
    ]
    assert fr.num_input_examples("train") is None  # JSON: not known without reading
    described = fr.describe()
    assert "mc4" in described["hf_source"] and root in described["hf_source"]
    assert described["hf_files"]["train"] == fr.list_shards("train")
    assert len(described["hf_files"]["train"]) == 3
    wmt = hf_sources.parallel_source(root, "en-de", source="hf")
    assert wmt.num_input_examples("train") == 5  # parquet footers
    assert set(wmt.splits) == {"train", "validation", "test"}


@pytest.mark.slow
def test_lm_task_tokens_equal_direct_tokenisation(seqio_registry, root, v):
    names = tasks.register_tasks(
        vocabulary=v, corpora_dir=root, langs=["fr", "en"], pairs=[], source="hf_cpt"
    )
    assert names == ["lm_fr", "span_fr", "lm_en", "span_en"]
    for lang, split, docs in (
        ("fr", "validation", _held("allenai/c4/multilingual/c4-fr-validation")),
        ("en", "train", _texts(hf_sources.mono_source(root, "en", source="hf_cpt"))),
    ):
        ds = seqio.get_mixture_or_task(f"lm_{lang}").get_dataset(
            sequence_length=None, split=split, shuffle=False, num_epochs=1
        )
        got = [ex["targets"].tolist() for ex in ds.as_numpy_iterator()]
        assert got == [v.encode(t) + [1] for t in docs]


@pytest.mark.slow
def test_mt_tasks_over_wmt_parquet_have_the_right_direction(seqio_registry, root, v):
    tasks.register_tasks(vocabulary=v, corpora_dir=root, langs=[], pairs=["en-de"], source="hf")
    pairs = LAYOUT["wmt/wmt17/de-en/test-00000-of-00001.parquet"][1]
    for name, prompt, src, tgt in (
        ("mt_en_de", "translate English to German: ", 0, 1),
        ("mt_de_en", "translate German to English: ", 1, 0),
    ):
        task = seqio.get_mixture_or_task(name)
        assert set(task.splits) == {"train", "validation", "test"}
        exs = list(
            task.get_dataset(sequence_length=None, split="test", shuffle=False, num_epochs=1)
        )
        assert [v.decode(ex["inputs"][:-1].numpy().tolist()) for ex in exs] == [
            v.decode(v.encode(prompt + p[src])) for p in pairs
        ]
        assert [ex["targets"].numpy().tolist() for ex in exs] == [
            v.encode(p[tgt]) + [1] for p in pairs
        ]


@pytest.mark.slow
def test_sharding_by_file_splits_the_documents_disjointly(root):
    fr = hf_sources.mono_source(root, "fr", source="hf")
    everything = _texts(fr)
    for shards in (3, 2, 5):  # 3 files: one each; 2: by file, uneven; 5: by document
        parts = [_texts(fr, shard_info=seqio.ShardInfo(i, shards)) for i in range(shards)]
        assert sorted(x for p in parts for x in p) == sorted(everything)
        assert sum(map(len, parts)) == len(everything)
    parts = [_texts(fr, shard_info=seqio.ShardInfo(i, 3)) for i in range(3)]
    assert [{d.split()[0] for d in p} for p in parts] == [{"fr0"}, {"fr1"}, {"fr2"}]
    # Shuffled with a different seed on each host: the shards stay disjoint.
    parts = [
        [
            ex["text"]
            for ex in fr.get_dataset(
                split="train", shuffle=True, seed=i, shard_info=seqio.ShardInfo(i, 2)
            ).as_numpy_iterator()
        ]
        for i in range(2)
    ]
    assert sorted(d.decode() for p in parts for d in p) == sorted(everything)
    once = fr.get_dataset(split="train", shuffle=True, seed=7)
    again = fr.get_dataset(split="train", shuffle=True, seed=7)
    assert list(once.as_numpy_iterator()) == list(again.as_numpy_iterator())


def test_bad_input_is_one_clear_error(seqio_registry, tmp_path, root, v):
    empty = tmp_path / "empty"
    empty.mkdir()
    for where, why in ((empty, "found: nothing"), (tmp_path / "nowhere", "no such directory")):
        with pytest.raises(FileNotFoundError, match="holds none of the corpora") as e:
            tasks.register_tasks(vocabulary=v, corpora_dir=where, source="hf")  # every language
        assert os.fspath(where) in str(e.value) and "allenai/c4" in str(e.value)
        assert why in str(e.value)
    with pytest.raises(hf_sources.MissingData) as e:
        tasks.register_tasks(vocabulary=v, corpora_dir=root, langs=["ro"], source="hf")
    for part in (root, "'ro'", "multilingual/c4-ro.tfrecord-*.json.gz", "allenai/c4"):
        assert part in str(e.value)
    # A column renamed: mC4 `text` as `content`, WMT without the German side.
    bad = {
        "allenai/c4/multilingual/c4-fr.tfrecord-00000-of-00001.json.gz": (
            gzip.compress(_jsonl([{"content": "x", "url": "u"}])),
            [],
        ),
        "wmt/wmt17/de-en/train-00000-of-00001.parquet": (_wmt([("a", "b")], other="fr"), []),
    }
    bad_root = _write(tmp_path / "bad", bad)
    with pytest.raises(hf_sources.LayoutError) as e:
        tasks.register_tasks(vocabulary=v, corpora_dir=bad_root, langs=["fr"], source="hf")
    for part in ("c4-fr.tfrecord-00000-of-00001.json.gz", "'text'", "'content'", "fr"):
        assert part in str(e.value)
    with pytest.raises(hf_sources.LayoutError, match=r"translation.*\{en, de\}.*\['en', 'fr'\]"):
        hf_sources.parallel_source(bad_root, "en-de", source="hf")


def test_data_config_source_hf_registers_the_tasks(seqio_registry, root, tiny_data):
    from trainer import data

    config = data.DataConfig(
        mixture_or_task="lm_fr",
        vocab_path=tiny_data["vocab"],
        corpora_dir=root,
        source="hf",
        langs=None,  # every language present: fr and de (mC4), the en-de pair (WMT17)
        pairs=None,
    )
    data.register(config)
    assert {"lm_fr", "lm_de", "span_de", "mt_en_de", "mt_de_en"} <= set(seqio.TaskRegistry.names())
    assert "lm_en" not in seqio.TaskRegistry.names()  # no mC4 English here


def test_reads_from_object_storage(gcs_bucket):
    files = {k: LAYOUT[k] for k in LAYOUT if k.startswith(("allenai/c4/multilingual", "wmt/"))}
    for rel, (data, _) in files.items():
        storage.write_bytes(f"{gcs_bucket}/hf/{rel}", data)
    fr = hf_sources.mono_source(f"{gcs_bucket}/hf", "fr", source="hf")
    assert fr.list_shards("train")[0].startswith(f"{gcs_bucket}/hf/allenai/c4/multilingual/")
    assert _texts(fr) == _held("allenai/c4/multilingual/c4-fr.tfrecord")
    wmt = hf_sources.parallel_source(f"{gcs_bucket}/hf", "en-de", source="hf")
    assert wmt.num_input_examples("validation") == 2


def test_paper_sources_cover_the_paper_manifests():
    for manifest, entry in hf_catalog.PAPER_SOURCES.items():
        sweep = tomllib.loads((REPO / "launch" / "manifests" / f"{manifest}.toml").read_text())
        langs = set(sweep.get("axes", {}).get("target_langs", []))
        text = json.dumps(sweep)
        langs |= {lang for lang in ("en", "de", "fr", "ro", "zh", "ru") if f"_{lang}_" in text}
        pairs = {f"en-{x}" for x in ("de", "fr", "ro") if f"mt_en_{x}" in text}
        keys = set(entry) - {"source"}
        assert langs | pairs <= keys, manifest
        table = hf_catalog.SOURCE_CORPORA[entry["source"]]
        for key in keys:
            names = [entry[key]] if isinstance(entry[key], str) else entry[key]
            assert tuple(names) == table["parallel" if "-" in key else "mono"][key]
    markdown = hf_catalog.paper_sources_markdown()
    assert markdown.count("\n") == 2 + sum(
        len([n] if isinstance(n, str) else n)
        for e in hf_catalog.PAPER_SOURCES.values()
        for k, n in e.items()
        if k != "source"
    )
    assert "| cpt_paper | `hf_cpt` | zh | wudao |" in markdown
    assert "`togethercomputer/RedPajama-Data-1T`" in markdown
