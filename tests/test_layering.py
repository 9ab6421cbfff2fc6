"""Layers point down (DESIGN.md, Layout; STYLE.md 14): a package never imports one above it.

Layers, bottom to top: `modeling` (shared model pieces) < the model families `llama_jax`,
`t5_jax` (which never import each other) < `pipelines`, `fitting`, `trainer` < `launch`, `studies`
< `xlscale_cli`. Every import statement of every tracked module is read with `ast` (lazy imports
inside functions included), so a hidden upward import fails here rather than in a user's process.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Package -> the packages it must never import.
TOP = {"xlscale_cli"}
RUNNERS = {"launch", "studies"} | TOP
MIDDLE = {"trainer", "fitting", "pipelines", "evals"}
FORBIDDEN: dict[str, set[str]] = {
    "modeling": {"llama_jax", "t5_jax"} | MIDDLE | RUNNERS,
    "llama_jax": {"t5_jax"} | MIDDLE | RUNNERS,
    "t5_jax": {"llama_jax"} | MIDDLE | RUNNERS,
    "pipelines": {"trainer", "fitting", "evals"} | RUNNERS,
    "fitting": {"trainer", "evals"} | RUNNERS,
    "trainer": RUNNERS,
    "evals": RUNNERS,
    "launch": {"studies"} | TOP,
    "studies": TOP,
}


def imported_packages(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `path`, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(root: pathlib.Path) -> list[str]:
    """`file:line imports pkg` for every import that points up or across the model families."""
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, imported in imported_packages(path):
                if imported in forbidden:
                    bad.append(f"{path.relative_to(root)}:{line} imports {imported}")
    return bad


def test_no_package_imports_a_higher_layer():
    assert violations(ROOT) == []


def test_the_check_catches_an_upward_import(tmp_path):
    (tmp_path / "t5_jax").mkdir()
    (tmp_path / "t5_jax" / "predict.py").write_text(
        "def f():\n    from trainer import decoding\n    return decoding\n"
    )
    (tmp_path / "modeling").mkdir()
    (tmp_path / "modeling" / "ok.py").write_text("import jax\nfrom modeling import axes\n")
    assert violations(tmp_path) == ["t5_jax/predict.py:2 imports trainer"]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_every_layer_is_a_package_or_absent(package):
    # A renamed package would silently drop out of the check: each name is a real package or
    # (for layers not built yet) absent altogether, never a stray module.
    path = ROOT / package
    assert not path.with_suffix(".py").exists()
    if path.exists():
        assert (path / "__init__.py").exists()
