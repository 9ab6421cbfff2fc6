"""Quality filters, normalisation and the hash split rule of the corpora."""

from __future__ import annotations

import pytest

from pipelines.corpora import filters, layout


def test_script_fractions():
    assert filters.script_fraction("打开文件 file", "han") == pytest.approx(0.5)
    assert filters.script_fraction("Открыть файл", "cyrillic") == 1.0
    assert filters.script_fraction("Ștergeți fișierul", "latin") == 1.0
    assert filters.script_fraction("1234 !!", "latin") == 0.0
    stripped = filters.strip_placeholders("%s: %1$d of %(n)s {name} $HOME <b>x</b>")
    assert [ch for ch in stripped if ch.isalpha()] == ["o", "f", "x"]


@pytest.mark.parametrize(
    ("en", "xx", "lang", "keep"),
    [
        ("Open file", "Datei öffnen", "de", True),
        ("Open file", "Open file", "de", False),  # untranslated copy
        ("Open File", "open  file", "fr", False),  # identical after normalisation
        ("%s: %s", "%s : %s", "fr", False),  # no letters besides placeholders
        ("%d files", "%d Dateien", "de", True),
        ("Open the file", "打开文件", "zh", True),
        ("Use the --force option now", "Use --force 选项", "zh", False),  # < 30% Han
        ("Delete the file", "Удалить файл", "ru", True),
        ("Delete the file", "Delete файл", "ru", False),  # mostly Latin
        ("Yes", "Oui, et voici une très longue phrase qui n'a rien à voir avec yes", "fr", False),
        ("The file is not found", "The file is not found in das Verzeichnis", "de", False),
    ],
)
def test_keep_pair(en, xx, lang, keep):
    assert filters.keep_pair(en, xx, lang) is keep


def test_keep_pair_han_threshold_boundary():
    # Exactly 30% Han letters passes, just below fails.
    assert filters.keep_pair("Open the settings", "设置ab" + "c" * 2 + "de", "zh") is False
    assert filters.script_ok("设置中" + "abcdefg", "zh") is True  # 3/10


def test_keep_mono():
    assert filters.keep_mono("Dies ist ein ganz gewöhnlicher deutscher Satz.", "de")
    assert not filters.keep_mono("This is plain English left in the German page.", "de")
    assert not filters.keep_mono("kurz", "de")
    assert not filters.keep_mono("0x00 0x01 0x02 0x03 0x04 0x05 0x06 ab", "en")
    assert filters.keep_mono("这是一个中文段落。", "zh")
    assert not filters.keep_mono("这是 a mostly English paragraph here", "zh")
    assert filters.keep_mono("Datei", "de", min_chars=2)


def test_normalize_and_split_rule():
    assert filters.normalize("  Ｏpen\u00a0FILE ") == filters.normalize("open file")
    texts = [f"sentence number {i}" for i in range(20000)]
    splits = [filters.split_of(t) for t in texts]
    share = splits.count("validation") / len(splits)
    assert abs(share - filters.VALIDATION_PER_MILLE / 1000) < 0.005
    # Same text (up to normalisation) -> same split, every time.
    assert all(
        filters.split_of(t.upper() + "  ") == s
        for t, s in zip(texts[:500], splits[:500], strict=True)
    )


def test_one_line_removes_all_line_breaks():
    text = "a\tb\nc\u2028d\x0be\r\nf   g"
    assert layout.one_line(text) == "a b c d e f g"
    assert len(layout.one_line(text).splitlines()) == 1
