"""Man pages as running text: render with `man -l -E UTF-8 FILE | col -bx`, keep paragraphs.

Pages are rendered at a very wide `MANWIDTH`, so groff neither wraps nor hyphenates a paragraph;
each body paragraph comes out as one indented line. Headings (column 0), the page header and footer
are dropped; filtering code, tables and untranslated text is left to `filters.keep_mono`.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Directory of each language's pages below usr/share/man (English pages have none). Only
# zh_CN: manpages-zh's zh_TW pages are a character conversion of the same translations.
MAN_LANG_DIRS: dict[str, str] = {
    "en": "",
    "de": "de",
    "fr": "fr",
    "ro": "ro",
    "ru": "ru",
    "zh": "zh_CN",
}
MANWIDTH = 4000
_PAGE_NAME = re.compile(r"^\S+\.\d\w*(\.(gz|bz2|xz|lzma))?$")
_CJK_END = re.compile(r"[\u3000-\u9fff\uff00-\uffef]$")
_CJK_START = re.compile(r"^[\u3000-\u9fff\uff00-\uffef]")


class ManError(RuntimeError):
    """Rendering a man page failed; the message names the file."""


def man_pages(tree: str | os.PathLike, lang: str) -> list[Path]:
    """Returns the sorted page files of `lang` in an unpacked package tree (regular files only:
    symlinks and `.so` redirections duplicate other pages)."""
    base = Path(tree) / "usr" / "share" / "man"
    base = base / MAN_LANG_DIRS[lang] if MAN_LANG_DIRS[lang] else base
    if not base.is_dir():
        return []
    return sorted(
        p
        for p in base.glob("man*/*")
        if p.is_file() and not p.is_symlink() and _PAGE_NAME.match(p.name)
    )


def render(path: str | os.PathLike) -> str:
    """Renders one page to plain UTF-8 text with `man -l -E UTF-8 FILE | col -bx`."""
    env = dict(os.environ, MANWIDTH=str(MANWIDTH), LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    env.pop("MANPAGER", None)
    env.pop("PAGER", None)
    # man's stderr goes to a file: a pipe nobody reads while col runs could fill and block it.
    with tempfile.TemporaryFile() as man_err:
        man = subprocess.Popen(
            ["man", "-l", "-E", "UTF-8", str(path)], env=env, stdout=subprocess.PIPE, stderr=man_err
        )
        col = subprocess.run(
            ["col", "-bx"], env=env, stdin=man.stdout, capture_output=True, check=False
        )
        man.stdout.close()
        if man.wait() != 0 or col.returncode != 0:
            man_err.seek(0)
            err = (man_err.read() or col.stderr).decode("utf-8", "replace").strip()
            raise ManError(
                f"rendering {path}: man exit {man.returncode}, col exit {col.returncode}: {err}"
            )
    return col.stdout.decode("utf-8", errors="replace")


def _join(a: str, b: str) -> str:
    if a.endswith("\u2010") or (a.endswith("-") and a[-2:-1].isalpha() and b[:1].islower()):
        return a[:-1] + b
    if _CJK_END.search(a) and _CJK_START.search(b):
        return a + b
    return a + " " + b


def paragraphs(rendered: str) -> Iterator[str]:
    """Yields the body paragraphs of a rendered page (pure text processing, no `man` needed).

    Lines at column 0 (section headings, the header and footer line) end a paragraph and are
    dropped; consecutive lines at the same indentation are joined (CJK without a space, soft
    hyphens at line ends removed).
    """
    current: list[str] = []
    indent = -1
    for raw in rendered.split("\n"):
        line = raw.rstrip()
        stripped = line.lstrip()
        level = len(line) - len(stripped)
        if not stripped or level == 0 or level != indent:
            if current:
                text = current[0]
                for part in current[1:]:
                    text = _join(text, part)
                yield " ".join(text.split())
            current = []
            indent = -1
        if stripped and level > 0:
            current.append(stripped)
            indent = level
    if current:
        text = current[0]
        for part in current[1:]:
            text = _join(text, part)
        yield " ".join(text.split())
