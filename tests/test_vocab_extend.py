"""Vocabulary extension for a new language: the merged tokenizer keeps every old id,
the grown model keeps every old token's logits, and a CPT run starts from the grown checkpoint.

The base tokenizer is `tiny_data`'s English/French vocabulary (320 pieces), extended with
Chinese pieces trained on the UDHR fixture corpora.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
from conftest import random_params
from sentencepiece import sentencepiece_model_pb2 as model_pb2
from tiny_runs import tiny_kwargs

from convert import grown_init as grow_lib
from llama_jax import embedding_growth, sizes
from llama_jax import model as llama_model
from pipelines import vocab, vocab_extend
from pipelines.corpora import paths
from trainer import checkpoints, model_spec
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig

PIECES = 100


def _proto(path) -> model_pb2.ModelProto:
    proto = model_pb2.ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    return proto


def _lines(corpora, lang):
    text = paths.mono_file(corpora, lang, "validation").read_text(encoding="utf-8")
    return [t for t in text.split("\n") if t.strip()]


@pytest.fixture(scope="module")
def extended(tiny_data, tmp_path_factory):
    """`tiny_data`'s en/fr vocabulary extended with up to 100 Chinese pieces (by the CLI)."""
    from xlscale_cli.main import main

    out = tmp_path_factory.mktemp("ext") / "en_fr_zh"
    rc = main(
        ["tokenizer", "extend", "--base", tiny_data["vocab"], "--corpora", tiny_data["corpora"]]
        + ["--lang", "zh", "--pieces", str(PIECES), "--out", str(out), "--check-langs", "en", "fr"]
    )
    assert rc == 0
    return {**tiny_data, "extended": str(out.with_suffix(".model"))}


def test_merged_tokenizer_keeps_old_ids_and_shortens_the_new_language(extended):
    old, new = _proto(extended["vocab"]), _proto(extended["extended"])
    base = len(old.pieces)
    assert 0 < len(new.pieces) - base <= PIECES
    for i, piece in enumerate(old.pieces):  # every old piece: same id, string, score, type
        assert new.pieces[i] == piece, i
    assert new.trainer_spec.model_type == old.trainer_spec.model_type
    assert new.normalizer_spec == old.normalizer_spec
    floor = min(p.score for p in old.pieces if p.type == vocab_extend.NORMAL)
    added = new.pieces[base:]
    assert all(p.type == vocab_extend.NORMAL and p.score < floor for p in added)
    assert len({p.piece for p in new.pieces}) == len(new.pieces)

    before = spm.SentencePieceProcessor(model_file=extended["vocab"])
    after = spm.SentencePieceProcessor(model_file=extended["extended"])
    zh = _lines(extended["corpora"], "zh")
    assert sum(map(len, after.encode(zh))) < 0.8 * sum(map(len, before.encode(zh)))
    assert after.decode(after.encode(zh)) == zh
    # English: identical wherever the old tokenizer needed no byte fallback. A character the old
    # model could only spell in bytes may now have a piece of its own (e.g. a punctuation mark
    # the Chinese model learned): those lines may change, and only to fewer tokens.
    en = _lines(extended["corpora"], "en")
    identical = 0
    for text, old_ids, new_ids in zip(en, before.encode(en), after.encode(en), strict=True):
        if old_ids == new_ids:
            identical += 1
        else:
            assert any(before.is_byte(i) for i in old_ids), text
            assert len(new_ids) < len(old_ids)
    assert identical >= len(en) // 2
    info = vocab_extend.read_extension_info(extended["extended"])
    assert info["base_size"] == base and info["new_size"] == len(new.pieces)
    assert info["lang"] == "zh" and [a["id"] for a in info["added"]] == list(
        range(base, len(new.pieces))
    )
    assert (
        info["measurements"]["zh"]["tokens_per_char_after"]
        < (info["measurements"]["zh"]["tokens_per_char_before"])
    )
    assert (after.pad_id(), after.eos_id(), after.unk_id()) == (
        vocab.PAD_ID,
        vocab.EOS_ID,
        vocab.UNK_ID,
    )


def _logits(params, config, tokens):
    return jax.jit(llama_model.Llama(config).apply)({"params": params}, tokens)


def test_growth_keeps_old_logits_and_averages_subword_rows(extended):
    sources = vocab_extend.old_ids_of_new_pieces(old=extended["vocab"], new=extended["extended"])
    base = len(_proto(extended["vocab"]).pieces)
    assert min(sources) == base and any(len(ids) > 1 for ids in sources.values())
    old_sp = spm.SentencePieceProcessor(model_file=extended["vocab"])
    new_sp = spm.SentencePieceProcessor(model_file=extended["extended"])
    for new_id, old_ids in sources.items():  # the old ids spell the new piece, bytes included
        spelled = b"".join(
            bytes([int(old_sp.id_to_piece(i)[3:5], 16)])
            if old_sp.is_byte(i)
            else old_sp.id_to_piece(i).encode()
            for i in old_ids
        )
        assert spelled.decode() == new_sp.id_to_piece(new_id), new_id
    old_cfg = sizes.get_config("llama2_tiny", vocab_size=base, max_len=64)
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, base, (2, 16)), jnp.int32)
    shapes = llama_model.abstract_variables(old_cfg)["params"]
    params = random_params(shapes, np.random.default_rng(0), scale=0.5)  # Flax's init: seconds
    new_size = base + len(sources) + 3  # 3 rows of padding beyond the new pieces
    grown = embedding_growth.grow_params(
        params, new_vocab_size=new_size, base_size=base, new_pieces=sources
    )
    emb, head = (
        np.asarray(params["token_embedder"]["embedding"]),
        np.asarray(params["lm_head"]["kernel"]),
    )
    g_emb, g_head = grown["token_embedder"]["embedding"], grown["lm_head"]["kernel"]
    assert g_emb.shape == (new_size, emb.shape[1]) and g_head.shape == (head.shape[0], new_size)
    np.testing.assert_array_equal(g_emb[:base], emb)
    np.testing.assert_array_equal(g_head[:, :base], head)
    for new_id, old_ids in sources.items():
        np.testing.assert_allclose(g_emb[new_id], emb[old_ids].mean(0), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(
            g_head[:, new_id], head[:, old_ids].mean(1), rtol=1e-6, atol=1e-7
        )
    np.testing.assert_allclose(g_emb[-1], emb.mean(0), rtol=1e-6, atol=1e-7)
    assert grown["layers_0"] is params["layers_0"]

    old_logits = np.asarray(_logits(params, old_cfg, tokens))
    new_cfg = sizes.get_config("llama2_tiny", vocab_size=new_size, max_len=64)
    new_logits = np.asarray(_logits(grown, new_cfg, tokens))
    np.testing.assert_allclose(new_logits[..., :base], old_logits, rtol=0, atol=1e-6)

    # The documented alternative: every new row is the mean of all base rows.
    mean = embedding_growth.grow_params(
        params, new_vocab_size=new_size, base_size=base, new_pieces=sources, method="mean"
    )
    np.testing.assert_array_equal(mean["token_embedder"]["embedding"][:base], emb)
    np.testing.assert_allclose(
        mean["token_embedder"]["embedding"][base], emb.mean(0), rtol=1e-6, atol=1e-7
    )
    # A table with padding beyond the base tokenizer: new pieces take the padding ids.
    padded = embedding_growth.grow_rows(
        np.arange(12.0).reshape(6, 2), new_vocab_size=6, base_size=4, new_pieces={4: [1, 3]}
    )
    np.testing.assert_array_equal(padded[:4], np.arange(8.0).reshape(4, 2))
    np.testing.assert_array_equal(padded[4], [4.0, 5.0])
    np.testing.assert_array_equal(padded[5], [10.0, 11.0])


@pytest.fixture(scope="module")
def source_run(extended, tmp_path_factory):
    """A 'source run' whose checkpoint holds fresh tiny params with the base vocabulary (what is
    grown does not depend on training), and whose run.json records its VOCAB_PATH."""
    base = len(_proto(extended["vocab"]).pieces)
    run_dir = tmp_path_factory.mktemp("source")
    config = sizes.get_config("llama2_tiny", vocab_size=base, max_len=128)
    shapes = llama_model.abstract_variables(config)["params"]
    params = random_params(shapes, np.random.default_rng(1), scale=0.5)
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(run_dir), CheckpointConfig(async_save=False)
    )
    store.save(7, params=params, opt_state={"count": np.zeros(())}, train_state={})
    store.close()
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "model": "llama2_tiny",
                "family": "llama2",
                "fingerprint": {"data": {"vocab_path": extended["vocab"]}},
            }
        )
    )
    return {"dir": run_dir, "params": params, "base": base}


@pytest.mark.slow
def test_cpt_run_trains_from_the_grown_checkpoint(extended, source_run, tmp_path, seqio_state):
    from xlscale_cli.main import main

    grown_dir = tmp_path / "grown"
    rc = main(
        [
            "tokenizer",
            "grow-checkpoint",
            "--run",
            str(source_run["dir"]),
            "--vocab",
            extended["extended"],
            "--out",
            str(grown_dir),
        ]
    )
    assert rc == 0
    record = json.loads((grown_dir / "run.json").read_text())["init_vocab_extension"]
    new_size = len(_proto(extended["extended"]).pieces)
    assert record["source_step"] == 7 and record["vocab_size"] == new_size
    assert record["base_size"] == source_run["base"] and record["lang"] == "zh"

    saved = seqio_state.snapshot()
    try:
        kwargs = tiny_kwargs(
            {"vocab": extended["extended"], "corpora": extended["corpora"]},
            model=model_spec.ModelSpec(
                size="llama2_tiny", overrides={"vocab_size": new_size, "max_len": 128}
            ),
            train_steps=3,
            checkpoint=CheckpointConfig(period=3, keep_last=1),
            mesh=MeshConfig(num_devices=1),
            evaluation=EvalConfig(),
            run=train_lib.RunInfo(strategy="cpt", source_lang="en", target_lang="zh"),
            loop=LoopConfig(log_every=1),
        )
        kwargs["data"] = dataclasses.replace(
            kwargs["data"],
            mixture_or_task="lm_zh",
            langs=("zh",),
            task_feature_lengths={"targets": 32},
        )
        result = train_lib.train(
            model_dir=tmp_path / "cpt", init_checkpoint=str(grown_dir), **kwargs
        )
    finally:
        seqio_state.restore(saved)
    assert result.completed and result.step == 3
    run = json.loads((tmp_path / "cpt" / "run.json").read_text())
    assert run["init_vocab_extension"] == record
    assert run["init_step"] == 7 and run["init_params_hash"] == record["params_hash"]
    losses = [r["train/loss"] for r in map(json.loads, open(tmp_path / "cpt" / "metrics.jsonl"))]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_clear_errors(extended, source_run, tmp_path):
    # A vocabulary that does not extend the source's: the first differing id is named.
    other = vocab.train_vocab(
        corpora_dir=extended["corpora"],
        langs=["en", "zh"],
        out_prefix=tmp_path / "other",
        vocab_size=source_run["base"] + 40,
    )
    old_pieces, new_pieces = _proto(extended["vocab"]).pieces, _proto(other).pieces
    first = next(
        i
        for i, (a, b) in enumerate(zip(old_pieces, new_pieces, strict=False))
        if a.piece != b.piece
    )
    with pytest.raises(vocab_extend.VocabPrefixError, match=rf"id {first} is"):
        grow_lib.grow_checkpoint(
            source=str(source_run["dir"]), vocab_path=other, out_dir=tmp_path / "g1"
        )
    # A checkpoint with fewer vocabulary rows than the tokenizer it is said to use.
    with pytest.raises(ValueError, match="vocab size mismatch.*320 vocabulary rows"):
        grow_lib.grow_checkpoint(
            source=str(source_run["dir"]),
            vocab_path=extended["extended"],
            old_vocab_path=extended["extended"],
            out_dir=tmp_path / "g2",
        )
    # A CPT run whose model keeps the old vocabulary size cannot start from a grown checkpoint.
    grown = tmp_path / "g3"
    grow_lib.grow_checkpoint(
        source=f"{source_run['dir']}@7", vocab_path=extended["extended"], out_dir=grown
    )
    old_model = model_spec.build_model(
        model_spec.ModelSpec(size="llama2_tiny", overrides={"vocab_size": source_run["base"]})
    )
    abstract = old_model.abstract_variables()["params"]
    with pytest.raises(ValueError, match="token_embedder/embedding: checkpoint has shape"):
        checkpoints.check_init_checkpoint(str(grown), abstract_params=abstract)
    with pytest.raises(ValueError, match="new piece id 2 is outside"):
        embedding_growth.grow_rows(
            np.zeros((4, 2)), new_vocab_size=5, base_size=4, new_pieces={2: [1]}
        )
