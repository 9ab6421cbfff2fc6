"""The documentation: README's links, the pages' wording, the results pages and the API pages.

`make docs-check` (a step of `make test`) builds the site with `mkdocs build --strict`, which
fails on a broken link, anchor or page; these tests check what the build cannot see: README.md
(outside the site), that the results pages and README's results summary are what
`docs/gen_results.py` writes from the measurement records, the generator's tables for a sample
record (`tests/data/`), and that the API reference covers every module. Stdlib only: no MkDocs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
README = ROOT / "README.md"
README_MAX_LINES = 250
# Markdown links and images: [text](target) / ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# What no page of the project refers to: notes outside the repository and its development history.
FORBIDDEN = {
    "a path outside the repository": re.compile(r"\.\./shared/"),
    "an outside design note": re.compile(r"\b(DESIGN|STYLE)\.md\b"),
    "an issue number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a development session": re.compile(r"\bsessions? \d+", re.IGNORECASE),
    "a CI stop": re.compile(r"\bstop \d+\b"),
}


def _load(name: str, path: Path):
    """Imports the script at `path` as module `name` (docs/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen_results = _load("docs_gen_results", ROOT / "docs" / "gen_results.py")
hooks = _load("docs_hooks", ROOT / "docs" / "hooks.py")


def _pages() -> list[Path]:
    """README.md and every markdown page under docs/."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_one_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_links_resolve_to_files_of_the_repository():
    text = README.read_text(encoding="utf-8")
    targets = LINK.findall(text)
    assert targets, "README.md links nowhere"
    broken = []
    for target in targets:
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor of the README itself
        path = (ROOT / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert not broken, f"README.md links to missing files: {broken}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_refer_to_nothing_outside_the_repository(page):
    text = page.read_text(encoding="utf-8")
    found = [f"{what}: {m.group(0)!r}" for what, rx in FORBIDDEN.items() for m in rx.finditer(text)]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_results_pages_and_readme_summary_are_generated_from_the_records():
    stale = [
        str(path.relative_to(ROOT))
        for path, text in gen_results.outputs().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"out of date, run docs/gen_results.py: {stale}"


def test_every_record_is_renderable_and_its_summary_fills():
    records = gen_results.load_records()
    assert records
    for _, record in records:
        gen_results.table(record)
        if record.get("summary"):
            gen_results.fill(record["summary"]["what"], record)
            gen_results.fill(record["summary"]["figure"], record)
    summaries = [r for _, r in records if r.get("summary")]
    assert 1 <= len(summaries) <= 15, "README's results summary holds at most 15 rows"


def test_the_generators_table_for_the_sample_record():
    record = json.loads((DATA / "results_record.json").read_text(encoding="utf-8"))
    assert gen_results.table(record) == (
        "| starts | batched, s | scipy loop, s | speed-up | α | same optimum | load | not measured |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| 4,500 | 3.47 | 24.7 | 7.1× | 0.400 | yes | 1.5 | – |"
    )
    section = gen_results.record_section(record)
    assert section.startswith("## Chinchilla fit: batched multi-start against scipy\n")
    assert "- **hardware**: x86-64 CPU, 2 cores, no accelerator" in section
    assert "- **date**: 2026-11-22; **commit**: `ca87a89`" in section
    assert section.rstrip().endswith("Both sides minimise the same Huber objective.")
    assert gen_results.summary_block([("fit", record)]).splitlines()[2] == (
        "| Chinchilla fit, 4,500 starts | 7.1× scipy (3.47 s vs 24.7 s) | 2-core CPU "
        "| [Speed on a CPU](docs/results/speed.md) |"
    )


def test_a_benchmarks_json_becomes_a_record_like_an_existing_one(tmp_path):
    like = DATA / "results_record.json"
    out = tmp_path / "fit.json"
    argv = [
        "record",
        str(DATA / "fit_benchmark.json"),
        "--like",
        str(like),
        "--hardware",
        "test machine",
        "--date",
        "2027-01-02",
        "--commit",
        "0123abc",
        "--out",
        str(out),
    ]
    assert gen_results.main(argv) == 0
    record = json.loads(out.read_text(encoding="utf-8"))
    assert (record["hardware"], record["date"], record["commit"]) == (
        "test machine",
        "2027-01-02",
        "0123abc",
    )
    assert record["columns"] == json.loads(like.read_text(encoding="utf-8"))["columns"]
    assert gen_results.table(record).splitlines()[2] == (
        "| 4,500 | 3.47 | 24.7 | 7.1× | 0.400 | yes | 1.5 / 1.4 / 1.3 | – |"
    )


def test_rows_from_a_benchmarks_list_of_rows():
    rows = gen_results.rows_from_benchmark([{"size": "a", "cost": {"flops": 2}}, {"size": "b"}])
    assert rows == [{"size": "a", "cost.flops": 2}, {"size": "b"}]


def test_cells():
    assert gen_results.cell(None) == "–"
    assert gen_results.cell(True) == "yes"
    assert gen_results.cell(1234567) == "1,234,567"
    assert gen_results.cell(0.125) == "0.125"
    assert gen_results.cell(0.125, "{:.0%}") == "12%"
    assert gen_results.cell("a|b") == "a\\|b"


def test_a_record_on_an_unknown_page_is_refused(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"title": "t", "page": "nope", "rows": []}))
    with pytest.raises(gen_results.RecordError, match="x.json: page 'nope'"):
        gen_results.load_records(tmp_path)


def test_api_pages_list_every_module_of_every_package():
    packages = set(hooks.PACKAGES)
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"t5x_configs", "tests"}
    assert on_disk <= packages, f"packages without an API page: {sorted(on_disk - packages)}"
    pages = hooks.api_pages()
    for package in hooks.PACKAGES:
        page = pages[f"api/{package}.md"]
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "__init__.py" or not (path.parent / "__init__.py").exists():
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if module in hooks.EXCLUDED:
                continue
            assert f"::: {module}\n" in page, f"api/{package}.md lacks {module}"


def test_citations_in_docstrings_render_as_code():
    pytest.importorskip("griffe")
    citations = _load("docs_griffe_citations", ROOT / "docs" / "griffe_citations.py")
    text = "Table 2 [q:cpt.table2_scratch]\n[q:cpt.table2_cpt], written `[q:mt.s4_finetune]`."
    assert citations.as_code(text) == (
        "Table 2 `[q:cpt.table2_scratch]`\n`[q:cpt.table2_cpt]`, written `[q:mt.s4_finetune]`."
    )
