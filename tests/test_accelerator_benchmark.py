"""benchmarks/accelerator_step.py runs on the CPU backend at its small shapes and reports sane
rows (the accelerator numbers themselves are measured on a GPU/TPU, never asserted here)."""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "accelerator_step.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("accelerator_step", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_packed_rows_hold_several_documents(bench):
    rng = np.random.default_rng(0)
    shape = bench.SHAPES[("t5", False)]
    batch = bench.synthetic_batch(rng, shape, vocab=512, packed=True)
    docs = batch["decoder_segment_ids"].max(axis=1)
    assert docs.min() >= 2 and batch["encoder_segment_ids"].max(axis=1).min() >= 2
    # Encoder and decoder rows pack the same examples.
    assert (docs == batch["encoder_segment_ids"].max(axis=1)).all()
    starts = batch["decoder_positions"] == 0
    assert (starts.sum(axis=1) == docs).all()


def test_peak_table(bench):
    assert bench.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert bench.peak_flops("cpu") is None


def test_cpu_run_prints_a_row_per_configuration(bench, capsys):
    rows = bench.main(["--remat", "none", "--packed", "both", "--steps", "1", "--no-hf"])
    assert [(r["model"], r["packed"]) for r in rows] == [
        ("llama2_tiny", False),
        ("llama2_tiny", True),
        ("t5_tiny", False),
        ("t5_tiny", True),
    ]
    for row in rows:
        assert row["step_ms"] > 0 and np.isfinite(row["loss"]) and row["mfu"] is None
        assert row["xla_bytes"] is None or row["xla_bytes"] > 0
    out = capsys.readouterr().out
    assert "MFU = with-attention model FLOPs" in out and "llama2_tiny" in out
