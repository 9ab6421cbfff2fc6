"""Reading compiled gettext catalogues (`.mo`) into English/translation pairs.

Format (GNU gettext manual, "The Format of GNU MO Files"): a magic number that also gives the byte
order, then N entries as (length, offset) tables of original and translated strings. An original
is `msgctxt\\x04msgid` when it has a context and `msgid\\x00msgid_plural` for plural entries; a
plural translation is `msgstr[0]\\x00msgstr[1]...`. The entry with an empty msgid is the header,
whose `Content-Type` gives the charset of the other strings.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

_MAGIC_LE = 0x950412DE
_MAGIC_BE = 0xDE120495


class MoError(ValueError):
    """A file that is not a well-formed `.mo` catalogue."""


@dataclasses.dataclass(frozen=True)
class MoEntry:
    """One catalogue message: context, singular/plural source strings and the translations."""

    msgid: str
    msgstr: tuple[str, ...]
    context: str | None = None
    msgid_plural: str | None = None


@dataclasses.dataclass(frozen=True)
class MoCatalog:
    """A parsed catalogue: header fields (e.g. `Language`, `Content-Type`) and the messages."""

    header: dict[str, str]
    entries: tuple[MoEntry, ...]


def _parse_header(text: str) -> dict[str, str]:
    header = {}
    for line in text.split("\n"):
        key, sep, value = line.partition(":")
        if sep and key.strip():
            header[key.strip()] = value.strip()
    return header


def _charset(header: dict[str, str]) -> str:
    match = re.search(r"charset=([\w.-]+)", header.get("Content-Type", ""))
    name = match.group(1) if match else "utf-8"
    return "utf-8" if name.upper() in ("CHARSET", "") else name


def parse_mo(data: bytes, *, name: str = "<bytes>") -> MoCatalog:
    """Parses `.mo` bytes; raises `MoError` (naming `name`) on malformed input."""
    if len(data) < 28:
        raise MoError(f"{name}: too short for a .mo file ({len(data)} bytes)")
    (magic,) = struct.unpack("<I", data[:4])
    if magic == _MAGIC_LE:
        order = "<"
    elif magic == _MAGIC_BE:
        order = ">"
    else:
        raise MoError(f"{name}: bad magic number 0x{magic:08x}")
    _, count, orig_off, trans_off = struct.unpack(order + "4I", data[4:20])

    def table(offset: int) -> list[bytes]:
        end = offset + 8 * count
        if end > len(data):
            raise MoError(f"{name}: string table at {offset} runs past the end of the file")
        out = []
        for i in range(count):
            length, start = struct.unpack(order + "2I", data[offset + 8 * i : offset + 8 * i + 8])
            if start + length > len(data):
                raise MoError(f"{name}: string {i} at {start}+{length} runs past the end")
            out.append(data[start : start + length])
        return out

    originals, translations = table(orig_off), table(trans_off)
    header: dict[str, str] = {}
    for orig, trans in zip(originals, translations, strict=True):
        if orig == b"":
            header = _parse_header(trans.decode("utf-8", errors="replace"))
    charset = _charset(header)
    entries = []
    for orig, trans in zip(originals, translations, strict=True):
        if orig == b"":
            continue
        try:
            source, target = orig.decode(charset), trans.decode(charset)
        except (UnicodeDecodeError, LookupError) as err:
            raise MoError(f"{name}: cannot decode a message as {charset}: {err}") from err
        context = None
        if "\x04" in source:
            context, source = source.split("\x04", 1)
        msgid, _, plural = source.partition("\x00")
        entries.append(
            MoEntry(
                msgid=msgid,
                msgstr=tuple(target.split("\x00")),
                context=context,
                msgid_plural=plural or None,
            )
        )
    return MoCatalog(header=header, entries=tuple(entries))


def read_mo(path: str | Path) -> MoCatalog:
    """Reads and parses one `.mo` file."""
    path = Path(path)
    return parse_mo(path.read_bytes(), name=str(path))


_ENTITY = re.compile(r"&#?\w+;")
_IDENTIFIER = re.compile(r"^[A-Z0-9]+(?:_[A-Z0-9]+)+$")


def strip_accelerators(text: str, markers: str = "_&~") -> str:
    """Removes keyboard-accelerator markers (GTK `_File`/`A_uto`, Qt `&File`, LibreOffice
    `~File`, CJK `文件(_F)`) for the marker characters in `markers`.

    A marker is stripped when a letter or digit follows it and it is the only marker of its
    whitespace-separated token; identifiers (`LC_ALL`, `a__b`) and HTML entities (`&amp;`) are
    kept, and `&&` (an escaped ampersand) becomes `&`.
    """
    if not markers:
        return text
    cls = re.escape(markers)
    text = re.sub(rf"\s*\([{cls}][^\W_]\)", "", text)

    def fix(token: str) -> str:
        if "&" in markers and "&&" in token:
            return token.replace("&&", "&")
        if _IDENTIFIER.match(token) or _ENTITY.search(token):
            return token
        hits = [i for i, ch in enumerate(token) if ch in markers]
        if len(hits) != 1:
            return token
        i = hits[0]
        if i + 1 < len(token) and (token[i + 1].isalnum()):
            return token[:i] + token[i + 1 :]
        return token

    return re.sub(r"\S+", lambda m: fix(m.group(0)), text)


def catalog_pairs(catalog: MoCatalog, *, markers: str = "") -> list[tuple[str, str]]:
    """Returns `(english, translation)` pairs of a catalogue, accelerators in `markers` stripped.

    Accelerators are a property of the program (GTK and LibreOffice use them, command-line tools
    do not, and there `_` belongs to identifiers), so the caller says which markers to strip; a
    catalogue's own `X-Accelerator-Marker` header is added to them.

    The singular pairs with `msgstr[0]`; the plural with the last form when the language has
    several (for Russian the "many" form, the closest to an English plural). Untranslated
    messages are dropped; filtering by length, script and identity happens in `filters`.
    """
    markers += catalog.header.get("X-Accelerator-Marker", "")[:1]
    pairs = []
    for entry in catalog.entries:
        forms = entry.msgstr
        if forms and forms[0]:
            pairs.append(
                (strip_accelerators(entry.msgid, markers), strip_accelerators(forms[0], markers))
            )
        if entry.msgid_plural and len(forms) > 1 and forms[-1]:
            pairs.append(
                (
                    strip_accelerators(entry.msgid_plural, markers),
                    strip_accelerators(forms[-1], markers),
                )
            )
    return pairs
