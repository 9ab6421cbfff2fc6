"""The papers' corpora as named sources: Hugging Face `datasets` files read by a seqio source.

The corpora themselves are `pipelines.corpora.hf_catalog`'s (`CORPORA`, `SOURCE_CORPORA`: which
corpora a task source reads per language and pair, `PAPER_SOURCES`). Files: parquet, arrow
(`datasets.save_to_disk`), JSON lines (`.jsonl`, `.jsonl.gz`, `.json.gz`, `.jsonl.zst`) or JSON
arrays (WuDao).

Layout under the root (`DATA_DIR`, `data.DataConfig.corpora_dir`; a local path or gs://):
`ROOT/<Corpus.directory>/<files as distributed>`, the directory being the dataset id
(`huggingface-cli download <id> --repo-type dataset --local-dir ROOT/<id>`), e.g.
`ROOT/allenai/c4/multilingual/c4-fr.tfrecord-00000-of-01024.json.gz`. Every corpus also accepts
what `datasets` writes: `<config>/<split>-*.parquet` (the Hub's parquet export),
`<config>/<split>/*.parquet` and `<config>/<split>/*.arrow` (`save_to_disk` of a split). The
first layout with training files for a config is used, whole. A corpus without a published
validation split (RedPajama, SkyPile, WuDao) holds out the last training file (by path) of each
config with two or more, as the CPT paper holds out part of each training set.

Reading (`HfFilesDataSource`): a split's files in sorted order, `CYCLE_LENGTH` at a time,
`BLOCK_LENGTH` documents from each in turn (tf.data's deterministic interleave). A
`seqio.ShardInfo` takes every `num_shards`-th file (every `num_shards`-th document when files are
fewer); `shuffle` permutes the shard's files. Monolingual sources yield `{"text"}` (TFDS mC4's
feature), parallel ones `{"en", "<xx>"}` (TFDS WMT's), so `pipelines.tasks` registers `lm_`,
`span_` and `mt_` tasks over them with the preprocessors of its `tfds` source.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import io
import json
import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import seqio

from pipelines.corpora import hf_catalog
from rundir import storage

CYCLE_LENGTH = 8  # files read at a time
BLOCK_LENGTH = 64  # documents taken from each file in turn
READ_BATCH = 1024  # rows per parquet/arrow record batch

# Layouts that `datasets` writes, tried after a corpus' native layout ({config}, {split}).
DATASETS_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("{config}/{split}-*.parquet",),
    ("{config}/{split}/*.parquet",),
    ("{config}/{split}/*.arrow",),
)
SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst")


class MissingData(FileNotFoundError):
    """A language or pair has no training files under the root (registration skips it unless it
    was asked for by name)."""


class LayoutError(ValueError):
    """Files are there but not in the expected shape (a column or a translation side missing)."""


# ----------------------------------------------------------------------------- files


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel if rel else root


def _list(directory: str) -> list[str]:
    """Every file under `directory` as a path relative to it, sorted ([] if it does not exist)."""
    top = os.fspath(storage.as_path(directory))
    return sorted(os.fspath(p)[len(top) :].lstrip("/") for p in storage.list_files(top))


def _match(files: Sequence[str], patterns: Sequence[str], config: str, split: str) -> list[str]:
    pats = [p.format(config=config, split=split) for p in patterns]
    return [f for f in files if f.endswith(SUFFIXES) and any(fnmatch.fnmatch(f, p) for p in pats)]


def _config_files(
    files: Sequence[str], corpus: hf_catalog.Corpus, config: str
) -> dict[str, list[str]]:
    """Split -> files of one config, from the first layout that has training files."""
    layouts = [corpus.splits] + [
        {s: layout for s in ("train", "validation", "test")} for layout in DATASETS_LAYOUTS
    ]
    for layout in layouts:
        found = {s: _match(files, pats, config, s) for s, pats in layout.items()}
        found = {s: f for s, f in found.items() if f}
        if "train" not in found:
            continue
        if corpus.hold_out and "validation" not in found and len(found["train"]) > 1:
            found["validation"] = found["train"][-1:]
            found["train"] = found["train"][:-1]
        return found
    return {}


def _expected(corpus: hf_catalog.Corpus, key: str) -> str:
    pats = [
        p.format(config=cfg, split="train")
        for cfg in corpus.configs[key]
        for p in (*corpus.splits["train"], *(layout[0] for layout in DATASETS_LAYOUTS))
    ]
    return f"{corpus.name} ({corpus.directory}/{{{', '.join(pats)}}})"


def resolve_files(
    root: str | os.PathLike, key: str, *, source: str
) -> dict[str, list[tuple[str, str]]]:
    """Split -> `(path, corpus name)` of one language (or pair) of a task source.

    Args:
      root: the directory holding the corpora (`ROOT/<Corpus.directory>/...`); local or gs://.
      key: a language (`"fr"`) or a pair (`"en-fr"`).
      source: a key of `SOURCE_CORPORA` (`"hf"`, `"hf_cpt"`).

    Returns:
      split -> (path, corpus) in reading order: the corpora in `SOURCE_CORPORA` order, each
      config's files sorted.

    Raises:
      FileNotFoundError: the root does not exist or holds none of the source's corpora (so an
        empty or mistyped root is an error even when registering every language present).
      MissingData: the corpora of `key` have no training files there; the message names the root,
        the files expected and the corpus directories found.
    """
    root = os.fspath(storage.as_path(root, name="DATA_DIR"))
    kind = "parallel" if "-" in key else "mono"
    names = hf_catalog.SOURCE_CORPORA[source][kind].get(key)
    if names is None:
        raise MissingData(f"source {source!r} has no corpus for {key!r}")
    tables = hf_catalog.SOURCE_CORPORA[source].values()
    wanted = {
        hf_catalog.CORPORA[n].directory for t in tables for names_ in t.values() for n in names_
    }
    present = sorted(d for d in wanted if storage.as_path(_join(root, d)).exists())
    if not present:
        top = storage.as_path(root)
        found = (
            f"found: {sorted(p.name for p in top.iterdir())[:12] or 'nothing'}"
            if top.exists()
            else "no such directory"
        )
        raise FileNotFoundError(
            f"DATA_DIR {root!r} holds none of the corpora of source {source!r} "
            f"(expected directories {sorted(wanted)}; {found})"
        )
    out: dict[str, list[tuple[str, str]]] = {}
    for name in names:
        corpus = hf_catalog.CORPORA[name]
        directory = _join(root, corpus.directory)
        files = _list(directory) if corpus.directory in present else []
        for config in corpus.configs[key]:
            for split, paths in _config_files(files, corpus, config).items():
                out.setdefault(split, []).extend((_join(directory, p), name) for p in paths)
    if "train" not in out:
        expected = "; ".join(_expected(hf_catalog.CORPORA[n], key) for n in names)
        raise MissingData(
            f"source {source!r}: no training files for {key!r} under DATA_DIR {root!r}; expected "
            f"{expected}; corpus directories found: {present}"
        )
    return out


# ----------------------------------------------------------------------------- records


def _open(path: str):
    return storage.as_path(path).open("rb")


def _json_records(path: str) -> Iterator[dict]:
    import pyarrow as pa

    with _open(path) as raw:
        if path.endswith(".gz"):
            f = gzip.GzipFile(fileobj=raw)
        elif path.endswith(".zst"):
            f = pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd")
        else:
            f = raw
        stream = f if hasattr(f, "peek") else io.BufferedReader(f)
        first = stream.peek(64).lstrip()[:1]
        if first == b"[":  # one JSON array per file (WuDao)
            yield from json.loads(stream.read())
            return
        for line in stream:
            if line.strip():
                yield json.loads(line)


def _table_records(path: str, columns: Sequence[str]) -> Iterator[dict]:
    import pyarrow as pa
    import pyarrow.ipc
    import pyarrow.parquet as pq

    with _open(path) as f:
        if path.endswith(".parquet"):
            pf = pq.ParquetFile(f)
            cols = [c for c in columns if c in pf.schema_arrow.names]
            batches = pf.iter_batches(batch_size=READ_BATCH, columns=cols)
        else:  # arrow: the IPC stream format of `datasets`, or the file format
            local = not storage.is_remote(path)
            data = pa.memory_map(path) if local else pa.BufferReader(f.read())
            try:
                batches = iter(pa.ipc.open_stream(data))
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(data)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        for batch in batches:
            cols = [c for c in columns if c in batch.schema.names]
            yield from (batch.select(cols) if cols else batch).to_pylist()


def read_records(path: str, columns: Sequence[str]) -> Iterator[dict]:
    """The records of one file (parquet, arrow, JSON lines or a JSON array; gzip or zstd), in
    file order; `columns` limits what parquet decodes."""
    if path.endswith((".parquet", ".arrow")):
        return _table_records(path, columns)
    return _json_records(path)


def _columns_of(path: str) -> list[str]:
    """The column names of a file, from its schema or its first record."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        with _open(path) as f:
            return list(pq.ParquetFile(f).schema_arrow.names)
    with contextlib.closing(read_records(path, ())) as records:
        first = next(records, None)
    return sorted(first) if first is not None else []


def _num_rows(paths: Sequence[str]) -> int | None:
    """Rows of parquet files from their footers (None if any file is not parquet)."""
    if not all(p.endswith(".parquet") for p in paths):
        return None
    import pyarrow.parquet as pq

    total = 0
    for p in paths:
        with _open(p) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


# ----------------------------------------------------------------------------- the source


class HfFilesDataSource(seqio.DataSource):
    """A seqio source over `datasets` files: documents `{"text"}` or pairs `{"en", "<xx>"}`.

    Deterministic: the files of a split in sorted order, read `CYCLE_LENGTH` at a time by
    tf.data's deterministic interleave. Sharding is by file (`files[index::num_shards]` of the
    sorted files), by document when there are fewer files than shards; `shuffle` then permutes
    the shard's files (seeded by `seed`).
    `num_input_examples` is read from parquet footers on first use (None for JSON and arrow).
    """

    def __init__(
        self,
        *,
        split_to_files: Mapping[str, Sequence[str]],
        text_columns: Sequence[str] | Mapping[str, Sequence[str]],
        fields: Sequence[str] = ("text",),
        description: str = "",
    ):
        """Args:
        split_to_files: split -> file paths (local or gs://), in reading order.
        text_columns: mono: the columns joined into `text`; parallel: the translation struct
          column. One tuple for every file, or path -> tuple (corpora of different shapes).
        fields: `("text",)` for documents, `("en", "<xx>")` for pairs (keys of the struct).
        description: what the files are (source, language, corpora, root), for errors and repr.
        """
        self._files = {s: tuple(f) for s, f in split_to_files.items()}
        paths = {p for f in self._files.values() for p in f}
        if isinstance(text_columns, Mapping):
            self._columns = {p: tuple(text_columns[p]) for p in paths}
        else:
            self._columns = {p: tuple(text_columns) for p in paths}
        self._fields = tuple(fields)
        self._description = description
        self._counts: dict[str, int | None] = {}
        super().__init__(splits=self._files)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        """Any shard count works (by file, or by document when files are fewer)."""
        return True

    def __repr__(self) -> str:
        files = {s: (len(f), f[0] if f else "") for s, f in self._files.items()}
        return f"HfFilesDataSource({self._description!r}, fields={self._fields}, files={files})"

    def describe(self) -> dict[str, object]:
        """What `pipelines.prepared.prepare` records in a preparation's manifest: the corpora and root, and
        every split's files (in reading order)."""
        return {
            "hf_source": self._description,
            "hf_files": {s: list(f) for s, f in self._files.items()},
        }

    def list_shards(self, split: str) -> Sequence[str]:
        """The files of `split`, in reading order."""
        return list(self._files[split])

    def num_input_examples(self, split: str) -> int | None:
        """Rows of the split when every file is parquet (footers only), else None."""
        if split not in self._counts:
            self._counts[split] = _num_rows(self._files[split])
        return self._counts[split]

    def _parallel(self) -> bool:
        return self._fields != ("text",)

    def _documents(self, path: str) -> Iterator[tuple[str, ...]]:
        columns = self._columns[path]
        for i, rec in enumerate(read_records(path, columns)):
            if self._parallel():
                pair = rec.get(columns[0])
                if not isinstance(pair, dict) or any(k not in pair for k in self._fields):
                    raise LayoutError(
                        f"{path} (record {i}): expected column {columns[0]!r} holding "
                        f"{{{', '.join(self._fields)}}}, found {sorted(rec)}"
                        + (f" with {sorted(pair)}" if isinstance(pair, dict) else "")
                    )
                yield tuple(pair[k] or "" for k in self._fields)
                continue
            missing = [c for c in columns if c not in rec]
            if missing:
                raise LayoutError(
                    f"{path} (record {i}): expected column(s) {missing}, found {sorted(rec)}"
                )
            text = "\n".join(str(rec[c]) for c in columns if rec[c])
            if text:
                yield (text,)

    def check_columns(self) -> None:
        """Reads the schema (or first record) of the first file of each corpus in each split and
        raises `LayoutError` naming the file, the expected and the found columns when a text
        column is absent, so a wrong layout fails at registration, not inside tf.data."""
        for split, files in self._files.items():
            checked: set[tuple[str, ...]] = set()
            for path in files:
                columns = self._columns[path]
                if columns in checked:
                    continue
                checked.add(columns)
                found = _columns_of(path)
                missing = [c for c in columns if c not in found]
                if missing:
                    raise LayoutError(
                        f"{self._description}, split {split!r}: {path} has columns {found}, "
                        f"expected {list(columns)} (missing {missing})"
                    )
                if self._parallel():
                    with contextlib.closing(self._documents(path)) as docs:
                        next(docs, None)  # checks the struct's keys

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        *,
        sequence_length: Mapping[str, int] | None = None,
        use_cached: bool = False,
        num_epochs: int | None = 1,
    ):
        """The documents (or pairs) of `split` as a `tf.data.Dataset` of string dicts.

        `shard_info` keeps this shard's files, or this shard's documents when there are fewer
        files than shards; `shuffle` permutes the files read (seeded by `seed`).
        """
        del sequence_length, use_cached, num_epochs
        import tensorflow as tf

        files = list(self._files[split])
        by_document = shard_info is not None and shard_info.num_shards > len(files)
        if shard_info is not None and not by_document:
            files = files[shard_info.index :: shard_info.num_shards]
        if shuffle:  # after sharding, so shards stay disjoint whatever each host's seed
            files = [files[i] for i in np.random.default_rng(seed).permutation(len(files))]
        fields = self._fields
        spec = tuple(tf.TensorSpec([], tf.string) for _ in fields)

        def read(path):
            return tf.data.Dataset.from_generator(
                lambda p: self._documents(p.decode()), args=(path,), output_signature=spec
            )

        ds = tf.data.Dataset.from_tensor_slices(tf.constant(files, dtype=tf.string))
        ds = ds.interleave(
            read,
            cycle_length=max(1, min(CYCLE_LENGTH, len(files))),
            block_length=BLOCK_LENGTH,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if by_document:
            ds = ds.shard(shard_info.num_shards, shard_info.index)
        return ds.map(
            lambda *xs: dict(zip(fields, xs, strict=True)), num_parallel_calls=tf.data.AUTOTUNE
        )


def mono_source(root: str | os.PathLike, lang: str, *, source: str) -> HfFilesDataSource:
    """The `{"text"}` source of one language of a task source (`"hf"`, `"hf_cpt"`), its columns
    checked. Raises like `resolve_files`, and `LayoutError` on a missing text column."""
    files = resolve_files(root, lang, source=source)
    names = hf_catalog.SOURCE_CORPORA[source]["mono"][lang]
    src = HfFilesDataSource(
        split_to_files={s: [p for p, _ in f] for s, f in files.items()},
        text_columns={p: hf_catalog.CORPORA[n].text_columns for f in files.values() for p, n in f},
        description=f"source {source!r} {lang} ({', '.join(names)}) under {os.fspath(root)}",
    )
    src.check_columns()
    return src


def parallel_source(root: str | os.PathLike, pair: str, *, source: str) -> HfFilesDataSource:
    """The `{"en", "<xx>"}` source of one pair `en-<xx>` of a task source, its columns checked.
    Raises like `resolve_files`, and `LayoutError` on a missing translation column or side."""
    other = pair.split("-", 1)[1]
    names = hf_catalog.SOURCE_CORPORA[source]["parallel"].get(pair, ())
    src = HfFilesDataSource(
        split_to_files={
            s: [p for p, _ in f] for s, f in resolve_files(root, pair, source=source).items()
        },
        text_columns=("translation",),
        fields=("en", other),
        description=f"source {source!r} {pair} ({', '.join(names)}) under {os.fspath(root)}",
    )
    src.check_columns()
    return src
