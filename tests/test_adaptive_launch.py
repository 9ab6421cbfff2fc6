"""Launchers and stop requests (`rundir.stop_request`): a run with a request is never started,
its dependents with requests of their own are dropped with it (without one they are blocked),
and a run that stops on its request is neither retried nor counted as failed."""

from __future__ import annotations

import pytest
from launch_fakes import MANIFEST, FakeTrainer, launch

from launch import sweep
from rundir import exits, stop_request


@pytest.fixture
def runs(tmp_path):
    """The unit sweep (`launch_fakes.MANIFEST`): sources, scratch and CPT runs of two sizes, one
    replay run."""
    path = tmp_path / "unit.toml"
    path.write_text(MANIFEST)
    return sweep.expand(sweep.load_manifest(path, runs_dir=str(tmp_path / "runs")))


def _source(runs, size):
    return next(r for r in runs if r.strategy == "source" and r.size == size)


def test_requested_runs_are_not_started_and_their_dependents_drop_or_block(runs):
    source_a = _source(runs, "a")
    dependents = [r for r in runs if r.depends_on == (source_a.run_id,)]
    assert len(dependents) == 2
    stop_request.request(source_a.model_dir, reason="SKIP: test")
    stop_request.request(dependents[0].model_dir, reason="SKIP: test")
    trainer = FakeTrainer()
    report, out = launch(runs, trainer)
    assert sorted(report.stopped) == sorted([source_a.run_id, dependents[0].run_id])
    assert report.blocked == [dependents[1].run_id] and not report.failed
    assert "stop requested (STOP_REQUESTED)" in out and "blocked by a stopped dependency" in out
    started = {run_id for run_id, _ in trainer.calls}
    assert started == {r.run_id for r in runs} - {source_a.run_id, *(d.run_id for d in dependents)}
    assert set(report.completed) == started


def _stops_on_request(run, log_path):
    """A trainer that sees its stop request at step 2: checkpoint, exit 79."""
    if run.strategy == "scratch":
        stop_request.request(run.model_dir, reason="STOP: test")
        return exits.STOPPED
    return FakeTrainer()(run, log_path)


def test_a_run_stopped_on_request_is_neither_retried_nor_failed(runs):
    report, out = launch(runs, _stops_on_request, retries=2)
    scratch = sorted(r.run_id for r in runs if r.strategy == "scratch")
    assert sorted(report.stopped) == scratch and not report.failed and report.ok
    assert out.count("stopped on request (STOP_REQUESTED") == len(scratch)  # once: no retry
    assert "FAILED" not in out
