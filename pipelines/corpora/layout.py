"""Writing the corpora layout: one-line-per-segment text, TSV pairs, file statistics, manifest.

Files are written atomically (temporary file + rename), so an interrupted build never leaves a
half-written split that a later incremental build would mistake for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path


def one_line(text: str) -> str:
    """Returns `text` as one line: every whitespace run (tabs, all of `str.splitlines()`'s line
    breaks, no-break spaces) becomes one space; leading and trailing space go."""
    return " ".join(text.split())


def _atomic_write(path: Path, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data, encoding="utf-8", newline="\n")
    os.replace(tmp, path)


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> int:
    """Writes one segment per line (cleaned by `one_line`, empty ones dropped); returns the count."""
    out = [s for s in (one_line(x) for x in lines) if s]
    _atomic_write(Path(path), "".join(s + "\n" for s in out))
    return len(out)


def write_pairs(path: str | os.PathLike, pairs: Iterable[tuple[str, str]]) -> int:
    """Writes `<english>\\t<xx>` per line (both sides cleaned, incomplete pairs dropped)."""
    out = []
    for en, xx in pairs:
        en, xx = one_line(en), one_line(xx)
        if en and xx:
            out.append(f"{en}\t{xx}\n")
    _atomic_write(Path(path), "".join(out))
    return len(out)


def write_json(path: str | os.PathLike, obj: object) -> None:
    """Writes `obj` as sorted, indented UTF-8 JSON (stable bytes for equal content)."""
    _atomic_write(Path(path), json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n")


def file_stats(path: str | os.PathLike) -> dict[str, object]:
    """Returns `{"bytes", "lines", "chars", "sha256"}` of a UTF-8 text file."""
    data = Path(path).read_bytes()
    return {
        "bytes": len(data),
        "lines": data.count(b"\n"),
        "chars": len(data.decode("utf-8")),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def read_lines(path: str | os.PathLike) -> list[str]:
    """Reads a layout text file back as a list of lines (without the trailing newline)."""
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def read_pairs(path: str | os.PathLike) -> list[tuple[str, str]]:
    """Reads a layout TSV file back as `(english, other)` tuples."""
    return [tuple(line.split("\t", 1)) for line in read_lines(path)]  # type: ignore[misc]


def layout_stats(
    corpora: str | os.PathLike, *, langs: Iterable[str], pairs: Iterable[str]
) -> dict[str, dict]:
    """Returns `{"languages": {lang: {split: stats}}, "pairs": {pair: {split: stats}}}` for the
    layout files that exist; TSV stats also carry `"pairs"` (= lines)."""
    from pipelines.corpora import paths

    languages: dict[str, dict] = {}
    for lang in langs:
        splits = {}
        for split in paths.MONO_SPLITS:
            f = paths.mono_file(corpora, lang, split)
            if f.exists():
                splits[split] = file_stats(f)
        languages[lang] = splits
    pair_stats: dict[str, dict] = {}
    for pair in pairs:
        files = {s: paths.parallel_file(corpora, pair, s) for s in paths.PARALLEL_SPLITS}
        files["test"] = paths.test_file(corpora, pair)
        splits = {}
        for split, f in files.items():
            if f.exists():
                st = file_stats(f)
                st["pairs"] = st["lines"]
                splits[split] = st
        pair_stats[pair] = splits
    return {"languages": languages, "pairs": pair_stats}
