"""What the Debian build reads, and how each unpacked package becomes cached raw text.

`PACKAGES` is the one table of source packages (a dict registry: adding a catalogue is one line).
`extract(kind, tree, ...)` turns an unpacked `.deb` into a JSON-able dict of *unfiltered* text, which
`build` caches per package version; filtering and splitting happen later, so changing a filter
never requires a new download.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipelines.corpora import install_guide, manpages, mo
from rundir import durations

# Bump when an extractor's output changes, so that cached extractions are redone.
EXTRACTOR_VERSION = 1

# Largest share of a package's man pages allowed to fail rendering before the build stops.
MAX_MAN_FAILURES = 0.05
# Directory name of each language under .../locale/ (gettext) .
GETTEXT_LANG_DIRS: dict[str, str] = {"de": "de", "fr": "fr", "ro": "ro", "ru": "ru", "zh": "zh_CN"}


@dataclasses.dataclass(frozen=True)
class Package:
    """One Debian binary package: what kind of text it holds and for which languages.

    `markers` lists the accelerator characters of its catalogues (GUI programs only).
    """

    kind: str  # "man" | "gettext" | "guide"
    langs: tuple[str, ...]
    markers: str = ""


_ALL_XX = ("de", "fr", "ro", "ru", "zh")
PACKAGES: dict[str, Package] = {
    "manpages": Package("man", ("en",)),
    "manpages-de": Package("man", ("de",)),
    "manpages-fr": Package("man", ("fr",)),
    "manpages-ro": Package("man", ("ro",)),
    "manpages-ru": Package("man", ("ru",)),
    "manpages-zh": Package("man", ("zh",)),
    "installation-guide-amd64": Package("guide", _ALL_XX),
    # Command-line programs: no accelerators, `_` belongs to identifiers.
    **{
        name: Package("gettext", _ALL_XX)
        for name in (
            "libc-l10n binutils-common git gnupg-l10n coreutils tar findutils grep sed diffutils"
            " bash wget gettext dpkg apt nano man-db psmisc cpio make"
        ).split()
    },
    # LibreOffice UI catalogues: `~` (and `_` in .ui strings) mark accelerators.
    "libreoffice-l10n-de": Package("gettext", ("de",), markers="~_"),
    "libreoffice-l10n-fr": Package("gettext", ("fr",), markers="~_"),
    "libreoffice-l10n-ro": Package("gettext", ("ro",), markers="~_"),
    "libreoffice-l10n-ru": Package("gettext", ("ru",), markers="~_"),
    "libreoffice-l10n-zh-cn": Package("gettext", ("zh",), markers="~_"),
}


def packages_for(langs: tuple[str, ...]) -> dict[str, Package]:
    """Returns the packages needed for `langs` (sorted by name, for a deterministic build)."""
    return {name: pkg for name, pkg in sorted(PACKAGES.items()) if set(pkg.langs) & set(langs)}


def licence_of(tree: str | os.PathLike, package: str) -> dict[str, object]:
    """Summarises `usr/share/doc/<package>/copyright`: the licence of the `Files: *` stanza of a
    machine-readable (DEP-5) file, or the common-licenses named in a free-form one, plus all
    licence names found."""
    doc = Path(tree) / "usr" / "share" / "doc"
    candidates = [doc / package / "copyright", *sorted(doc.glob("*/copyright"))]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        return {"licence": "unknown (no copyright file in the package)", "licences": []}
    text = path.read_text(encoding="utf-8", errors="replace")
    names = re.findall(r"^License:[ \t]*(\S[^\n]*)", text, flags=re.M)
    main = None
    for stanza in re.split(r"\n\s*\n", text):
        if re.search(r"^Files:\s*\*\s*$", stanza, flags=re.M):
            found = re.search(r"^License:[ \t]*(\S[^\n]*)", stanza, flags=re.M)
            main = found.group(1).strip() if found else None
    if not names:
        names = re.findall(r"/usr/share/common-licenses/([\w.+-]+?)[.'\"`]?(?:\s|$)", text)
    unique = sorted({n.strip() for n in names})
    return {
        "licence": main or (", ".join(unique) if unique else "see copyright file"),
        "licences": unique[:20],
        "copyright_file": str(path.relative_to(tree)),
    }


def _extract_gettext(tree: Path, pkg: Package, log: Callable[[str], None]) -> dict:
    pairs: dict[str, list[list[str]]] = {}
    catalogs: dict[str, list[str]] = {}
    for lang in pkg.langs:
        ldir = GETTEXT_LANG_DIRS[lang]
        files = sorted(
            p
            for p in tree.rglob("*.mo")
            if p.parent.name == "LC_MESSAGES" and p.parent.parent.name == ldir
        )
        rows: list[list[str]] = []
        for f in files:
            catalog = mo.read_mo(f)
            rows.extend([en, xx] for en, xx in mo.catalog_pairs(catalog, markers=pkg.markers))
        pairs[lang] = rows
        catalogs[lang] = [str(f.relative_to(tree)) for f in files]
    log(
        "  catalogues: "
        + ", ".join(f"{k} {len(v)} files/{len(pairs[k])} msgs" for k, v in catalogs.items())
    )
    return {"pairs": pairs, "catalogs": catalogs}


def _extract_man(tree: Path, pkg: Package, log: Callable[[str], None]) -> dict:
    (lang,) = pkg.langs
    pages = manpages.man_pages(tree, lang)
    results: list[list[str] | None] = [None] * len(pages)
    failed: list[str] = []
    start = time.monotonic()
    last = start

    def one(i: int) -> tuple[int, list[str] | None, str | None]:
        try:
            return i, list(manpages.paragraphs(manpages.render(pages[i]))), None
        except manpages.ManError as err:
            return i, None, str(err)

    workers = max(2, (os.cpu_count() or 2) * 2)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for done, (i, paras, err) in enumerate(pool.map(one, range(len(pages))), 1):
            results[i] = paras
            if err:
                failed.append(str(pages[i].relative_to(tree)))
            now = time.monotonic()
            if now - last > 10 or done == len(pages):
                rate = done / max(now - start, 1e-9)
                eta = (len(pages) - done) / max(rate, 1e-9)
                eta_text = durations.format_duration(eta)
                log(f"  rendered {done}/{len(pages)} pages ({rate:.1f}/s, ETA {eta_text})")
                last = now
    if failed:
        log(f"  {len(failed)} page(s) failed to render, e.g. {failed[0]}")
    if len(failed) > MAX_MAN_FAILURES * max(len(pages), 1):
        raise manpages.ManError(
            f"{len(failed)} of {len(pages)} {lang} pages failed to render (first: {failed[:3]}); "
            "check that man-db and groff work: man -l -E UTF-8 FILE | col -bx"
        )
    paragraphs = [p for paras in results if paras for p in paras]
    return {"paragraphs": {lang: paragraphs}, "pages": len(pages), "failed": failed}


def _extract_guide(tree: Path, pkg: Package, log: Callable[[str], None]) -> dict:
    pairs, stats = {}, {}
    for lang in pkg.langs:
        rows, stats[lang] = install_guide.guide_pairs(tree, lang)
        pairs[lang] = [list(r) for r in rows]
    log(
        "  guide: "
        + ", ".join(
            f"{k} {v['files_matched']}/{v['files']} files, {v['blocks_paired']} blocks"
            for k, v in stats.items()
        )
    )
    return {"pairs": pairs, "stats": stats}


EXTRACTORS: dict[str, Callable[[Path, Package, Callable[[str], None]], dict]] = {
    "gettext": _extract_gettext,
    "man": _extract_man,
    "guide": _extract_guide,
}


def extract(name: str, tree: str | os.PathLike, log: Callable[[str], None] = print) -> dict:
    """Extracts the raw text of package `name` from its unpacked `tree` (see `PACKAGES`); the
    result also carries the package's licence summary."""
    pkg = PACKAGES[name]
    out = EXTRACTORS[pkg.kind](Path(tree), pkg, log)
    out["kind"] = pkg.kind
    out["licence"] = licence_of(tree, name)
    out["extractor_version"] = EXTRACTOR_VERSION
    return out
