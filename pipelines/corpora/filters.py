"""Quality filters, deduplication keys and the fixed split rule of the corpora.

All decisions here are pure functions of the text, so a rebuild from the same inputs gives the same
corpus (and the same split) byte for byte.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

# Minimum share of a language's own script among the letters of a segment. Chinese must be
# >= 30% Han (technical text mixes in Latin command names); Russian mostly Cyrillic.
SCRIPT_MIN: dict[str, tuple[str, float]] = {
    "zh": ("han", 0.30),
    "ru": ("cyrillic", 0.50),
    "en": ("latin", 0.90),
    "de": ("latin", 0.90),
    "fr": ("latin", 0.90),
    "ro": ("latin", 0.90),
}
# English characters per character of the language (Han characters carry ~3 Latin ones).
CHAR_FACTOR: dict[str, float] = {"zh": 3.0}
MAX_LENGTH_RATIO = 3.0
# Per-mille of (deduplicated) segments that go to validation, chosen by a hash of the text.
VALIDATION_PER_MILLE = 20

# Frequent function words, for spotting untranslated English left inside translated text.
STOPWORDS: dict[str, frozenset[str]] = {
    "en": frozenset(
        "the of and to is in that for it with as be this are on by not or an which can from"
        " you if will when was has have".split()
    ),
    "de": frozenset(
        "der die das und ist nicht ein eine einen einem einer zu den von mit sich des auf für im"
        " dem wird werden oder auch wenn kann als sie in an es bei nach aus über nur wie".split()
    ),
    "fr": frozenset(
        "le la les de des et est un une du pour que qui dans pas en sur par au aux ce ne sont"
        " avec être peut cette il ou à".split()
    ),
    "ro": frozenset(
        "și este în de la cu pe un o care nu se sau din pentru să mai ca sunt fi acest această"
        " dacă poate a al ale lui".split()
    ),
}
_WORD = re.compile(r"[^\W\d_]+")
# printf/Python/shell placeholders and XML-ish tags: markup, not language.
_PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.\d+)?(?:hh|h|ll|l|L|q|j|z|t|I64)?[a-zA-Z%]"
    r"|%\([\w.]+\)[a-z]|\{[\w.:!]*\}|\$\{?\w+\}?|<[^<>]{1,40}>"
)


def strip_placeholders(text: str) -> str:
    """Removes format placeholders (`%s`, `%1$d`, `{name}`, `$VAR`) and short tags (`<b>`)."""
    return _PLACEHOLDER.sub(" ", text)


# Runs of each script's letters (counting runs, not single characters, is much faster).
_SCRIPT_RUNS: dict[str, re.Pattern[str]] = {
    "han": re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003ffff]+"),
    "cyrillic": re.compile("[\u0400-\u0481\u048a-\u052f]+"),
    "latin": re.compile(
        "[A-Za-z\u00aa\u00ba\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]+"
    ),
}


def script_of(ch: str) -> str:
    """Returns `han`, `cyrillic`, `latin` or `other` for one letter."""
    for name, pattern in _SCRIPT_RUNS.items():
        if pattern.match(ch):
            return name
    return "other"


def letter_count(text: str) -> int:
    """Number of letters (str.isalpha) in `text`."""
    return sum(map(str.isalpha, text))


def script_fraction(text: str, script: str, *, letters: int | None = None) -> float:
    """Share of `script` (`han`, `cyrillic`, `latin`) among the letters of `text`; 0.0 if it
    has none. `letters` may pass a known `letter_count(text)`."""
    letters = letter_count(text) if letters is None else letters
    if not letters:
        return 0.0
    return sum(map(len, _SCRIPT_RUNS[script].findall(text))) / letters


def script_ok(text: str, lang: str, *, letters: int | None = None) -> bool:
    """Whether `text` is written mostly in `lang`'s script (see `SCRIPT_MIN`)."""
    script, minimum = SCRIPT_MIN[lang]
    return script_fraction(text, script, letters=letters) >= minimum


def stopword_lang_ok(text: str, lang: str) -> bool:
    """Rejects text in a Latin-script language that reads as English: more English function
    words than the language's own, and at least two (words of both lists count for neither)."""
    if lang not in STOPWORDS or lang == "en":
        return True
    own_words, en_words = STOPWORDS[lang], STOPWORDS["en"] - STOPWORDS[lang]
    words = [w.lower() for w in _WORD.findall(text)]
    english = sum(w in en_words for w in words)
    own = sum(w in own_words for w in words)
    return not (english >= 2 and english > own)


def length_ratio_ok(en: str, xx: str, lang: str) -> bool:
    """Whether the character lengths of a pair agree within `MAX_LENGTH_RATIO` (smoothed by 10
    characters so very short labels are not judged on a ratio of two tiny numbers)."""
    ratio = (len(en) + 10) / (CHAR_FACTOR.get(lang, 1.0) * len(xx) + 10)
    return 1 / MAX_LENGTH_RATIO <= ratio <= MAX_LENGTH_RATIO


def normalize(text: str) -> str:
    """The comparison key of a segment: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def keep_pair(en: str, xx: str, lang: str) -> bool:
    """The parallel-segment filter: both sides have letters (placeholders aside), are in their
    scripts, are not identical, agree in length, and the translation does not read as English."""
    if normalize(en) == normalize(xx):
        return False
    en_text, xx_text = strip_placeholders(en), strip_placeholders(xx)
    en_letters, xx_letters = letter_count(en_text), letter_count(xx_text)
    if en_letters < 2 or xx_letters < (1 if lang == "zh" else 2):
        return False
    return (
        script_ok(en_text, "en", letters=en_letters)
        and script_ok(xx_text, lang, letters=xx_letters)
        and length_ratio_ok(en, xx, lang)
        and stopword_lang_ok(xx, lang)
    )


def keep_mono(text: str, lang: str, *, min_chars: int = 20) -> bool:
    """The running-text filter: long enough (a third of `min_chars` for Chinese), mostly letters
    rather than code or tables, in the language's script, and not untranslated English."""
    stripped = "".join(text.split())
    need = max(1, min_chars // 3) if lang == "zh" else min_chars
    if len(stripped) < need:
        return False
    letters = letter_count(stripped)
    if letters < 0.5 * len(stripped):
        return False
    return script_ok(stripped, lang, letters=letters) and stopword_lang_ok(text, lang)


def split_of(text: str, *, validation_per_mille: int = VALIDATION_PER_MILLE) -> str:
    """The fixed split rule: `validation` for a `validation_per_mille` share of texts chosen by
    SHA-1 of the normalised text, else `train`; equal texts always land in the same split."""
    return split_of_key(normalize(text), validation_per_mille=validation_per_mille)


def split_of_key(key: str, *, validation_per_mille: int = VALIDATION_PER_MILLE) -> str:
    """`split_of` for a text already passed through `normalize`."""
    digest = hashlib.sha1(key.encode("utf-8")).digest()
    return (
        "validation" if int.from_bytes(digest[:8], "big") % 1000 < validation_per_mille else "train"
    )
