"""Evaluation on prepared data: a validation split prepared once (`xlscale data prepare --split
validation`) gives exactly the eval batches of the seqio path, array by array, for an LM task and
a translation task; the vocabulary a prepared run reads with SentencePiece agrees with seqio's;
and a run on prepared data whose eval task has no prepared validation split is refused, naming
PREPARED_DATA, the missing directory and the command that prepares it."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from prepared_runs import prepare_splits, tiny_registration

from pipelines import mixture_tables, mixtures, streams
from pipelines import vocab as vocab_lib
from pipelines.prepared import eval_batches as prepared_eval
from pipelines.prepared import manifest as manifest_lib
from pipelines.prepared import packing, shards
from trainer import data as data_lib
from trainer import validation
from trainer.data import DataConfig, EvalConfig

TASKS = ("lm_en", "mt_en_fr")


@pytest.fixture(scope="module")
def prepared(tiny_data, seqio_state, tmp_path_factory):
    """The validation splits of `TASKS` prepared from the tiny corpora (one shard each), and
    the tasks left registered for the seqio path (restored after the module)."""
    saved = seqio_state.snapshot()
    out = tmp_path_factory.mktemp("prepared_eval")
    tiny_registration(tiny_data).register()
    mixtures.register_mixtures()
    for task in TASKS:
        for split in ("validation", "train"):  # train: longer, so packing spans many windows
            prepare_splits(out, [task], split=split, num_shards=1)
    yield out
    streams.clear_caches()
    seqio_state.restore(saved)


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs) > 0
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert sorted(a) == sorted(b), i
        for key in b:
            assert a[key].dtype == b[key].dtype, (i, key)
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"batch {i} {key}")


def _prepared_batches(root, tiny_data, task, split="validation", **kwargs):
    info = vocab_lib.vocab_info(tiny_data["vocab"])
    directory = os.path.join(root, manifest_lib.task_dir_name(task, split))
    with shards.PreparedDataset.open(directory) as dataset:
        return prepared_eval.eval_batches(
            dataset, eos_id=info.eos_id, start_id=info.start_id, **kwargs
        )


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", [None, 100])
@pytest.mark.parametrize("length,batch", [(32, 2), (32, 5), (64, 8)])
def test_lm_eval_batches_equal_the_seqio_path(prepared, tiny_data, length, batch, max_tokens):
    kwargs = dict(sequence_length=length, batch_size=batch, max_tokens=max_tokens)
    theirs = streams.eval_batches(task="lm_en", split="validation", **kwargs)
    ours = _prepared_batches(prepared, tiny_data, "lm_en", **kwargs)
    _assert_same(ours, theirs)
    # The last batch is padded (weight 0, task id -1) as the seqio path pads it.
    assert (ours[-1]["decoder_task_ids"] == -1).any()


@pytest.mark.parametrize("max_tokens", [None, 1000])
def test_lm_eval_batches_over_many_packing_windows_equal_the_seqio_path(
    prepared, tiny_data, max_tokens
):
    kwargs = dict(sequence_length=8, batch_size=16, max_tokens=max_tokens)
    theirs = streams.eval_batches(task="lm_en", split="train", **kwargs)
    ours = _prepared_batches(prepared, tiny_data, "lm_en", split="train", **kwargs)
    if max_tokens is None:  # more rows than a window has examples: several windows packed
        assert sum(len(b["decoder_target_tokens"]) for b in ours) > packing.PACK_WINDOW
    _assert_same(ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("split", ["validation", "train"])
@pytest.mark.parametrize("max_tokens", [None, 60])
def test_translation_eval_batches_equal_the_seqio_path(prepared, tiny_data, split, max_tokens):
    kwargs = dict(
        sequence_length={"inputs": 48, "targets": 16}, batch_size=3, max_tokens=max_tokens
    )
    theirs = streams.eval_batches(task="mt_en_fr", split=split, **kwargs)
    ours = _prepared_batches(prepared, tiny_data, "mt_en_fr", split=split, **kwargs)
    _assert_same(ours, theirs)


def test_the_vocabulary_read_without_seqio_agrees_with_seqios(tiny_data):
    seqio_vocab = vocab_lib.load_vocab(tiny_data["vocab"], extra_ids=100)
    info = vocab_lib.vocab_info(tiny_data["vocab"], extra_ids=100)
    assert info.vocab_size == seqio_vocab.vocab_size
    assert info.eos_id == seqio_vocab.eos_id
    assert info.extra_ids == seqio_vocab.extra_ids
    assert info.start_id == vocab_lib.start_id(seqio_vocab) == vocab_lib.start_id(info)
    assert info.sha256 == shards.vocab_sha256(tiny_data["vocab"])


def test_mixture_tables_agree_with_the_seqio_registry(prepared):
    for name in ("cpt_fr_replay_en_20", "cpt_fr_replay_en_0", "lm_en"):
        assert mixture_tables.components(name) == mixtures.component_names(name)
        assert mixture_tables.fractions(name) == pytest.approx(mixtures.token_fractions(name))


def _config(tiny_data, root) -> DataConfig:
    return DataConfig(
        mixture_or_task="lm_en",
        task_feature_lengths={"targets": 64},
        batch_size=8,
        vocab_path=tiny_data["vocab"],
        corpora_dir=tiny_data["corpora"],
        prepared_dir=os.fspath(root),
    )


def test_an_eval_task_without_a_prepared_validation_split_is_refused(prepared, tiny_data):
    config = _config(tiny_data, prepared)
    data_lib.check_prepared_eval(config, EvalConfig(tasks=("lm_en",)))  # prepared: accepted
    with pytest.raises(validation.ConfigError) as refused:
        data_lib.check_prepared_eval(config, EvalConfig(tasks=("lm_fr",)))
    text = str(refused.value)
    assert "PREPARED_DATA" in text
    assert os.path.join(os.fspath(prepared), "lm_fr@validation") in text
    assert "xlscale data prepare --task lm_fr --split validation --shards 1" in text


def test_an_eval_split_in_several_shards_is_refused(prepared, tiny_data, tmp_path):
    prepare_splits(tmp_path, ["lm_en"], split="validation", num_shards=2)
    config = dataclasses.replace(_config(tiny_data, tmp_path))
    with pytest.raises(validation.ConfigError, match="2 shards.*--shards 1"):
        data_lib.check_prepared_eval(config, EvalConfig(tasks=("lm_en",)))


def test_validation_and_train_splits_of_a_task_sit_side_by_side():
    assert manifest_lib.task_dir_name("lm_en", "train") == "lm_en"
    assert manifest_lib.task_dir_name("lm_en", "validation") == "lm_en@validation"


def test_data_prepare_prepares_a_validation_split_in_one_shard_by_default():
    from xlscale_cli import data as data_cli

    assert data_cli.default_shards("validation") == 1
    assert data_cli.default_shards("train") == data_cli.DEFAULT_SHARDS
