"""The trainer's encoder-decoder path: the T5 wrapper, span-corruption pretraining with a kept
checkpoint grid, finetuning from a checkpoint or from scratch with downstream scores, and
`trainer.infer` for translations.

One module-scoped set of tiny runs on the UDHR fixture (a 20-step pretraining on en 50 / fr 50
keeping steps 5, 10, 15, 20; a finetune on mt_en_fr from step 10 through the gin files; the
non-pretrained baseline) serves the run tests (marked slow: about a minute together on a 2-core
CPU), because compiling is what costs time here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from conftest import random_params
from tiny_runs import started_from, t5_pretrain_data

from convert import init_checkpoints
from pipelines import features
from rundir import records as rundir_records
from trainer import checkpoints, downstream, model_spec, recipes, steps
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import DataConfig, EvalConfig
from trainer.loop import LoopConfig
from trainer.optimizers import adafactor_defaults, build_optimizer
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig, build_schedule
from trainer.steps import StepConfig

LENGTHS = {"inputs": 64, "targets": 32}
T5_TINY = model_spec.ModelSpec(family="t5", size="t5_tiny", overrides={"vocab_size": 512})
PRETRAIN_STEPS = 20
FINETUNE_TOKENS = 1500  # ceil(1500 / (8 x 32)) = 6 steps


# ----------------------------------------------------------------------------- the wrapper


def _packed_and_single_batches():
    """Three (inputs, targets) examples: each alone in a padded row, and all three packed into
    one row with segment ids, per-segment positions and per-segment shifted decoder inputs."""
    rng = np.random.RandomState(0)
    examples = [
        (rng.randint(3, 100, n_in), rng.randint(3, 100, n_tgt))
        for n_in, n_tgt in ((5, 4), (7, 2), (3, 5))
    ]
    li, lt = 20, 14

    def row(parts, *, packed):
        enc = {k: np.zeros(li, np.int32) for k in features.ENCODER_KEYS}
        dec = {k: np.zeros(lt, np.int32) for k in features.DECODER_KEYS}
        i = t = 0
        for seg, (inputs, targets) in enumerate(parts, start=1):
            enc["encoder_input_tokens"][i : i + len(inputs)] = inputs
            enc["encoder_segment_ids"][i : i + len(inputs)] = seg
            enc["encoder_positions"][i : i + len(inputs)] = np.arange(len(inputs))
            dec["decoder_target_tokens"][t : t + len(targets)] = targets
            dec["decoder_input_tokens"][t : t + len(targets)] = np.r_[0, targets[:-1]]
            dec["decoder_loss_weights"][t : t + len(targets)] = 1
            dec["decoder_segment_ids"][t : t + len(targets)] = seg
            dec["decoder_positions"][t : t + len(targets)] = np.arange(len(targets))
            i, t = i + len(inputs), t + len(targets)
        out = {**enc, **dec}
        if not packed:  # unpacked batches carry no segment ids or positions
            for key in ("encoder_segment_ids", "encoder_positions"):
                out.pop(key)
            for key in ("decoder_segment_ids", "decoder_positions"):
                out.pop(key)
        return {k: v[None] for k, v in out.items()}

    packed = row(examples, packed=True)
    singles = [row([ex], packed=False) for ex in examples]
    return packed, singles


@pytest.mark.slow
def test_encdec_loss_on_a_packed_row_equals_the_sum_over_its_examples():
    model = model_spec.build_model(T5_TINY)
    assert (model.family, model.feature_keys) == ("t5", ("inputs", "targets"))
    from trainer import partitioning

    # Parameters drawn by numpy (compiling the real initialiser costs seconds on a CPU; the
    # identities tested here hold for any values).
    abstract = partitioning.unbox(model.abstract_variables()["params"])
    params = random_params(abstract, np.random.RandomState(1), scale=0.3, dtype=np.float32)
    packed, singles = _packed_and_single_batches()
    unpacked = {k: np.concatenate([b[k] for b in singles]) for k in singles[0]}

    @jax.jit  # one program for everything: compiling is what costs time here
    def losses(params, packed, unpacked, key):
        return (
            model.loss_fn(params, packed),
            model.score_batch(params, unpacked),
            model.loss_fn(params, packed, dropout_rng=key),
        )

    out, (ce_rows, tokens_rows), dropped = losses(params, packed, unpacked, jax.random.key(3))
    assert float(out.weight_sum) == 11
    np.testing.assert_array_equal(np.asarray(tokens_rows), [4, 2, 5])
    np.testing.assert_allclose(float(out.loss_sum), float(np.sum(ce_rows)), rtol=1e-5)
    # Dropout is on only with a key, and then changes the loss.
    assert float(dropped.loss_sum) != pytest.approx(float(out.loss_sum), rel=1e-6)


def test_encdec_counts_and_flops_per_target_token():
    model = model_spec.build_model(T5_TINY)
    total, non_embedding = model.param_counts()
    assert total - non_embedding == 2 * 512 * 24  # shared embedding + untied logits
    six_n, with_attn = model.flops_per_token(seq_len=32, inputs_len=64)
    from t5_jax import counting

    per_example = counting.flops_per_example(model.config, inputs_length=64, targets_length=32)
    assert six_n == per_example.six_n / 32 and with_attn == per_example.with_attention / 32
    with pytest.raises(ValueError, match="llama2 has no dropout"):
        model_spec.build_model(model_spec.ModelSpec(size="llama2_tiny", dropout_rate=0.1))


def test_finetune_steps_follow_the_token_budget():
    assert recipes.finetune_steps(
        finetune_tokens=6_000_000, batch_size=128, task_feature_lengths={"targets": 512}
    ) == math.ceil(6_000_000 / (128 * 512))
    assert (
        recipes.finetune_steps(finetune_tokens=5, batch_size=8, task_feature_lengths=LENGTHS) == 1
    )
    assert (
        recipes.finetune_steps(finetune_tokens=None, batch_size=8, task_feature_lengths=LENGTHS)
        == 300
    )
    with pytest.raises(ValueError, match="FINETUNE_TOKENS"):
        recipes.finetune_steps(finetune_tokens=0, batch_size=8, task_feature_lengths=LENGTHS)


@pytest.mark.slow
def test_runs_of_any_length_or_learning_rate_lower_to_the_same_program():
    """Nothing run-specific but the shapes and the schedule's formula is baked into a train step
    (its numbers are arguments), so runs of one shape share one compiled program (and the
    persistent compilation cache), whatever their length, peak or warm-up."""
    from trainer import partitioning
    from trainer.jobs import batch_abstract

    model = model_spec.build_model(T5_TINY)
    partitioner = partitioning.Partitioner(
        mesh=partitioning.build_mesh(MeshConfig(num_devices=1)), rules=()
    )
    texts = {}
    for name, peak, total in (("constant", 0.03, 6), ("constant", 0.01, 300), ("cosine", 0.03, 6),
                              ("cosine", 2e-4, 300)):  # fmt: skip
        lr = build_schedule(ScheduleConfig(name=name, peak=peak), total_steps=total)
        tx = build_optimizer(adafactor_defaults(), learning_rate=lr)
        state = jax.eval_shape(
            lambda r, tx=tx: steps.init_train_state(model, tx, r),
            jax.ShapeDtypeStruct((2,), jnp.uint32),
        )
        batch = batch_abstract(partitioner, batch_size=8, seq_len=32, feature_lengths=LENGTHS)
        numbers = steps.schedule_numbers_abstract(lr.numbers, partitioner.replicated())
        step = steps.make_train_step(model, tx, lr, steps.StepConfig())
        texts.setdefault(name, set()).add(jax.jit(step).lower(state, batch, numbers).as_text())
    assert {name: len(t) for name, t in texts.items()} == {"constant": 1, "cosine": 1}


# ----------------------------------------------------------------------------- runs


def _pretrain_kwargs(paths):
    return dict(
        model=dataclasses.replace(T5_TINY, dropout_rate=0.0),
        data=t5_pretrain_data(paths, LENGTHS),
        train_steps=PRETRAIN_STEPS,
        optimizer=adafactor_defaults(),
        schedule=ScheduleConfig(name="rsqrt", base=1.0, rsqrt_offset=100),
        checkpoint=CheckpointConfig(period=5, keep_last=1, keep_every=5),
        mesh=MeshConfig(num_devices=1),
        run=train_lib.RunInfo(strategy="pretrain"),
        loop=LoopConfig(log_every=100),  # records only where checkpoints are kept (and at the end)
        step=StepConfig(z_loss=1e-4),
    )


def _finetune_argv(paths, model_dir, *extra):
    return [
        "--gin_file=experiments/mt_finetune.gin",
        "--gin_file=experiments/t5_tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.DATA_DIR='{paths['corpora']}'",
        f"--gin.VOCAB_PATH='{paths['vocab']}'",
        "--gin.TASK='mt_en_fr'",
        f"--gin.FINETUNE_TOKENS={FINETUNE_TOKENS}",
        "--gin.partitioning.MeshConfig.num_devices=1",
        *extra,
    ]


def _train_with_gin(argv):
    from trainer import gin_entry

    gin.clear_config()
    try:
        config = gin_entry.parse(argv, job="train")
        return gin_entry.call(train_lib.train, config)
    finally:
        gin.clear_config()


@pytest.fixture(scope="module")
def mt_runs(tiny_data, tmp_path_factory, seqio_state):
    """A pretraining run, a finetune from its step 10 (through the gin files, beam search) and
    the non-pretrained baseline (greedy)."""
    saved = seqio_state.snapshot()
    root = tmp_path_factory.mktemp("mt_runs")
    out = {"root": root}
    try:
        out["pretrain"] = train_lib.train(model_dir=root / "pre", **_pretrain_kwargs(tiny_data))
        out["finetune"] = _train_with_gin(
            _finetune_argv(tiny_data, root / "ft", f"--gin.INIT_CHECKPOINT='{root / 'pre'}@10'")
        )
        out["scratch"] = _train_with_gin(
            _finetune_argv(
                tiny_data,
                root / "scratch",
                "--gin.STRATEGY='finetune_scratch'",
                "--gin.DECODE_METHOD='greedy'",
            )
        )
    finally:
        seqio_state.restore(saved)
    return out


@pytest.mark.slow
def test_pretraining_keeps_the_checkpoint_grid_with_token_counts(mt_runs):
    model_dir = mt_runs["root"] / "pre"
    assert mt_runs["pretrain"].completed
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    )
    assert store.all_steps() == [5, 10, 15, 20]
    store.close()
    records = rundir_records.read_metrics(model_dir)
    assert [r["step"] for r in records] == [5, 10, 15, 20]
    tokens = [r["tokens"] for r in records]
    assert tokens[0] > 0 and all(np.diff(tokens) > 0)
    for r in records:
        assert sum(r["tokens_by_task"].values()) == r["tokens"]
        assert set(r["tokens_by_task"]) == {"span_en", "span_fr"}
        assert r["input_tokens"] > r["tokens"]  # span corruption: short targets
    assert records[-1]["train/loss"] < records[0]["train/loss"]
    run = rundir_records.read_run_json(model_dir)
    assert (run["family"], run["model"], run["strategy"]) == ("t5", "t5_tiny", "pretrain")
    assert run["languages"] == ["en", "fr"] and run["mixture_or_task"] == "mix_en_50_fr_50"
    assert run["components"] == ["span_en", "span_fr"]
    assert run["task_feature_lengths"] == LENGTHS
    assert run["params_total"] > run["params_non_embedding"] > 0


@pytest.mark.slow
def test_finetuning_starts_from_exactly_the_checkpoint_parameters(mt_runs, tiny_data, seqio_state):
    from trainer import jobs

    saved = seqio_state.snapshot()
    try:
        job = jobs.build_job(
            model=T5_TINY,
            data=dataclasses.replace(
                _pretrain_kwargs(tiny_data)["data"], mixture_or_task="mt_en_fr", pairs=None
            ),
            evaluation=EvalConfig(),
            optimizer=adafactor_defaults(),
            schedule=ScheduleConfig(name="constant", peak=0.03),
            mesh=MeshConfig(num_devices=1),
            train_steps=4,
            compile_train=False,
        )
    finally:
        seqio_state.restore(saved)
    state, _, init, reference = started_from(
        job, mt_runs["root"] / "pre", 10, store_dir=mt_runs["root"] / "empty", seed=3
    )
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(reference), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(state.step) == 0
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(state.opt_state))  # fresh
    assert init["init_step"] == 10
    run = rundir_records.read_run_json(mt_runs["root"] / "ft")
    assert run["init_params_hash"] == init_checkpoints.params_hash(reference)
    assert run["init_checkpoint"] == os.fspath(mt_runs["root"] / "pre")
    assert (run["init_step"], run["strategy"], run["family"]) == (10, "finetune", "t5")
    assert (run["source_lang"], run["target_lang"], run["languages"]) == ("en", "fr", ["en", "fr"])
    assert (run["finetune_tokens"], run["train_steps"]) == (FINETUNE_TOKENS, 6)
    assert run["finetune_recipe"] == "paper_300"  # runs/finetune.gin's default recipe, recorded
    assert run["mixture_or_task"] == "mt_en_fr" and run["batch_size"] == 8


@pytest.mark.slow
def test_finetune_ends_with_downstream_scores_equal_to_sacrebleu(mt_runs):
    model_dir = mt_runs["root"] / "ft"
    assert mt_runs["finetune"].completed and mt_runs["finetune"].step == 6
    last = rundir_records.read_metrics(model_dir)[-1]
    assert last["step"] == 6
    for name in ("loss", "bleu", "chrf", "rouge_l"):
        assert math.isfinite(last[f"eval/mt_en_fr/{name}"]), name
    assert "eval/mt_en_fr/comet" not in last  # no local COMET model configured
    assert last["eval/mt_en_fr/decoded"] == 3  # the fixture's held-out test articles
    path = model_dir / downstream.PREDICTIONS_SUBDIR / "mt_en_fr_6.jsonl"
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 3 and all(set(x) == {"inputs", "target", "prediction"} for x in lines)
    assert lines[0]["inputs"].startswith("translate English to French: ")
    targets = [x["target"] for x in lines]
    predictions = [x["prediction"] for x in lines]
    bleu = sacrebleu.corpus_bleu(predictions, [targets], tokenize="13a").score
    chrf = sacrebleu.corpus_chrf(predictions, [targets], word_order=2).score
    assert last["eval/mt_en_fr/bleu"] == pytest.approx(bleu, abs=1e-9)
    assert last["eval/mt_en_fr/chrf"] == pytest.approx(chrf, abs=1e-9)
    parts = sacrebleu.corpus_bleu(predictions, [targets], tokenize="13a")
    assert last["eval/mt_en_fr/bleu_bp"] == pytest.approx(parts.bp, abs=1e-9)
    assert last["eval/mt_en_fr/bleu_p4"] == pytest.approx(parts.precisions[3], abs=1e-9)


@pytest.mark.slow
def test_finetune_scratch_is_the_non_pretrained_baseline(mt_runs):
    model_dir = mt_runs["root"] / "scratch"
    run = rundir_records.read_run_json(model_dir)
    assert run["strategy"] == "finetune_scratch"
    assert run["init_checkpoint"] is None and run["init_step"] is None
    last = rundir_records.read_metrics(model_dir)[-1]
    assert {"eval/mt_en_fr/loss", "eval/mt_en_fr/bleu", "eval/mt_en_fr/rouge_l"} <= set(last)
    assert (model_dir / downstream.PREDICTIONS_SUBDIR / "mt_en_fr_6.jsonl").exists()
    # Pretraining helps even here: the finetuned model's downstream CE is lower.
    finetuned = rundir_records.read_metrics(mt_runs["root"] / "ft")[-1]
    assert finetuned["eval/mt_en_fr/loss"] < last["eval/mt_en_fr/loss"]


def test_strategies_check_their_init_checkpoint(tmp_path):
    with pytest.raises(train_lib.validation.ConfigError, match="INIT_CHECKPOINT"):
        train_lib.train(
            model_dir=tmp_path / "a",
            model=T5_TINY,
            data=DataConfig(),
            run=train_lib.RunInfo("finetune"),
        )
    with pytest.raises(train_lib.validation.ConfigError, match="random initialisation"):
        train_lib.train(
            model_dir=tmp_path / "b",
            model=T5_TINY,
            data=DataConfig(),
            run=train_lib.RunInfo("finetune_scratch"),
            init_checkpoint="/x@1",
        )


@pytest.mark.slow
def test_infer_translates_a_task_split_and_given_lines(mt_runs, tiny_data, tmp_path, seqio_state):
    from trainer import infer as infer_lib

    decoding = infer_lib.InferDecoding(inputs_len=64, max_decode_len=32, method="greedy")
    saved = seqio_state.snapshot()
    try:
        results = infer_lib.infer(
            model_dir=tmp_path / "task",
            model=T5_TINY,
            vocab_path=tiny_data["vocab"],
            checkpoint=os.fspath(mt_runs["root"] / "ft"),
            source=infer_lib.InferSource(task="mt_en_fr", data_dir=tiny_data["corpora"]),
            decoding=decoding,
            mesh=MeshConfig(num_devices=1),
        )
        assert len(results) == 3 and all("target" in r for r in results)
        scores = json.loads((tmp_path / "task" / infer_lib.SCORES_FILE).read_text())
        assert (scores["task"], scores["split"], scores["step"]) == ("mt_en_fr", "test", 6)
        assert {"bleu", "chrf", "rouge_l"} <= set(scores)
        written = (tmp_path / "task" / infer_lib.INFER_FILE).read_text(encoding="utf-8")
        assert [json.loads(x)["prediction"] for x in written.splitlines()] == [
            r["prediction"] for r in results
        ]

        lines = infer_lib.infer(
            model_dir=tmp_path / "lines",
            model=T5_TINY,
            vocab_path=tiny_data["vocab"],
            checkpoint=os.fspath(mt_runs["root"] / "ft"),
            source=infer_lib.InferSource(
                task="mt_en_fr",
                prompts=[
                    "Everyone has the right to life.\tTout individu a droit à la vie.",
                    "Hello",
                ],
            ),
            decoding=decoding,
            mesh=MeshConfig(num_devices=1),
        )
    finally:
        seqio_state.restore(saved)
    assert [r["inputs"] for r in lines] == [
        "translate English to French: Everyone has the right to life.",
        "translate English to French: Hello",
    ]
    assert "target" not in lines[1]  # one line without a reference: no scores
    assert not (tmp_path / "lines" / infer_lib.SCORES_FILE).exists()


def test_feature_lengths_and_decode_tasks_must_fit_the_model():
    from trainer import validation

    with pytest.raises(validation.ConfigError, match=r"allowed keys: exactly \['targets'\]"):
        validation.check_model_features(
            feature_lengths=LENGTHS, feature_keys=("targets",), family="llama2"
        )
    validation.check_model_features(
        feature_lengths=LENGTHS, feature_keys=("inputs", "targets"), family="t5"
    )
    with pytest.raises(validation.ConfigError, match="needs an encoder-decoder"):
        validation.check_decoding(
            tasks=["mt_en_fr"], allowed=["mt_en_fr"], feature_keys=("targets",)
        )
    with pytest.raises(
        validation.ConfigError, match=r"DECODE_TASKS.*'mt_en_xx'.*allowed: mt_en_fr"
    ):
        validation.check_decoding(
            tasks=["mt_en_xx"], allowed=["mt_en_fr"], feature_keys=("inputs", "targets")
        )
    with pytest.raises(ValueError, match="DECODE_METHOD = 'sample'.*'greedy', 'beam'"):
        downstream.DecodeConfig(method="sample")


def test_downstream_helpers_tokenise_and_detokenise_as_seqio_does(tiny_data):
    from pipelines import vocab

    vocabulary = vocab.load_vocab(tiny_data["vocab"], extra_ids=100)
    rows = downstream.encode_inputs(vocabulary, ["All human beings", "x " * 40], length=32)
    ids = list(vocabulary.encode("All human beings"))
    assert len(ids) < 31
    assert rows[0, : len(ids) + 1].tolist() == ids + [1] and not rows[0, len(ids) + 1 :].any()
    assert rows[1, -1] == 1 and (rows[1] > 1).sum() == 31  # truncated, EOS kept last
    decoded = downstream.decode_outputs(vocabulary, np.array([ids + [1, 5, 6], ids + [0, 0, 0]]))
    assert decoded == ["All human beings", "All human beings"]
    assert downstream.target_lang("mt_en_zh") == "zh" and downstream.target_lang("span_en") == "en"
