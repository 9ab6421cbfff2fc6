"""Layers point down and no module imports back into a circle.

Every package has a layer (`LAYERS`), bottom to top: `rundir` (the run directory; imports nothing
of ours) < `modeling` (shared model pieces), `pipelines` (data, text metrics, COMET's caller) <
the model families `llama_jax`, `t5_jax` (which never import each other) < `trainer`, `convert`,
`fitting`, `evals` < `launch`, `studies` < `xlscale_cli`. Each import statement of every module
(lazy imports inside functions included, so a hidden upward import fails here rather than in a
user's process) is checked module by module: a module never imports a module of a higher layer,
nor across one of the forbidden pairs of a layer (`ACROSS`: e.g. `trainer` never imports
`evals`, which drives the trainer); a failure names the importing module, the imported one and
both layers.

Cycles: the module-level imports (statements run when a module is imported, not those inside
functions) of every module of the project's packages form a graph that must have no cycle; a cycle
makes the import order decide which module sees the other half-initialised.
"""

from __future__ import annotations

import ast
import collections
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Each package's layer, bottom (0) to top; a module may import modules of its own layer or lower
# ones, never of a higher layer (CLI -> studies, launch -> trainer, convert, fitting,
# evals -> models -> modeling, pipelines -> rundir). `t5x_configs` (gin files and the T5X
# environment's task registrations) sits with the data pipelines it registers.
LAYERS: dict[str, int] = {
    "rundir": 0,
    "modeling": 1,
    "pipelines": 1,
    "t5x_configs": 1,
    "llama_jax": 2,
    "t5_jax": 2,
    "trainer": 3,
    "convert": 3,
    "fitting": 3,
    "evals": 3,
    "launch": 4,
    "studies": 4,
    "xlscale_cli": 5,
}
# Imports across one layer that are forbidden too: the model families never import each other;
# shared model pieces do not import the data pipelines; conversion sits beside the trainer (the
# trainer may import it, never the reverse); fitting reads run directories only; the trainer never
# imports the evaluation harness (which drives the trainer); launchers never import studies.
ACROSS: frozenset[tuple[str, str]] = frozenset(
    {
        ("llama_jax", "t5_jax"),
        ("t5_jax", "llama_jax"),
        ("modeling", "pipelines"),
        ("convert", "trainer"),
        ("convert", "fitting"),
        ("convert", "evals"),
        ("fitting", "trainer"),
        ("fitting", "convert"),
        ("fitting", "evals"),
        ("trainer", "evals"),
        ("launch", "studies"),
    }
)
PACKAGES = set(LAYERS)


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path, *, module: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import of a project package in `path`, lazy ones included:
    `import a.b` gives `a.b`, `from a.b import c` gives `a.b.c` (a module or a name in `a.b`);
    relative imports are resolved against `module`."""
    found = []
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in PACKAGES]


def _allowed(importer: str, imported: str) -> bool:
    if importer == imported:
        return True
    if importer == "rundir":  # the bottom imports nothing of ours
        return False
    return LAYERS[imported] <= LAYERS[importer] and (importer, imported) not in ACROSS


def violations(root: pathlib.Path) -> list[str]:
    """`file:line: module (package, layer n) imports module (package, layer m)` for every import
    of a higher layer or across a forbidden pair (`ACROSS`)."""
    bad = []
    for package in sorted(LAYERS):
        for path in sorted((root / package).rglob("*.py")):
            module = _module_name(root, path)
            for line, name in imported_modules(path, module=module):
                target = name.split(".")[0]
                if not _allowed(package, target):
                    bad.append(
                        f"{path.relative_to(root)}:{line}: {module} ({package}, layer "
                        f"{LAYERS[package]}) imports {name} ({target}, layer {LAYERS[target]})"
                    )
    return bad


@pytest.mark.slow
def test_no_module_imports_a_higher_layer():
    assert violations(ROOT) == []


def test_the_check_catches_an_upward_import(tmp_path):
    def write(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    write("t5_jax/predict.py", "def f():\n    from trainer import decoding\n    return decoding\n")
    write("modeling/ok.py", "import jax\nfrom modeling import axes\nfrom rundir import names\n")
    write(
        "trainer/downstream.py", "from evals import comet_scoring\nfrom pipelines import metrics\n"
    )
    write("rundir/records.py", "from . import names\nfrom pipelines.names import mt_pair\n")
    assert violations(tmp_path) == [
        "rundir/records.py:2: rundir.records (rundir, layer 0) imports pipelines.names.mt_pair "
        "(pipelines, layer 1)",
        "t5_jax/predict.py:2: t5_jax.predict (t5_jax, layer 2) imports trainer.decoding "
        "(trainer, layer 3)",
        "trainer/downstream.py:1: trainer.downstream (trainer, layer 3) imports "
        "evals.comet_scoring (evals, layer 3)",
    ]


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_layer_is_a_package_or_absent(package):
    # A renamed package would silently drop out of the check: each name is a real package or
    # (for layers not built yet) absent altogether, never a stray module.
    path = ROOT / package
    assert not path.with_suffix(".py").exists()
    if path.exists():
        assert (path / "__init__.py").exists()


def test_every_top_level_package_has_a_layer():
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert found <= set(LAYERS), sorted(found - set(LAYERS))


# Inside `fitting`, subpackages point down too: its root modules (`fitting.checks`,
# `fitting.formats`: input errors and number formats every part shares) < `readers` (run
# directories in, fit inputs out) < `laws` (the laws and their fits) < `analyses` (what the fits
# say) < `design` (which runs a budget should buy, judged by the laws) < `reports` (what
# `xlscale fit` writes).
FITTING_LAYERS: dict[str, int] = {
    "": 0,
    "readers": 1,
    "laws": 2,
    "analyses": 3,
    "design": 4,
    "reports": 5,
}


def _fitting_layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FITTING_LAYERS else ""


def fitting_violations(root: pathlib.Path) -> list[str]:
    """`file:line: module (layer) imports module (layer)` for every import within `fitting` from
    a lower subpackage of `FITTING_LAYERS` to a higher one (lazy imports included)."""
    bad = []
    for path in sorted((root / "fitting").rglob("*.py")):
        module = _module_name(root, path)
        low = _fitting_layer(module)
        for line, name in imported_modules(path, module=module):
            high = _fitting_layer(name)
            if name.startswith("fitting.") and FITTING_LAYERS[high] > FITTING_LAYERS[low]:
                bad.append(
                    f"{path.relative_to(root)}:{line}: {module} ({low or 'fitting'}) imports "
                    f"{name} ({high})"
                )
    return bad


def test_fitting_subpackages_point_down():
    assert set(FITTING_LAYERS) - {""} == {
        p.parent.name for p in (ROOT / "fitting").glob("*/__init__.py")
    }
    assert fitting_violations(ROOT) == []


def test_the_fitting_check_catches_an_upward_import(tmp_path):
    def write(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    write("fitting/checks.py", "from fitting.readers import points\n")
    write("fitting/readers/points.py", "from fitting import checks\nfrom fitting.laws import fit\n")
    write("fitting/laws/fit.py", "def f():\n    from fitting.reports.plots import draw\n")
    write("fitting/reports/plots.py", "from fitting.analyses import transfer\n")
    assert fitting_violations(tmp_path) == [
        "fitting/checks.py:1: fitting.checks (fitting) imports fitting.readers.points (readers)",
        "fitting/laws/fit.py:2: fitting.laws.fit (laws) imports fitting.reports.plots.draw "
        "(reports)",
        "fitting/readers/points.py:2: fitting.readers.points (readers) imports "
        "fitting.laws.fit (laws)",
    ]


# --- module-level import cycles -----------------------------------------------------------


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(body: list[ast.stmt]):
    """The import statements that run when the module is imported: top-level ones, and those in
    top-level `if`/`try`/`with`/loops and class bodies; not those in functions, nor under
    `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _module_level_imports(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _module_level_imports(getattr(node, field, None) or [])


def _imported(node: ast.stmt, *, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The project modules one import statement runs: each dotted name's packages and module, and
    for `from pkg import name` the module `pkg.name` when it is one."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolve against this module's package
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for name in names:
        parts = name.split(".")
        found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules
    return found - {module}


def import_graph(root: pathlib.Path, *, lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports at module level (every import when `lazy`)."""
    paths = {
        _module_name(root, path): path
        for package in sorted(PACKAGES)
        for path in sorted((root / package).rglob("*.py"))
    }
    modules = set(paths)
    graph = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        nodes = (
            [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
            if lazy
            else _module_level_imports(tree.body)
        )
        is_package = path.name == "__init__.py"
        graph[module] = set().union(
            *(_imported(n, module=module, is_package=is_package, modules=modules) for n in nodes)
        )
    return graph


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components (Tarjan) with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """A shortest path `start -> ... -> start` inside one component (breadth first)."""
    parent: dict[str, str] = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(graph[node] & within):
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if succ not in parent:
                parent[succ] = node
                queue.append(succ)
    raise AssertionError(f"{start} is on no cycle")


def import_cycles(root: pathlib.Path, *, lazy: bool = False) -> list[str]:
    """Each import cycle as `a -> b -> a`: for every module on one, a shortest cycle through it
    (the same cycle is reported once, starting at its first module in sorted order)."""
    graph = import_graph(root, lazy=lazy)
    cycles = set()
    for component in _components(graph):
        for module in component:
            cycle = _shortest_cycle(graph, module, component)[:-1]
            first = cycle.index(min(cycle))
            cycle = cycle[first:] + cycle[:first]
            cycles.add(" -> ".join([*cycle, cycle[0]]))
    return sorted(cycles)


def test_no_module_level_import_cycle():
    assert import_cycles(ROOT) == []


def test_the_check_catches_an_import_cycle(tmp_path):
    def write(path: str, text: str) -> None:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)

    for package in ("trainer", "convert", "rundir"):
        write(f"{package}/__init__.py", '"""Nothing is imported here."""\n')
    # A module-level cycle, through `from pkg import module` and a top-level `try`.
    write("trainer/checkpoints.py", "import jax\nfrom convert import hf_checkpoints\n")
    write(
        "convert/hf_checkpoints.py",
        "try:\n    import trainer.checkpoints\nexcept ImportError:\n    pass\n",
    )
    # A cycle only through a function-level import, and one only for type checkers: no failure.
    write("convert/vocab.py", "from convert import grow\n")
    write("convert/grow.py", "def f():\n    from convert import vocab\n    return vocab\n")
    write(
        "rundir/names.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rundir import records\n",
    )
    write("rundir/records.py", "from rundir.names import RUN_FILE\n")

    assert import_cycles(tmp_path) == [
        "convert.hf_checkpoints -> trainer.checkpoints -> convert.hf_checkpoints"
    ]
    assert import_cycles(tmp_path, lazy=True) == [
        "convert.grow -> convert.vocab -> convert.grow",
        "convert.hf_checkpoints -> trainer.checkpoints -> convert.hf_checkpoints",
        "rundir.names -> rundir.records -> rundir.names",
    ]
