"""Dp and Df in the papers' units, beside the real token counts.

The MT paper counts pretraining data as steps × batch 256 × 512 (the span-corruption *inputs*
length; our targets are at most 114 tokens) and a finetuning set as training pairs × 512
(WMT16 en-ro: 610,320 pairs = 312.5M), trained 300 steps at every Df. These tests check that the
trainer records those units (`tokens_paper`, `token_units`, `finetune_pairs`,
`finetune_tokens_paper`), that `FINETUNE_UNIT = 'paper'` sizes the set in pairs at fixed steps,
and that fitting reads Dp and Df in them.
"""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import gin
import numpy as np
import pytest

from fitting.readers import points
from fitting.readers.run_data import RunData
from rundir import paper_units
from trainer import data, metrics_log, recipes, run_files
from trainer import train as train_lib
from trainer.data import DataConfig

MT_PRETRAIN_LENGTHS = {"inputs": 512, "targets": 114}


def test_records_carry_paper_tokens_beside_the_real_ones():
    # 3 applied steps and 1 skipped of batch 256 × 512 inputs: the paper counts 3 × 256 × 512.
    per_step = paper_units.tokens_paper_per_step(
        batch_size=256, task_feature_lengths=MT_PRETRAIN_LENGTHS
    )
    assert per_step == 256 * 512
    assert paper_units.tokens_paper_per_step(
        batch_size=8, task_feature_lengths={"targets": 2048}
    ) == (8 * 2048)
    counters = metrics_log.Counters(["span_en"], tokens_paper_per_step=per_step)
    step = {
        "finite": True,
        "tokens_by_task": np.asarray([100]),
        "loss_sum": 1.0,
        "z_loss_sum": 0.0,
        "weight_sum": 100.0,
        "learning_rate": 0.1,
        "grad_norm": 1.0,
    }
    counters.absorb([(1, step), (2, step), (3, {**step, "finite": False}), (4, step)])
    record = counters.record(4, flops_per_token=1.0, flops_per_token_attn=1.0)
    assert record["tokens"] == 300  # real target tokens, unchanged
    assert record["tokens_paper"] == 3 * 256 * 512
    assert "tokens_paper" not in metrics_log.Counters(["x"]).record(
        0, flops_per_token=1.0, flops_per_token_attn=1.0
    )


def _job(components):
    model = types.SimpleNamespace(name="t5_tiny", family="t5", param_counts=lambda: (2000, 1000))
    return types.SimpleNamespace(
        model=model,
        components=components,
        total_steps=300,
        flops_per_token=6.0,
        flops_per_token_attn=7.0,
    )


def test_run_json_states_the_token_units_and_the_paper_df():
    finetune = DataConfig(
        mixture_or_task="mt_en_ro",
        task_feature_lengths={"inputs": 512, "targets": 512},
        batch_size=128,
        subset_examples=610_320,
    )
    run = train_lib.RunInfo(strategy="finetune", finetune_tokens=312_483_840, finetune_unit="paper")
    info = run_files.run_record(
        _job(["mt_en_ro"]), run=run, data=finetune, seed=0, init={}, gin=""
    ).to_json()
    assert info["finetune_unit"] == "paper" and info["finetune_pairs"] == 610_320
    assert info["finetune_tokens_paper"] == 610_320 * 512 == 312_483_840
    assert info["tokens_paper_per_step"] == 128 * 512
    assert set(info["token_units"]) == {
        "tokens",
        "input_tokens",
        "tokens_paper",
        "finetune_tokens_paper",
    }
    assert "target" in info["token_units"]["tokens"]
    assert "inputs length" in info["token_units"]["tokens_paper"]
    pretrain = DataConfig(
        mixture_or_task="mix_en_100", task_feature_lengths=MT_PRETRAIN_LENGTHS, batch_size=256
    )
    info = run_files.run_record(
        _job(["span_en"]), run=train_lib.RunInfo(), data=pretrain, seed=0, init={}, gin=""
    ).to_json()
    assert info["tokens_paper_per_step"] == 256 * 512  # not 256 × 114
    assert info["finetune_pairs"] is None and info["finetune_tokens_paper"] is None
    decoder = DataConfig(mixture_or_task="lm_en", task_feature_lengths={"targets": 2048})
    info = run_files.run_record(
        _job(["lm_en"]), run=train_lib.RunInfo("source"), data=decoder, seed=0, init={}, gin=""
    ).to_json()
    assert info["tokens_paper_per_step"] == 512 * 2048
    assert "2048" in info["token_units"]["tokens_paper"]


def test_paper_df_is_pairs_at_fixed_steps_and_target_df_is_one_pass():
    lengths = {"inputs": 512, "targets": 512}
    steps = {
        unit: [
            recipes.finetune_steps(
                finetune_tokens=df, batch_size=128, task_feature_lengths=lengths, unit=unit
            )
            for df in (625_000, 3_000_000, 312_483_840)
        ]
        for unit in ("target", "paper")
    }
    assert steps["paper"] == [300, 300, 300]  # the paper: 300 steps at every Df
    assert steps["target"] == [10, 46, 4769]  # unchanged: one pass over Df target tokens
    assert [recipes.finetune_pairs(finetune_tokens=df, unit="paper") for df in (625_000, 6e6)] == [
        1221,
        11_719,
    ]
    assert recipes.finetune_pairs(finetune_tokens=312_483_840, unit="paper") == 610_320
    assert recipes.finetune_subset_tokens(finetune_tokens=312_483_840, unit="paper") is None
    assert recipes.finetune_pairs(finetune_tokens=6_000_000, unit="target") is None
    assert recipes.finetune_subset_tokens(finetune_tokens=6_000_000, unit="target") == 6_000_000
    with pytest.raises(ValueError, match="FINETUNE_UNIT = 'pairs'.*'target', 'paper'"):
        recipes.finetune_pairs(finetune_tokens=6_000_000, unit="pairs")
    with pytest.raises(ValueError, match="subset_tokens or subset_examples"):
        DataConfig(subset_tokens=10, subset_examples=10)


def test_the_training_stream_gets_the_pair_count(monkeypatch):
    from pipelines import streams

    seen = {}

    def fake_batches(**kwargs):
        seen.update(kwargs)
        return iter([])

    monkeypatch.setattr(streams, "encdec_batches", fake_batches)
    config = DataConfig(
        mixture_or_task="mt_en_ro",
        task_feature_lengths={"inputs": 512, "targets": 512},
        batch_size=128,
        subset_examples=1221,
    )
    list(data.train_batches(config, seed=0, start_step=0, shard_index=0, num_shards=1))
    assert (seen["subset_examples"], seen["subset_tokens"]) == (1221, None)


def test_the_finetune_gin_files_size_the_paper_set_in_pairs():
    from gin_values import evaluate, parse_mt, resolve

    gin.clear_config()
    try:
        parse_mt(
            "mt_finetune.gin",
            "--gin.TASK='mt_en_ro'",
            "--gin.INIT_CHECKPOINT='/xl/pre@25000'",
            "--gin.FINETUNE_TOKENS=625000",
            "--gin.FINETUNE_UNIT='paper'",
        )
        assert resolve("TRAIN_STEPS") == 300
        query = lambda key: evaluate(gin.query_parameter(key))  # noqa: E731
        assert query("data.DataConfig.subset_examples") == 1221
        assert query("data.DataConfig.subset_tokens") is None
        assert query("train_script.RunInfo.finetune_unit") == "paper"
        gin.clear_config()
        parse_mt("mt_finetune.gin", "--gin.TASK='mt_en_ro'", "--gin.FINETUNE_TOKENS=625000")
        assert resolve("TRAIN_STEPS") == 10  # today's default unit: one pass, Df target tokens
        query = lambda key: evaluate(gin.query_parameter(key))  # noqa: E731
        assert query("data.DataConfig.subset_tokens") == 625_000
        assert query("data.DataConfig.subset_examples") is None
    finally:
        gin.clear_config()


# ----------------------------------------------------------------------------- fitting


def _pretrain(meta_extra, records):
    meta = {"model": "t5_3b", "family": "t5", "strategy": "pretrain", **meta_extra}
    meta.setdefault("mixture_or_task", "mix_en_100")
    return RunData("pre", Path("/runs/pre"), meta, tuple(records))


def _finetunes(step_values, **meta):
    out = []
    for step, bleu in step_values:
        out.append(
            RunData(
                f"ft{step}",
                Path(f"/runs/ft{step}"),
                {
                    "model": "t5_3b",
                    "family": "t5",
                    "strategy": "finetune",
                    "mixture_or_task": "mt_en_ro",
                    "init_checkpoint": f"/runs/pre@{step}",
                    "init_step": step,
                    "train_steps": 300,
                    **meta,
                },
                ({"step": 300, "tokens": 1.0, "eval/mt_en_ro/bleu": bleu},),
            )
        )
    return out


def test_downstream_dp_and_df_are_in_the_papers_units():
    per_step = 256 * 512
    records = [
        {"step": s, "tokens": s * 256 * 100, "tokens_paper": s * per_step} for s in (100, 200)
    ]
    fts = _finetunes(
        [(100, 10.0), (200, 12.0), (150, 11.0)],
        finetune_tokens=625_000,
        finetune_tokens_paper=1221 * 512,
        finetune_pairs=1221,
        finetune_unit="paper",
    )
    meta = {"batch_size": 256, "task_feature_lengths": MT_PRETRAIN_LENGTHS}
    (series,) = points.downstream_series([_pretrain(meta, records), *fts], metric="bleu")
    np.testing.assert_allclose(series.Dp, [100 * per_step, 150 * per_step, 200 * per_step])
    assert series.dp_unit == "paper"
    assert series.key[2] == f"300 steps, Df {1221 * 512}"  # Df = pairs × 512
    (real,) = points.downstream_series(
        [_pretrain(meta, records), *fts], metric="bleu", dp_unit="target"
    )
    np.testing.assert_allclose(real.Dp, [100 * 25_600, 150 * 25_600, 200 * 25_600])
    # A run written before `tokens_paper`: Dp from run.json (steps × batch × inputs length).
    old = [{"step": s, "tokens": s * 256 * 100} for s in (100, 200)]
    (series,) = points.downstream_series([_pretrain(meta, old), *fts], metric="bleu")
    np.testing.assert_allclose(series.Dp, [100 * per_step, 150 * per_step, 200 * per_step])
    with pytest.raises(ValueError, match="unknown Dp unit 'pairs'"):
        points.downstream_series(fts, metric="bleu", dp_unit="pairs")
    assert points.finetune_tokens({"finetune_tokens": 6_000_000}) == 6_000_000


def test_trainer_t5x_reader_and_paper_study_record_the_same_units():
    # One definition (`rundir.paper_units`): a Df in the paper's unit that is not a whole number
    # of pairs is recorded as the pairs actually held × 512 by every writer and reader.
    from fitting.readers import t5x_runs
    from studies import paper_study

    df = 312_483_840 + 300  # 610,320.6 pairs: the set holds 610,321
    lengths = {"inputs": 512, "targets": 512}
    trainer_fields = run_files.run_record(
        _job(["mt_en_ro"]),
        run=train_lib.RunInfo(strategy="finetune", finetune_tokens=df, finetune_unit="paper"),
        data=DataConfig(
            mixture_or_task="mt_en_ro",
            task_feature_lengths=lengths,
            batch_size=128,
            subset_examples=paper_units.pairs_for(df),
        ),
        seed=0,
        init={},
        gin="",
    ).to_json()
    keys = ("token_units", "tokens_paper_per_step", "finetune_pairs", "finetune_tokens_paper")
    expected = {k: trainer_fields[k] for k in keys}
    assert expected["finetune_tokens_paper"] == 610_321 * 512
    # The MT paper's manifest, as the synthetic paper study writes its finetunes.
    run = next(
        r
        for r in paper_study.expand_manifests(["mt_paper"], runs_dir="/runs")
        if r.strategy == "finetune" and dict(r.coords).get("finetune_tokens") is not None
    )
    run = dataclasses.replace(
        run, coords=tuple((k, df if k == "finetune_tokens" else v) for k, v in run.coords)
    )
    study = paper_study._unit_fields(run)
    assert {k: study[k] for k in keys} == {
        **expected,
        "tokens_paper_per_step": run.batch_size * 512,
    }
    # A T5X finetune's config.gin (`t5x/runs/finetune.gin` records Df), as `fitting.t5x_runs`
    # reads it.
    text = "\n".join(
        [
            "BATCH_SIZE = 128",
            "MIXTURE_OR_TASK_NAME = 'mt_en_ro'",
            "TASK_FEATURE_LENGTHS = {'inputs': 512, 'targets': 512}",
            "TRAIN_STEPS_RELATIVE = 300",
            f"FINETUNE_TOKENS = {df}",
            "FINETUNE_UNIT = 'paper'",
            "INITIAL_CHECKPOINT_PATH = '/runs/pre/checkpoint_100'",
        ]
    )
    meta = t5x_runs.run_meta(t5x_runs.parse_config(text), text=text, checkpoint_steps=[400])
    assert {k: meta[k] for k in keys} == expected


def test_finetune_recipes_and_the_epochs_the_docs_quote():
    from rundir import finetune_recipes as fr

    assert fr.recipe_steps(recipe_name="paper_300") == 300
    assert fr.recipe_steps(recipe_name="raffel_2^18") == 262_144
    # en-de Df 3.02B = 5,906,184 pairs: 300 steps see 0.65% of it, 2^18 steps 5.7 passes.
    assert fr.epochs(recipe_name="paper_300", batch_size=128, pairs=5_906_184) < 0.0066
    assert round(fr.epochs(recipe_name="raffel_2^18", batch_size=128, pairs=5_906_184), 2) == 5.68
    with pytest.raises(ValueError, match="FINETUNE_RECIPE = 'raffel'.*allowed"):
        fr.recipe("raffel")
