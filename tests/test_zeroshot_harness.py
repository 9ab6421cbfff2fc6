"""The `xlscale` lm-evaluation-harness model: its log-likelihoods are the trainer's eval
loss, its accuracies are lm-eval's from those log-likelihoods, the context/continuation boundary
is lm-eval's, and the results round-trip into `fitting`.

One module-scoped 4-step `llama2_tiny` run (trained on the 2x2x2 mesh of 8 host devices) serves
every test; the scorer restores it with the trainer's shardings over all 8 devices.
"""

from __future__ import annotations

import io
import json
import math

import jax
import numpy as np
import pytest
from tiny_runs import tiny_kwargs

pytest.importorskip("lm_eval")

from evals import harness, results, scorer  # noqa: E402
from fitting.readers import run_dirs as fit_io  # noqa: E402
from rundir import zeroshot as zeroshot_lib  # noqa: E402
from trainer import checkpoints, jobs  # noqa: E402
from trainer import data as data_lib  # noqa: E402
from trainer import eval as eval_lib  # noqa: E402
from trainer import train as train_lib  # noqa: E402
from trainer.checkpoints import CheckpointConfig  # noqa: E402
from trainer.data import EvalConfig  # noqa: E402
from trainer.partitioning import MeshConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("compilation_cache")

STEPS = 4


@pytest.fixture(scope="module")
def run_dir(tiny_data, tmp_path_factory, seqio_state):
    saved = seqio_state.snapshot()
    model_dir = tmp_path_factory.mktemp("zeroshot") / "source_en"
    try:
        result = train_lib.train(
            model_dir=model_dir,
            **tiny_kwargs(
                tiny_data,
                train_steps=STEPS,
                checkpoint=CheckpointConfig(period=2, keep_last=10),
                evaluation=EvalConfig(),
            ),
        )
    finally:
        seqio_state.restore(saved)
    assert result.completed
    return model_dir


@pytest.fixture(scope="module")
def lm(run_dir):
    return harness.XlscaleLM(model_dir=str(run_dir), batch_size=8)


class Req:
    """lm-eval's `Instance` as the model sees it (only `.args` is read)."""

    def __init__(self, *args):
        self.args = args


@pytest.mark.slow
def test_scores_equal_the_trainers_eval_loss(run_dir, lm, tiny_data, seqio_state):
    # The trainer's own packed eval rows of lm_en: each segment is one document (or a piece of
    # one) starting at position 0; scoring each alone must give the trainer's eval loss.
    saved = seqio_state.snapshot()
    try:
        kwargs = tiny_kwargs(tiny_data, mesh=MeshConfig(num_devices=1))
        evaluation = EvalConfig(tasks=("lm_en",), max_tokens=384)
        job = jobs.build_job(
            model=kwargs["model"],
            data=kwargs["data"],
            evaluation=evaluation,
            optimizer=train_lib.OptimizerConfig(),
            schedule=kwargs["schedule"],
            mesh=MeshConfig(num_devices=1),
            train_steps=1,
            compile_train=False,
        )
        params, _, _ = checkpoints.restore_init_params(
            str(run_dir), abstract_params=job.abstract_state_with_shardings().params
        )
        trainer_loss = eval_lib.evaluate_params(job, params, evaluation, seq_len=64)
        batches = list(
            data_lib.eval_batches(
                task="lm_en",
                split="validation",
                seq_len=64,
                batch_size=job.eval_batch_size,
                max_tokens=384,
                shard_index=0,
                num_shards=1,
            )
        )
    finally:
        seqio_state.restore(saved)
    docs = []
    for batch in batches:
        for row in range(batch["decoder_target_tokens"].shape[0]):
            seg = batch["decoder_segment_ids"][row]
            weights = batch["decoder_loss_weights"][row]
            for s in sorted(set(seg[weights > 0].tolist())):
                where = (seg == s) & (weights > 0)
                assert batch["decoder_positions"][row][where][0] == 0
                docs.append(batch["decoder_target_tokens"][row][where].tolist())
    assert len(docs) >= 3
    scored = lm.scorer.score([([lm.scorer.start_id], doc) for doc in docs])
    tokens = sum(len(d) for d in docs)
    assert tokens == trainer_loss["eval/lm_en/tokens"]
    ours = -sum(lp for lp, _ in scored) / tokens
    np.testing.assert_allclose(ours, trainer_loss["eval/lm_en/loss"], rtol=2e-5)


@pytest.mark.slow
def test_rolling_loglikelihood_is_the_document_score(lm):
    text = "All human beings are born free and equal in dignity and rights."
    ids = lm.scorer.encode(text)
    (whole,) = lm.scorer.score([([lm.scorer.start_id], ids)])
    (rolling,) = lm.loglikelihood_rolling([Req(text)])
    np.testing.assert_allclose(rolling, whole[0], rtol=1e-6)
    # A text longer than the context goes through several disjoint windows; each token is
    # scored exactly once, so the per-window sums add up over the whole text.
    long_text = " ".join([text] * 12)
    long_ids = lm.scorer.encode(long_text)
    assert len(long_ids) > lm.scorer.max_len
    (total,) = lm.loglikelihood_rolling([Req(long_text)])
    assert math.isfinite(total) and total < whole[0] * 2


@pytest.mark.slow
def test_context_continuation_boundary(lm):
    # lm-eval's causal split: trailing context spaces move to the continuation, the pair is
    # encoded whole and cut at the context's length; the context starts with the start token.
    context, continuation = "Everyone has the right to", " life"
    ctx, cont = lm.encode_pair(context + " ", "life")
    assert ctx == [lm.scorer.start_id, *lm.scorer.encode(context)]
    whole = lm.scorer.encode(context + continuation)
    assert ctx[1:] + cont == whole
    # Scoring the continuation equals the difference of the two prefixes' rolling scores.
    ((ll, _),) = lm.loglikelihood([Req(context, continuation)])
    (full,) = lm.scorer.score([([lm.scorer.start_id], whole)])
    (prefix,) = lm.scorer.score([([lm.scorer.start_id], ctx[1:])])
    np.testing.assert_allclose(ll, full[0] - prefix[0], rtol=1e-5, atol=1e-5)
    # An empty context conditions on the start token alone.
    ((empty, _),) = lm.loglikelihood([Req("", "life")])
    (direct,) = lm.scorer.score([([lm.scorer.start_id], lm.scorer.encode("life"))])
    np.testing.assert_allclose(empty, direct[0], rtol=1e-6)


@pytest.mark.slow
def test_is_greedy_matches_argmax(lm):
    # The greedy continuation (decoded by the model's cached decoder) is greedy when scored.
    context = "Everyone has the right"
    (generated,) = lm.scorer.generate([lm.scorer.encode(context)], max_new_tokens=4)
    assert generated, "the tiny model produced EOS at once"
    ((_, greedy),) = lm.scorer.score(
        [([lm.scorer.start_id, *lm.scorer.encode(context)], generated)]
    )
    assert greedy
    # generate_until is the same decoder, cut at the first stop string.
    text = lm.scorer.decode(generated)
    stop = text[len(text) // 2 :] or "\n"
    (out,) = lm.generate_until([Req(context, {"until": [stop], "max_gen_toks": 4})])
    assert out == harness.cut_at_stop(text, [stop]) and len(out) < len(text)
    other = [(generated[0] + 1) % 300 + 3]
    ((_, not_greedy),) = lm.scorer.score(
        [([lm.scorer.start_id, *lm.scorer.encode(context)], other)]
    )
    assert not not_greedy


@pytest.mark.slow
def test_bucketing_changes_cost_not_scores(run_dir):
    spec = scorer.read_run_spec(run_dir)
    # 8 rows per batch (the 8 data-parallel devices): the 8 long requests fill one batch, the
    # 8 short ones another, which buckets to 16 positions instead of 64.
    lengths = (5, 9, 12, 7, 16, 3, 11, 8, 20, 40, 63, 33, 50, 62, 45, 30)
    bucketed = scorer.Scorer(spec, batch_size=8, bucket=True)
    full = scorer.Scorer(spec, batch_size=8, bucket=False)
    pairs = [([bucketed.start_id], list(range(3, 3 + n))) for n in lengths]
    np.testing.assert_allclose(
        [s for s, _ in bucketed.score(pairs)], [s for s, _ in full.score(pairs)], rtol=1e-5
    )
    assert bucketed.stats.tokens_padded < full.stats.tokens_padded
    assert full.stats.shapes == {64} and bucketed.stats.shapes == {16, 64}
    assert scorer.bucket_length(17, max_len=64, bucket=True) == 32
    assert scorer.bucket_length(90, max_len=64, bucket=True) == 64


def _hand_task(tmp_path):
    """A 4-item, 3-choice multiple-choice task as lm-eval YAML over a local JSON file."""
    docs = [
        {"ctx": "Everyone has the right to", "choices": [" life", " freedom of", " a"], "gold": 0},
        {"ctx": "All human beings are", "choices": [" born free", " equal", " the"], "gold": 1},
        {"ctx": "No one shall be", "choices": [" held", " subjected to torture", " x"], "gold": 2},
        {"ctx": "Everyone is entitled", "choices": [" to all", " rights", " freedoms"], "gold": 0},
    ]
    data = tmp_path / "hand.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "hand.yaml").write_text(
        "task: xl_hand_en\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{ctx}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: gold\n"
        "target_delimiter: ''\n"
        # Only acc, as lm-eval 0.4.13's XNLI/XCOPA/XStoryCloze/XWinograd: the harness adds
        # acc_norm for the tasks it is told to normalise.
        "metric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n"
    )
    return docs


@pytest.mark.slow
def test_acc_and_acc_norm_by_hand(run_dir, lm, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # not a git checkout: lm-eval's `git describe` fails here
    docs = _hand_task(tmp_path)
    capfd.readouterr()
    out = harness.evaluate(
        model_dir=str(run_dir),
        step=None,
        tasks=["xl_hand_en"],
        include_path=str(tmp_path),
        include_defaults=False,
        normalise={"xl_hand_en"},
    )
    row = out["results"]["xl_hand_en"]
    acc, acc_norm = [], []
    for doc in docs:
        lls = [ll for ll, _ in lm.loglikelihood([Req(doc["ctx"], c) for c in doc["choices"]])]
        acc.append(int(np.argmax(lls)) == doc["gold"])
        norm = [ll / len(c) for ll, c in zip(lls, doc["choices"], strict=True)]
        acc_norm.append(int(np.argmax(norm)) == doc["gold"])
    assert row["acc,none"] == pytest.approx(np.mean(acc))
    assert row["acc_norm,none"] == pytest.approx(np.mean(acc_norm))
    assert out["n-samples"]["xl_hand_en"]["effective"] == 4
    assert out["step"] == STEPS and out["scorer"]["requests"] == 12
    assert "not a git repository" not in capfd.readouterr().err  # git's complaint kept off

    # Written where fitting reads it: zeroshot/<step>.json and metrics.jsonl.
    path = results.write_results(
        run_dir, step=out["step"], results=out, checkpoint=f"{run_dir}@{STEPS}", extra={}
    )
    assert path == run_dir / "zeroshot" / f"{STEPS}.json"
    (score,) = zeroshot_lib.read_zeroshot(run_dir)
    assert (score.step, score.task, score.language, score.n) == (STEPS, "xl_hand_en", "en", 4)
    assert score.acc_norm == pytest.approx(np.mean(acc_norm))
    (run,) = [r for r in fit_io.read_runs(run_dir.parent) if r.run_id == run_dir.name]
    found = zeroshot_lib.from_records(list(run.records))
    assert found[STEPS]["xl_hand_en"]["acc_norm"] == pytest.approx(np.mean(acc_norm))


@pytest.mark.slow
def test_lm_eval_command_line_runs_the_model(run_dir, tmp_path, monkeypatch, capsys):
    # lm-eval's own CLI (`python -m evals.lm_eval_cli`), every flag its own.
    from evals import lm_eval_cli

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    _hand_task(tmp_path)
    args = ["run", "--model", "xlscale", "--model_args", f"model_dir={run_dir},step=2"]
    args += ["--tasks", "xl_hand_en", "--include_path", str(tmp_path), "--batch_size", "8"]
    assert lm_eval_cli.main(args) == 0
    out = capsys.readouterr().out
    assert "xl_hand_en" in out and "acc" in out and "'step': 2" in out


def test_bad_model_args_name_the_argument(run_dir):
    with pytest.raises(ValueError, match="--model_args temperature"):
        harness.XlscaleLM(model_dir=str(run_dir), temperature=0.5)
    with pytest.raises(FileNotFoundError, match="vocab_path="):
        harness.XlscaleLM(model_dir=str(run_dir), vocab_path="/nonexistent.model")
    with pytest.raises(FileNotFoundError, match="run.json"):
        scorer.read_run_spec(run_dir / "nope")


def test_registered_with_lm_eval():
    from lm_eval.api.registry import get_model

    assert get_model("xlscale") is harness.XlscaleLM
    assert jax.device_count() == 8


@pytest.mark.slow
def test_paper_tasks_get_acc_norm_on_their_own_config():
    # lm-eval 0.4.13's XNLI lists only acc; the paper reports acc_norm. The spec keeps the
    # task's dataset and prompt (its YAML with includes resolved) and adds acc_norm.
    from lm_eval.tasks import TaskManager

    spec = harness.with_acc_norm(TaskManager(), "xnli_zh")
    assert (spec["task"], spec["dataset_path"], spec["dataset_name"]) == (
        "xnli_zh",
        "facebook/xnli",
        "zh",
    )
    assert [m["metric"] for m in spec["metric_list"]] == ["acc", "acc_norm"]
    assert spec["output_type"] == "multiple_choice" and "doc_to_choice" in spec
    assert harness.with_acc_norm(TaskManager(include_defaults=False), "nope") == "nope"


@pytest.mark.slow
def test_xlscale_zeroshot_command(run_dir, tiny_data, tmp_path, capsys):
    from pathlib import Path

    from evals import local_tasks
    from xlscale_cli import main as cli

    tasks = local_tasks.write_local_tasks(
        Path(tiny_data["corpora"]), tmp_path / "tasks", langs=["en", "fr"], items=6
    )
    assert "xl_cont_en" in tasks.tasks
    # The run's languages (en) pick the local tasks; step 2 is a kept checkpoint.
    status = cli.main(
        ["zeroshot", "--model-dir", str(run_dir), "--local", str(tasks.dir), "--step", "2"]
    )
    captured = capsys.readouterr()
    out = captured.out
    assert status == 0, out
    assert "xl_cont_en" in out and "requests in" in out and "xl_cont_fr" not in out
    assert "it/s]" not in captured.err and "%|" not in captured.err  # no lm-eval bars
    (score,) = [s for s in zeroshot_lib.read_zeroshot(run_dir) if s.step == 2]
    assert (score.task, score.language, score.chance) == ("xl_cont_en", "en", 0.25)
    assert score.n == tasks_n(tasks.dir, "xl_cont_en")
    saved = json.loads((run_dir / "zeroshot" / "2.json").read_text())
    assert saved["checkpoint"].endswith("@2") and saved["tasks_source"] == "local"

    # Bad input names the flag, the value and what is allowed; nothing is written.
    assert cli.main(["zeroshot", "--model-dir", str(run_dir), "--step", "3"]) == 2
    assert "--step 3: not a kept checkpoint" in capsys.readouterr().err
    assert cli.main(["zeroshot", "--model-dir", str(run_dir), "--local", str(tmp_path)]) == 2
    assert f"local tasks {tmp_path}: no tasks.json" in capsys.readouterr().err
    french = local_tasks.write_local_tasks(
        Path(tiny_data["corpora"]), tmp_path / "fr", langs=["fr"], items=6
    )
    assert cli.main(["zeroshot", "--model-dir", str(run_dir), "--local", str(french.dir)]) == 2
    assert "no local zero-shot task for languages ['en']" in capsys.readouterr().err
    assert not (run_dir / "zeroshot" / "3.json").exists()


def tasks_n(directory, task):
    from evals import local_tasks

    return local_tasks.task_info(directory, task)["n"]


@pytest.mark.slow
def test_sweep_stage_scores_a_completed_run_once(run_dir, tiny_data, tmp_path):
    """The sweep's zero-shot stage on a completed run: the local launcher finds it
    COMPLETED, scores its final step through `evals.score_run`, scores nothing when run again,
    and a stage with one more language scores only that one, keeping the earlier tasks."""
    import dataclasses
    from pathlib import Path

    from evals import local_tasks
    from launch import launchers, status, sweep, zeroshot_stage

    tasks = local_tasks.write_local_tasks(
        Path(tiny_data["corpora"]), tmp_path / "tasks", langs=["en", "fr"], items=6
    )
    (source,) = [
        r for r in sweep.expand(sweep.load_manifest("cpt_replay")) if r.strategy == "source"
    ]
    spec = zeroshot_stage.ScoreSpec(
        ("local:en",), limit=3, batch_size=8, include_path=str(tasks.dir)
    )
    run = dataclasses.replace(source, model_dir=str(run_dir), steps=STEPS, zeroshot=spec)
    launcher = launchers.LocalLauncher(scorer=zeroshot_stage.score_in_process)

    def launch(run):
        return launcher.launch([run], progress=status.Progress([run], stream=io.StringIO()))

    report = launch(run)
    assert report.skipped == [run.run_id] and report.scored == [run.run_id] and report.ok
    assert zeroshot_lib.scored_tasks(run_dir, STEPS, limit=3).keys() == {"xl_cont_en"}
    assert not zeroshot_stage.needs_scoring(run)
    assert launch(run).scored == []  # resumable: already scored
    both = dataclasses.replace(
        run, zeroshot=dataclasses.replace(spec, tasks=("local:en", "local:fr"))
    )
    before = zeroshot_lib.scored_tasks(run_dir, STEPS, limit=3)["xl_cont_en"]
    assert launch(both).scored == [run.run_id]
    after = zeroshot_lib.scored_tasks(run_dir, STEPS, limit=3)
    assert set(after) == set(local_tasks.read_local_tasks(tasks.dir)) and "xl_cont_fr" in after
    assert after["xl_cont_en"] == before  # kept, not scored again
    assert after["xl_cont_fr"]["n"] == 3 and after["xl_cont_fr"]["language"] == "fr"
