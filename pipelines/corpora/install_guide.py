"""The held-out test set: the Debian Installation Guide, translated into all six languages.

`installation-guide-amd64` ships one DocBook-generated HTML tree per language with the same file
names. Each file is reduced to its sequence of text blocks (paragraphs, headings, list items,
table cells, definition terms); where the English and the translated file have the same number of
blocks, blocks are paired by index. Navigation bars and preformatted text (commands, screens) are
left out.
"""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path

GUIDE_DIR = Path("usr/share/doc/installation-guide-amd64")
GUIDE_LANG_DIRS: dict[str, str] = {
    "en": "en",
    "de": "de",
    "fr": "fr",
    "ro": "ro",
    "ru": "ru",
    "zh": "zh_CN",
}
BLOCK_TAGS = frozenset(
    "p h1 h2 h3 h4 h5 h6 li dt dd td th caption blockquote figcaption title".split()
)
_SKIP_TAGS = frozenset(("pre", "script", "style", "head"))
_SKIP_CLASSES = frozenset(("navheader", "navfooter", "toc", "list-of-tables", "list-of-examples"))
_VOID = frozenset("area base br col embed hr img input link meta source track wbr".split())


class _Blocks(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[list[str]] = []
        self.open: list[tuple[str, int | None, bool]] = []  # (tag, block index, skipping)
        self.skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        skipping = tag in _SKIP_TAGS or bool(classes & _SKIP_CLASSES)
        if skipping:
            self.skip_depth += 1
        index = None
        if tag in BLOCK_TAGS and not self.skip_depth:
            index = len(self.blocks)
            self.blocks.append([])
        self.open.append((tag, index, skipping))

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID or not any(t == tag for t, _, _ in self.open):
            return
        while self.open:
            t, _, skipping = self.open.pop()
            if skipping:
                self.skip_depth -= 1
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.skip_depth:
            return
        for _, index, _ in reversed(self.open):
            if index is not None:
                self.blocks[index].append(data)
                return


def html_blocks(html: str) -> list[str]:
    """Returns the text blocks of one HTML page in document order, whitespace collapsed; a block's
    text excludes that of blocks nested in it (those come as their own, later entries). Empty
    blocks are kept, because pairing relies on equal block structure."""
    parser = _Blocks()
    parser.feed(html)
    parser.close()
    return [" ".join("".join(parts).split()) for parts in parser.blocks]


def guide_pairs(tree: str | os.PathLike, lang: str) -> tuple[list[tuple[str, str]], dict]:
    """Pairs English and `lang` blocks of the guide in an unpacked package tree.

    Returns the pairs (in file-name, then block order) and statistics: files seen, files whose
    block counts matched, blocks paired.
    """
    base = Path(tree) / GUIDE_DIR
    en_dir, xx_dir = base / GUIDE_LANG_DIRS["en"], base / GUIDE_LANG_DIRS[lang]
    if not en_dir.is_dir() or not xx_dir.is_dir():
        raise FileNotFoundError(f"installation guide: missing {en_dir} or {xx_dir}")
    pairs: list[tuple[str, str]] = []
    files = matched = 0
    for en_file in sorted(en_dir.glob("*.html")):
        xx_file = xx_dir / en_file.name
        if not xx_file.is_file():
            continue
        files += 1
        en_blocks = html_blocks(en_file.read_text(encoding="utf-8", errors="replace"))
        xx_blocks = html_blocks(xx_file.read_text(encoding="utf-8", errors="replace"))
        if len(en_blocks) != len(xx_blocks):
            continue
        matched += 1
        pairs.extend((a, b) for a, b in zip(en_blocks, xx_blocks, strict=True) if a and b)
    return pairs, {"files": files, "files_matched": matched, "blocks_paired": len(pairs)}
