"""The papers' corpora as distributed on the Hugging Face Hub (and WuDao from BAAI): what each
corpus is, which corpora a task source reads per language and pair, and what each paper trains on.

`CORPORA` names each corpus (dataset id, configs per language, text column(s), file layout);
`SOURCE_CORPORA` says which corpora a task source (`pipelines.tasks.SOURCES["hf"]`, `["hf_cpt"]`)
reads for each language and pair; `PAPER_SOURCES` says what each paper manifest under
`launch/manifests/` trains on. `pipelines.corpora.hf_sources` finds and reads the files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


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
