"""The papers' corpora as named sources: Hugging Face `datasets` files read by a seqio source.

`CORPORA` names each corpus (dataset id, configs per language, text column(s), file layout);
`SOURCE_CORPORA` says which corpora a task source (`pipelines.tasks.SOURCES["hf"]`, `["hf_cpt"]`)
reads for each language and pair; `PAPER_SOURCES` says what each paper manifest under
`launch/manifests/` trains on. Files: parquet, arrow (`datasets.save_to_disk`), JSON lines
(`.jsonl`, `.jsonl.gz`, `.json.gz`, `.jsonl.zst`) or JSON arrays (WuDao).

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
import dataclasses
import fnmatch
import gzip
import io
import json
import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import seqio

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


@dataclasses.dataclass(frozen=True)
class Corpus:
    """One corpus as distributed: where its files are and which fields hold the text.

    Attributes:
      name: the registry key.
      hf_id: the Hugging Face dataset id ("" when the corpus is not on the Hub).
      directory: where it lives under the root (the dataset id for Hub datasets).
      configs: language (or pair `en-<xx>`) -> the dataset configs that hold it.
      splits: split -> glob patterns of the native layout, relative to `directory`, with
        `{config}`; `*` also matches `/`.
      text_columns: monolingual: the fields joined (with a newline, empty ones skipped) into the
        document; parallel: the struct column `{en: ..., <xx>: ...}`.
      columns: every column of a record, for the documentation.
      kind: `"mono"` or `"parallel"`.
      hold_out: hold out each config's last training file as `validation` (no published split).
      paper: which paper uses it for what.
      notes: assumptions and provenance.
    """

    name: str
    hf_id: str
    directory: str
    configs: Mapping[str, tuple[str, ...]]
    splits: Mapping[str, tuple[str, ...]]
    text_columns: tuple[str, ...]
    columns: tuple[str, ...]
    kind: str = "mono"
    hold_out: bool = False
    paper: str = ""
    notes: str = ""


_MC4_LANGS = ("en", "de", "fr", "ro", "ru", "zh")
_WMT = {  # pair -> (WMT edition, config): the TFDS choices of pipelines.tasks.TFDS_WMT
    "en-de": ("wmt17", "de-en"),
    "en-fr": ("wmt15", "fr-en"),
    "en-ro": ("wmt16", "ro-en"),
    "en-zh": ("wmt19", "zh-en"),
    "en-ru": ("wmt19", "ru-en"),
}
_REDPAJAMA_SUBSETS = ("arxiv", "book", "c4", "common_crawl", "github", "stackexchange")

CORPORA: dict[str, Corpus] = {
    "redpajama": Corpus(
        name="redpajama",
        hf_id="togethercomputer/RedPajama-Data-1T",
        directory="togethercomputer/RedPajama-Data-1T",
        configs={"en": _REDPAJAMA_SUBSETS},
        splits={"train": ("{config}/*.jsonl", "{config}/*.jsonl.zst")},
        text_columns=("text",),
        columns=("text", "meta"),
        hold_out=True,
        paper="CPT paper: English (source models, replay)",
        notes=(
            "The Hub repo holds a loading script and urls/<subset>.txt; the files come from "
            "data.together.xyz/redpajama-data-1T/v1.0.0/<subset>/... and are kept under the same "
            "relative paths (what the script's RED_PAJAMA_DATA_DIR expects), e.g. "
            "c4/c4-train.00000-of-01024.jsonl, common_crawl/2019-30/"
            "en_head_0000.json.gz.dedup.classifier.jsonl.zst, book/book.jsonl. The `wikipedia` "
            "subset is left out: it mixes 20 languages in one file."
        ),
    ),
    "commoncrawl_zh": Corpus(
        name="commoncrawl_zh",
        hf_id="Skywork/SkyPile-150B",
        directory="Skywork/SkyPile-150B",
        configs={"zh": ("default",)},
        splits={"train": ("data/*.jsonl", "data/*.jsonl.gz")},
        text_columns=("text",),
        columns=("text",),
        hold_out=True,
        paper="CPT paper: Chinese (with WuDao)",
        notes=(
            "The paper's Chinese Common Crawl text is not published; SkyPile-150B (Chinese pages "
            "filtered from Common Crawl, data/<snapshot>_zh_<part>_<n>.jsonl) stands in."
        ),
    ),
    "wudao": Corpus(
        name="wudao",
        hf_id="",
        directory="WuDaoCorpus2.0_base_200G",
        configs={"zh": ("default",)},
        splits={"train": ("*.json", "*.jsonl")},
        text_columns=("title", "content"),
        columns=("id", "uniqueKey", "titleUkey", "dataType", "title", "content"),
        hold_out=True,
        paper="CPT paper: Chinese (with Common Crawl)",
        notes=(
            "WuDaoCorpora Text 2.0 base (200 GB), from BAAI (data.baai.ac.cn / ScienceDB, "
            "doi:10.57760/sciencedb.o00126.00004), not the Hub: the unpacked rar is a directory "
            "of part-*.json files, each one JSON array of records; title and content make the "
            "document."
        ),
    ),
    "mc4": Corpus(
        name="mc4",
        hf_id="allenai/c4",
        directory="allenai/c4",
        configs={lang: (lang,) for lang in _MC4_LANGS},
        splits={
            "train": ("multilingual/c4-{config}.tfrecord-*.json.gz",),
            "validation": ("multilingual/c4-{config}-validation.tfrecord-*.json.gz",),
        },
        text_columns=("text",),
        columns=("text", "timestamp", "url"),
        paper="CPT paper: French, Russian; MT paper: en, de, fr, ro pretraining",
        notes=(
            "mC4 3.1.0 (the TFDS c4/multilingual the T5 papers use) as AllenAI distributes it: "
            "multilingual/c4-<lang>.tfrecord-NNNNN-of-MMMMM.json.gz and "
            "multilingual/c4-<lang>-validation.tfrecord-NNNNN-of-MMMMM.json.gz."
        ),
    ),
    **{
        edition: Corpus(
            name=edition,
            hf_id=f"wmt/{edition}",
            directory=f"wmt/{edition}",
            configs={pair: (cfg,) for pair, (ed, cfg) in _WMT.items() if ed == edition},
            splits={s: (f"{{config}}/{s}-*.parquet",) for s in ("train", "validation", "test")},
            text_columns=("translation",),
            columns=("translation",),
            kind="parallel",
            paper={
                "wmt15": "MT paper: en-fr finetuning",
                "wmt16": "MT paper: en-ro finetuning",
                "wmt17": "MT paper: en-de finetuning",
                "wmt19": "en-zh, en-ru translation (beyond the papers)",
            }[edition],
            notes="The Hub's parquet: <xx>-en/<split>-NNNNN-of-MMMMM.parquet.",
        )
        for edition in ("wmt15", "wmt16", "wmt17", "wmt19")
    },
}

# Task source name -> {"mono": language -> corpora, "parallel": pair -> corpus}.
_WMT_PAIRS = {pair: (edition,) for pair, (edition, _) in _WMT.items()}
SOURCE_CORPORA: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {
    # mC4 and WMT for every language and pair: the files behind `source="tfds"`.
    "hf": {"mono": {lang: ("mc4",) for lang in _MC4_LANGS}, "parallel": _WMT_PAIRS},
    # The CPT paper's corpora: English RedPajama, Chinese Common Crawl + WuDao, the rest mC4.
    "hf_cpt": {
        "mono": {
            **{lang: ("mc4",) for lang in _MC4_LANGS},
            "en": ("redpajama",),
            "zh": ("commoncrawl_zh", "wudao"),
        },
        "parallel": _WMT_PAIRS,
    },
}

# Paper manifest (launch/manifests/<name>.toml) -> the task source it reads and, per language or
# pair it trains on, the corpora.
PAPER_SOURCES: dict[str, dict[str, object]] = {
    "cpt_paper": {"source": "hf_cpt", "en": "redpajama", "zh": ["commoncrawl_zh", "wudao"]},
    "cpt_languages": {"source": "hf_cpt", "en": "redpajama", "fr": "mc4", "ru": "mc4"},
    "cpt_replay": {"source": "hf_cpt", "en": "redpajama", "zh": ["commoncrawl_zh", "wudao"]},
    "mt_paper": {
        "source": "hf",
        **{lang: "mc4" for lang in ("en", "de", "fr", "ro")},
        "en-de": "wmt17",
        "en-fr": "wmt15",
        "en-ro": "wmt16",
    },
}


def paper_sources_markdown() -> str:
    """`PAPER_SOURCES` as a markdown table (manifest, language, corpus, dataset id, configs, text
    column, where under the root), for the README: one place says what each paper trains on."""
    rows = [
        "| Manifest | Source | Language | Corpus | Dataset | Configs | Text | Files under ROOT |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for manifest, entry in PAPER_SOURCES.items():
        for lang, names in entry.items():
            if lang == "source":
                continue
            for name in [names] if isinstance(names, str) else names:
                c = CORPORA[name]
                configs = ", ".join(c.configs[lang])
                one = c.configs[lang][0] if len(c.configs[lang]) == 1 else "<config>"
                files = " or ".join(
                    f"`{c.directory}/{p.format(config=one)}`" for p in c.splits["train"]
                )
                rows.append(
                    f"| {manifest} | `{entry['source']}` | {lang} | {name} | "
                    f"{f'`{c.hf_id}`' if c.hf_id else 'BAAI (not on the Hub)'} | {configs} | "
                    f"{' + '.join(f'`{t}`' for t in c.text_columns)} | "
                    f"{files} |"
                )
    return "\n".join(rows) + "\n"


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


def _config_files(files: Sequence[str], corpus: Corpus, config: str) -> dict[str, list[str]]:
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


def _expected(corpus: Corpus, key: str) -> str:
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
    names = SOURCE_CORPORA[source][kind].get(key)
    if names is None:
        raise MissingData(f"source {source!r} has no corpus for {key!r}")
    tables = SOURCE_CORPORA[source].values()
    wanted = {CORPORA[n].directory for t in tables for names_ in t.values() for n in names_}
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
        corpus = CORPORA[name]
        directory = _join(root, corpus.directory)
        files = _list(directory) if corpus.directory in present else []
        for config in corpus.configs[key]:
            for split, paths in _config_files(files, corpus, config).items():
                out.setdefault(split, []).extend((_join(directory, p), name) for p in paths)
    if "train" not in out:
        expected = "; ".join(_expected(CORPORA[n], key) for n in names)
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
    names = SOURCE_CORPORA[source]["mono"][lang]
    src = HfFilesDataSource(
        split_to_files={s: [p for p, _ in f] for s, f in files.items()},
        text_columns={p: CORPORA[n].text_columns for f in files.values() for p, n in f},
        description=f"source {source!r} {lang} ({', '.join(names)}) under {os.fspath(root)}",
    )
    src.check_columns()
    return src


def parallel_source(root: str | os.PathLike, pair: str, *, source: str) -> HfFilesDataSource:
    """The `{"en", "<xx>"}` source of one pair `en-<xx>` of a task source, its columns checked.
    Raises like `resolve_files`, and `LayoutError` on a missing translation column or side."""
    other = pair.split("-", 1)[1]
    names = SOURCE_CORPORA[source]["parallel"].get(pair, ())
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
