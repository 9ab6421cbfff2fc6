"""Prepared tasks: tokens equal seqio's pre-cache output, the manifest says what was
prepared, `PreparedDataset.open` refuses a damaged directory before any read, and preparation
restarts and splits across machines without losing or duplicating a document."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import shutil
import time

import numpy as np
import pytest

from pipelines.prepared import manifest as manifest_lib
from pipelines.prepared import prepare as prepare_lib
from pipelines.prepared.shards import PreparedDataError, PreparedDataset, vocab_sha256

LM_SHARDS = 4


def _quiet(line: str) -> None:
    del line


@pytest.fixture(scope="module")
def registration(tiny_data, seqio_state):
    """The tiny corpora's tasks registered for this module (restored afterwards)."""
    saved = seqio_state.snapshot()
    reg = prepare_lib.Registration(vocab_path=tiny_data["vocab"], corpora_dir=tiny_data["corpora"])
    reg.register()
    yield reg
    seqio_state.restore(saved)


@pytest.fixture(scope="module")
def prepared(registration, tmp_path_factory):
    """`lm_en` (4 shards) and `mt_en_fr` (2 shards) prepared once; `{task: (dir, manifest)}`."""
    out = tmp_path_factory.mktemp("prepared")
    found = {}
    for task, shards in (("lm_en", LM_SHARDS), ("mt_en_fr", 2)):
        manifest = prepare_lib.prepare(
            task_name=task, split="train", out_dir=out, num_shards=shards, workers=1, log=_quiet
        )
        found[task] = (os.path.join(out, task), manifest)
    return found


def _seqio_docs(task_name: str, *, shard: tuple[int, int] | None = None) -> list[dict]:
    """seqio's pre-cache output of the train split (or of every n-th raw line from k)."""
    import seqio

    task = seqio.get_mixture_or_task(task_name)
    ds = task.source.get_dataset(split="train", shuffle=False)
    if shard is not None:
        ds = ds.shard(shard[1], shard[0])
    ds = task.preprocess_precache(ds, seed=0)
    keys = [k for k in ("inputs", "targets") if k in ds.element_spec]
    return [{k: np.asarray(ex[k]) for k in keys} for ex in ds.as_numpy_iterator()]


def _key(doc: dict) -> tuple:
    return tuple(tuple(doc[k].tolist()) for k in sorted(doc))


def _all_docs(directory: str) -> list[dict]:
    with PreparedDataset.open(directory) as ds:
        return ds.read(np.arange(ds.num_docs))


@pytest.mark.slow
@pytest.mark.parametrize("task", ["lm_en", "mt_en_fr"])
def test_prepared_tokens_are_seqios_precache_output(prepared, task):
    directory, manifest = prepared[task]
    with PreparedDataset.open(directory) as ds:
        offsets = manifest.offsets
        for k in range(len(manifest.shards)):
            want = _seqio_docs(task, shard=(k, len(manifest.shards)))
            got = ds.read(range(offsets[k], offsets[k + 1]))
            assert [_key(d) for d in got] == [_key(d) for d in want], f"shard {k}"
            for doc in got:
                assert all(v.dtype == np.int32 and v.ndim == 1 for v in doc.values())
        everything = _seqio_docs(task)
        assert ds.num_docs == len(everything) > 2 * len(manifest.shards)
        assert sorted(_key(d) for d in ds.read(np.arange(ds.num_docs))) == sorted(
            _key(d) for d in everything
        )
        for feature in ds.features:
            np.testing.assert_array_equal(
                ds.lengths(feature), [len(d[feature]) for d in ds.read(range(ds.num_docs))]
            )
        eos = manifest.eos_id
        assert not any(int(d["targets"][-1]) == eos for d in everything)  # the reader adds EOS


@pytest.mark.slow
def test_manifest_records_what_was_prepared(prepared, tiny_data):
    directory, manifest = prepared["lm_en"]
    docs = _seqio_docs("lm_en")
    with open(tiny_data["vocab"], "rb") as f:
        vocab_hash = hashlib.sha256(f.read()).hexdigest()
    assert manifest.task == "lm_en" and manifest.split == "train"
    assert manifest.documents == len(docs)
    assert manifest.tokens == {"targets": sum(len(d["targets"]) for d in docs)}
    assert manifest.vocab_hash == vocab_hash == vocab_sha256(tiny_data["vocab"])
    assert (manifest.vocab_size, manifest.eos_id) == (320, 1)
    assert manifest.postprocess == "lm_chunks" and manifest.features == ("targets",)
    assert manifest.preprocessors == {
        "precache": ("lines_to_targets", "tokenize"),
        "postcache": ("lm_chunks",),
    }
    train = os.path.join(tiny_data["corpora"], "mono", "en", "train.txt")
    assert manifest.source["files"] == [{"path": train, "bytes": os.path.getsize(train)}]
    assert [s.file for s in manifest.shards] == [
        f"data-0000{k}-of-0000{LM_SHARDS}.array_record" for k in range(LM_SHARDS)
    ]
    for shard in manifest.shards:
        path = os.path.join(directory, shard.file)
        assert shard.bytes == os.path.getsize(path)
        assert shard.sha256 == manifest_lib.file_sha256(path)
    assert sum(s.documents for s in manifest.shards) == manifest.documents
    on_disk = manifest_lib.Manifest.from_json(open(os.path.join(directory, "manifest.json")).read())
    assert on_disk == manifest
    assert manifest_lib.Manifest.from_json(manifest.to_json()) == manifest

    mt = prepared["mt_en_fr"][1]
    assert mt.postprocess == "pairs" and mt.features == ("inputs", "targets")
    assert mt.preprocessors["postcache"] == ("append_eos_after_trim",)
    assert mt.preprocessors["precache"] == ("parse_tsv", "to_translation", "tokenize")


def test_span_tasks_prepare_their_targets_for_span_corruption(registration, tmp_path):
    manifest = prepare_lib.prepare(
        task_name="span_fr",
        split="train",
        out_dir=tmp_path,
        num_shards=1,
        workers=1,
        max_documents=3,
        log=_quiet,
    )
    assert manifest.postprocess == "span_corruption" and manifest.features == ("targets",)
    assert manifest.documents == 3 and manifest.max_documents == 3
    got = _all_docs(os.path.join(tmp_path, "span_fr"))
    assert [_key(d) for d in got] == [_key(d) for d in _seqio_docs("span_fr")[:3]]


def _damaged_copy(prepared, tmp_path) -> str:
    directory = os.path.join(tmp_path, "lm_en")
    shutil.copytree(prepared["lm_en"][0], directory)
    return directory


def test_a_missing_shard_is_refused_at_open(prepared, tmp_path):
    directory = _damaged_copy(prepared, tmp_path)
    os.remove(os.path.join(directory, "data-00001-of-00004.array_record"))
    with pytest.raises(PreparedDataError) as err:
        PreparedDataset.open(directory)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(os.path.join(directory, "data-00001-of-00004.array_record: missing"))


def test_a_truncated_shard_is_refused_at_open(prepared, tmp_path):
    directory = _damaged_copy(prepared, tmp_path)
    path = os.path.join(directory, "data-00002-of-00004.array_record")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(PreparedDataError) as err:
        PreparedDataset.open(directory)
    assert str(err.value) == (f"{path}: {size - 1000:,} bytes, manifest says {size:,} (truncated?)")


def test_a_shard_with_other_records_is_refused_at_open(prepared, tmp_path):
    # Same size, other record count: shard 3 replaced by shard 0 of the same size.
    directory = _damaged_copy(prepared, tmp_path)
    manifest = prepared["lm_en"][1]
    sizes = {s.documents for s in manifest.shards}
    first, last = manifest.shards[0], manifest.shards[-1]
    assert len(sizes) > 1 and first.bytes == last.bytes and first.documents != last.documents
    shutil.copy(os.path.join(directory, first.file), os.path.join(directory, last.file))
    with pytest.raises(PreparedDataError, match=f"{last.file}: {first.documents} documents, "):
        PreparedDataset.open(directory)


def test_a_foreign_vocabulary_or_no_manifest_is_refused_at_open(prepared, tmp_path):
    directory, manifest = prepared["lm_en"]
    other = hashlib.sha256(b"another vocabulary").hexdigest()
    with pytest.raises(PreparedDataError) as err:
        PreparedDataset.open(directory, vocab_hash=other, vocab_path="other.model")
    assert str(err.value) == (
        f"{os.path.join(directory, 'manifest.json')}: prepared with vocabulary sha256 "
        f"{manifest.vocab_hash[:12]}.. ({manifest.vocab_path}), this run's VOCAB_PATH "
        f"other.model has {other[:12]}.."
    )
    PreparedDataset.open(directory, vocab_hash=manifest.vocab_hash).close()

    copy = _damaged_copy(prepared, tmp_path)
    os.remove(os.path.join(copy, "manifest.json"))
    with pytest.raises(PreparedDataError, match="manifest.json: no manifest"):
        PreparedDataset.open(copy)


def test_reads_come_back_in_the_order_asked_and_are_counted(prepared):
    directory, manifest = prepared["lm_en"]
    with PreparedDataset.open(directory) as ds:
        assert ds.reads == 0 and ds.postprocess == "lm_chunks" and len(ds) == ds.num_docs
        one_by_one = [ds.read([i])[0] for i in range(ds.num_docs)]
        assert ds.reads == ds.num_docs
        order = np.random.default_rng(0).permutation(ds.num_docs)[:17].tolist() + [3, 3]
        batch = ds.read(order)
        assert [_key(d) for d in batch] == [_key(one_by_one[i]) for i in order]
        assert ds.reads == ds.num_docs + len(order)
        assert ds.read([]) == [] and ds.reads == ds.num_docs + len(order)
        with pytest.raises(IndexError, match=f"outside \\[0, {ds.num_docs}\\)"):
            ds.read([ds.num_docs])
        with pytest.raises(KeyError, match="allowed: targets"):
            ds.lengths("inputs")
        copy = pickle.loads(pickle.dumps(ds))  # what a data-loader process receives
        assert copy.reads == 0 and [_key(d) for d in copy.read(order)] == list(map(_key, batch))
        copy.close()


@pytest.mark.slow
def test_a_killed_preparation_reruns_to_the_same_documents(registration, prepared, tmp_path):
    # First run: shards 0 and 1 finished; then killed while writing shard 2 (a temporary file
    # left) and after renaming shard 3 but before its sidecar (the file without a sidecar).
    logged = []
    first = prepare_lib.prepare(
        task_name="lm_en",
        split="train",
        out_dir=tmp_path,
        num_shards=LM_SHARDS,
        workers=1,
        shard_indices=[0, 1],
        log=logged.append,
    )
    assert first is None and "left: [2, 3]" in logged[-1]
    directory = os.path.join(tmp_path, "lm_en")
    with open(os.path.join(directory, "data-00002-of-00004.array_record.tmp-99999"), "wb") as f:
        f.write(b"half a shard")
    shutil.copy(
        os.path.join(directory, "data-00000-of-00004.array_record"),
        os.path.join(directory, "data-00003-of-00004.array_record"),
    )
    with pytest.raises(PreparedDataError, match="no manifest"):
        PreparedDataset.open(directory)
    done = os.stat(os.path.join(directory, "data-00000-of-00004.array_record")).st_mtime_ns

    logged.clear()
    manifest = prepare_lib.prepare(
        task_name="lm_en",
        split="train",
        out_dir=tmp_path,
        num_shards=LM_SHARDS,
        workers=1,
        log=logged.append,
    )
    assert any("2 of the 4 shards asked for are done already" in line for line in logged)
    assert os.stat(os.path.join(directory, "data-00000-of-00004.array_record")).st_mtime_ns == done
    assert not [n for n in os.listdir(directory) if ".tmp-" in n]
    everything = _seqio_docs("lm_en")
    got = _all_docs(directory)
    assert len(got) == manifest.documents == len(everything)
    assert sorted(map(_key, got)) == sorted(map(_key, everything))
    assert manifest.without_time() == prepared["lm_en"][1].without_time()


@pytest.mark.slow
def test_two_machines_prepare_the_same_as_one(registration, prepared, tmp_path):
    common = dict(task_name="lm_en", split="train", out_dir=tmp_path, num_shards=LM_SHARDS)
    assert prepare_lib.prepare(**common, workers=1, shard_indices=[3, 1], log=_quiet) is None
    manifest = prepare_lib.prepare(**common, workers=1, shard_indices=[0, 2], log=_quiet)
    assert manifest.without_time() == prepared["lm_en"][1].without_time()
    # Another machine, finalizing after the fact, keeps the manifest as written.
    again = prepare_lib.prepare(**common, workers=1, shard_indices=(), log=_quiet)
    assert again == manifest


def test_a_directory_of_other_settings_is_refused(registration, prepared, tmp_path):
    directory = os.path.join(tmp_path, "lm_en")
    shutil.copytree(prepared["lm_en"][0], directory)
    with pytest.raises(PreparedDataError, match="prepared with max_documents None .this run: 2.;"):
        prepare_lib.prepare(
            task_name="lm_en",
            split="train",
            out_dir=tmp_path,
            num_shards=LM_SHARDS,
            workers=1,
            max_documents=2,
            log=_quiet,
        )


def _cli(args, capsys) -> tuple[int, str]:
    from xlscale_cli import main

    code = main.main(["data", "prepare", *args])
    return code, capsys.readouterr().err.strip()


def test_cli_bad_flags_are_one_line_naming_the_flag(tiny_data, tmp_path, capsys, seqio_registry):
    from pipelines import tasks

    base = ["--vocab", tiny_data["vocab"], "--data-dir", tiny_data["corpora"], "--out", "x"]
    cases = {
        f"--task 'lm_xx': no such registered task (registered from --data-dir "
        f"{tiny_data['corpora']}, --source local); allowed: lm_de, lm_en,": ["--task", "lm_xx"],
        "--shards 0: allowed: an integer >= 1": ["--task", "lm_en", "--shards", "0"],
        "--workers 0: allowed: an integer >= 1": ["--task", "lm_en", "--workers", "0"],
        "--shard-index 4: allowed: 0 to 3 (--shards 4)": [
            "--task", "lm_en", "--shards", "4", "--shard-index", "1", "4",
        ],
        f"--source 'hub': allowed: {', '.join(sorted(tasks.SOURCES))}": [
            "--task", "lm_en", "--source", "hub",
        ],
        "--split 'dev': task lm_en has no such split; allowed: train, validation": [
            "--task", "lm_en", "--split", "dev", "--out", os.fspath(tmp_path),
        ],
    }  # fmt: skip
    for expected, args in cases.items():
        code, err = _cli([*base, *args], capsys)
        assert code == 2 and "\n" not in err, (args, err)
        assert err.startswith(f"xlscale data prepare: {expected}"), (args, err)
    missing = os.fspath(tmp_path / "none.model")
    code, err = _cli(["--task", "lm_en", "--vocab", missing, "--out", "x"], capsys)
    assert (code, err) == (
        2,
        f"xlscale data prepare: --vocab {missing!r}: no such file; allowed: a SentencePiece "
        ".model file",
    )


@pytest.mark.slow  # two spawned processes import TensorFlow: 8 s idle, more on a busy machine
def test_spawned_workers_prepare_the_same_documents(registration, prepared, tmp_path):
    logged = []
    manifest = prepare_lib.prepare(
        task_name="lm_en",
        split="train",
        out_dir=tmp_path,
        num_shards=LM_SHARDS,
        workers=2,
        registration=registration,
        log=logged.append,
    )
    assert manifest.without_time() == prepared["lm_en"][1].without_time()
    assert sum(" done (" in line for line in logged) == LM_SHARDS
    assert all("docs/s" in line and "tokens/s" in line and "ETA" in line for line in logged[1:-1])
    got = _all_docs(os.path.join(tmp_path, "lm_en"))
    assert [_key(d) for d in got] == [_key(d) for d in _all_docs(prepared["lm_en"][0])]


@pytest.mark.slow
def test_cli_prepares_and_finalizes(tiny_data, tmp_path, capsys, seqio_registry):
    from xlscale_cli import main

    base = ["data", "prepare", "--task", "mt_fr_en", "--vocab", tiny_data["vocab"]]
    base += ["--data-dir", tiny_data["corpora"], "--out", os.fspath(tmp_path), "--shards", "2"]
    assert main.main([*base, "--workers", "1", "--shard-index", "1", "--max-documents", "3"]) == 0
    assert "left: [0]" in capsys.readouterr().out
    assert main.main([*base, "--finalize"]) == 0
    assert "1 of 2 shards done" in capsys.readouterr().out
    assert main.main([*base, "--workers", "1", "--shard-index", "0", "--max-documents", "3"]) == 0
    assert "6 documents" in capsys.readouterr().out
    with PreparedDataset.open(tmp_path / "mt_fr_en") as ds:
        assert (ds.num_docs, ds.postprocess, ds.features) == (6, "pairs", ("inputs", "targets"))


def test_verify_checksums_finds_a_changed_byte(prepared, tmp_path):
    directory = _damaged_copy(prepared, tmp_path)
    with PreparedDataset.open(directory) as ds:
        ds.verify_checksums()
    path = os.path.join(directory, "data-00001-of-00004.array_record")
    with open(path, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with PreparedDataset.open(directory) as ds, pytest.raises(PreparedDataError, match="sha256"):
        ds.verify_checksums()


def test_a_rerun_on_other_source_data_is_refused(tiny_data, tmp_path, capsys, seqio_registry):
    # The same file names, other English text: the shards of the first corpus are not reused.
    corpora, out = tmp_path / "corpora", tmp_path / "prepared"
    shutil.copytree(tiny_data["corpora"], corpora)
    args = ["--task", "lm_en", "--vocab", tiny_data["vocab"], "--data-dir", os.fspath(corpora)]
    args += ["--out", os.fspath(out), "--shards", "2", "--workers", "1"]
    assert _cli(args, capsys) == (0, "")
    train = corpora / "mono" / "en" / "train.txt"
    before = train.stat().st_size
    train.write_text(train.read_text().replace("e", "ee"))  # as many lines, other text
    after = train.stat().st_size
    code, err = _cli(args, capsys)
    sidecar = out / "lm_en" / "data-00000-of-00002.lengths.npz"
    assert (code, err) == (
        2,
        f"xlscale data prepare: {sidecar}: prepared with source file {train} {before:,} bytes "
        f"(this run: {after:,} bytes); use another --out, or delete the directory",
    )
    # --finalize from the other data is refused as well (the manifest would name it).
    code, err = _cli([*args, "--finalize"], capsys)
    assert code == 2 and err.startswith(f"xlscale data prepare: {sidecar}: prepared with source")


@pytest.mark.slow
def test_another_shard_count_is_refused_and_finalize_takes_shards(registration, prepared, tmp_path):
    directory = _damaged_copy(prepared, tmp_path)  # lm_en in 4 shards
    manifest = prepared["lm_en"][1]
    common = dict(task_name="lm_en", split="train", out_dir=tmp_path, log=_quiet)
    with pytest.raises(PreparedDataError) as err:
        prepare_lib.prepare(**common, num_shards=2, workers=1)
    assert str(err.value) == (
        f"{directory}: holds 8 file(s) of a preparation into 4 shards (data-00000-of-00004."
        "array_record, data-00000-of-00004.lengths.npz, data-00001-of-00004.array_record, ...); "
        "this run: --shards 2; use another --out, or delete those files"
    )
    assert not [n for n in os.listdir(directory) if "-of-00002" in n]
    with pytest.raises(PreparedDataError, match="this run: --shards 2;"):
        prepare_lib.finalize(**common, num_shards=2)
    assert prepare_lib.finalize(**common, num_shards=4) == manifest
    assert prepare_lib.finalize(**common) == manifest  # the one count the directory holds

    # A 2-shard preparation beside it (as an older version left them): finalize is ambiguous
    # without --shards, and refused with either count; manifest.json stays as it was.
    two = tmp_path / "two"
    prepare_lib.prepare(**{**common, "out_dir": two}, num_shards=2, workers=1)
    for name in os.listdir(two / "lm_en"):
        if name != "manifest.json":
            shutil.copy(two / "lm_en" / name, directory)
    with pytest.raises(PreparedDataError) as err:
        prepare_lib.finalize(**common)
    assert str(err.value).startswith(f"{directory}: holds 12 file(s) of a preparation into 2 and 4")
    assert str(err.value).endswith(
        "allowed: --shards naming the one to finalize, once the others are deleted"
    )
    for shards, other in ((2, "4"), (4, "2")):
        with pytest.raises(PreparedDataError, match=f"into {other} shards .*--shards {shards};"):
            prepare_lib.finalize(**common, num_shards=shards)
    on_disk = manifest_lib.Manifest.from_json(open(os.path.join(directory, "manifest.json")).read())
    assert on_disk == manifest


def test_finalize_refuses_sidecars_that_disagree(registration, prepared, tmp_path):
    directory = _damaged_copy(prepared, tmp_path)
    common = dict(task_name="lm_en", split="train", num_shards=LM_SHARDS, log=_quiet)
    sample = tmp_path / "sample"
    prepare_lib.prepare(**common, out_dir=sample, workers=1, max_documents=2, shard_indices=[3])
    for suffix in (".array_record", ".lengths.npz"):
        name = f"data-00003-of-00004{suffix}"
        shutil.copy(sample / "lm_en" / name, os.path.join(directory, name))
    with pytest.raises(PreparedDataError) as err:
        prepare_lib.finalize(**common, out_dir=tmp_path)
    assert str(err.value) == (
        f"{os.path.join(directory, 'data-00003-of-00004.lengths.npz')}: prepared with "
        "max_documents 2 (data-00000-of-00004.lengths.npz: None); the sidecars disagree: delete "
        "the directory and prepare again"
    )


def _jsonl_gz(records) -> bytes:
    return gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in records))


def _mc4_fr(root, files: list[bytes]) -> tuple[str, list[str]]:
    """An HF `hf` source root holding mC4 French as `files` (in order); (root, file paths)."""
    directory = root / "allenai" / "c4" / "multilingual"
    directory.mkdir(parents=True)
    paths = []
    for i, data in enumerate(files):
        path = directory / f"c4-fr.tfrecord-{i:05d}-of-{len(files):05d}.json.gz"
        path.write_bytes(data)
        paths.append(os.fspath(path))
    return os.fspath(root), paths


@pytest.mark.slow
def test_an_input_that_cannot_be_read_is_one_line_naming_shard_and_file(
    tiny_data, tmp_path, capsys, seqio_registry
):
    good = _jsonl_gz({"text": f"bonjour {i}"} for i in range(3))
    cases = {
        "layout": (
            _jsonl_gz([{"content": "x"}]),
            "LayoutError: {file} (record 0): expected column(s) ['text'], found ['content']",
        ),
        "gzip": (b"no gzip here", "reading {file}: "),
    }
    for case, (bad, expected) in cases.items():
        root, files = _mc4_fr(tmp_path / case, [good, bad])
        out = tmp_path / f"{case}-out"
        args = ["--task", "lm_fr", "--vocab", tiny_data["vocab"], "--data-dir", root]
        args += ["--source", "hf", "--out", os.fspath(out), "--shards", "2", "--workers", "1"]
        for _ in range(2):  # a rerun fails the same way; shard 0 is kept, nothing half-written
            code, err = _cli(args, capsys)
            shard = out / "lm_fr" / "data-00001-of-00002.array_record"
            assert code == 2 and "\n" not in err, err
            assert err.startswith(f"xlscale data prepare: {shard}: shard 1 of 2 failed"), err
            assert expected.format(file=files[1]) in err, err
            assert sorted(os.listdir(out / "lm_fr")) == [
                "data-00000-of-00002.array_record",
                "data-00000-of-00002.lengths.npz",
            ]


@pytest.mark.slow  # spawned processes import TensorFlow
def test_the_first_failing_shard_stops_the_workers(tiny_data, tmp_path, seqio_registry):
    # Shard 0 fails at its second record; shards 1-3 take far longer than that to prepare.
    # The call ends at the failure: the other shards are stopped, not prepared to the end.
    text = "le droit de toute personne a la liberte et a la securite, numero {}."
    bad = _jsonl_gz([{"text": "bonjour"}, {"content": "x"}])
    big = [_jsonl_gz({"text": text.format(i)} for i in range(60_000)) for _ in range(3)]
    root, files = _mc4_fr(tmp_path / "hf", [bad, *big])
    registration = prepare_lib.Registration(
        vocab_path=tiny_data["vocab"], corpora_dir=root, source="hf"
    )
    common = dict(task_name="lm_fr", split="train", out_dir=tmp_path / "out", num_shards=4)
    start = time.monotonic()
    with pytest.raises(PreparedDataError) as err:
        prepare_lib.prepare(**common, workers=2, registration=registration, log=_quiet)
    assert str(err.value).startswith(
        f"{tmp_path / 'out' / 'lm_fr' / 'data-00000-of-00004.array_record'}: shard 0 of 4 "
        f"failed: LayoutError: {files[0]} (record 1)"
    )
    # Nothing prepared to the end, nothing half-written left by the stopped workers.
    assert os.listdir(tmp_path / "out" / "lm_fr") == [], time.monotonic() - start
