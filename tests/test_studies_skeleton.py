"""The studies' skeleton: one failure rule, the stages called in order, the summary written."""

import json
import types

import pytest

from launch.launchers import LaunchReport
from studies import skeleton


def _study(monkeypatch, tmp_path, report: LaunchReport):
    """Stages that record their calls, a two-run sweep and a launcher answering `report`."""
    calls = []
    runs = [types.SimpleNamespace(run_id=f"r{i}", strategy="pretrain") for i in range(2)]
    manifest = types.SimpleNamespace(name="fake")
    monkeypatch.setattr(skeleton, "study_runs", lambda *a: (manifest, runs))
    launcher = types.SimpleNamespace(launch=lambda rs, progress: calls.append("train") or report)
    monkeypatch.setattr(skeleton, "training_launcher", lambda jobs, log: launcher)
    monkeypatch.setattr(skeleton, "Progress", lambda runs: None)
    stages = skeleton.Stages(
        study="fake",
        tag="demo-fake",
        manifest="fake",
        corpora=lambda out, data: calls.append("corpora") or tmp_path / "corpora",
        vocabulary=lambda corpora, out: calls.append("vocab") or tmp_path / "v.model",
        report=lambda runs_dir, out: calls.append("report") or out / "fits.json",
        check_runs=lambda rs, vocab: calls.append("check"),
    )
    return stages, calls


@pytest.mark.parametrize(
    "report", [LaunchReport(failed=["r0"]), LaunchReport(completed=["r0"], blocked=["r1"])]
)
def test_a_failed_or_blocked_run_stops_the_study_before_fitting(monkeypatch, tmp_path, report):
    stages, calls = _study(monkeypatch, tmp_path, report)
    with pytest.raises(RuntimeError, match=r"\[demo-fake\] 1 run\(s\) failed or were blocked"):
        skeleton.run_study(
            stages, profile="p", description="d", out_dir=tmp_path / "out", log=lambda s: None
        )
    assert calls == ["corpora", "vocab", "check", "train"]
    assert not (tmp_path / "out" / "demo.json").exists()


def test_stages_run_in_order_and_the_summary_is_written(monkeypatch, tmp_path):
    report = LaunchReport(completed=["r1"], skipped=["r0"])
    stages, calls = _study(monkeypatch, tmp_path, report)
    summary = skeleton.run_study(
        stages, profile="p", description="d", out_dir=tmp_path / "out", log=lambda s: None
    )
    assert calls == ["corpora", "vocab", "check", "train", "report"]
    assert summary["study"] == "fake" and summary["runs"] == 2 and summary["runs_reused"] == 1
    assert json.loads((tmp_path / "out" / "demo.json").read_text()) == summary
