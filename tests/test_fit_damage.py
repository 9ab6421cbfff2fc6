"""Damaged run directories never change what `xlscale fit` fits silently: each is warned of
(naming the run and file) and, where the damage allows, read as the undamaged run would be."""

import json
import logging
import struct

import numpy as np
import pytest
from fit_inputs import RUN_META

from fitting.readers import points, run_dirs
from rundir import records


def _rec(step: int, loss: float) -> dict:
    """One metrics.jsonl record of an evaluation at `step`."""
    return {"step": step, "tokens": step * 32, "flops": step * 32 * 6e8, "eval/lm_fr/loss": loss}


def _run(root, run_id: str, recs: list[dict], *, completed: bool = True):
    """A run directory in the trainer's format (run.json, metrics.jsonl, COMPLETED)."""
    return records.write_run(root / run_id, info=RUN_META, records=recs, completed=completed)


def _write_events(path, points_: list[tuple[int, str, float]]) -> None:
    """A TensorBoard event file of scalar summaries (step, tag, value) at `path`, in TFRecord
    framing (the reader does not check the CRCs, so they are left zero here)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for step, tag, value in points_:
            value_pb = summary_pb2.Summary.Value(tag=tag, simple_value=value)
            event = event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[value_pb]))
            data = event.SerializeToString()
            f.write(struct.pack("<Q", len(data)) + b"\0" * 4 + data + b"\0" * 4)


def test_duplicated_steps_keep_the_last_row_with_a_warning(tmp_path):
    rows = [_rec(10, 3.0), _rec(20, 2.5), _rec(10, 2.9), _rec(20, 2.4), _rec(30, 2.2)]
    _run(tmp_path, "dup", rows)
    scan = run_dirs.scan_runs(tmp_path)
    (run,) = scan.runs
    assert [r["step"] for r in run.records] == [10, 20, 30]
    np.testing.assert_allclose(points.curve(run).loss, [2.9, 2.4, 2.2])
    (warning,) = scan.warnings
    metrics = str(tmp_path / "dup" / "metrics.jsonl")
    assert "run 'dup'" in warning and metrics in warning
    assert "2 duplicated rows" in warning and "step 10, 20" in warning
    assert "last row of each step was kept" in warning


def test_a_run_without_completed_marker_is_fitted_with_a_warning(tmp_path, caplog):
    _run(tmp_path, "killed", [_rec(10, 3.0), _rec(20, 2.5)], completed=False)
    _run(tmp_path, "done", [_rec(10, 3.1), _rec(20, 2.6)])
    with caplog.at_level(logging.WARNING, logger=run_dirs.__name__):
        runs = run_dirs.read_runs(tmp_path)
    assert sorted(r.run_id for r in runs) == ["done", "killed"]
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("run 'killed'") and "no COMPLETED marker" in message
    assert "step 20" in message


def test_a_run_read_from_tensorboard_events_is_fitted_with_a_warning(tmp_path):
    run_dir = tmp_path / "tb_only"
    _write_events(
        run_dir / "tb" / "events.out.tfevents.1.host",
        [(100, "eval/lm_fr/loss", 3.5), (200, "eval/lm_fr/loss", 3.25)],
    )
    (run_dir / "run.json").write_text(json.dumps(RUN_META))
    records.write_completed(run_dir, step=200, tokens=200 * 32)
    scan = run_dirs.scan_runs(tmp_path)
    (run,) = scan.runs
    np.testing.assert_allclose(points.curve(run).loss, [3.5, 3.25])
    (warning,) = scan.warnings
    assert "run 'tb_only'" in warning and str(run_dir) in warning
    assert "no metrics.jsonl" in warning and "TensorBoard" in warning and "float32" in warning


def test_an_empty_run_json_skips_the_run_with_a_warning(tmp_path):
    _run(tmp_path, "good", [_rec(10, 3.0)])
    _run(tmp_path, "blank", [_rec(10, 3.0)])
    (tmp_path / "blank" / "run.json").write_bytes(b"")
    scan = run_dirs.scan_runs(tmp_path)
    assert [r.run_id for r in scan.runs] == ["good"]
    (warning,) = scan.warnings
    assert "run 'blank'" in warning and str(tmp_path / "blank" / "run.json") in warning
    assert "0 bytes" in warning and warning.endswith("skipped")
    with pytest.raises(run_dirs.EmptyRunFileError, match=r"run 'blank'.*0 bytes"):
        run_dirs.read_run(tmp_path / "blank")
