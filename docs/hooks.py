"""MkDocs hook: the API reference pages, written at build time from the package tree.

One page per top-level package, `api/<package>.md`, holding one `::: package.module` block per
module (subpackages' modules included, `__init__` aside), rendered by mkdocstrings from the
docstrings (static analysis: nothing is imported). The pages are made while the site builds, so a
module added, moved or removed never leaves a stale page behind.

`mkdocs.yml` names this file under `hooks:`; `api_pages()` is what the hook adds, callable on its
own (`tests/test_docs_site.py`).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# The packages the reference covers, in the order of the layers (bottom first), with one line
# saying what each holds.
PACKAGES: dict[str, str] = {
    "rundir": "The run directory as a contract: names, records, units, lease, checksums, storage.",
    "modeling": "What every model family shares: axes, remat, attention, decoding, the registry.",
    "pipelines": "Corpora, vocabularies, seqio tasks and mixtures, prepared data, text metrics.",
    "llama_jax": "LLaMA2 in Flax: layers, sizes, counting, memory model, HF conversion.",
    "t5_jax": "T5 in Flax: layers, sizes, counting, memory model, decoding.",
    "convert": "Published checkpoints in and out, vocabulary growth.",
    "trainer": "The gin-configured runner: train, eval, infer.",
    "evals": "Zero-shot evaluation through lm-evaluation-harness.",
    "fitting": "Laws, fits, designs, readers and reports.",
    "launch": "Sweep manifests, launchers, adaptive sweeps, status.",
    "studies": "The CPT and MT studies behind `xlscale demo`, and the paper check.",
    "xlscale_cli": "The `xlscale` console script, one module per subcommand.",
}

# Modules left out of the reference, with the reason (none at present: every module's
# docstrings render).
EXCLUDED: dict[str, str] = {}


def package_modules(package: str, root: Path = REPO) -> list[str]:
    """The dotted names of `package`'s modules (subpackages included, `__init__` aside, excluded
    ones dropped), sorted: top-level modules first, then each subpackage's."""
    base = root / package
    names = []
    for path in base.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("")
        if path.name == "__init__.py" or "__pycache__" in rel.parts:
            continue
        if not (path.parent / "__init__.py").exists():
            continue
        names.append(".".join(rel.parts))
    names = [n for n in names if n not in EXCLUDED]
    return sorted(names, key=lambda n: (n.count("."), n))


def package_page(package: str, root: Path = REPO) -> str:
    """The markdown of `api/<package>.md`."""
    modules = package_modules(package, root)
    lines = [
        f"# `{package}`",
        "",
        PACKAGES[package],
        "",
        "Modules: " + ", ".join(f"[`{m}`](#{m})" for m in modules) + ".",
        "",
    ]
    for module in modules:
        lines += [f"::: {module}", ""]
    return "\n".join(lines)


def index_page() -> str:
    """The markdown of `api/index.md`: the packages, bottom layer first."""
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings of every module when the site is built. The packages are",
        "listed bottom layer first; a package imports only those below it (see",
        "[Architecture](../architecture.md)).",
        "",
        "| package | what it holds |",
        "|---|---|",
    ]
    lines += [f"| [`{p}`]({p}.md) | {what} |" for p, what in PACKAGES.items()]
    if EXCLUDED:
        lines += ["", "Left out of the reference:", ""]
        lines += [f"- `{m}`: {why}" for m, why in sorted(EXCLUDED.items())]
    return "\n".join(lines) + "\n"


def api_pages(root: Path = REPO) -> dict[str, str]:
    """Path under docs/ -> markdown, for every API page."""
    pages = {"api/index.md": index_page()}
    pages.update({f"api/{p}.md": package_page(p, root) for p in PACKAGES})
    return pages


def on_files(files, config):
    """Adds the API pages to the site's files."""
    from mkdocs.structure.files import File

    for path, text in api_pages().items():
        files.append(File.generated(config, path, content=text))
    return files
