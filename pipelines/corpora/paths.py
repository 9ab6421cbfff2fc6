"""Where corpora live on disk: the data root and the fixed layout under `<root>/corpora/`.

The layout is the contract of docs/interfaces.md ("Data on disk"); every reader and writer goes
through these helpers so that the paths are spelled in one place.
"""

from __future__ import annotations

import os
from pathlib import Path

LANGS: tuple[str, ...] = ("en", "zh", "fr", "ru", "de", "ro")
PAIRS: tuple[str, ...] = ("en-de", "en-fr", "en-ro", "en-zh", "en-ru")
MONO_SPLITS: tuple[str, ...] = ("train", "validation")
PARALLEL_SPLITS: tuple[str, ...] = ("train", "validation")


def data_root() -> Path:
    """Returns the data root: `$XLSCALE_DATA` if set, else `~/.cache/xlscale` (never committed)."""
    env = os.environ.get("XLSCALE_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "xlscale"


def corpora_dir(root: str | os.PathLike | None = None) -> Path:
    """Returns `<root>/corpora`, with `root` defaulting to `data_root()`."""
    return Path(root if root is not None else data_root()) / "corpora"


def mono_file(corpora: str | os.PathLike, lang: str, split: str) -> Path:
    """Returns `<corpora>/mono/<lang>/<split>.txt` (one paragraph per line, no tabs)."""
    return Path(corpora) / "mono" / lang / f"{split}.txt"


def parallel_file(corpora: str | os.PathLike, pair: str, split: str) -> Path:
    """Returns `<corpora>/parallel/<pair>/<split>.tsv` (`<english>\\t<xx>` per line)."""
    return Path(corpora) / "parallel" / pair / f"{split}.tsv"


def test_file(corpora: str | os.PathLike, pair: str) -> Path:
    """Returns `<corpora>/test/<pair>/test.tsv`, the held-out translation test set."""
    return Path(corpora) / "test" / pair / "test.tsv"


def manifest_file(corpora: str | os.PathLike) -> Path:
    """Returns `<corpora>/manifest.json`."""
    return Path(corpora) / "manifest.json"


def pair_lang(pair: str) -> str:
    """Returns the non-English side of a pair name such as `en-de` (raises on other shapes)."""
    src, sep, tgt = pair.partition("-")
    if src != "en" or not sep or not tgt:
        raise ValueError(f"pair {pair!r} is not of the form en-<xx>")
    return tgt
