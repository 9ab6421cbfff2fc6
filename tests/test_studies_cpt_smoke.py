"""The main job end to end at toy size: `xlscale demo --profile smoke` on the UDHR fixture."""

import json

import pytest


@pytest.mark.slow
def test_smoke_demo_end_to_end(tmp_path, monkeypatch, run_quietly):
    from studies.registry import run_demo

    monkeypatch.setenv("XLSCALE_DATA", str(tmp_path / "data"))
    out = tmp_path / "out"
    # The command as a user runs it; its terminal holds the project's lines only (62
    # third-party lines before, from TensorFlow's start-up, tf_text and orbax). One run at a time
    # (`--jobs 1`, in the command's own process): the suite's other worker has the other core,
    # and one process imports and compiles once (53 s of user CPU against 67 s two at a time).
    shown = run_quietly("demo", "--profile", "smoke", "--jobs", "1", "--out", out)
    assert "[demo] done in" in shown
    summary = json.loads((out / "demo.json").read_text())
    assert summary["runs"] == 15 and summary["runs_reused"] == 0
    report = (out / "report.md").read_text()
    assert "The demo against the CPT paper" in report
    fits = json.loads((out / "fits.json").read_text())
    for law in ("chinchilla", "cpt", "compute", "transfer", "replay"):
        assert law in fits, f"{law} missing from fits.json (skipped: {fits.get('skipped')})"
    assert fits["chinchilla"]["zh"]["fit"]["converged"]
    assert fits["cpt"]["zh"]["fit"]["converged"]
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"loss_compute_zh.png", "transfer_zh.png", "replay_zh.png"} <= set(pngs)
    # Zero-shot: the Fig. 3 and Fig. 6 analogues, from the runs' zero-shot JSON.
    assert {"zeroshot_by_strategy.png", "zeroshot_vs_replay.png"} <= set(pngs)
    assert "Zero-shot accuracy" in report and "Wilson" in report
    scored = sorted(p.parent.parent.name for p in out.glob("runs/*/zeroshot/*.json"))
    # source, scratch, CPT of the largest size; source, CPT and 3 replay runs of the replay size
    assert len(scored) == 8, scored
    # Re-running reuses every finished run (the launcher finds each completed and starts none:
    # counted, not timed) and refits.
    again = run_demo(profile="smoke", out_dir=out, log=lambda line: None)
    assert again["runs"] == again["runs_reused"] == 15
    assert json.loads((out / "fits.json").read_text())["cpt"]["zh"]["fit"]["converged"]
