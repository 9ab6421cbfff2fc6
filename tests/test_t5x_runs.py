"""`fitting` reads T5X run directories: config.gin → run.json's fields, T5X's summaries (their
exact directories and tags) → records, `checkpoint_<step>/` → kept steps; fits run on them.

Event files are written the way T5X writes them, without T5X or TensorFlow: one
`events.out.tfevents.*` per summary directory, rank-0 float tensors with the `scalars` plugin's
metadata (what `clu.metric_writers` / `tf.summary.scalar` and seqio's `TensorBoardLogger` write).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from fitting.checks import FitInputError
from fitting.laws import formulas
from fitting.readers import event_files, points, run_dirs, t5x_runs
from fitting.reports import fit_all
from t5_jax import counting, sizes

pytest.importorskip("tensorboard")
from t5x_run_dirs import (  # noqa: E402
    FINETUNE_EXTRA,
    PRETRAIN_GIN,
    loss_metrics,
    write_events,
    write_t5x_run,
)


def test_operative_config_parses_macros_scopes_continuations():
    cfg = t5x_runs.parse_config(
        PRETRAIN_GIN.format(task="mix_en_50_de_50", run="r", steps=100)
        + FINETUNE_EXTRA.format(parent="p", init=25)
    )
    assert cfg.value("TASK_FEATURE_LENGTHS") == {"inputs": 512, "targets": 114}
    assert cfg.value("train/utils.DatasetConfig.batch_size") == 256  # %BATCH_SIZE followed
    assert cfg.value("INITIAL_CHECKPOINT_PATH") == "/runs/p/checkpoint_25"
    assert cfg.find("RestoreCheckpointConfig", "path") == "/runs/p/checkpoint_25"
    assert cfg.find("T5Config", "mlp_activations") == ("gelu", "linear")
    with pytest.raises(FitInputError, match="config.gin: not a gin config"):
        t5x_runs.parse_config("BATCH_SIZE = = 3")


def test_pretrain_meta_from_config_gin(tmp_path):
    d = write_t5x_run(
        tmp_path,
        "pre",
        task="mix_en_50_de_50",
        steps=300,
        ckpts=[0, 100, 200, 300],
        ce={100: 3.0, 200: 2.5, 300: 2.2},
    )
    run = run_dirs.read_runs(d)[0]
    m = run.meta
    want = counting.param_counts(sizes.get_config("t5_770m"))
    assert m["model"] == "t5_770m" and m["family"] == "t5"
    assert m["params_non_embedding"] == want.non_embedding and m["params_total"] == want.total
    assert m["strategy"] == "pretrain" and m["mixture_or_task"] == "mix_en_50_de_50"
    assert m["languages"] == ["en", "de"] and m["components"] == ["span_en", "span_de"]
    assert m["batch_size"] == 256 and m["task_feature_lengths"] == {"inputs": 512, "targets": 114}
    assert m["train_steps"] == 300 and m["checkpoint_steps"] == [0, 100, 200, 300]
    # Real target tokens: steps x batch x 114 x the logged non-padding fraction (0.8 here).
    assert m["init_checkpoint"] is None and run.completed == {
        "step": 300,
        "tokens": pytest.approx(300 * 256 * 114 * 0.8),
    }
    by_step = {r["step"]: r for r in run.records}
    assert by_step[200]["tokens"] == pytest.approx(200 * 256 * 114 * 0.8)
    assert by_step[200]["train/loss"] == pytest.approx(2.5)  # Σ CE / Σ real tokens
    assert by_step[200]["eval/mix_en_50_de_50/loss"] == pytest.approx(2.6)
    assert by_step[200]["learning_rate"] == pytest.approx(0.01)
    assert not any(k.endswith("/accuracy") for k in by_step[200])  # not a downstream score
    assert by_step[0] == {"step": 0, "tokens": 0.0, "tokens_paper": 0.0}  # a checkpoint only
    assert by_step[300]["tokens_paper"] == 300 * 256 * 512  # the MT paper's Dp
    assert points.paper_tokens_at(run, 200) == 200 * 256 * 512
    assert not any(k.startswith(("loss", "timing/", "z_loss")) for r in run.records for k in r)


def test_size_name_config_as_t5x_configs_writes_it():
    # t5x_configs/t5x/models/t5.gin: MODEL_SIZE -> sizes.get_config.name, VOCAB_SIZE rows.
    cfg = t5x_runs.parse_config(
        "MODEL_SIZE = 't5_tiny'\nVOCAB_SIZE = 512\n"
        "sizes.get_config.name = %MODEL_SIZE\nsizes.get_config.vocab_size = %VOCAB_SIZE\n"
        "model.Transformer.config = @sizes.get_config()\n"
    )
    want = counting.param_counts(sizes.get_config("t5_tiny", vocab_size=512))
    assert t5x_runs.model_meta(cfg) == {
        "model": "t5_tiny",
        "family": "t5",
        "params_total": want.total,
        "params_non_embedding": want.non_embedding,
        "vocab_size": 512,
    }


def test_real_tokens_follow_each_windows_non_padding_fraction(tmp_path):
    write_events(tmp_path / "train", {"non_padding_fraction/loss_weights": [(10, 0.5), (20, 1.0)]})
    windows = t5x_runs._loss_weight_windows(tmp_path, start=0)
    assert windows == [(0, 10, 0.5), (10, 20, 1.0)]
    rows = [t5x_runs._real_rows(windows, start=0, step=s) for s in (0, 5, 10, 15, 20, 30)]
    assert rows == [0.0, 2.5, 5.0, 10.0, 15.0, 25.0]
    assert t5x_runs._real_rows([], start=20, step=30) == 10.0  # no summaries: every row real


def test_finetune_meta_and_inference_eval_scores(tmp_path):
    write_t5x_run(tmp_path, "pre", task="mix_en_100", steps=300, ckpts=[300], ce={300: 2.0})
    write_t5x_run(
        tmp_path,
        "ft",
        task="mt_en_de",
        steps=425,
        ckpts=[425],
        ce={425: 1.5},
        parent="pre",
        init=125,
        bleu=21.5,
    )
    runs = {r.run_id: r for r in run_dirs.read_runs(tmp_path)}
    m = runs["ft"].meta
    assert m["strategy"] == "finetune" and m["init_checkpoint"] == "/runs/pre@125"
    assert m["init_step"] == 125 and m["train_steps"] == 300  # T5X counts on from the checkpoint
    assert m["source_lang"] == "en" and m["target_lang"] == "de" and m["languages"] == ["en", "de"]
    last = runs["ft"].records[-1]
    assert last["eval/mt_en_de/bleu"] == 21.5 and last["eval/mt_en_de/chrf"] == 40.0
    assert last["eval/mt_en_de/rouge_l"] == 50.0  # seqio's rougeL under xlscale's name
    assert runs["ft"].completed is not None
    rows = run_dirs.tidy([runs["ft"]])
    assert rows[-1]["scores"]["mt_en_de/bleu"] == 21.5


def test_loss_normalizing_factor_rules(tmp_path):
    frac = {"cross_ent_loss_per_all_target_tokens": 1.6, "non_padding_fraction/loss_weights": 0.8}
    assert t5x_runs._ce_rule(None, run_id="r")(frac) == pytest.approx(2.0)
    assert t5x_runs._ce_rule(233472.0, run_id="r")(frac) == pytest.approx(2.0 * 233472)
    assert t5x_runs._ce_rule("NUM_REAL_TARGET_TOKENS", run_id="r")({"cross_ent_loss": 2.0}) == 2.0
    with pytest.raises(
        FitInputError, match="loss_normalizing_factor = 'AVERAGE_PER_SEQUENCE'.*allowed"
    ):
        t5x_runs._ce_rule("AVERAGE_PER_SEQUENCE", run_id="r")


def test_read_tensorboard_puts_inference_eval_scores_under_their_task(tmp_path):
    write_events(tmp_path / "inference_eval" / "mt_en_fr", {"eval/bleu": [(10, 30.0)]})
    write_events(tmp_path / "training_eval" / "mt_en_fr", {"loss": [(10, 2.0)]})
    assert event_files.read_tensorboard(tmp_path) == {
        "eval/mt_en_fr/bleu": [(10, 30.0)],
        "eval/mt_en_fr/loss": [(10, 2.0)],
    }


def _mt_study(root: Path) -> None:
    """2 pretraining runs (checkpoints every 100 steps) + 4 finetunes of the first one's
    checkpoints, BLEU = log-law of Dp, downstream CE = power law of Dp."""
    write_t5x_run(
        root,
        "pre_en",
        task="mix_en_100",
        steps=800,
        ckpts=[200, 400, 600, 800],
        ce={s: 3.0 - s / 1000 for s in (200, 400, 600, 800)},
    )
    write_t5x_run(
        root,
        "pre_en_de",
        task="mix_en_50_de_50",
        steps=800,
        ckpts=[800],
        ce={800: 2.4},
    )
    for init in (200, 400, 600, 800):
        dp = init * 256 * 512
        write_t5x_run(
            root,
            f"ft_{init}",
            task="mt_en_de",
            steps=init + 300,
            ckpts=[init + 300],
            ce={init + 300: 0.5 + 60.0 * dp**-0.2},
            parent="pre_en",
            init=init,
            bleu=float(formulas.log_law(dp, log_A=-5.0, alpha=0.5, beta=1.5)),
        )


def test_fit_pipeline_on_t5x_runs(tmp_path):
    _mt_study(tmp_path / "runs")
    series = points.downstream_series(run_dirs.read_runs(tmp_path / "runs"), metric="bleu")
    assert len(series) == 1 and series[0].key == ("mix_en_100", "mt_en_de", "300")
    np.testing.assert_array_equal(series[0].Dp, [s * 256 * 512 for s in (200, 400, 600, 800)])
    assert series[0].model == "t5_770m"
    result = fit_all.fit_runs(tmp_path / "runs", tmp_path / "out", law="ce", bootstrap=0)
    (entry,) = result["ce"]
    assert entry["fit"]["converged"] and entry["fit"]["params"]["alpha"] == pytest.approx(
        0.2, rel=1e-2
    )


@pytest.mark.slow
def test_xlscale_fit_cli_on_t5x_and_xlscale_runs(tmp_path, capsys):
    from fitting.laws import synthetic
    from xlscale_cli import main as cli

    _mt_study(tmp_path / "runs")
    synthetic.write_study(tmp_path / "runs", sizes=(3e7, 1e8, 3e8), evals=3, replay_ratios=(0.5,))
    rc = cli.main(
        [
            "fit",
            "--runs",
            str(tmp_path / "runs"),
            "--out",
            str(tmp_path / "out"),
            "--law",
            "bleu",
            "--bootstrap",
            "0",
        ]
    )
    assert rc in (0, None)
    fits = json.loads((tmp_path / "out" / "fits.json").read_text())
    mine = [e for e in fits["bleu"] if e["pretraining"] == "mix_en_100" and e["model"] == "t5_770m"]
    assert mine and mine[0]["metric"] == "bleu" and mine[0]["fit"]["converged"]


def test_fits_read_a_finetune_at_its_recorded_best_step(tmp_path):
    # A finetune evaluated mid-run too: its series point is the last evaluation, until a
    # [[select]] with at = "best" records the best validation step (best_checkpoint.json, as
    # launch.best_checkpoint writes it); then the scores at that step, COMET included.
    from launch import best_checkpoint

    root = tmp_path / "runs"
    _mt_study(root)
    ft = root / "ft_400"
    write_events(
        ft / "training_eval" / "mt_en_de", {**{k: [(550, v)] for k, v in loss_metrics(0.2).items()}}
    )
    write_events(
        ft / "inference_eval" / "mt_en_de",
        {"eval/bleu": [(550, 55.0)], "eval/comet": [(550, 80.0)]},
    )
    (series,) = points.downstream_series(run_dirs.read_runs(root), metric="bleu")
    last = dict(zip(series.runs, series.values, strict=True))["ft_400"]
    assert last != 55.0
    found = best_checkpoint.record(str(ft), metric="eval/mt_en_de/loss", rule="min")
    assert (found["step"], found["last_step"], found["kept"]) == (550, 700, False)
    assert found["checkpoint"] == str(ft / "checkpoint_550")  # T5X's layout, not saved there
    runs = run_dirs.read_runs(root)
    (series,) = points.downstream_series(runs, metric="bleu")
    values = dict(zip(series.runs, series.values, strict=True))
    assert values["ft_400"] == 55.0 and values["ft_200"] != 55.0
    (comet,) = points.downstream_series(runs, metric="comet")
    assert dict(zip(comet.runs, comet.values, strict=True)) == {"ft_400": 80.0}
