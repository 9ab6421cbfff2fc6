"""benchmarks/gpu_preflight.py names every module a GPU run would miss, before the run."""

import importlib.util
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PATH = REPO / "benchmarks" / "gpu_preflight.py"


@pytest.fixture(scope="module")
def preflight():
    spec = importlib.util.spec_from_file_location("gpu_preflight", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_gpu_path_reaches_the_prepared_data_reader_and_finds_everything_here(preflight):
    # The trainer's prepared-data reader needs array_record, which a JAX GPU image may lack:
    # the walk must reach it through the GPU tests' imports of the trainer.
    looked_up = []
    missing, files, packages = preflight.missing_imports(
        preflight.gpu_entries(), find=lambda name: looked_up.append(name) or object()
    )
    assert missing == {}
    assert {"array_record", "jax", "flax", "optax", "orbax"} <= set(looked_up)
    assert "tensorflow" not in looked_up and "seqio" not in looked_up and "gin" not in looked_up
    assert packages == len(looked_up) and files > 10
    assert preflight.missing_imports(preflight.gpu_entries())[0] == {}


def test_every_missing_module_is_named_with_an_importer_and_optional_ones_are_not(
    preflight, tmp_path
):
    _write(
        tmp_path,
        {
            "tests/conftest.py": "import os\nfrom pkg import mod\n",
            "tests/test_gpu_thing.py": "import pytest\npytestmark = pytest.mark.gpu\n",
            "tests/test_cpu_thing.py": "import cpu_only_module\n",
            "benchmarks/accelerator_rows.py": "import helper\n",
            "benchmarks/helper.py": "import missing_two\n",
            "pkg/__init__.py": "",
            "pkg/mod.py": """
                from typing import TYPE_CHECKING
                from . import sub
                if TYPE_CHECKING:
                    import typed_only
                try:
                    import optional_one
                except ImportError:
                    optional_one = None

                def later():
                    import lazy_one
            """,
            "pkg/sub.py": "import missing_one.deeper\nimport numpy\n",
        },
    )
    entries = preflight.gpu_entries(tmp_path)
    assert [p.name for p in entries] == ["conftest.py", "test_gpu_thing.py", "accelerator_rows.py"]
    missing, files, _ = preflight.missing_imports(
        entries, root=tmp_path, find=lambda name: None if name.startswith("missing") else object()
    )
    assert {name: path.name for name, path in missing.items()} == {
        "missing_one": "sub.py",
        "missing_two": "helper.py",
    }
    assert files == 7  # the three entries, the helper, the package, mod and sub


def test_the_command_says_so_in_one_line_here():
    result = subprocess.run(
        [sys.executable, str(PATH)], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("preflight: all ") and result.stdout.count("\n") == 1
