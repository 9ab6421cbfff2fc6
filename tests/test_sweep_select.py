"""Grids over gin macros (learning rates) and the `[[select]]` stage: expansion, the choice from
run directories in the trainer's format, dependents starting from the chosen run, fits that
skip the runs not chosen, and clear errors for bad specs."""

import json
import logging
import textwrap
from pathlib import Path

import pytest

from fitting.readers import run_dirs as fit_io
from launch import run_selection, sweep
from launch.launchers import LocalLauncher
from xlscale_cli.main import main

MANIFEST = """
[sweep]
name = "lr"
seq_len = 64
runs_dir = "RUNS"
gin_files = ["experiments/tiny.gin"]

[axes]
sizes = ["llama2_cpu_d64"]
target_langs = ["zh"]

[[grid]]
strategies = ["source"]
gin_axes = { PEAK_LR = [0.001, 0.003, 0.01] }

[[grid]]
strategies = ["cpt", "scratch"]

[budget]
steps = 10
batch_size = 4

[[select]]
name = "source_lr"
strategy = "source"
over = ["PEAK_LR"]
metric = "eval/lm_en/loss"
rule = "min"
"""
# The eval loss each source learning rate reaches in the fake runs: 0.003 is best.
LOSS = {0.001: 3.2, 0.003: 2.9, 0.01: 3.5}


def load(tmp_path, text=MANIFEST):
    path = tmp_path / "lr.toml"
    path.write_text(textwrap.dedent(text))
    return sweep.load_manifest(path, runs_dir=str(tmp_path / "runs"))


def fake_train(run, log_path=None, *, loss=None):
    """Writes a finished run directory as the trainer does (run.json, metrics.jsonl,
    COMPLETED) whose final eval loss depends on its PEAK_LR coordinate."""
    directory = Path(run.model_dir)
    directory.mkdir(parents=True, exist_ok=True)
    bindings = dict(run.bindings)
    meta = {
        "model": run.size,
        "family": run.family,
        "strategy": run.strategy,
        "params_non_embedding": run.counts.params_non_embedding,
        "params_total": run.counts.params_total,
        "seed": 0,
        "init_checkpoint": bindings.get("INIT_CHECKPOINT"),
    }
    (directory / "run.json").write_text(json.dumps(meta))
    final = LOSS.get(run.coord("PEAK_LR"), 3.0) if loss is None else loss
    records = [
        {"step": 5, "tokens": 1280, "train/loss": 4.0, "eval/lm_en/loss": 9.0},
        {"step": run.steps, "tokens": 2560, "train/loss": final, "eval/lm_en/loss": final},
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (directory / "COMPLETED").write_text(json.dumps({"step": run.steps}))
    return 0


def by_strategy(runs):
    out = {}
    for r in runs:
        out.setdefault(r.strategy, []).append(r)
    return out


def test_a_gin_macro_grid_expands_into_named_runs(tmp_path):
    runs = by_strategy(sweep.expand(load(tmp_path)))
    assert {k: len(v) for k, v in runs.items()} == {"source": 3, "cpt": 1, "scratch": 1}
    lrs = {}
    for run in runs["source"]:
        lr = run.coord("PEAK_LR")
        lrs[lr] = run
        assert f"_peak_lr{lr:g}_" in run.run_id
        assert f"--gin.PEAK_LR={lr!r}" in run.argv()
    assert sorted(lrs) == [0.001, 0.003, 0.01]
    (cpt,) = runs["cpt"]
    assert cpt.waits_for_selection and cpt.selected_from.startswith("source_lr: ")
    assert sorted(cpt.depends_on) == sorted(r.run_id for r in runs["source"])
    with pytest.raises(ValueError, match="source_lr.*not chosen yet"):
        cpt.argv()
    assert any("INIT_CHECKPOINT" in a for a in cpt.argv(allow_missing=True))
    assert not runs["scratch"][0].depends_on


def test_selection_picks_the_best_run_and_dependents_start_from_it(tmp_path):
    manifest = load(tmp_path)
    runs = sweep.expand(manifest)
    sources = {r.coord("PEAK_LR"): r for r in runs if r.strategy == "source"}
    for run in sources.values():
        fake_train(run)
    document = run_selection.decide(manifest, runs)
    stage = document["selections"]["source_lr"]
    assert (stage["rule"], stage["metric"], stage["over"]) == (
        "min",
        "eval/lm_en/loss",
        ["PEAK_LR"],
    )
    (group,) = stage["groups"]
    decided = stage["groups"][group]
    assert decided["chosen"] == sources[0.003].run_id
    assert decided["value"] == 2.9 and decided["model_dir"] == sources[0.003].model_dir
    values = {c["coords"]["PEAK_LR"]: c["value"] for c in decided["candidates"]}
    assert values == LOSS
    run_selection.write(manifest.runs_dir, document)
    assert run_selection.read(manifest.runs_dir)["selections"]["source_lr"]["groups"] == {
        group: json.loads(json.dumps(decided))
    }
    again = sweep.expand(manifest, selection=run_selection.read(manifest.runs_dir))
    assert [r.run_id for r in again] == [r.run_id for r in runs]  # ids do not depend on the choice
    (cpt,) = [r for r in again if r.strategy == "cpt"]
    assert not cpt.waits_for_selection and cpt.depends_on == (sources[0.003].run_id,)
    assert f"--gin.INIT_CHECKPOINT='{sources[0.003].model_dir}'" in cpt.argv()


def test_max_rule_failed_and_pending_candidates(tmp_path):
    manifest = load(tmp_path, MANIFEST.replace('rule = "min"', 'rule = "max"'))
    runs = sweep.expand(manifest)
    sources = {r.coord("PEAK_LR"): r for r in runs if r.strategy == "source"}
    fake_train(sources[0.001])
    fake_train(sources[0.003])
    states = {sources[0.01].run_id: "running"}
    document = run_selection.decide(manifest, runs, status=lambda r: states.get(r.run_id, "done"))
    stage = document["selections"]["source_lr"]
    assert not stage["groups"] and list(stage["pending"].values()) == [[sources[0.01].run_id]]
    states[sources[0.01].run_id] = "failed"  # e.g. diverged: it loses, whatever the rule
    stage = run_selection.decide(manifest, runs, status=lambda r: states.get(r.run_id, "done"))[
        "selections"
    ]["source_lr"]
    (decided,) = stage["groups"].values()
    assert decided["chosen"] == sources[0.001].run_id  # max of 3.2 and 2.9
    for run in sources.values():
        fake_train(run, loss=float("nan"))
    stage = run_selection.decide(manifest, runs)["selections"]["source_lr"]
    assert not stage["groups"] and "no candidate has a finite" in next(
        iter(stage["failed"].values())
    )


def diverging_train(run, log_path=None):
    """`fake_train`, except that the largest learning rate diverges (the job fails)."""
    if run.coord("PEAK_LR") == 0.01:
        raise FloatingPointError("loss is nan")
    return fake_train(run, log_path)


def test_a_sweep_runs_in_stages_and_fits_skip_the_runs_not_chosen(tmp_path, caplog):
    manifest = load(tmp_path)
    reports, waiting = run_selection.launch_in_stages(
        manifest, LocalLauncher(runner=diverging_train), note=lambda _: None
    )
    runs = sweep.expand(manifest, selection=run_selection.read(manifest.runs_dir))
    best = next(r for r in runs if r.strategy == "source" and r.coord("PEAK_LR") == 0.003)
    diverged = next(r for r in runs if r.strategy == "source" and r.coord("PEAK_LR") == 0.01)
    (cpt,) = [r for r in runs if r.strategy == "cpt"]
    assert not waiting and len(reports) == 2
    assert reports[0].failed == [diverged.run_id] and not reports[1].failed  # not retried
    assert reports[1].completed == [cpt.run_id]
    (decided,) = run_selection.read(manifest.runs_dir)["selections"]["source_lr"]["groups"].values()
    states = {c["run_id"]: (c["state"], c["value"]) for c in decided["candidates"]}
    assert states[diverged.run_id] == ("failed", None) and decided["chosen"] == best.run_id
    meta = json.loads((tmp_path / "runs" / cpt.run_id / "run.json").read_text())
    assert meta["init_checkpoint"] == repr(best.model_dir)
    with caplog.at_level(logging.INFO, logger="fitting.readers.run_dirs"):
        read = {r.run_id for r in fit_io.read_runs(tmp_path / "runs")}
    assert read == {best.run_id, cpt.run_id, *(r.run_id for r in runs if r.strategy == "scratch")}
    assert "skipping 1 runs that selection.json did not choose" in caplog.text
    assert len(fit_io.read_runs(tmp_path / "runs", use_selection=False)) == 4


def test_cli_select_and_plan(tmp_path, capsys):
    manifest = load(tmp_path)
    for run in sweep.expand(manifest):
        if run.strategy == "source":
            fake_train(run)
    path = str(tmp_path / "lr.toml")
    runs_dir = manifest.runs_dir
    assert main(["sweep", "plan", path, "--runs-dir", runs_dir, "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert "# grid over PEAK_LR = [0.001, 0.003, 0.01] (source; grid 0)" in out
    assert "# [[select]] source_lr: min eval/lm_en/loss over ['PEAK_LR'] of source runs" in out
    assert "1 runs wait for its choices" in out
    assert main(["sweep", "select", path, "--runs-dir", runs_dir]) == 0
    out = capsys.readouterr().out
    assert "selection.json" in out and "0.003=2.9" in out
    assert (tmp_path / "runs" / "selection.json").is_file()
    assert main(["sweep", "plan", path, "--runs-dir", runs_dir, "--no-measure"]) == 0
    assert "wait for its choices" not in capsys.readouterr().out
    assert main(["sweep", "status", path, "--runs-dir", runs_dir]) == 0
    assert "# [[select]] source_lr: 1 groups chosen" in capsys.readouterr().out


@pytest.mark.parametrize(
    "change, message",
    [
        (("PEAK_LR = [0.001, 0.003, 0.01]", "PEAK_LR = 0.001"), "non-empty list"),
        (("PEAK_LR = [0.001, 0.003, 0.01]", "PEAK_LR = [0.001, 0.001]"), "repeats a value"),
        (("{ PEAK_LR =", "{ TRAIN_STEPS ="), "TRAIN_STEPS is set by the sweep"),
        (("{ PEAK_LR =", "{ PEAK_RL ="), "PEAK_RL"),
        (('rule = "min"', 'rule = "best"'), r"rule 'best': choose one of \['min', 'max'\]"),
        (('over = ["PEAK_LR"]', 'over = ["LR"]'), r"over \['LR'\]: not coordinates of source"),
        (('strategy = "source"\nover', 'strategy = "cpt_replay"\nover'), "has no runs"),
        (('rule = "min"', 'rule = "min"\nby = 1'), r"unknown keys \['by'\]"),
        (('rule = "min"', 'rule = "min"\nwhere = { lang = "zh" }'), r"where \['lang'\]: not coord"),
        (('metric = "eval/lm_en/loss"\n', ""), "missing 'metric'"),
        (("eval/lm_en/loss", "eval/{task}/loss"), r"names \['task'\], not coordinates of source"),
    ],
)
def test_bad_grid_or_select_specs_name_the_manifest_and_key(tmp_path, change, message):
    text = MANIFEST.replace(*change)
    assert text != MANIFEST
    with pytest.raises(ValueError, match=message) as raised:
        sweep.expand(load(tmp_path, text))
    assert "lr.toml" in str(raised.value)


def test_a_dependent_of_a_grid_needs_a_select(tmp_path):
    text = MANIFEST[: MANIFEST.index("[[select]]")]
    with pytest.raises(ValueError, match=r"vary over \['PEAK_LR'\]; add a \[\[select\]\]"):
        sweep.expand(load(tmp_path, text))


def test_at_best_compares_each_candidate_at_its_best_evaluated_step(tmp_path):
    # A small finetuning set overfits: 0.01 reaches the lowest loss mid-run (1.9 at step 4) but
    # ends worst; "last" picks 0.003 (2.9 at the end), "best" picks 0.01 and records its step.
    best_text = MANIFEST.replace('rule = "min"\n', 'rule = "min"\nat = "best"\n')
    manifest, last = load(tmp_path, best_text), load(tmp_path)
    runs = sweep.expand(manifest)
    sources = {r.coord("PEAK_LR"): r for r in runs if r.strategy == "source"}
    dips = {0.001: 3.1, 0.003: 2.95, 0.01: 1.9}
    for lr, run in sources.items():
        fake_train(run)
        path = Path(run.model_dir) / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows[1:1] = [
            {"step": 0, "eval/lm_en/loss": 0.5},  # before finetuning: never the choice
            {"step": 4, "eval/lm_en/loss": dips[lr]},
            {"step": 7, "eval/lm_en/loss": float("nan")},
        ]
        path.write_text(
            "".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["step"]))
        )
    (Path(sources[0.01].model_dir) / "checkpoints" / "4").mkdir(parents=True)
    chosen = run_selection.decide(last, runs)["selections"]["source_lr"]["groups"]
    assert [g["chosen"] for g in chosen.values()] == [sources[0.003].run_id]
    stage = run_selection.decide(manifest, runs)["selections"]["source_lr"]
    (group,) = stage["groups"].values()
    assert stage["at"] == "best" and group["chosen"] == sources[0.01].run_id
    assert (group["value"], group["step"]) == (1.9, 4)
    record = json.loads((Path(sources[0.01].model_dir) / "best_checkpoint.json").read_text())
    assert record == {
        "metric": "eval/lm_en/loss",
        "rule": "min",
        "step": 4,
        "value": 1.9,
        "last_step": 10,
        "last_value": 3.5,
        "evaluations": 5,
        "checkpoint": f"{sources[0.01].model_dir}/checkpoints/4",
        "kept": True,
    }
    other = json.loads((Path(sources[0.001].model_dir) / "best_checkpoint.json").read_text())
    assert (other["step"], other["value"], other["kept"]) == (4, 3.1, False)
    with pytest.raises(ValueError, match=r"\[\[select\]\] 0.*at 'middle': choose one of"):
        load(tmp_path, MANIFEST.replace('rule = "min"\n', 'rule = "min"\nat = "middle"\n'))
