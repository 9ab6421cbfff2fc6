"""`xlscale sweep plan|run|status`, through the real console entry point."""

import json
import time
from pathlib import Path

import pytest

from launch import sweep
from xlscale_cli.main import main


def test_plan_table_with_a_given_step_time(capsys):
    assert main(["sweep", "plan", "smoke", "--step-time", "0.5"]) == 0
    out = capsys.readouterr().out
    runs = sweep.expand(sweep.load_manifest("smoke"))
    assert out.startswith("# smoke: 15 runs")
    assert "--step-time 0.5s for source_smoke_d16_s0-" in out
    header = next(line for line in out.splitlines() if line.startswith("run id"))
    assert header.split() == [
        "run",
        "id",
        "N",
        "tokens",
        "FLOPs",
        "(6ND)",
        "steps",
        "batch",
        "est.",
        "time",
    ]
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if "_s0-" in line and not line.startswith("#")
    }
    assert set(rows) == {r.run_id for r in runs}
    smallest = next(r for r in runs if r.strategy == "source" and r.size == "smoke_d16")
    assert rows[smallest.run_id][-1] == "12s"  # 24 steps × 0.5 s
    assert rows[smallest.run_id][1:3] == [
        f"{smallest.counts.params_non_embedding:.3g}",
        f"{24 * 8 * 64:.3g}",
    ]
    assert "# total:" in out and "on this machine" in out


def test_plan_json_scales_the_step_time_by_flops(capsys):
    assert main(["sweep", "plan", "smoke", "--step-time", "2", "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    runs = {r.run_id: r for r in sweep.expand(sweep.load_manifest("smoke"))}
    small = min(runs.values(), key=lambda r: r.cost)
    big = max(runs.values(), key=lambda r: r.cost)
    assert rows[small.run_id]["estimated_s"] == 24 * 2
    assert rows[big.run_id]["estimated_s"] == 24 * 2 * big.cost / small.cost
    assert rows[big.run_id]["params_non_embedding"] == big.counts.params_non_embedding


def test_plan_measures_the_smallest_model(capsys):
    assert main(["sweep", "plan", "smoke", "--only", "source_smoke_d16*"]) == 0
    out = capsys.readouterr().out
    assert "# time estimates:" in out and "measured smoke_d16 on cpu" in out


def test_plan_of_the_paper_without_estimates(capsys):
    assert main(["sweep", "plan", "cpt_paper", "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# cpt_paper: 126 runs")
    assert "source_llama2_5534m_s0-" in out


def test_run_dry_run_with_the_tpu_launcher(capsys, tmp_path):
    args = [
        "sweep",
        "run",
        "smoke",
        "--runs-dir",
        str(tmp_path),
        "--dry-run",
        "--launcher",
        "tpu_vm",
    ]
    assert main([*args, "--tpu", "t", "--zone", "z"]) == 0
    out = capsys.readouterr().out
    assert "(dry run)" in out
    assert (
        sum(line.startswith("gcloud compute tpus tpu-vm ssh t") for line in out.splitlines()) == 15
    )
    assert not any(tmp_path.iterdir())
    assert main(args) == 2
    assert "--tpu NAME and --zone ZONE" in capsys.readouterr().err


def test_run_needs_the_variables(capsys, tmp_path):
    assert main(["sweep", "run", "smoke", "--runs-dir", str(tmp_path)]) == 2
    assert "DATA_DIR" in capsys.readouterr().err
    assert main(["sweep", "run", "smoke", "--var", "NOPE=1"]) == 2


def test_status_summarises_the_run_directories(capsys, tmp_path):
    runs = sweep.expand(sweep.load_manifest("smoke", runs_dir=str(tmp_path)))
    done, running = Path(runs[0].model_dir), Path(runs[1].model_dir)
    for directory in (done, running):
        directory.mkdir(parents=True)
        metrics = {"step": 12, "train/loss": 2.5, "eval/lm_en/loss": 2.75}
        (directory / "metrics.jsonl").write_text(json.dumps(metrics) + "\n")
    (done / "COMPLETED").write_text(json.dumps({"step": 24, "tokens": 1}))
    assert main(["sweep", "status", "smoke", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "# done 1, running 1, interrupted 0, failed 0, pending 13 (of 15)" in out
    line = next(line for line in out.splitlines() if line.startswith(runs[1].run_id))
    assert line.split()[1:] == ["running", "12/24", "2.5000", "lm_en=2.7500"]
    old = time.time() - 7200
    import os

    os.utime(running / "metrics.jsonl", (old, old))
    assert main(["sweep", "status", "smoke", "--runs-dir", str(tmp_path), "--json"]) == 0
    states = {s["run_id"]: s["state"] for s in json.loads(capsys.readouterr().out)}
    assert states[runs[0].run_id] == "done" and states[runs[1].run_id] == "interrupted"


@pytest.mark.slow
def test_plan_measures_the_step_of_either_family(capsys):
    # The estimate times one real step of the smallest run through the trainer's wrapper: a
    # decoder-only LLaMA2 for the CPT smoke study, an encoder-decoder T5 for the MT one.
    from launch import estimate

    for name, family in (("smoke", "llama2"), ("mt_smoke", "t5")):
        runs = sweep.expand(sweep.load_manifest(name))
        base = estimate.smallest(runs)
        assert base.family == family
        rate = estimate.measure(base, seq_len=16, steps=1)
        assert rate.flops_per_s > 0 and "measured" in rate.source


def test_plan_on_booked_hardware_prints_chip_hours(capsys):
    from launch import estimate

    assert main(["sweep", "plan", "cpt_paper", "--hardware", "v5p-128", "--mfu", "0.4"]) == 0
    out = capsys.readouterr().out
    assert "v5p-128: 64 chips x 459 TFLOP/s dense bf16 peak x 40% MFU" in out
    assert "chip-hours" in out.splitlines()[2] and "on v5p-128, one run after another" in out
    assert main(["sweep", "plan", "cpt_paper", "--hardware", "8xH100", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    runs = {r.run_id: r for r in sweep.expand(sweep.load_manifest("cpt_paper"))}
    for row in rows[:3]:
        seconds = runs[row["run_id"]].cost / (8 * 989e12 * 0.5)
        assert row["estimated_s"] == pytest.approx(seconds)
        assert row["chip_hours"] == pytest.approx(8 * seconds / 3600)
    assert estimate.parse_hardware("v5e-16").chips == 16
    for bad in ("v5p-3", "tpu-8", "0xH100"):
        assert main(["sweep", "plan", "smoke", "--hardware", bad]) == 2
        err = capsys.readouterr().err
        assert f"--hardware {bad!r}" in err and "8xH100" in err, err
    assert main(["sweep", "plan", "smoke", "--hardware", "v4-8", "--mfu", "1.5"]) == 2
    assert "--mfu 1.5" in capsys.readouterr().err
