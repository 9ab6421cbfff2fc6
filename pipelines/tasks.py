"""The seqio task registry of xlscale: `lm_<lang>`, `span_<lang>`, `mt_<src>_<tgt>`.

Nothing is registered at import time. `register_tasks(vocabulary=..., corpora_dir=...)` registers
(or re-registers: it is idempotent) every task for the languages and pairs asked for, reading
either the local corpora layout (`source="local"`, docs/interfaces.md "Data on disk"), TFDS at
paper scale (`source="tfds"`: mC4 `c4/multilingual` per language; WMT17 en-de, WMT15 en-fr,
WMT16 en-ro, WMT19 en-zh/en-ru), or the same corpora as Hugging Face `datasets` files under
`corpora_dir` (`source="hf"`; `"hf_cpt"` for the CPT paper's RedPajama English and Common Crawl +
WuDao Chinese; `pipelines.corpora.hf_sources`).

- `lm_<lang>`: targets-only language modelling. Each document gets EOS and is split into chunks
  of the targets length, so no text is lost to truncation; packing then fills the rows.
- `span_<lang>`: T5 span corruption (noise density 0.15, mean span 3, sentinels from the
  vocabulary end; see `pipelines.preprocessors`). Needs a vocabulary with extra ids.
- `mt_<src>_<tgt>` for both directions of every pair: inputs `translate English to German: ...`,
  targets the translation; splits `train`, `validation` and, where present, `test`; metrics BLEU,
  chrF++ and ROUGE-L from `pipelines.text_metrics`.
- `super_glue_<task>` and the mixture `super_glue` when the root holds SuperGLUE (TFDS or HF
  files; `pipelines.superglue_sources`).

Tokenisation (batched, `pipelines.preprocessors.tokenize`) sits before a
`seqio.CacheDatasetPlaceholder`, so everything before it is deterministic and may be cached
offline by seqio's cache job at TFDS scale; the stochastic span corruption runs after it.
`pipelines.streams` holds local corpora's raw lines in memory and shuffles them globally.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import seqio

from pipelines import preprocessors as prep
from pipelines import superglue_sources, text_metrics
from pipelines.corpora import hf_catalog, hf_sources, paths
from pipelines.names import LANG_NAMES, lm_task_name, mt_task_name, span_task_name

SHUFFLE_BUFFER_SIZE = 1000

TFDS_MC4 = "c4/multilingual:3.1.0"
TFDS_WMT: dict[str, str] = {
    "en-de": "wmt17_translate/de-en:1.0.0",
    "en-fr": "wmt15_translate/fr-en:1.0.0",
    "en-ro": "wmt16_translate/ro-en:1.0.0",
    "en-zh": "wmt19_translate/zh-en:1.0.0",
    "en-ru": "wmt19_translate/ru-en:1.0.0",
}


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """A seqio data source plus the preprocessors that turn its records into text fields."""

    source: seqio.DataSource
    parse: tuple[Callable, ...]


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def _text_lines(files: dict[str, Path]) -> seqio.TextLineDataSource:
    return seqio.TextLineDataSource(
        split_to_filepattern={split: str(p) for split, p in files.items()},
        num_input_examples={split: _count_lines(p) for split, p in files.items()},
    )


def _local_mono(corpora_dir: Path, lang: str) -> SourceSpec | None:
    files = {s: paths.mono_file(corpora_dir, lang, s) for s in paths.MONO_SPLITS}
    files = {s: p for s, p in files.items() if p.exists()}
    if "train" not in files:
        return None
    return SourceSpec(_text_lines(files), (prep.lines_to_targets,))


def _local_parallel(corpora_dir: Path, pair: str) -> SourceSpec | None:
    files = {s: paths.parallel_file(corpora_dir, pair, s) for s in paths.PARALLEL_SPLITS}
    files["test"] = paths.test_file(corpora_dir, pair)
    files = {s: p for s, p in files.items() if p.exists()}
    if "train" not in files:
        return None
    fields = ("en", paths.pair_lang(pair))
    return SourceSpec(_text_lines(files), (functools.partial(prep.parse_tsv, field_names=fields),))


# mC4's `{"text": ...}` records (TFDS and HF files alike) -> `{"targets": ...}`.
_TEXT_TO_TARGETS = (functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),)


def _tfds_mono(corpora_dir: Path, lang: str) -> SourceSpec:
    del corpora_dir
    source = seqio.TfdsDataSource(
        tfds_name=TFDS_MC4, splits={"train": lang, "validation": f"{lang}-validation"}
    )
    return SourceSpec(source, _TEXT_TO_TARGETS)


def _tfds_parallel(corpora_dir: Path, pair: str) -> SourceSpec:
    del corpora_dir
    source = seqio.TfdsDataSource(tfds_name=TFDS_WMT[pair], splits=("train", "validation", "test"))
    return SourceSpec(source, ())


def _hf_mono(corpora_dir: str, lang: str, *, source: str) -> SourceSpec:
    return SourceSpec(hf_sources.mono_source(corpora_dir, lang, source=source), _TEXT_TO_TARGETS)


def _hf_parallel(corpora_dir: str, pair: str, *, source: str) -> SourceSpec:
    return SourceSpec(hf_sources.parallel_source(corpora_dir, pair, source=source), ())


# source name -> (monolingual source builder, parallel source builder). A builder returns None
# (or raises `hf_sources.MissingData`) when the language or pair has no training data.
SOURCES: dict[str, tuple[Callable, Callable]] = {
    "local": (_local_mono, _local_parallel),
    "tfds": (_tfds_mono, _tfds_parallel),
    # HF `datasets` files under corpora_dir (pipelines.corpora.hf_sources): mC4 + WMT ("hf"),
    # the CPT paper's RedPajama / Common Crawl + WuDao / mC4 + WMT ("hf_cpt").
    **{
        name: (
            functools.partial(_hf_mono, source=name),
            functools.partial(_hf_parallel, source=name),
        )
        for name in hf_catalog.SOURCE_CORPORA
    },
}


def _build(builder: Callable, root, key: str) -> SourceSpec | None:
    try:
        return builder(root, key)
    except hf_sources.MissingData:
        return None


def _add(name: str, **kwargs) -> str:
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, shuffle_buffer_size=SHUFFLE_BUFFER_SIZE, **kwargs)
    return name


def _register_mono(spec: SourceSpec, lang: str, vocabulary) -> list[str]:
    lm_features = {"targets": seqio.Feature(vocabulary, add_eos=True)}
    seq2seq_features = {
        "inputs": seqio.Feature(vocabulary, add_eos=True),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }
    tokenized = [*spec.parse, prep.tokenize, seqio.CacheDatasetPlaceholder()]
    lm = _add(
        lm_task_name(lang),
        source=spec.source,
        output_features=lm_features,
        preprocessors=[*tokenized, prep.lm_chunks],
    )
    span = _add(
        span_task_name(lang),
        source=spec.source,
        output_features=seq2seq_features,
        preprocessors=[
            *tokenized,
            prep.span_corruption,
            seqio.preprocessors.append_eos_after_trim,
        ],
    )
    return [lm, span]


def _register_pair(spec: SourceSpec, pair: str, vocabulary) -> list[str]:
    features = {
        "inputs": seqio.Feature(vocabulary, add_eos=True),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }
    other = paths.pair_lang(pair)
    names = []
    for src, tgt in (("en", other), (other, "en")):
        names.append(
            _add(
                mt_task_name(src, tgt),
                source=spec.source,
                output_features=features,
                preprocessors=[
                    *spec.parse,
                    functools.partial(
                        prep.to_translation,
                        src=src,
                        tgt=tgt,
                        src_name=LANG_NAMES[src],
                        tgt_name=LANG_NAMES[tgt],
                    ),
                    prep.tokenize,
                    seqio.CacheDatasetPlaceholder(),
                    seqio.preprocessors.append_eos_after_trim,
                ],
                metric_fns=[functools.partial(text_metrics.translation_metrics, target_lang=tgt)],
            )
        )
    return names


def register_tasks(
    *,
    vocabulary,
    corpora_dir: str | os.PathLike | None,
    langs: Sequence[str] | None = None,
    pairs: Sequence[str] | None = None,
    source: str = "local",
) -> list[str]:
    """Registers `lm_<lang>`, `span_<lang>` and `mt_<src>_<tgt>` (both directions) with seqio.

    Args:
      vocabulary: a `seqio.Vocabulary` (use `pipelines.vocab.load_vocab(path, extra_ids=100)`;
        span corruption needs the extra ids).
      corpora_dir: the `corpora/` directory of the local layout, or the root of the HF
        datasets files (`source="hf"`/`"hf_cpt"`, local or gs://; unused for `"tfds"`).
      langs: languages for `lm_`/`span_` tasks. Default: every language of
        `pipelines.corpora.paths.LANGS` whose training text exists (all of them for TFDS).
      pairs: pairs `en-<xx>` for `mt_` tasks. Default: every pair whose training TSV exists.
      source: a key of `SOURCES`: `"local"`, `"tfds"`, `"hf"` or `"hf_cpt"`.

    Returns:
      The registered task names (re-registering a name replaces the earlier task).

    Raises:
      ValueError: on an unknown source, language or pair.
      FileNotFoundError: when a language or pair asked for explicitly has no training data (for
        HF sources: also when the root holds none of the source's corpora).
      pipelines.corpora.hf_sources.LayoutError: HF files without the expected text column.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {sorted(SOURCES)}, got {source!r}")
    mono_fn, pair_fn = SOURCES[source]
    # A str keeps gs:// URLs whole (pathlib would turn gs://b into gs:/b).
    root = os.fspath(corpora_dir) if corpora_dir is not None else paths.corpora_dir()
    unknown = [x for x in (langs or ()) if x not in LANG_NAMES]
    unknown += [p for p in (pairs or ()) if p not in paths.PAIRS]
    if unknown:
        raise ValueError(f"unknown languages/pairs {unknown}")
    names: list[str] = []
    kinds = (  # (asked for, every one, source, registration, what a missing one lacks)
        (langs, paths.LANGS, mono_fn, _register_mono, "training text"),
        (pairs, paths.PAIRS, pair_fn, _register_pair, "parallel training data"),
    )
    for asked, every, build, register, what in kinds:
        for key in asked if asked is not None else every:
            spec = build(root, key) if asked is not None else _build(build, root, key)
            if spec is None:
                if asked is not None:
                    raise FileNotFoundError(f"no {what} for {key!r} under {root}")
                continue
            names += register(spec, key, vocabulary)
    # SuperGLUE (the MT paper's App. B) wherever DATA_DIR holds it; nothing when it does not.
    names += superglue_sources.register(
        vocabulary=vocabulary,
        corpora_dir=corpora_dir,
        source=source,
        shuffle_buffer_size=SHUFFLE_BUFFER_SIZE,
    )
    return names
