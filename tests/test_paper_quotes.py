"""Every claim the project attributes to a paper is a quote: each `[q:<key>]` citation in the
project's texts (code, docstrings, reports, gin comments, manifests, docs) names an entry of
`fitting.paper_quotes.QUOTES`, every entry has a paper, a place in it and the paper's words, and
every entry is cited somewhere.

The quotes' words were checked by hand against the papers' text (each verbatim, whitespace aside);
the papers are not part of the repository, so this test checks the registry's form and its use,
not the words themselves.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from fitting import paper_quotes
from fitting.paper_quotes import QUOTES, Quote

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The project's texts: everything but the tests (which build bad citations on purpose), the
# virtual environment and other tools' directories.
SKIP = {"tests", ".venv", ".git", "node_modules", "xlscale.egg-info", "__pycache__"}
# Side installs and caches made inside the checkout (e.g. COMET's venv) are not the project's.
SKIP |= {".comet-venv", "site", ".pytest_cache", ".ruff_cache"}
SUFFIXES = {".py", ".gin", ".toml", ".md", ".sh", ".txt", ".cfg", ".yaml", ".yml"}
# A sentence that says what a paper says must carry its quote within `WINDOW` lines.
SAYS = re.compile(
    r"\b(?:the|its|MT|CPT) paper(?:'s)? (?:says|said|writes|wrote|states)\b|says it follows"
    r"|\(the paper: ",
    re.IGNORECASE,
)
WINDOW = 3


def _texts() -> dict[str, str]:
    out = {}
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if (
            set(rel.parts) & SKIP
            or any(p.endswith("-venv") for p in rel.parts)
            or path.suffix not in SUFFIXES
            or not path.is_file()
        ):
            continue
        out[str(rel)] = path.read_text(errors="replace")
    return out


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    return _texts()


def test_every_entry_has_a_paper_a_place_and_words():
    assert paper_quotes.problems(QUOTES) == []


def test_an_entry_without_a_place_or_words_is_found():
    bad = {
        "mt.no_place": Quote("mt", "", "We perform full-weight finetuning."),
        "mt.no_words": Quote("mt", "§4", " … "),
        "cpt.wrong_paper": Quote("mt", "§4", "We perform full-weight finetuning."),
        "xx.unknown": Quote("xx", "§1", "words"),
    }
    assert paper_quotes.problems(bad) == [
        "mt.no_place: no section, table, figure or appendix in where=''",
        "mt.no_words: no words",
        "cpt.wrong_paper: the key does not start with its paper, 'mt'",
        "xx.unknown: paper 'xx' is none of ['cpt', 'mt']",
    ]


@pytest.mark.slow
def test_every_citation_names_an_entry(texts):
    unknown = [
        f"{name}: [q:{key}]"
        for name, text in texts.items()
        for key in paper_quotes.cited(text)
        if key not in QUOTES
    ]
    assert unknown == []


def test_a_citation_of_no_entry_is_found():
    text = "300 steps [q:mt.s4_finetune]; 2^18 steps [q:mt.s4_" + "2_18_steps]"
    assert [k for k in paper_quotes.cited(text) if k not in QUOTES] == ["mt.s4_2_18_steps"]
    with pytest.raises(KeyError, match="no paper quote 'mt.s4_2_18_steps'"):
        paper_quotes.cite("mt.s4_2_18_steps")


@pytest.mark.slow
def test_every_entry_is_cited(texts):
    # By a citation, or by its key as a string in code (a report that prints the quote).
    cited = {key for text in texts.values() for key in paper_quotes.cited(text)}
    code = "\n".join(t for name, t in texts.items() if name.endswith(".py"))
    cited |= {key for key in QUOTES if f'"{key}"' in code}
    assert sorted(set(QUOTES) - cited) == []


@pytest.mark.slow
def test_what_a_paper_says_is_quoted_where_it_is_said(texts):
    bare = []
    for name, text in texts.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if SAYS.search(line):
                near = "\n".join(lines[max(0, i - WINDOW) : i + WINDOW + 1])
                if not paper_quotes.cited(near):
                    bare.append(f"{name}:{i + 1}: {line.strip()}")
    assert bare == []


def test_cite_prints_the_paper_the_place_and_the_words():
    assert paper_quotes.cite("mt.s4_full_weight") == (
        'MT paper §4: "We perform full-weight finetuning."'
    )
    assert QUOTES["mt.s4_finetune"].fragments() == [QUOTES["mt.s4_finetune"].words]
    assert len(QUOTES["cpt.table1_bands"].fragments()) == 3
