"""The xmanager launcher for real: `xlscale sweep run --launcher xmanager --xm-executor local
--xm-packaging checkout` runs the tiny adaptive study (`test_adaptive_sweep`) as an xmanager
experiment on xmanager's own local executor, each work unit a process of this machine; a
completed run's zero-shot stage is a work unit too.

`make test` installs the local executor's imports off the venv's import path (`.venv/xmanager-local`,
pinned in `tests/xmanager_local_requirements.txt`) and names the folder in XLSCALE_XMANAGER_PATH;
this test puts it on the sweep's PYTHONPATH. xmanager keeps its experiments in
`~/.xmanager/experiments.sqlite3`: HOME is the test's own.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from adaptive_study import manifest_text
from conftest import fast_compile_flags
from launch_fakes import with_prepared_data

from evals import local_tasks
from launch import adaptive, status, sweep
from rundir import names, stop_request, zeroshot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XM_ENV = "XLSCALE_XMANAGER_PATH"
XM_PATH = os.environ.get(XM_ENV, "")
INJECT = Path(__file__).resolve().parent / "inject_faults.py"

pytestmark = pytest.mark.skipif(
    not os.path.isdir(os.path.join(XM_PATH, "xmanager")),
    reason=f"needs xmanager's local executor: `make test` installs it and sets {XM_ENV}",
)


def _sweep(
    manifest, variables, cwd, home, *extra: str, trainers_under: str | None = None
) -> subprocess.CompletedProcess:
    """`xlscale sweep run MANIFEST --var K=V ... --launcher xmanager ...` as a user runs it;
    with `trainers_under`, each training work unit runs under that `tests/inject_faults.py`
    fault."""
    env = dict(os.environ, HOME=str(home), JAX_PLATFORMS="cpu", XLA_FLAGS=fast_compile_flags())
    env["PYTHONPATH"] = os.pathsep.join([XM_PATH, REPO])
    env["XLSCALE_COMPILATION_CACHE"] = jax.config.jax_compilation_cache_dir or str(home / "xla")
    argv = [sys.executable, "-m", "xlscale_cli.main", "sweep", "run", str(manifest)]
    if trainers_under is not None:
        argv[1:3] = [str(INJECT), f"xm_units@{trainers_under}", "xlscale"]
    for key, value in variables.items():
        argv += ["--var", f"{key}={value}"]
    argv += ["--launcher", "xmanager", "--xm-executor", "local", "--xm-packaging", "checkout"]
    argv += ["--xm-accelerator", "cpu", "--xm-accelerator-count", "1", *extra]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _variables(tiny_data, tiny_prepared) -> dict[str, str]:
    """The `--var`s of a manifest `with_prepared_data`: its runs read `tiny_prepared` (the
    subject here is the launcher, not seqio: no tf.data pipeline in its work units)."""
    return {
        "DATA_DIR": tiny_data["corpora"],
        "VOCAB_PATH": tiny_data["vocab"],
        "PREPARED_DATA": tiny_prepared,
    }


@pytest.mark.slow
def test_an_adaptive_sweep_steers_xmanager_local_work_units(tiny_data, tiny_prepared, tmp_path):
    # The five scratch runs have no dependencies: one wave, five work units started at once. The
    # sweep polls their run directories and refits on every evaluation; once three sizes identify
    # the law it drops every run left, and each running unit finds its stop request, saves a
    # checkpoint and exits 79: xmanager sees a failed unit (and raises it again as the experiment
    # ends), the sweep a stopped run, and `sweep run` exits 0 with no traceback.
    # When is set by the sweep, not by how fast the trainers are: every training unit runs under
    # `inject_faults.held_for_the_sweep`. The two smallest runs train their 24 steps while the
    # three larger ones, started beside them, wait before their first metrics record: two sizes
    # complete, kept (two sizes cannot identify the law). Each larger run then waits after its
    # evaluation of step 12 until the sweep has decided about it: it is still training when the
    # law that drops it is identified, and stops at its next step.
    manifest = tmp_path / "adaptive_tiny.toml"
    manifest.write_text(with_prepared_data(manifest_text(tmp_path / "runs")))
    home = tmp_path / "home"
    home.mkdir()
    steer = ["--adaptive", "--min-gain=1e12", "--tolerance=0.02", "--adaptive-poll=1"]
    variables = _variables(tiny_data, tiny_prepared)
    runs = sweep.expand(sweep.load_manifest(manifest, variables=variables))
    kept = [r.run_id for r in runs[:2]]
    held = f"held_for_the_sweep@12:{','.join(kept)}"
    proc = _sweep(
        manifest, variables, tmp_path, home, *steer, "--adaptive-bootstrap=0", trainers_under=held
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out[-6000:]

    states = {r.run_id: status.run_status(r).state for r in runs}
    assert set(states.values()) <= {"done", "stopped"}, (states, out[-4000:])
    dropped = {k for k, state in states.items() if state == "stopped"}
    assert dropped, (states, out[-4000:])
    assert dropped == set(states) - set(kept), (states, out[-4000:])
    for run in runs:
        # Each unit's output is appended to its run's log, as the local launcher's.
        log = (tmp_path / "runs" / run.run_id / names.LOG_FILE).read_text()
        if run.run_id in dropped:
            assert "adaptive" in stop_request.read(run.model_dir)["by"]
            assert f"skip {run.run_id} (stopped on request" in out, out[-4000:]
            assert f"adaptive: STOP {run.run_id}" in out or f"adaptive: SKIP {run.run_id}" in out
            assert "stop requested" in log and "saving a checkpoint" in log, log[-2000:]
        else:
            assert status.is_completed(run) and f"step {run.steps}/{run.steps}" in log, log[-2000:]
    summary = out[out.index("xmanager experiment") :] if "xmanager experiment" in out else out
    assert f"completed {len(runs) - len(dropped)}," in out and "failed 0," in out, summary[-3000:]
    decisions = adaptive.read_lines(str(tmp_path / "runs"), names.ADAPTIVE_DECISIONS_FILE)
    assert {d["run_id"] for d in decisions if d["decision"] != adaptive.RUN} >= dropped
    assert adaptive.replay(str(tmp_path / "runs")).ok

    # Each decision is said once, not again at every later evaluation of a run that stops.
    for run_id in dropped:
        said = out.count(f"adaptive: STOP {run_id}:") + out.count(f"adaptive: SKIP {run_id}:")
        assert said == 1, out[-4000:]
    # xmanager's own record: the experiment, titled after the manifest, a work unit a run.
    with sqlite3.connect(home / ".xmanager" / "experiments.sqlite3") as db:
        ((experiment, title),) = db.execute(
            "SELECT experiment_id, experiment_title FROM experiment"
        )
        units = db.execute(
            "SELECT work_unit_id FROM work_unit WHERE experiment_id = ?", (experiment,)
        )
        assert title == "adaptive_tiny" and sorted(u for (u,) in units) == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_a_completed_run_is_scored_by_a_zero_shot_work_unit(tiny_data, tiny_prepared, tmp_path):
    # The smallest run of the tiny study, with a zero-shot stage on local tasks: a training unit,
    # then a scoring unit (`evals.score_run`) on its final checkpoint, whose output goes to the
    # run's log as the training's does. A second `sweep run` finds it trained and scored.
    tasks_dir = tmp_path / "zeroshot_tasks"
    local_tasks.write_local_tasks(
        Path(tiny_data["corpora"]), tasks_dir, langs=["en", "fr"], items=8
    )
    manifest = tmp_path / "adaptive_tiny.toml"
    text = manifest_text(tmp_path / "runs").replace("steps = 24", "steps = 6")
    manifest.write_text(
        with_prepared_data(text)
        + f'\n[zeroshot]\ntasks = "local"\nlocal_dir = "{tasks_dir}"\nlimit = 8\n'
    )
    variables = _variables(tiny_data, tiny_prepared)
    run = sweep.expand(sweep.load_manifest(manifest, variables=variables))[0]
    home = tmp_path / "home"
    home.mkdir()
    proc = _sweep(manifest, variables, tmp_path, home, "--only", run.run_id)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out[-6000:]
    assert "completed 1," in out and "zero-shot: scored 1, scoring failed 0" in out, out[-3000:]
    scored = json.loads(zeroshot.results_file(run.model_dir, run.steps).read_text())
    assert set(scored["tasks"]) == {"xl_cont_en", "xl_cont_fr", "xl_trans_fr"}, scored
    assert all(row["n"] > 0 and row["limit"] == 8 for row in scored["tasks"].values()), scored
    log = (tmp_path / "runs" / run.run_id / names.LOG_FILE).read_text()
    assert "step 6/6" in log and "xl_trans_fr" in log, log[-3000:]
    # Both units are xmanager's: one experiment, a training unit and a scoring unit.
    with sqlite3.connect(home / ".xmanager" / "experiments.sqlite3") as db:
        units = db.execute("SELECT work_unit_id FROM work_unit").fetchall()
        assert sorted(u for (u,) in units) == [1, 2]

    again = _sweep(manifest, variables, tmp_path, home, "--only", run.run_id)
    out = again.stdout + again.stderr
    assert again.returncode == 0 and f"skip {run.run_id} (completed)" in out, out[-3000:]
    assert "zero-shot: scored" not in out, out[-3000:]


@pytest.mark.slow
def test_failed_work_units_block_their_dependents_and_the_sweep_exits_1(tmp_path):
    # launch_fakes' unit manifest, which binds no vocabulary: wave 0's four source and scratch
    # units are refused at start (before anything is compiled), so wave 1's CPT units
    # never start. xmanager raises the failures again as the experiment ends; the sweep reports
    # each once and exits 1, without a traceback.
    from launch_fakes import MANIFEST

    manifest = tmp_path / "unit.toml"
    manifest.write_text(MANIFEST)
    home = tmp_path / "home"
    home.mkdir()
    missing = {"DATA_DIR": str(tmp_path / "no_data")}
    proc = _sweep(manifest, missing, tmp_path, home, "--runs-dir", str(tmp_path / "runs"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-6000:]
    assert "Traceback" not in out and "Multiple exceptions" not in out, out[-6000:]
    loaded = sweep.load_manifest(manifest, variables=missing, runs_dir=str(tmp_path / "runs"))
    runs = sweep.expand(loaded)
    first = [r for r in runs if not r.depends_on]
    later = [r for r in runs if r.depends_on]
    assert len(first) == 4 and later
    for run in first:
        assert f"FAILED {run.run_id} after " in out, out[-4000:]
        log = (tmp_path / "runs" / run.run_id / names.LOG_FILE).read_text()
        assert "required gin macro VOCAB_PATH is not set" in log, log
    for run in later:
        assert f"skip {run.run_id} (blocked by a failed dependency)" in out, out[-4000:]
        assert not (tmp_path / "runs" / run.run_id / names.LOG_FILE).exists()
    assert f"failed {len(first)}, blocked {len(later)}" in out, out[-2000:]
