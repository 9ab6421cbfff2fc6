"""Corpus extraction from small real inputs built here: .mo catalogues, man pages, Debian
description files and installation-guide HTML (no network, no apt)."""

from __future__ import annotations

import gzip
import shutil
import struct

import pytest

from pipelines.corpora import descriptions, install_guide, manpages, mo


def write_mo(messages: list[tuple[bytes, bytes]], *, big_endian: bool = False) -> bytes:
    """A minimal GNU .mo writer (format per the gettext manual), originals sorted as msgfmt does."""
    messages = sorted(messages)
    order = ">" if big_endian else "<"
    n = len(messages)
    orig_off = 28
    trans_off = orig_off + 8 * n
    data_off = trans_off + 8 * n
    blob = b""
    orig_tab, trans_tab = [], []
    for src, _ in messages:
        orig_tab.append((len(src), data_off + len(blob)))
        blob += src + b"\0"
    for _, dst in messages:
        trans_tab.append((len(dst), data_off + len(blob)))
        blob += dst + b"\0"
    head = struct.pack(order + "7I", 0x950412DE, 0, n, orig_off, trans_off, 0, data_off)
    tabs = b"".join(struct.pack(order + "2I", *t) for t in orig_tab + trans_tab)
    return head + tabs + blob


HEADER = (
    b"",
    b"Project-Id-Version: demo 1.0\nLanguage: de\nContent-Type: text/plain; charset=UTF-8\n"
    b"Plural-Forms: nplurals=2; plural=(n != 1);\n",
)


@pytest.mark.parametrize("big_endian", [False, True])
def test_parse_mo_contexts_plurals_header(big_endian):
    data = write_mo(
        [
            HEADER,
            (b"Open file", "Datei öffnen".encode()),
            (b"menu\x04_Save", b"_Speichern"),
            (b"%d file\x00%d files", b"%d Datei\x00%d Dateien"),
            (b"Untranslated", b""),
        ],
        big_endian=big_endian,
    )
    catalog = mo.parse_mo(data, name="demo.mo")
    assert catalog.header["Language"] == "de"
    by_id = {e.msgid: e for e in catalog.entries}
    assert set(by_id) == {"Open file", "_Save", "%d file", "Untranslated"}
    assert by_id["_Save"].context == "menu"
    assert by_id["%d file"].msgid_plural == "%d files"
    assert by_id["%d file"].msgstr == ("%d Datei", "%d Dateien")
    pairs = mo.catalog_pairs(catalog, markers="_")
    assert ("Save", "Speichern") in pairs
    assert ("Open file", "Datei öffnen") in pairs
    assert ("%d files", "%d Dateien") in pairs
    assert all(en != "Untranslated" for en, _ in pairs)


def test_parse_mo_legacy_charset_and_errors(tmp_path):
    data = write_mo(
        [
            (b"", b"Content-Type: text/plain; charset=ISO-8859-1\n"),
            (b"Yes", "Oui, très".encode("latin-1")),
        ]
    )
    path = tmp_path / "fr.mo"
    path.write_bytes(data)
    assert mo.catalog_pairs(mo.read_mo(path)) == [("Yes", "Oui, très")]
    with pytest.raises(mo.MoError, match="bad magic"):
        mo.parse_mo(b"\0" * 40, name="x.mo")
    with pytest.raises(mo.MoError, match="x.mo"):
        mo.parse_mo(data[:40], name="x.mo")


def test_header_accelerator_marker_is_used():
    data = write_mo(
        [
            (b"", b"Content-Type: text/plain; charset=UTF-8\nX-Accelerator-Marker: ~\n"),
            (b"~Open", b"~Deschide"),
        ]
    )
    assert mo.catalog_pairs(mo.parse_mo(data)) == [("Open", "Deschide")]


@pytest.mark.parametrize(
    ("text", "markers", "expected"),
    [
        ("_File", "_&~", "File"),
        ("A_uto", "_", "Auto"),
        ("Save ~As...", "~", "Save As..."),
        ("&Open", "&", "Open"),
        ("打开(_O)", "_", "打开"),
        ("Tom & Jerry", "&", "Tom & Jerry"),
        ("a && b", "&", "a & b"),
        ("&amp; sign", "&", "&amp; sign"),
        ("set LC_ALL first", "_", "set LC_ALL first"),
        ("~/.bashrc", "~", "~/.bashrc"),
        ("max_size", "", "max_size"),
    ],
)
def test_strip_accelerators(text, markers, expected):
    assert mo.strip_accelerators(text, markers) == expected


RENDERED = """\
LS(1)                         User Commands                         LS(1)

NAME
       ls - list directory contents

DESCRIPTION
       List information about the FILEs (the current directory by default).
       Sort entries alphabetically if none of -cftuvSUX nor --sort is speci\u2010
       fied.

       -a, --all
              do not ignore entries starting with .

       中文的段落在这里
       继续写下去。

GNU coreutils 9.1                 September 2022                      LS(1)
"""


def test_man_paragraphs_pure_python():
    paras = list(manpages.paragraphs(RENDERED))
    assert paras == [
        "ls - list directory contents",
        "List information about the FILEs (the current directory by default). Sort entries "
        "alphabetically if none of -cftuvSUX nor --sort is specified.",
        "-a, --all",
        "do not ignore entries starting with .",
        "中文的段落在这里继续写下去。",
    ]


def test_man_pages_lists_regular_pages_only(tmp_path):
    base = tmp_path / "usr/share/man/de/man1"
    base.mkdir(parents=True)
    (base / "ls.1.gz").write_bytes(gzip.compress(b".TH LS 1\n"))
    (base / "dir.1.gz").symlink_to("ls.1.gz")
    (base / "README").write_text("not a page")
    assert [p.name for p in manpages.man_pages(tmp_path, "de")] == ["ls.1.gz"]
    assert manpages.man_pages(tmp_path, "fr") == []


@pytest.mark.skipif(not (shutil.which("man") and shutil.which("col")), reason="needs man, col")
def test_man_render_real_page(tmp_path):
    page = tmp_path / "demo.1"
    page.write_text(
        ".TH DEMO 1 2024 demo\n.SH NAME\ndemo \\- Demonstrationsprogramm\n.SH BESCHREIBUNG\n"
        ".B demo\nzeigt, wie eine Handbuchseite \\fIgerendert\\fR wird, und zwar mit einem "
        "Absatz, der lang genug ist, um bei achtzig Spalten umbrochen zu werden, was wir "
        "vermeiden wollen.\n.PP\nZweiter Absatz über Straßen.\n",
        encoding="utf-8",
    )
    paras = list(manpages.paragraphs(manpages.render(page)))
    assert "demo - Demonstrationsprogramm" in paras
    assert any(
        p.startswith("demo zeigt, wie eine Handbuchseite gerendert wird")
        and p.endswith("vermeiden wollen.")
        for p in paras
    )
    assert "Zweiter Absatz über Straßen." in paras


TRANSLATION_EN = """\
Package: hello
Description-md5: aaa
Description-en: example package based on GNU hello
 The GNU hello program produces a familiar, friendly greeting.
 It allows non-programmers to use a classic computer science tool.
 .
 Seriously, though: this is an example of how to do a Debian package.

Package: other
Description-md5: bbb
Description-en: another tool
 One paragraph only.

"""
TRANSLATION_DE = """\
Package: hello
Description-md5: aaa
Description-de: Beispielpaket, das auf GNU hello basiert
 Das Programm GNU hello gibt einen freundlichen Gruß aus.
 .
 Im Ernst: dies ist ein Beispiel für ein Debian-Paket.

Package: other
Description-md5: bbb
Description-de: ein anderes Werkzeug
 Erster Absatz.
 .
 Zweiter Absatz, den das Original nicht hat.
"""


def test_descriptions_join_on_md5():
    en = descriptions.parse_translation_file(TRANSLATION_EN, "en")
    de = descriptions.parse_translation_file(TRANSLATION_DE, "de")
    assert en["aaa"][1] == (
        "The GNU hello program produces a familiar, friendly greeting. It allows "
        "non-programmers to use a classic computer science tool."
    )
    pairs = descriptions.description_pairs(en, de)
    assert pairs[0] == (
        "example package based on GNU hello",
        "Beispielpaket, das auf GNU hello basiert",
    )
    assert pairs[2][1] == "Im Ernst: dies ist ein Beispiel für ein Debian-Paket."
    # bbb has 2 paragraphs in English, 3 in German: only the short descriptions pair up.
    assert pairs[3:] == [("another tool", "ein anderes Werkzeug")]


GUIDE = """<html><head><title>{title}</title></head><body>
<div class="navheader"><table><tr><th>{title}</th></tr><tr><td><a href="x">{nav}</a></td></tr></table></div>
<div class="sect1"><h2 class="title"><a name="x"></a>{title}</h2>
<p>
{p1} <span class="command"><strong>gcc</strong></span>.
</p>
<ul><li><p>{li}</p></li></ul>
<pre class="screen">$ apt-get install foo</pre>
<p></p>
</div>
<div class="navfooter"><a href="y">{nav}</a></div>
</body></html>"""


def test_html_blocks_and_guide_pairs(tmp_path):
    en = GUIDE.format(
        title="2.1. Supported Hardware",
        nav="Next",
        p1="Debian does not impose hardware requirements beyond the kernel and",
        li="Any architecture with a Debian port can run Debian.",
    )
    de = GUIDE.format(
        title="2.1. Unterstützte Hardware",
        nav="Weiter",
        p1="Debian stellt keine Hardware-Anforderungen über die des Kernels und",
        li="Jede Architektur mit einer Debian-Portierung kann Debian ausführen.",
    )
    blocks = install_guide.html_blocks(en)
    assert blocks == [
        "2.1. Supported Hardware",
        "Debian does not impose hardware requirements beyond the kernel and gcc.",
        "",
        "Any architecture with a Debian port can run Debian.",
        "",
    ]
    root = tmp_path / install_guide.GUIDE_DIR
    for lang, html in (("en", en), ("de", de)):
        (root / lang).mkdir(parents=True)
        (root / lang / "ch02s01.html").write_text(html, encoding="utf-8")
    # A file whose block structure differs is skipped rather than mis-paired.
    (root / "en" / "ch02s02.html").write_text("<p>one</p><p>two</p>")
    (root / "de" / "ch02s02.html").write_text("<p>eins</p>")
    pairs, stats = install_guide.guide_pairs(tmp_path, "de")
    assert stats == {"files": 2, "files_matched": 1, "blocks_paired": 3}
    assert pairs[0] == ("2.1. Supported Hardware", "2.1. Unterstützte Hardware")
    assert pairs[2][1] == "Jede Architektur mit einer Debian-Portierung kann Debian ausführen."
    with pytest.raises(FileNotFoundError, match="installation guide"):
        install_guide.guide_pairs(tmp_path, "fr")
