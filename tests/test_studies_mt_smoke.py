"""The translation study end to end at toy size: `xlscale demo --study mt --profile smoke`."""

import json

import pytest


@pytest.mark.slow
def test_mt_smoke_study_end_to_end(tmp_path, monkeypatch, optimized_xla, run_quietly):
    from studies.registry import run_demo

    monkeypatch.setenv("XLSCALE_DATA", str(tmp_path / "data"))
    out = tmp_path / "out"
    # The command as a user runs it, one run at a time (`--jobs 1`, in the command's own
    # process): the suite's other worker has the other core, and one process imports and
    # compiles once (84 s of user CPU against 108 s two at a time).
    shown = run_quietly("demo", "--study", "mt", "--profile", "smoke", "--jobs", "1", "--out", out)
    assert "[demo-mt] done in" in shown, shown
    summary = json.loads((out / "demo.json").read_text())
    assert summary["study"] == "mt" and summary["runs"] == 28 and summary["runs_reused"] == 0
    report = (out / "report.md").read_text()
    for heading in (
        "The study against the MT paper",
        "Valuation verdicts",
        "Fitted laws",
        "## Runs",
    ):
        assert heading in report, heading
    # Real runs beside the MT paper: every series a row saying why it is (not)
    # comparable, the paper's CE-vs-BLEU consistency, Remark 2 on the logged brevity penalty.
    for heading in (
        "## The MT paper beside these fits",
        "### Paper consistency",
        "**Brevity penalty (Remark 2",
    ):
        assert heading in report, heading
    fits = json.loads((out / "fits.json").read_text())
    assert fits["bleu"] and fits["ce"], fits.get("skipped")
    assert {e["metric"] for e in fits["bleu"]} <= {"bleu", "rouge_l", "comet"}  # no BLEU parts
    assert {e["task"] for e in fits["ce"]} == {"mt_en_fr"}
    assert {e["pretraining"] for e in fits["ce"]} == {"mix_en_50_fr_50", "mix_en_100"}
    verdicts = json.loads((out / "verdicts.json").read_text())
    assert len(verdicts) == 4  # (2 mixtures) x (2 Df)
    assert all(v["kind"] and v["explanation"] for v in verdicts)
    for png in ("mt_laws_mt_en_fr.png", "mt_bleu_vs_ce_mt_en_fr.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 28 and all((r / "COMPLETED").exists() for r in runs)
    # Re-running reuses every finished run (the launcher finds each completed and starts none,
    # so no run's metrics grow: counted, not timed) and refits.
    metrics = {r.name: (r / "metrics.jsonl").read_bytes() for r in runs}
    again = run_demo(study="mt", profile="smoke", out_dir=out, log=lambda line: None)
    assert again["runs_reused"] == 28
    assert {r.name: (r / "metrics.jsonl").read_bytes() for r in runs} == metrics
