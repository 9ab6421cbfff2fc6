"""The xmanager launcher for real: `xlscale sweep run --launcher xmanager --xm-executor local
--xm-packaging checkout` runs the tiny adaptive study (`test_adaptive_sweep`) as an xmanager
experiment on xmanager's own local executor, each work unit a process of this machine.

`make test` installs the local executor's imports off the venv's import path (`.venv/xmanager-local`,
pinned in `tests/xmanager_local_requirements.txt`) and names the folder in XLSCALE_XMANAGER_PATH;
this test puts it on the sweep's PYTHONPATH. xmanager keeps its experiments in
`~/.xmanager/experiments.sqlite3`: HOME is the test's own.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import jax
import pytest
from test_adaptive_sweep import _manifest_text

from launch import adaptive, status, sweep
from rundir import names, stop_request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XM_ENV = "XLSCALE_XMANAGER_PATH"
XM_PATH = os.environ.get(XM_ENV, "")

pytestmark = pytest.mark.skipif(
    not os.path.isdir(os.path.join(XM_PATH, "xmanager")),
    reason=f"needs xmanager's local executor: `make test` installs it and sets {XM_ENV}",
)


def _sweep(manifest, tiny_data, cwd, home, *extra: str) -> subprocess.CompletedProcess:
    """`xlscale sweep run MANIFEST --launcher xmanager ...` as a user runs it."""
    env = dict(os.environ, HOME=str(home), JAX_PLATFORMS="cpu", XLA_FLAGS="")
    env["PYTHONPATH"] = os.pathsep.join([XM_PATH, REPO])
    env["XLSCALE_COMPILATION_CACHE"] = jax.config.jax_compilation_cache_dir or str(home / "xla")
    argv = [sys.executable, "-m", "xlscale_cli.main", "sweep", "run", str(manifest)]
    argv += ["--var", f"DATA_DIR={tiny_data['corpora']}"]
    argv += ["--var", f"VOCAB_PATH={tiny_data['vocab']}"]
    argv += ["--launcher", "xmanager", "--xm-executor", "local", "--xm-packaging", "checkout"]
    argv += ["--xm-accelerator", "cpu", "--xm-accelerator-count", "1", *extra]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_an_adaptive_sweep_steers_xmanager_local_work_units(tiny_data, tmp_path):
    # The five scratch runs have no dependencies: one wave, five work units started at once. The
    # sweep polls their run directories and refits on every evaluation; once three sizes identify
    # the law it drops every run left, and each running unit finds its stop request, saves a
    # checkpoint and exits 79: xmanager sees a failed unit (and raises it again as the experiment
    # ends), the sweep a stopped run, and `sweep run` exits 0 with no traceback.
    manifest = tmp_path / "adaptive_tiny.toml"
    # 600 steps: the runs are still training when the law is identified (a refit, not a step
    # count, sets when; a stopped run has spent only its first evaluations).
    manifest.write_text(_manifest_text(tmp_path / "runs").replace("steps = 24", "steps = 600"))
    home = tmp_path / "home"
    home.mkdir()
    steer = ["--adaptive", "--min-gain=1e12", "--tolerance=0.02", "--adaptive-poll=1"]
    proc = _sweep(manifest, tiny_data, tmp_path, home, *steer, "--adaptive-bootstrap=0")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out[-6000:]

    variables = {"DATA_DIR": tiny_data["corpora"], "VOCAB_PATH": tiny_data["vocab"]}
    runs = sweep.expand(sweep.load_manifest(manifest, variables=variables))
    states = {r.run_id: status.run_status(r).state for r in runs}
    assert set(states.values()) <= {"done", "stopped"}, (states, out[-4000:])
    dropped = {k for k, state in states.items() if state == "stopped"}
    assert dropped, (states, out[-4000:])
    for run in runs:
        # Each unit's output is appended to its run's log, as the local launcher's.
        log = (tmp_path / "runs" / run.run_id / names.LOG_FILE).read_text()
        if run.run_id in dropped:
            assert "adaptive" in stop_request.read(run.model_dir)["by"]
            assert f"skip {run.run_id} (stopped on request" in out, out[-4000:]
            assert f"adaptive: STOP {run.run_id}" in out or f"adaptive: SKIP {run.run_id}" in out
            assert "stop requested" in log and "saving a checkpoint" in log, log[-2000:]
        else:
            assert status.is_completed(run) and "step 600/600" in log, log[-2000:]
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
