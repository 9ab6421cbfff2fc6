"""Names, in one go, every module a GPU run would fail to import on this machine.

    python benchmarks/gpu_preflight.py        # exit 1 and one line per missing module

A lent GPU machine is a bare JAX image held for minutes. A module it lacks shows up as one
`ModuleNotFoundError` at a time, each costing a call. This reads (never imports) what the GPU
path imports when its modules load: `tests/conftest.py`, the test modules that hold GPU tests
(as `pytest -m gpu` collects them) and the accelerator benchmark's children, following this
repository's own modules through their module-level imports. Each third-party module found is
looked up with `importlib.util.find_spec`; the missing ones are printed with a file that imports
them. Imports inside functions, under `if TYPE_CHECKING:` or in a `try:` (an optional
dependency) are left out: they do not run when a module loads, or they may fail.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where this repository's modules are found: the checkout, and the folders the GPU path puts on
# sys.path itself (the benchmark's children import their neighbours; tests import helpers).
SEARCH = ("", "benchmarks", "tests")
GPU_MARK = "mark.gpu"


def gpu_entries(root: Path = ROOT) -> list[Path]:
    """The files a GPU run loads first: the test conftest, the test modules with GPU tests and
    the accelerator benchmark's children."""
    tests = root / "tests"
    entries = [tests / "conftest.py"]
    entries += sorted(p for p in tests.glob("test_*.py") if GPU_MARK in p.read_text("utf-8"))
    entries.append(root / "benchmarks" / "accelerator_rows.py")
    return [p for p in entries if p.exists()]


def _local_file(name: str, root: Path) -> Path | None:
    """The file of this repository's module `name` (dotted), or None if it is not ours."""
    parts = name.split(".")
    for base in SEARCH:
        folder = root / base if base else root
        for candidate in (
            folder.joinpath(*parts).with_suffix(".py"),
            folder.joinpath(*parts, "__init__.py"),
        ):
            if candidate.is_file():
                return candidate
    return None


def _loaded_statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a module body that run when it loads, descending into `if` and
    `with` blocks (not `if TYPE_CHECKING:`, not `try:`, not function or class bodies)."""
    for node in body:
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                continue
            yield from _loaded_statements(node.body)
            yield from _loaded_statements(node.orelse)
        elif isinstance(node, ast.With):
            yield from _loaded_statements(node.body)
        else:
            yield node


def _imported_names(path: Path, root: Path) -> Iterator[str]:
    """Dotted names that `path` imports when it loads (relative imports made absolute)."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    for node in _loaded_statements(tree.body):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base:
                yield base
                # `from package import module` loads the submodule too.
                yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def missing_imports(
    entries: Iterable[Path], root: Path = ROOT, find=importlib.util.find_spec
) -> tuple[dict[str, Path], int, int]:
    """Third-party top-level modules that the files `entries` load, transitively through this
    repository's modules, and that `find` cannot locate: name -> a file that imports it. Also
    returns how many of our files and how many third-party modules were read."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    seen: set[Path] = set()
    third_party: dict[str, Path] = {}
    queue = [Path(p).resolve() for p in entries]
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imported_names(path, root):
            parts = name.split(".")
            local = [_local_file(".".join(parts[: i + 1]), root) for i in range(len(parts))]
            if local[0] is not None:
                queue.extend(p for p in local if p is not None)
            elif parts[0] not in stdlib:
                third_party.setdefault(parts[0], path)
    missing = {name: path for name, path in sorted(third_party.items()) if find(name) is None}
    return missing, len(seen), len(third_party)


def main(argv: list[str] | None = None) -> int:
    """Prints one summary line, and one line per missing module; exit 1 if any is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    missing, files, packages = missing_imports(gpu_entries())
    if not missing:
        print(f"preflight: all {packages} third-party modules that {files} files load are here")
        return 0
    print(f"preflight: {len(missing)} of {packages} third-party modules are missing here:")
    for name, path in missing.items():
        print(f"  {name} (imported by {path.relative_to(ROOT)})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
