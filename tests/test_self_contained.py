"""The project speaks of itself alone, and its tests lean on fixtures, not on each other.

- No tracked file names a development issue, session or CI stop, or a design note that is not
  part of the repository: a reader has only the repository, so each such pointer leads nowhere.
  Conventions the code follows are written in `docs/conventions.md`.
- No test module imports another test module: shared fixtures live in `tests/conftest.py` and
  shared helpers in modules whose names do not start with `test_`, so that a test module can be
  run, moved or deleted alone.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What points outside the repository. Built from pieces so that this file does not match itself.
_OUTSIDE = re.compile(
    "|".join(
        [
            r"\b(?i:issue|session)s? #?\d+",  # a development issue or session
            r"(?<![A-Za-z])stop \d+\b",  # a CI stop (not the adaptive decision "STOP 1")
            r"\b(?:DESIGN|STYLE)" + r"\.md\b",  # design notes kept outside the project
            r"\.\./" + r"shared\b",
        ]
    )
)
# Binary or generated files where such text would not be ours.
_SKIPPED_SUFFIXES = {".png", ".model", ".vocab", ".json", ".gz", ".npz", ".arrayrecord"}


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e})")
    return [REPO / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_points_outside_the_repository():
    found = []
    for path in _tracked_files():
        if path.suffix in _SKIPPED_SUFFIXES or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if _OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_the_reference_pattern_finds_what_it_is_for():
    # Each example is built from pieces so that this file does not match itself.
    examples = ["(is" + "sue 36)", "Ses" + "sion 23", "CI, st" + "op 52", "DESIGN" + ".md"]
    for text in [*examples, "../" + "shared/x"]:
        assert _OUTSIDE.search(text), text
    for text in ("STOP 1", "stops at step 3", "the issues list", "a session's lease"):
        assert not _OUTSIDE.search(text), text


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            if node.module == "tests":
                names += [f"tests.{alias.name}" for alias in node.names]
    return names


def test_no_test_module_imports_another():
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for name in _imported_modules(path):
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("test_") and (name.startswith("tests.") or "." not in name):
                found.append(f"{path.relative_to(REPO)} imports {name}")
    assert not found, "test modules importing test modules:\n" + "\n".join(found)
