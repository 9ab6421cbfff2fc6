"""An adaptive sweep end to end with the local launcher on a tiny study: five tiny from-scratch
runs (French, the fixture corpora), trained one after another in this process while
`launch.adaptive_loop` refits the Chinchilla law on every new evaluation and skips or stops what
the law already knows; then `xlscale sweep status` and `xlscale sweep adaptive replay` on the log,
and `xlscale sweep run --adaptive` again, which finds nothing left to run."""

from __future__ import annotations

import json
import re

import pytest

from launch import adaptive, adaptive_loop, launchers
from launch.sweep import expand, load_manifest
from rundir import names, stop_request
from xlscale_cli.main import main

SIZES = {  # name -> (d_model, num_layers): 4k to 100k non-embedding parameters
    "a_d16": (16, 1),
    "b_d32": (32, 1),
    "c_d32x2": (32, 2),
    "d_d48x2": (48, 2),
    "e_d64x2": (64, 2),
}
MANIFEST = """
[sweep]
name = "adaptive_tiny"
description = "five tiny scratch runs (fr) for the adaptive sweep"
family = "llama2"
runs_dir = "RUNS_DIR"
seq_len = 64
gin_files = ["experiments/tiny.gin"]

[vars]
DATA_DIR = ""
VOCAB_PATH = ""

[gin]
DATA_DIR = "${DATA_DIR}"
VOCAB_PATH = "${VOCAB_PATH}"
MODEL_OVERRIDES = { vocab_size = 512, max_len = 128 }
SEQUENCE_LENGTH = 64
PEAK_LR = 3e-3
EVAL_PERIOD = 6
EVAL_MAX_TOKENS = 1024
LOG_EVERY = 3
CHECKPOINT_PERIOD = 12

[axes]
sizes = SIZE_NAMES
target_langs = ["fr"]
seeds = [0]

[[grid]]
strategies = ["scratch"]

[budget]
steps = 24
batch_size = 8
"""


def _manifest_text(runs_dir) -> str:
    text = MANIFEST.replace("RUNS_DIR", str(runs_dir))
    text = text.replace("SIZE_NAMES", json.dumps(list(SIZES)))
    for name, (width, layers) in SIZES.items():
        text += (
            f'\n[sizes.{name}]\nbase = "llama2_cpu_d64"\nd_model = {width}\n'
            f"d_ff = {4 * width}\nnum_heads = 2\nnum_layers = {layers}\n"
        )
    return text


def train_here(run, log_path) -> int:
    """The trainer's gin entry point in this process (its exit code: 0, 75 or 79)."""
    import gin

    from trainer import train

    gin.clear_config()
    return train.main(run.gin_args())


@pytest.mark.slow
def test_adaptive_sweep_end_to_end_with_the_local_launcher(
    tiny_data, tmp_path, seqio_state, capsys
):
    path = tmp_path / "adaptive_tiny.toml"
    path.write_text(_manifest_text(tmp_path / "runs"))
    variables = {"DATA_DIR": tiny_data["corpora"], "VOCAB_PATH": tiny_data["vocab"]}
    manifest = load_manifest(str(path), variables=variables)
    runs = expand(manifest)
    ids = [r.run_id for r in runs]
    # Information per PFLOP/s-hour is never this high: once the law is identified, every run
    # left is dropped, on its prediction or its information.
    policy = adaptive.Policy(min_gain=1e12, tolerance=0.02)
    sweep = adaptive_loop.AdaptiveSweep.for_runs(runs, manifest.runs_dir, policy, bootstrap=20)
    launcher = launchers.LocalLauncher(runner=train_here, poll_s=0.5)
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
    # Each law's noise from its residuals by run: σ per evaluation, τ per run (issue 37).
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
