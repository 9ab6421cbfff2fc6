"""The sweep's zero-shot stage: the CPT manifests' `[zeroshot]` tables, the check that
makes it resumable, and each launcher running it after a run's training. The scoring itself
(`evals.score_run` through lm-eval on a trained run) is tested in test_zeroshot_harness.py."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path

import pytest

from evals import paper_tasks
from launch import launchers, slurm, status, sweep, tpu_vm, xm_launch, zeroshot_stage
from rundir import zeroshot

VARIABLES = {"DATA_DIR": "/data", "VOCAB_PATH": "/v.model"}


def expand(name: str, tmp_path=None):
    runs_dir = str(tmp_path / "runs") if tmp_path else None
    return sweep.expand(sweep.load_manifest(name, variables=VARIABLES, runs_dir=runs_dir))


def progress(runs):
    return status.Progress(runs, stream=io.StringIO())


def test_cpt_manifests_score_every_run_on_the_paper_benchmarks():
    assert zeroshot_stage.PAPER_LANGUAGES == tuple(paper_tasks.PAPER_TASKS)
    for name, targets in (("cpt_paper", ["zh"]), ("cpt_languages", ["fr", "ru"])):
        runs = expand(name)
        wanted = [t for lang in ("en", *targets) for t in paper_tasks.paper_tasks(lang)]
        assert {r.strategy for r in runs} == {"source", "scratch", "cpt"}
        for run in runs:  # the English source model too, in every target language
            assert run.zeroshot.tasks == tuple(wanted) and run.zeroshot.limit is None
    replay = expand("cpt_replay")  # its 30% arm: test_sweep_manifests.py
    assert all("hellaswag" in r.zeroshot.tasks and "xcopa_zh" in r.zeroshot.tasks for r in replay)
    # Other manifests have no stage.
    assert all(r.zeroshot is None for r in expand("smoke"))


@pytest.mark.parametrize(
    "table, message",
    [
        ({"tasks": "all"}, r"\[zeroshot\] tasks: 'all': choose one of 'paper', 'local'"),
        ({"task": "paper"}, r"\[zeroshot\]: unknown keys \['task'\]"),
        ({"languages": ["de"]}, r"\[zeroshot\] languages: \['de'\]: .*en, zh, fr, ru only"),
        ({"strategies": ["finetune"]}, r"\[zeroshot\] strategies: \['finetune'\]: choose among"),
        ({"limit": 0}, r"\[zeroshot\] limit: 0: give a whole number"),
        ({"batch_size": "8"}, r"\[zeroshot\] batch_size: '8'"),
        ({"tasks": "local"}, r"\[zeroshot\] local_dir: give it with tasks = \"local\""),
        ({"tasks": {"en": []}}, r"\[zeroshot\] tasks.en: \[\]: give a non-empty list"),
        ({"tasks": {"en": ["a"]}, "languages": ["zh"]}, r"languages: \['zh'\] have no list"),
    ],
)
def test_bad_zeroshot_tables_name_the_key_and_the_allowed_values(table, message):
    with pytest.raises(ValueError, match=message):
        zeroshot_stage.parse_stage(table, path="m.toml")


def test_a_table_of_tasks_and_languages():
    stage = zeroshot_stage.parse_stage(
        {"tasks": {"en": ["piqa"], "zh": ["xcopa_zh"]}, "strategies": ["cpt"], "limit": 50},
        path="m.toml",
    )
    spec = zeroshot_stage.score_spec(stage, "cpt", ["en", "zh"])
    assert spec == zeroshot_stage.ScoreSpec(("piqa", "xcopa_zh"), limit=50, batch_size=16)
    assert zeroshot_stage.score_spec(stage, "source", ["en"]) is None
    assert zeroshot_stage.score_args(spec, "/r") == [
        *("--model-dir", "/r", "--tasks", "piqa,xcopa_zh", "--batch-size", "16", "--limit", "50")
    ]


def _score(run, log_path=None) -> int:
    """Writes what `evals.score_run` writes for the run's tasks (its real run is in
    test_zeroshot_harness.py), so the launcher's bookkeeping is what is tested here."""
    rows = {t: {"acc_norm": 0.5, "n": 10, "limit": run.zeroshot.limit} for t in run.zeroshot.tasks}
    data = {"format": zeroshot.FORMAT, "step": run.steps, "tasks": rows}
    zeroshot.write_results_file(run.model_dir, data)
    return 0


def _train(run, log_path=None) -> int:
    Path(run.model_dir).mkdir(parents=True, exist_ok=True)
    (Path(run.model_dir) / "COMPLETED").write_text("{}")
    return 0


def test_local_launcher_scores_each_run_after_training_and_once(tmp_path):
    runs = expand("cpt_replay", tmp_path)
    order = []

    def train(run, log_path):
        order.append(("train", run.run_id))
        return _train(run)

    def score(run, log_path):
        order.append(("score", run.run_id))
        return _score(run) if "replay80" not in run.run_id else 3

    launcher = launchers.LocalLauncher(runner=train, scorer=score)
    report = launcher.launch(runs, progress=progress(runs))
    assert order == [(step, r.run_id) for r in runs for step in ("train", "score")]
    failed = [r.run_id for r in runs if "replay80" in r.run_id]
    assert report.score_failed == failed and not report.ok
    assert report.scored == [r.run_id for r in runs if r.run_id not in failed]
    # Again: nothing trains; only the run whose scoring failed is scored.
    order.clear()
    launcher.scorer = lambda run, log_path: _score(run)
    report = launcher.launch(runs, progress=progress(runs))
    assert report.skipped == [r.run_id for r in runs] and report.scored == failed and report.ok
    assert launcher.launch(runs, progress=progress(runs)).scored == []
    # A results file at another limit does not count: that run is scored again.
    data = json.loads(zeroshot.results_file(runs[0].model_dir, runs[0].steps).read_text())
    data["tasks"] = {t: {**row, "limit": 100} for t, row in data["tasks"].items()}
    zeroshot.write_results_file(runs[0].model_dir, data)
    assert launcher.launch(runs, progress=progress(runs)).scored == [runs[0].run_id]


def test_dry_runs_show_the_scoring_command_after_each_run(tmp_path):
    runs = expand("cpt_replay", tmp_path)
    local = launchers.LocalLauncher(python="py").launch(runs, dry_run=True, progress=progress(runs))
    assert len(local.commands) == 2 * len(runs)
    for run, train, score in zip(runs, local.commands[::2], local.commands[1::2], strict=True):
        assert "trainer.train" in train and run.model_dir in train
        assert shlex.split(score)[1:5] == ["-m", "evals.score_run", "--model-dir", run.model_dir]
    tpu = tpu_vm.TpuVmLauncher(tpu="t", zone="z").launch(
        runs, dry_run=True, progress=progress(runs)
    )
    assert len(tpu.commands) == 2 * len(runs)
    assert all("--worker=all" in c and "evals.score_run" in c for c in tpu.commands[1::2])
    plan = xm_launch.XManagerLauncher().plan(runs)
    assert f"zero-shot ({len(runs)} work units; each after its run's)" in plan
    units = [
        json.loads(line)
        for line in plan[plan.index(next(p for p in plan if "zero-shot" in p)) + 1 :]
    ]
    assert [u["work_unit"] for u in units] == [f"{r.run_id}.zeroshot" for r in runs]
    assert {u["module"] for u in units} == {"evals.score_run"}
    assert units[0]["args"][:2] == ["--model-dir", runs[0].model_dir]


def test_slurm_submits_a_scoring_job_after_each_training_job(tmp_path):
    runs = expand("cpt_replay", tmp_path)
    submitted = []

    def sbatch(argv):
        submitted.append(argv)
        return str(1000 + len(submitted))

    scripts = tmp_path / "s"
    launcher = slurm.SlurmLauncher(script_dir=str(scripts), submit=sbatch, queued=lambda: {})
    report = launcher.launch(runs, progress=progress(runs))
    jobs = {Path(a[-1]).stem: str(1001 + i) for i, a in enumerate(submitted)}
    for run in runs:
        name = f"{run.run_id}.zeroshot"
        argv = next(a for a in submitted if Path(a[-1]).stem == name)
        assert argv[2] == f"--dependency=afterok:{jobs[run.run_id]}"
        script = (scripts / f"{name}.sbatch").read_text()
        assert f"--job-name={name}" in script and "--nodes=1" in script
        assert "-m evals.score_run --model-dir" in script and "trainer.train" not in script
    assert report.submitted[len(runs) :] == [f"{r.run_id}.zeroshot" for r in runs]

    # Completed runs: scoring jobs only for the unscored, at once; none for one already queued.
    for run in runs:
        _train(run)
    _score(runs[0])
    submitted.clear()
    launcher.queued = lambda: {f"{runs[1].run_id}.zeroshot": "99"}
    report = launcher.launch(runs, progress=progress(runs))
    assert [Path(a[-1]).stem for a in submitted] == [f"{r.run_id}.zeroshot" for r in runs[2:]]
    assert all(len(a) == 3 for a in submitted)  # sbatch --parsable SCRIPT: no dependency


def test_sweep_status_counts_scored_and_unscored_runs(tmp_path, capsys):
    from xlscale_cli import main as cli

    runs = expand("cpt_replay", tmp_path)
    for run in runs[:3]:
        _train(run)
    _score(runs[0])
    args = ["sweep", "status", "cpt_replay", "--runs-dir", str(tmp_path / "runs")]
    args += ["--var", "DATA_DIR=/data", "--var", "VOCAB_PATH=/v.model", "--scheduler", "none"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"# zero-shot: scored 1, completed but unscored 2 (of {len(runs)} runs" in out
    args[1] = "plan"
    assert cli.main([*(a for a in args if a not in ("--scheduler", "none")), "--no-measure"]) == 0
    out = capsys.readouterr().out
    assert f"# [zeroshot]: {len(runs)} runs scored after training on 10 task(s) (global_piqa" in out


def test_tpu_vm_scores_each_run_on_the_workers_after_its_training(tmp_path):
    runs = expand("cpt_replay", tmp_path)
    by_dir = {r.model_dir: r for r in runs}
    calls = []

    def gcloud(argv, stdout, stderr):
        remote = shlex.split(argv[-1].split(" && ")[-1])
        if "evals.score_run" in remote:
            run = by_dir[remote[remote.index("--model-dir") + 1]]
            calls.append(("score", run.run_id))
            return _score(run)
        gin = dict(a[6:].split("=", 1) for a in remote if a.startswith("--gin."))
        run = by_dir[gin["MODEL_DIR"].strip("'")]
        calls.append(("train", run.run_id))
        return _train(run)

    launcher = tpu_vm.TpuVmLauncher(tpu="t", zone="z", call=gcloud, log_dir=str(tmp_path / "l"))
    report = launcher.launch(runs, progress=progress(runs))
    assert calls == [(step, r.run_id) for r in runs for step in ("train", "score")]
    assert report.scored == [r.run_id for r in runs] and report.ok
    calls.clear()
    assert launcher.launch(runs, progress=progress(runs)).scored == [] and calls == []


def test_the_scorer_refuses_a_run_that_is_not_completed(tmp_path, capsys):
    from evals import score_run

    (tmp_path / "run").mkdir()
    assert score_run.main(["--model-dir", str(tmp_path / "run"), "--tasks", "piqa"]) == 2
    assert "not completed (no COMPLETED): nothing to score" in capsys.readouterr().err
    with pytest.raises(ValueError, match="local:<lang> tasks need --include-path"):
        score_run.resolve_tasks(["local:en", "piqa"], str(tmp_path))
