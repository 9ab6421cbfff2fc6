"""An adaptive sweep end to end with the local launcher on a tiny study: five tiny from-scratch
runs (French, the fixture corpora), trained one after another in this process while
`launch.adaptive_loop` refits the Chinchilla law on every new evaluation and skips or stops what
the law already knows; then `xlscale sweep status` and `xlscale sweep adaptive replay` on the log,
and `xlscale sweep run --adaptive` again, which finds nothing left to run. Then the same study
under the schedule-aware law (`--adaptive-law lr_area`), from a pilot fit of it, reusing the two
finished runs. Each run starts only once the sweep has polled the runs before it
(`adaptive_study.caught_up`), so what is skipped does not hang on how fast the trainer is."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from adaptive_study import caught_up, manifest_text
from launch_fakes import with_prepared_data

from launch import adaptive, adaptive_loop, launchers
from launch.sweep import expand, load_manifest
from rundir import names, stop_request
from xlscale_cli.main import main

# A pilot fit of the tiny study as `xlscale fit RUNS --law lr_area --lr-decay 0.8` writes it (the
# five runs above trained whole, rounded): the French from-scratch law, its λ, reference scales
# and residual RMS.
PILOT_FIT = {
    "params": dict(
        zip(
            ("E", "A", "alpha", "B", "beta", "C", "gamma"),
            (3e-16, 4.78, 0.123, 0.049, 3.0, 0.134, -0.218),
            strict=True,
        )
    ),
    "decay": 0.8,
    "n_ref": 2.94e4,
    "s_ref": 14.15,
    "rms": 0.029,
}
PILOT = {"n_basis": "exact", "lr_area": {"fr": {"from_scratch": {"fit": PILOT_FIT}}}}


def train_here(run, log_path) -> int:
    """The trainer's gin entry point in this process (its exit code: 0, 75 or 79)."""
    import gin

    from trainer import train

    gin.clear_config()
    # One of the test process's eight CPU devices: the subject is the adaptive loop, not sharding.
    return train.main([*run.gin_args(), "--gin.partitioning.MeshConfig.num_devices=1"])


@pytest.mark.slow
def test_adaptive_sweep_end_to_end_with_the_local_launcher(
    tiny_data, tiny_prepared, tmp_path, seqio_state, capsys, monkeypatch
):
    # The runs read prepared data (`tiny_prepared`): the subject is the adaptive loop, not seqio.
    path = tmp_path / "adaptive_tiny.toml"
    path.write_text(with_prepared_data(manifest_text(tmp_path / "runs")))
    variables = {
        "DATA_DIR": tiny_data["corpora"],
        "VOCAB_PATH": tiny_data["vocab"],
        "PREPARED_DATA": tiny_prepared,
    }
    manifest = load_manifest(str(path), variables=variables)
    runs = expand(manifest)
    ids = [r.run_id for r in runs]
    # Information per PFLOP/s-hour is never this high: once the law is identified, every run
    # left is dropped, on its prediction or its information.
    policy = adaptive.Policy(min_gain=1e12, tolerance=0.02)
    sweep = adaptive_loop.AdaptiveSweep.for_runs(runs, manifest.runs_dir, policy, bootstrap=20)
    launcher = launchers.LocalLauncher(runner=train_here, poll_s=0.5)
    caught_up(sweep, launcher, monkeypatch)
    saved = seqio_state.snapshot()
    try:
        (report,) = adaptive_loop.run(sweep, lambda: [launcher.launch(runs)], poll_s=0.3)
    finally:
        seqio_state.restore(saved)

    # The first two sizes run (the law needs three); what follows is skipped or stopped once
    # the third size's first evaluations identify the law (a run may finish before it notices).
    assert report.completed[:2] == ids[:2] and not report.failed
    dropped = set(report.stopped)
    assert dropped and dropped <= set(ids[2:]) and set(report.completed) | dropped == set(ids)
    by_id = {r.run_id: r for r in runs}
    for run_id in dropped:
        model_dir = by_id[run_id].model_dir
        assert stop_request.requested(model_dir)
        assert "adaptive" in stop_request.read(model_dir)["by"]
        assert not (tmp_path / "runs" / run_id / names.COMPLETED_FILE).exists()

    decisions = adaptive.read_lines(manifest.runs_dir, names.ADAPTIVE_DECISIONS_FILE)
    fits = adaptive.read_lines(manifest.runs_dir, names.ADAPTIVE_FITS_FILE)
    assert fits and all({"chip_hours", "params", "ci"} <= set(f) for f in fits)
    spent = [f["chip_hours"] for f in fits]
    assert spent == sorted(spent) and spent[-1] > 0
    assert fits[-1]["fitted"] == ["scratch"] and set(fits[-1]["ci"]) >= {"scratch.alpha"}
    drops = [d for d in decisions if d["decision"] != adaptive.RUN]
    assert {d["run_id"] for d in drops} >= dropped
    for d in drops:  # never before the fit is identifiable; the numbers behind each
        assert d["identifiable"] and d["fit"]["n_points"] > 0 and d["gain"] is not None
        assert d["decision"] == (adaptive.SKIP if d["status"] == "pending" else adaptive.STOP)
    early = [d for d in decisions if d["fit"]["params"] == fits[0]["params"]]
    assert early and all(d["decision"] == adaptive.RUN for d in early)
    assert adaptive.replay(manifest.runs_dir).ok
    print("\n".join(json.dumps(d) for d in drops[:2]))  # shown with -s

    cli = [str(path), *(f"--var={k}={v}" for k, v in variables.items())]
    capsys.readouterr()
    assert main(["sweep", "status", *cli]) == 0
    shown = capsys.readouterr().out
    assert "# adaptive (--min-gain 1e+12, --tolerance 0.02): spent" in shown
    assert "scratch.alpha = " in shown and f"{len(decisions)} logged" in shown
    # Each law's noise from its residuals by run: σ per evaluation, τ per run.
    assert re.search(
        r"#   noise scratch: sigma \S+% per evaluation, tau \S+% per run \(\d runs", shown
    )
    # The report section and plot: every refit's estimates and intervals against compute.
    assert main(["sweep", "status", *cli, f"--report={tmp_path / 'report'}"]) == 0
    section = (tmp_path / "report" / "adaptive.md").read_text()
    assert "scratch.alpha" in section and "adaptive.png" in section
    assert (tmp_path / "report" / "adaptive.png").stat().st_size > 10_000
    assert main(["sweep", "adaptive", "replay", *cli]) == 0
    assert "every decision reproduces" in capsys.readouterr().out
    # Run again: every run is done or stopped, so nothing starts and nothing fails.
    assert main(["sweep", "run", *cli, "--adaptive", "--min-gain=1e12", "--adaptive-poll=1"]) == 0
    again = capsys.readouterr()
    assert f"stop requested ({names.STOP_REQUEST_FILE})" in again.out + again.err

    # The schedule-aware law (`--adaptive-law lr_area --adaptive-prior PILOT`): the two finished
    # runs reused in another runs directory (a run keeps its id there), the third size trained
    # until the law, refitted on every evaluation at the pilot's λ and scales, knows the rest.
    lr_path = tmp_path / "adaptive_tiny_lr_area.toml"
    lr_path.write_text(with_prepared_data(manifest_text(tmp_path / "runs_lr_area")))
    lr_manifest = load_manifest(str(lr_path), variables=variables)
    lr_runs = expand(lr_manifest)
    assert [r.run_id for r in lr_runs] == ids
    for run in lr_runs[:2]:
        shutil.copytree(by_id[run.run_id].model_dir, run.model_dir)
    pilot = tmp_path / "pilot_fits.json"
    pilot.write_text(json.dumps(PILOT))
    lr_sweep = adaptive_loop.AdaptiveSweep.for_runs(
        lr_runs, lr_manifest.runs_dir, policy, bootstrap=20, law="lr_area", prior_path=str(pilot)
    )
    lr_launcher = launchers.LocalLauncher(runner=train_here, poll_s=0.5)
    caught_up(lr_sweep, lr_launcher, monkeypatch)
    saved = seqio_state.snapshot()
    try:
        (lr_report,) = adaptive_loop.run(
            lr_sweep, lambda: [lr_launcher.launch(lr_runs)], poll_s=0.3
        )
    finally:
        seqio_state.restore(saved)
    assert set(lr_report.skipped) >= set(ids[:2]) and not lr_report.failed
    lr_dropped = set(lr_report.stopped)
    assert lr_dropped and lr_dropped <= set(ids[2:])
    assert set(lr_report.completed) | lr_dropped | set(ids[:2]) == set(ids)
    assert adaptive.read_session(lr_manifest.runs_dir)["law"] == "lr_area"
    lr_fits = adaptive.read_lines(lr_manifest.runs_dir, names.ADAPTIVE_FITS_FILE)
    assert lr_fits[-1]["fitted"] == ["scratch"]
    assert set(lr_fits[-1]["params"]) == {f"scratch.{p}" for p in PILOT_FIT["params"]}
    assert "scratch.alpha" in lr_fits[-1]["ci"]
    lr_decisions = adaptive.read_lines(lr_manifest.runs_dir, names.ADAPTIVE_DECISIONS_FILE)
    lr_drops = [d for d in lr_decisions if d["decision"] != adaptive.RUN]
    assert {d["run_id"] for d in lr_drops} >= lr_dropped
    assert all(d["identifiable"] and d["fit"]["n_points"] > 0 for d in lr_drops)
    assert adaptive.replay(lr_manifest.runs_dir).ok
    lr_cli = [str(lr_path), *(f"--var={k}={v}" for k, v in variables.items())]
    capsys.readouterr()
    assert main(["sweep", "status", *lr_cli]) == 0
    shown = capsys.readouterr().out
    assert "--adaptive-law lr_area):" in shown and "scratch.gamma = " in shown
