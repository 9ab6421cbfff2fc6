"""Debian package descriptions and their translations (DDTP `Translation-xx` files).

A `Translation-xx` file is a list of deb822 records with `Package`, `Description-md5` (the MD5 of
the English description, which keys the translation) and `Description-xx`: a short description on
the first line, then the long description, one space-indented line per line, with ` .` between
paragraphs (Debian Policy 5.6.13). English and translation are joined on `Description-md5` and
paired paragraph by paragraph where both have the same number of paragraphs.
"""

from __future__ import annotations

from collections.abc import Iterator

# Debian's name of each language's Translation file.
TRANSLATION_NAMES: dict[str, str] = {
    "en": "en",
    "de": "de",
    "fr": "fr",
    "ru": "ru",
    "zh": "zh_CN",
}


def _records(text: str) -> Iterator[dict[str, list[str]]]:
    record: dict[str, list[str]] = {}
    key = None
    for line in text.split("\n"):
        if not line.strip():
            if record:
                yield record
            record, key = {}, None
        elif line[0] in " \t" and key is not None:
            record[key].append(line)
        else:
            key, _, value = line.partition(":")
            record[key] = [value.strip()]
    if record:
        yield record


def description_paragraphs(lines: list[str]) -> list[str]:
    """Splits a `Description` field (its first line, then the indented continuation lines) into
    paragraphs: the short description first, then each ` .`-separated paragraph on one line."""
    paras = [lines[0].strip()] if lines and lines[0].strip() else []
    current: list[str] = []
    for line in lines[1:]:
        body = line[1:] if line[:1] == " " else line.lstrip("\t")
        if body.strip() == ".":
            if current:
                paras.append(" ".join(" ".join(current).split()))
            current = []
        else:
            current.append(body.strip())
    if current:
        paras.append(" ".join(" ".join(current).split()))
    return [p for p in paras if p]


def parse_translation_file(text: str, lang: str) -> dict[str, list[str]]:
    """Returns `{Description-md5: paragraphs}` for the `Description-<name>` fields of one
    Translation file (`lang` is ISO 639-1; the first record of a repeated md5 wins)."""
    field = f"Description-{TRANSLATION_NAMES[lang]}"
    out: dict[str, list[str]] = {}
    for record in _records(text):
        md5 = record.get("Description-md5", [""])[0]
        if md5 and field in record and md5 not in out:
            paras = description_paragraphs(record[field])
            if paras:
                out[md5] = paras
    return out


def description_pairs(
    english: dict[str, list[str]], other: dict[str, list[str]]
) -> list[tuple[str, str]]:
    """Pairs paragraphs of descriptions with the same md5, in md5 order; a description whose
    paragraph counts differ contributes only its short description."""
    pairs = []
    for md5 in sorted(english.keys() & other.keys()):
        en, xx = english[md5], other[md5]
        if len(en) == len(xx):
            pairs.extend(zip(en, xx, strict=True))
        else:
            pairs.append((en[0], xx[0]))
    return pairs
