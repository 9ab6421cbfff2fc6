"""`xlscale data build`: the Debian corpora, from packages to the layout of docs/interfaces.md.

Stages, each cached under `<data root>/debian/` so that rebuilds are incremental:

1. private APT indices (`apt/`, refreshed only on request or when absent), which fix the package
   versions and the `Translation-xx` description files;
2. per package and version: download (`debs/`), unpack, extract raw text into
   `extract/<package>_<version>.json`, delete the unpacked tree;
3. assembly (always redone, it is fast): filter, deduplicate, remove overlap with the held-out test
   set, split by a hash of the text, write the layout and `manifest.json`.

Inputs are processed in sorted order and the split is a pure function of the text, so the same
indices give byte-identical outputs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from pipelines.corpora import apt, descriptions, filters, layout, manpages, paths, sources
from rundir import storage

Log = Callable[[str], None]
# Shortest mono segment kept, per source (catalogue strings are short UI labels and messages).
MONO_MIN_CHARS: dict[str, int] = {"man": 20, "descriptions": 20, "gettext": 2}


class BuildError(RuntimeError):
    """The build cannot proceed; the message says which tool, package or file is at fault."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def _extraction_file(cache: Path, name: str, version: str) -> Path:
    return cache / "extract" / f"{name}_{version.replace(':', '%3a')}.json"


def _cached_extraction(cache: Path, name: str, version: str) -> dict | None:
    target = _extraction_file(cache, name, version)
    if target.exists():
        data = json.loads(target.read_text(encoding="utf-8"))
        if data.get("extractor_version") == sources.EXTRACTOR_VERSION:
            return data
    return None


def _extract_package(state: apt.AptState, cache: Path, name: str, version: str, log: Log) -> dict:
    """Downloads (unless cached), unpacks and extracts `name=version`; caches the result."""
    target = _extraction_file(cache, name, version)
    try:
        deb = state.download(name, version, cache / "debs")
    except apt.AptError as err:
        raise BuildError(str(err)) from err
    log(f"  {deb.name}: {_mb(deb.stat().st_size)}")
    tree = cache / "trees" / target.stem
    try:
        apt.extract_deb(deb, tree)
        data = sources.extract(name, tree, log=log)
    except (apt.AptError, manpages.ManError, OSError, ValueError) as err:
        raise BuildError(f"extracting {name} {version} ({deb.name}): {err}") from err
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    data.update(package=name, version=version, deb=deb.name, deb_sha256=_sha256(deb))
    layout.write_json(target, data)
    return data


def _read_translations(state: apt.AptState, lang: str, log: Log) -> tuple[dict, list[dict]]:
    """Parses all `Translation-<lang>` files of the private lists (sorted; first md5 wins)."""
    name = descriptions.TRANSLATION_NAMES[lang]
    files = state.translation_files(name)
    if not files:
        raise BuildError(
            f"no Translation-{name} file in {state.lists}: run with --update "
            "(the private APT config requests Acquire::Languages en de fr ru zh_CN)"
        )
    merged: dict[str, list[str]] = {}
    info = []
    for f in files:
        parsed = descriptions.parse_translation_file(state.read_list_file(f), lang)
        for md5, paras in parsed.items():
            merged.setdefault(md5, paras)
        info.append(
            {
                "file": f.name,
                "sha256": _sha256(f),
                "descriptions": len(parsed),
                "licence": "Debian package descriptions (main, DFSG-free) and their DDTP "
                "translations, under the licences of the respective packages",
            }
        )
    log(f"  Translation-{name}: {len(merged)} descriptions from {len(files)} file(s)")
    return merged, info


def _tool_versions() -> dict[str, str]:
    out = {}
    for tool, args in {"man": ["man", "--version"], "groff": ["groff", "--version"]}.items():
        try:
            proc = subprocess.run(args, capture_output=True, text=True, check=False)
            out[tool] = (proc.stdout or proc.stderr).strip().splitlines()[0]
        except (OSError, IndexError):
            out[tool] = "unavailable"
    return out


def build_corpora(
    *,
    data_dir: str | Path | None = None,
    langs: Iterable[str] = paths.LANGS,
    update: bool = False,
    log: Log = print,
) -> Path:
    """Builds the Debian corpora for `langs` under `<data_dir>/corpora` and returns that path.

    Args:
      data_dir: the data root (default `paths.data_root()`, i.e. `$XLSCALE_DATA`).
      langs: languages to build; pairs are `en-<xx>` for every other language given.
      update: refresh the private APT indices first (they are fetched anyway when absent); a
        refresh can change package versions and hence the corpus.
      log: progress sink, one line per call.
    """
    requested = set(langs)
    unknown = sorted(requested - set(paths.LANGS))
    if not requested or unknown:
        raise BuildError(f"unknown languages {unknown}; choose among {' '.join(paths.LANGS)}")
    langs = tuple(lang for lang in paths.LANGS if lang in requested)
    missing = apt.missing_tools()
    if missing:
        pkgs = sorted({m.split("package ")[1].rstrip(")") for m in missing})
        raise BuildError(
            "missing tools: "
            + "; ".join(missing)
            + f". Install them: apt-get install {' '.join(pkgs)}"
        )
    why = "apt and the extractors write the corpora on this machine"
    root = (
        storage.local_dir(data_dir, name="--data-dir", why=why)
        if data_dir is not None
        else paths.data_root()
    )
    cache = root / "debian"
    corpora = paths.corpora_dir(root)
    xxs = tuple(lang for lang in langs if lang != "en")
    t_start = time.monotonic()

    state = apt.AptState.create(cache / "apt")
    if update or not state.has_lists():
        log(f"apt-get update (private state in {state.root}) ...")
        try:
            state.update()
        except apt.AptError as err:
            raise BuildError(str(err)) from err
    wanted = sources.packages_for(langs)
    try:
        versions = state.candidates(sorted(wanted))
    except apt.AptError as err:
        raise BuildError(str(err)) from err
    absent = sorted(set(wanted) - set(versions))
    if absent:
        raise BuildError(f"no installable version of: {', '.join(absent)} (try --update)")

    extracted: dict[str, dict] = {}
    for name in sorted(wanted):
        cached = _cached_extraction(cache, name, versions[name])
        if cached is not None:
            extracted[name] = cached
    todo = [(n, versions[n]) for n in sorted(wanted) if n not in extracted]
    if todo:
        log(f"downloading {len(todo)} package(s) ...")
        t0 = time.monotonic()
        try:
            state.download_many(todo, cache / "debs")
        except apt.AptError as err:
            raise BuildError(str(err)) from err
        log(f"  downloaded in {time.monotonic() - t0:.1f} s")
    for i, name in enumerate(sorted(wanted), 1):
        log(f"[{i}/{len(wanted)}] {name} {versions[name]} ({wanted[name].kind})")
        if name in extracted:
            log(f"  cached: {_extraction_file(cache, name, versions[name]).name}")
        else:
            extracted[name] = _extract_package(state, cache, name, versions[name], log)

    log("descriptions ...")
    desc: dict[str, dict] = {}
    desc_info: list[dict] = []
    for lang in (lang for lang in langs if lang in descriptions.TRANSLATION_NAMES):
        desc[lang], info = _read_translations(state, lang, log)
        desc_info.extend(info)
    if xxs and "en" not in desc:
        desc["en"], info = _read_translations(state, "en", log)
        desc_info.extend(info)

    log("assembling ...")
    manifest = write_corpora(
        corpora,
        langs=langs,
        extracted=extracted,
        descriptions_by_lang=desc,
        description_files=desc_info,
        log=log,
    )
    log(f"done in {time.monotonic() - t_start:.0f} s: {corpora}")
    log(summary_table(manifest))
    return corpora


def write_corpora(
    corpora: str | Path,
    *,
    langs: Iterable[str],
    extracted: dict[str, dict],
    descriptions_by_lang: dict[str, dict[str, list[str]]],
    description_files: Iterable[dict] = (),
    log: Log = print,
) -> dict:
    """Assembles the layout and `manifest.json` under `corpora` from extracted package data.

    Args:
      corpora: the output directory (`<data root>/corpora`).
      langs: languages to write; pairs are `en-<xx>` for the others.
      extracted: `{package: sources.extract(...) result + version/deb fields}`.
      descriptions_by_lang: `{lang: {Description-md5: paragraphs}}`; must hold `en` for pairs.
      description_files: provenance of the Translation files, copied into the manifest.
      log: progress sink.

    Returns:
      The manifest that was written.
    """
    corpora = Path(corpora)
    langs = tuple(lang for lang in paths.LANGS if lang in set(langs))
    pairs = tuple(f"en-{lang}" for lang in langs if lang != "en")
    result = _assemble(corpora, langs, pairs, extracted, descriptions_by_lang, log)
    manifest = {
        "format_version": 1,
        "kind": "debian",
        "created_by": "pipelines.corpora.build.build_corpora",
        "built_langs": list(langs),
        **layout.layout_stats(corpora, langs=paths.LANGS, pairs=paths.PAIRS),
        "breakdown": result["breakdown"],
        "sources": [
            {
                "package": name,
                "version": data.get("version", "unknown"),
                "kind": data["kind"],
                "langs": sorted(set(data.get("pairs", {})) | set(data.get("paragraphs", {}))),
                "deb": data.get("deb"),
                "deb_sha256": data.get("deb_sha256"),
                **data.get("licence", {"licence": "unknown"}),
            }
            for name, data in sorted(extracted.items())
        ],
        "description_files": list(description_files),
        "filters": {
            "script_min": {k: list(v) for k, v in filters.SCRIPT_MIN.items()},
            "max_length_ratio": filters.MAX_LENGTH_RATIO,
            "char_factor": filters.CHAR_FACTOR,
            "mono_min_chars": MONO_MIN_CHARS,
            "dedup": "exact match after NFKC, case folding and whitespace collapsing",
        },
        "split_rule": (
            f"validation iff SHA-1(normalised text) mod 1000 < {filters.VALIDATION_PER_MILLE} "
            "(mono: the line; parallel: the English side)"
        ),
        "tools": _tool_versions(),
        "notes": result["notes"],
    }
    layout.write_json(paths.manifest_file(corpora), manifest)
    return manifest


def _gettext_sources(extracted: dict[str, dict], lang: str) -> list[tuple[str, list]]:
    return [
        (name, data["pairs"][lang])
        for name, data in sorted(extracted.items())
        if data["kind"] == "gettext" and lang in data["pairs"]
    ]


def _assemble(
    corpora: Path,
    langs: tuple[str, ...],
    pairs: tuple[str, ...],
    extracted: dict[str, dict],
    desc: dict[str, dict],
    log: Log,
) -> dict:
    """Filters, deduplicates, removes test overlap, splits and writes every layout file."""
    norm, one = filters.normalize, layout.one_line
    breakdown: dict[str, dict] = {"mono": {}, "parallel": {}, "test": {}}

    # 1. The held-out test set comes first: training data is cleaned against it.
    guide = next((d for d in extracted.values() if d["kind"] == "guide"), None)
    test_en: set[str] = set()
    test_xx: dict[str, set[str]] = {}
    for pair in pairs:
        xx = paths.pair_lang(pair)
        seen: set[tuple[str, str]] = set()
        rows = []
        for en, tr in (guide or {"pairs": {}})["pairs"].get(xx, []):
            en, tr = one(en), one(tr)
            key = (norm(en), norm(tr))
            if filters.keep_pair(en, tr, xx) and key not in seen:
                seen.add(key)
                rows.append((en, tr))
        layout.write_pairs(paths.test_file(corpora, pair), rows)
        test_en |= {norm(en) for en, _ in rows}
        test_xx[xx] = {norm(tr) for _, tr in rows}
        breakdown["test"][pair] = {"pairs": len(rows), **(guide or {}).get("stats", {}).get(xx, {})}
        log(f"  test {pair}: {len(rows)} pairs")

    # 2. Parallel: catalogues (by package name), then package descriptions.
    accepted: dict[str, dict[str, list[str]]] = {}
    for pair in pairs:
        xx = paths.pair_lang(pair)
        srcs = _gettext_sources(extracted, xx)
        if xx in desc:
            srcs.append(("descriptions", descriptions.description_pairs(desc["en"], desc[xx])))
        seen = set()
        out: dict[str, list[tuple[str, str]]] = {"train": [], "validation": []}
        counts: dict[str, int] = {}
        candidates: dict[str, int] = {}
        overlap = 0
        for src, rows in srcs:
            kept = 0
            candidates[src] = len(rows)
            # Catalogue translations that pass the pair filter also feed the mono corpus.
            targets = (
                None if src == "descriptions" else accepted.setdefault(xx, {}).setdefault(src, [])
            )
            for en, tr in rows:
                en, tr = one(en), one(tr)
                key = (norm(en), norm(tr))
                if key in seen:
                    continue
                seen.add(key)
                if not filters.keep_pair(en, tr, xx):
                    continue
                if targets is not None:
                    targets.append(tr)
                if key[0] in test_en or key[1] in test_xx.get(xx, ()):
                    overlap += 1
                    continue
                out[filters.split_of_key(key[0])].append((en, tr))
                kept += 1
            counts[src] = kept
        for split, rows in out.items():
            layout.write_pairs(paths.parallel_file(corpora, pair, split), rows)
        breakdown["parallel"][pair] = {
            "by_source": counts,
            "candidates_by_source": candidates,
            "removed_test_overlap": overlap,
        }
        log(
            f"  parallel {pair}: {len(out['train'])} train, {len(out['validation'])} validation"
            f" pairs ({overlap} overlapping the test set removed)"
        )

    # 3. Mono: man pages, then package descriptions, then catalogue translations.
    for lang in langs:
        banned = test_en if lang == "en" else test_xx.get(lang, set())
        srcs: list[tuple[str, str, Iterable[str]]] = [
            ("man", name, data["paragraphs"][lang])
            for name, data in sorted(extracted.items())
            if data["kind"] == "man" and lang in data["paragraphs"]
        ]
        if lang in desc:
            paras = (p for md5 in sorted(desc[lang]) for p in desc[lang][md5])
            srcs.append(("descriptions", f"Translation-{lang}", paras))
        for name, targets in accepted.get(lang, {}).items():
            srcs.append(("gettext", name, targets))
        seen_lines: set[str] = set()
        out_lines: dict[str, list[str]] = {"train": [], "validation": []}
        stats: dict[str, dict[str, int]] = {}
        overlap = 0
        for kind, _, texts in srcs:
            st = stats.setdefault(
                kind, {"lines": 0, "bytes": 0, "candidate_lines": 0, "candidate_bytes": 0}
            )
            for text in texts:
                text = one(text)
                st["candidate_lines"] += 1
                st["candidate_bytes"] += len(text.encode("utf-8")) + 1
                key = norm(text)
                if key in seen_lines:
                    continue
                seen_lines.add(key)
                if not filters.keep_mono(text, lang, min_chars=MONO_MIN_CHARS[kind]):
                    continue
                if key in banned:
                    overlap += 1
                    continue
                out_lines[filters.split_of_key(key)].append(text)
                st["lines"] += 1
                st["bytes"] += len(text.encode("utf-8")) + 1
        for split, lines in out_lines.items():
            layout.write_lines(paths.mono_file(corpora, lang, split), lines)
        breakdown["mono"][lang] = {"by_source": stats, "removed_test_overlap": overlap}
        log(f"  mono {lang}: " + ", ".join(f"{k} {_mb(v['bytes'])}" for k, v in stats.items()))
    return {"breakdown": breakdown, "notes": _notes(breakdown, langs)}


def _notes(breakdown: dict, langs: tuple[str, ...]) -> list[str]:
    notes = [
        "Monolingual files hold one paragraph per line in source order (man pages, package "
        "descriptions, catalogue translations): shuffle when sampling.",
        "Chinese is Simplified (zh_CN) only: the zh_TW pages of manpages-zh are a character "
        "conversion of the same translations and are left out.",
        "Held-out test set: the Debian Installation Guide (installation-guide-amd64), blocks "
        "paired by index in files whose block counts match; training and validation segments "
        "equal to a test segment (after normalisation) were removed.",
        "Sizes are after filtering and exact deduplication; breakdown.mono.*.by_source."
        "*.candidate_bytes and breakdown.parallel.*.candidates_by_source give the raw amounts "
        "(e.g. many package descriptions repeat paragraphs verbatim).",
    ]
    mono = breakdown["mono"]
    if "ro" in mono:
        total = {lang: sum(v["bytes"] for v in m["by_source"].values()) for lang, m in mono.items()}
        ro = mono["ro"]["by_source"]
        parts = ", ".join(f"{k} {_mb(v['bytes'])}" for k, v in ro.items())
        others = [v for k, v in total.items() if k != "ro"]
        than = f", against at least {_mb(min(others))} for every other language" if others else ""
        notes.append(
            f"Romanian is the thin language: {_mb(total['ro'])} of monolingual text in all "
            f"({parts}); Debian has no Romanian package-description translations in the fetched "
            f"set (Acquire::Languages en de fr ru zh_CN){than}."
        )
    return notes


def summary_table(manifest: dict) -> str:
    """Formats the per-language and per-pair sizes of a manifest as a plain-text table."""
    lines = [f"{'lang':<6}{'train MB':>10}{'train lines':>13}{'valid lines':>13}"]
    for lang, splits in manifest["languages"].items():
        if splits:
            tr, va = splits.get("train", {}), splits.get("validation", {})
            lines.append(
                f"{lang:<6}{tr.get('bytes', 0) / 1e6:>10.2f}{tr.get('lines', 0):>13}"
                f"{va.get('lines', 0):>13}"
            )
    lines.append(f"{'pair':<6}{'train pairs':>12}{'valid pairs':>13}{'test pairs':>12}")
    for pair, splits in manifest["pairs"].items():
        if splits:
            lines.append(
                f"{pair:<6}{splits.get('train', {}).get('pairs', 0):>12}"
                f"{splits.get('validation', {}).get('pairs', 0):>13}"
                f"{splits.get('test', {}).get('pairs', 0):>12}"
            )
    return "\n".join(lines)
