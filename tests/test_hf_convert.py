"""Hugging Face / Meta LLaMA checkpoints in and out of xlscale.

The reference is transformers itself: a random `LlamaForCausalLM` with distinct dimensions and
grouped-query attention is saved with `save_pretrained`, imported, and must give the same float32
logits as `llama_jax`; exports must load back in transformers and generate what `trainer.infer`
generates. Tests that need torch/transformers skip cleanly without them (`pip install
'xlscale[hf]'`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import random_params
from flax.core import meta as nn_meta

from convert import hf_cache, hf_checkpoints, init_checkpoints, safetensors_files
from llama_jax import hf_config, hf_convert, sizes
from llama_jax.config import LlamaConfig
from llama_jax.counting import param_counts
from llama_jax.model import Llama, abstract_variables
from rundir import checksums
from trainer import checkpoints as ckpt_lib
from trainer import validation
from trainer.loop import LoopConfig

# Distinct sizes everywhere: vocab 61, d_model 48, 6 query heads of 8, 2 kv heads, d_ff 40.
HF_SHAPE = dict(
    vocab_size=61,
    hidden_size=48,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rope_theta=5000.0,
    rms_norm_eps=1e-5,
)
TOKENS = np.array([[3, 17, 60, 5, 42, 8, 8, 1, 33, 20, 11], [0, 59, 2, 7, 7, 31, 14, 50, 9, 6, 4]])


def _logits(params: dict, config: LlamaConfig, tokens: np.ndarray = TOKENS) -> np.ndarray:
    return np.asarray(Llama(config).apply({"params": params}, jnp.asarray(tokens)))


def _assert_logits_close(ours: np.ndarray, reference: np.ndarray) -> None:
    """Equal to 1e-5 relative to the logits' scale (float32)."""
    scale = float(np.abs(reference).max())
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5 * scale)


def _restore(directory: Path) -> dict:
    """The latest step's params as stored (host numpy, the stored dtype)."""
    return init_checkpoints.read_params(*init_checkpoints.resolve_step(os.fspath(directory)))


# --- pure numpy: no torch needed ----------------------------------------------------------


def _random_config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=61, d_model=48, d_ff=40, num_heads=6, num_kv_heads=2, num_layers=2
    )


def test_hf_mapping_round_trips_every_tensor_bit_exactly():
    config = _random_config()
    params = random_params(abstract_variables(config)["params"], np.random.default_rng(0))
    hf = dict(hf_convert.hf_tensors(params, config=config))
    assert hf["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 8, 48)
    assert hf["model.layers.0.self_attn.o_proj.weight"].shape == (48, 6 * 8)
    back = hf_convert.params_from_hf(hf.__getitem__, config=config)
    assert jax.tree.all(jax.tree.map(np.array_equal, back, params))
    # The documented mapping: q_proj.weight is query's kernel transposed, heads flattened.
    q = params["layers_1"]["attention"]["query"]
    np.testing.assert_array_equal(hf["model.layers.1.self_attn.q_proj.weight"], q.reshape(48, -1).T)


def test_layer_stacking_matches_the_models_scanned_layout():
    from llama_jax.model import stack_layer_params

    config = _random_config()
    params = random_params(abstract_variables(config)["params"], np.random.default_rng(0))
    stacked = hf_convert.stack_layers(params, config.num_layers)
    reference = stack_layer_params(params, config.num_layers)
    assert jax.tree.structure(stacked) == jax.tree.structure(reference)
    assert jax.tree.all(jax.tree.map(np.array_equal, stacked, reference))
    back = hf_convert.unstack_layers(stacked)
    assert jax.tree.all(jax.tree.map(np.array_equal, back, params))


def test_meta_permutation_is_the_inverse_of_transformers_permute():
    w = np.arange(16 * 5, dtype=np.float32).reshape(16, 5)  # 2 heads of 8 rows
    # transformers' convert_llama_weights_to_hf.permute, frozen here:
    hf = w.reshape(2, 16 // 2 // 2, 2, 5).transpose(0, 2, 1, 3).reshape(16, 5)
    np.testing.assert_array_equal(hf_convert.hf_permute(w, 2), hf)
    np.testing.assert_array_equal(hf_convert.meta_permute(hf, 2), w)
    # Meta pairs adjacent rows (0, 1) of a head; HF pairs rows i and i + hd/2.
    np.testing.assert_array_equal(hf[[0, 4]], w[[0, 1]])


def test_safetensors_files_read_back_what_they_write_in_every_dtype(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": rng.standard_normal((7,)).astype(ml_dtypes.bfloat16),
        "c": rng.standard_normal((2, 2, 2)).astype(np.float16),
    }
    safetensors_files.write_checkpoint(
        tmp_path / "sharded",
        specs=[(n, a.shape, a.dtype) for n, a in tensors.items()],
        tensor=tensors.__getitem__,
        max_shard_bytes=40,
    )
    files = safetensors_files.CheckpointFiles(tmp_path / "sharded")
    assert len(files.files()) == 2  # a (60 bytes) alone; b + c (14 + 16 bytes) together
    for name, array in tensors.items():
        read = files.get(name)
        assert read.dtype == array.dtype and files.shape(name) == array.shape
        np.testing.assert_array_equal(read, array)


def test_imported_size_reads_config_json_and_refuses_what_it_cannot_compute(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **HF_SHAPE}))
    config = sizes.get_config(f"hf:{tmp_path}")
    assert (config.vocab_size, config.d_model, config.kv_heads, config.head_size) == (61, 48, 2, 8)
    assert (config.rope_theta, config.norm_eps, config.max_len) == (5000.0, 1e-5, 64)
    validation.check_model_size(
        family="llama2", size=f"hf:{tmp_path}", allowed=["llama2_tiny"], prefixes=("hf:",)
    )
    with pytest.raises(validation.ConfigError, match="hf:"):
        validation.check_model_size(
            family="llama2", size="llama2_huge", allowed=["llama2_tiny"], prefixes=("hf:",)
        )
    with pytest.raises(FileNotFoundError, match="MODEL_SIZE 'hf:/nowhere'"):
        sizes.get_config("hf:/nowhere")
    scaled = {**HF_SHAPE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(ValueError, match="rope type 'llama3'"):
        hf_config.llama_fields(scaled)
    with pytest.raises(ValueError, match="hidden_act = 'gelu'"):
        hf_config.llama_fields({**HF_SHAPE, "hidden_act": "gelu"})


def test_init_checkpoint_hf_without_a_model_names_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="INIT_CHECKPOINT 'hf:.*config.json"):
        ckpt_lib.check_init_checkpoint(f"hf:{tmp_path}", abstract_params={})


# --- against transformers -----------------------------------------------------------------


def _hf_model(*, tied: bool, seed: int = 0, **shape):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        **{**HF_SHAPE, **shape}, tie_word_embeddings=tied, attn_implementation="eager"
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms start at 1: make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def _hf_logits(model, tokens: np.ndarray = TOKENS) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.float().numpy()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Two random models saved with save_pretrained: untied (GQA) and tied."""
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for tied in (False, True):
        model = _hf_model(tied=tied, seed=int(tied))
        path = root / ("tied" if tied else "untied")
        model.save_pretrained(path, safe_serialization=True)
        out[tied] = (path, model, _hf_logits(model))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_hf_checkpoint_imports_to_the_same_logits(hf_dirs, tmp_path, tied):
    path, _, reference = hf_dirs[tied]
    record = hf_checkpoints.hf_to_orbax(src=path, dst=tmp_path / "orbax")
    assert record["tied"] is tied and record["format"] == "hf"
    params = _restore(tmp_path / "orbax")
    assert record["params_hash"] == init_checkpoints.params_hash(params)
    config = sizes.get_config(f"hf:{path}")
    _assert_logits_close(_logits(params, config), reference)
    # The imported shape counts what the checkpoint holds (a tied one: plus its untied head).
    hf_total = sum(t.numel() for t in hf_dirs[tied][1].parameters())
    assert param_counts(config).total == hf_total + (config.vocab_size * config.d_model) * tied
    # The import directory names the shape too, and its run.json says where it came from.
    assert sizes.get_config(f"hf:{tmp_path / 'orbax'}") == config
    info = json.loads((tmp_path / "orbax" / "run.json").read_text())
    assert info["kind"] == hf_checkpoints.IMPORT_KIND and info["init_import"]["source"] == str(path)


@pytest.mark.slow
def test_init_checkpoint_hf_is_cached_and_shape_checked(hf_dirs, tmp_path, monkeypatch):
    from llama_jax.model import abstract_variables

    monkeypatch.setenv(hf_cache.CACHE_ENV, os.fspath(tmp_path / "cache"))
    path, _, _ = hf_dirs[False]
    config = sizes.get_config(f"hf:{path}")

    def abstract(cfg):
        return jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, np.float32),
            dict(nn_meta.unbox(abstract_variables(cfg)["params"])),
        )

    directory, step = ckpt_lib.check_init_checkpoint(f"hf:{path}", abstract_params=abstract(config))
    assert (directory.parent.parent, step) == (tmp_path / "cache", 0)
    mtime = os.stat(directory.parent / "run.json").st_mtime_ns
    ckpt_lib.check_init_checkpoint(f"hf:{path}", abstract_params=abstract(config))
    assert os.stat(directory.parent / "run.json").st_mtime_ns == mtime  # converted once
    # An entry without its integrity record (written by older code) is converted again.
    (directory / str(step) / checksums.MANIFEST_FILE).unlink()
    ckpt_lib.check_init_checkpoint(f"hf:{path}", abstract_params=abstract(config))
    assert checksums.has_manifest(directory / str(step))
    assert os.stat(directory.parent / "run.json").st_mtime_ns != mtime
    with pytest.raises(ValueError, match=r"lm_head/kernel: checkpoint has shape \(48, 61\)"):
        ckpt_lib.check_init_checkpoint(
            f"hf:{path}", abstract_params=abstract(config.replace(vocab_size=64))
        )


@pytest.mark.slow
def test_scanned_import_runs_a_scan_layers_model_to_the_same_logits(hf_dirs, tmp_path):
    path, _, reference = hf_dirs[False]
    record = hf_checkpoints.hf_to_orbax(src=path, dst=tmp_path / "scanned", scan_layers=True)
    params = _restore(tmp_path / "scanned")
    assert record["scan_layers"] and "layers" in params and "layers_0" not in params
    config = sizes.get_config(f"hf:{path}", scan_layers=True)
    _assert_logits_close(_logits(params, config), reference)
    # Exporting a scanned checkpoint unstacks it: the original tensors come back.
    hf_checkpoints.orbax_to_hf(src=os.fspath(tmp_path / "scanned"), dst=tmp_path / "hf")
    original = safetensors_files.CheckpointFiles(path)
    exported = safetensors_files.CheckpointFiles(tmp_path / "hf")
    assert sorted(exported.names()) == sorted(original.names())
    for name in original.names():
        np.testing.assert_array_equal(exported.get(name), original.get(name), err_msg=name)


def test_bfloat16_checkpoints_import_exactly_and_restore_as_float32(hf_dirs, tmp_path):
    import copy

    import torch

    model = copy.deepcopy(hf_dirs[False][1]).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16", safe_serialization=True)
    kept = hf_checkpoints.hf_to_orbax(src=tmp_path / "bf16", dst=tmp_path / "kept")
    wide = hf_checkpoints.hf_to_orbax(src=tmp_path / "bf16", dst=tmp_path / "f32", dtype="float32")
    assert (kept["dtype"], wide["dtype"]) == ("bfloat16", "float32")
    params = _restore(tmp_path / "kept")  # as stored
    assert {p.dtype for p in jax.tree.leaves(params)} == {np.dtype(ml_dtypes.bfloat16)}
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    config = sizes.get_config(f"hf:{tmp_path / 'bf16'}")
    for name, value in hf_convert.hf_tensors(params, config=config, dtype=np.float32):
        np.testing.assert_array_equal(value, state[name], err_msg=name)
    # A float32 run restores either directory to the same values, and hashes them as recorded.
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, np.float32), params)
    restored = [
        ckpt_lib.restore_init_params(os.fspath(tmp_path / d), abstract_params=abstract)[0]
        for d in ("kept", "f32")
    ]
    assert {p.dtype for p in jax.tree.leaves(restored[0])} == {np.dtype(np.float32)}
    hashes = {init_checkpoints.params_hash(r) for r in restored}
    assert hashes == {kept["params_hash"]} == {wide["params_hash"]}


def test_orbax_to_hf_to_orbax_is_bit_exact_and_loads_in_transformers(hf_dirs, tmp_path, tiny_data):
    from safetensors import safe_open
    from transformers import LlamaForCausalLM

    source, model, reference = hf_dirs[False]
    path = shutil.copytree(source, tmp_path / "with_tokenizer")
    shutil.copyfile(tiny_data["vocab"], path / "tokenizer.model")
    first = hf_checkpoints.hf_to_orbax(src=path, dst=tmp_path / "a")
    export = hf_checkpoints.orbax_to_hf(
        src=os.fspath(tmp_path / "a"), dst=tmp_path / "hf", max_shard_bytes=20_000
    )
    assert len(export["files"]) > 1  # sharded, with an index
    assert (tmp_path / "hf" / safetensors_files.INDEX_FILE).is_file()
    tokenizer = (tmp_path / "hf" / "tokenizer.model").read_bytes()
    assert tokenizer == Path(tiny_data["vocab"]).read_bytes()  # shipped through the import dir
    second = hf_checkpoints.hf_to_orbax(src=tmp_path / "hf", dst=tmp_path / "b")
    assert first["params_hash"] == export["params_hash"] == second["params_hash"]
    # The exported tensors are the original ones, read by the safetensors library itself.
    state = model.state_dict()
    for file in export["files"]:
        with safe_open(tmp_path / "hf" / file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is no mapping
                assert bool((f.get_tensor(name) == state[name]).all()), name
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    np.testing.assert_array_equal(_hf_logits(loaded.eval()), reference)


@pytest.mark.slow
@pytest.mark.parametrize("num_shards", [1, 2])
def test_meta_layout_imports_to_the_same_logits(hf_dirs, tmp_path, tiny_data, num_shards):
    import torch

    path, model, reference = hf_dirs[False]
    config = sizes.get_config(f"hf:{path}")
    # Meta's layout from the HF tensors: the inverse of transformers' permute on q and k.
    meta = {}
    for name, tensor in model.state_dict().items():
        meta_name, _ = hf_convert.hf_to_meta(name, tensor.numpy(), config=config)
        w = tensor.clone()
        heads = {"wq": config.num_heads, "wk": config.kv_heads}.get(meta_name.split(".")[-2])
        if heads is not None:
            rows, cols = w.shape
            w = w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)
        meta[meta_name] = w
    shards = [{} for _ in range(num_shards)]
    for name, w in meta.items():
        axis = hf_convert.META_SHARD_AXES[hf_convert.meta_suffix(name)]
        for shard, part in zip(
            shards, [w] * num_shards if axis is None else w.chunk(num_shards, axis), strict=True
        ):
            shard[name] = part.clone()
    src = tmp_path / "meta"
    src.mkdir()
    for i, shard in enumerate(shards):
        torch.save(shard, src / f"consolidated.{i:02d}.pth")
    (src / "params.json").write_text(
        json.dumps(
            {
                "dim": 48,
                "n_layers": 2,
                "n_heads": 6,
                "n_kv_heads": 2,
                "vocab_size": -1,
                "norm_eps": 1e-5,
                "rope_theta": 5000.0,
                "multiple_of": 8,
            }
        )
    )
    shutil.copyfile(tiny_data["vocab"], tmp_path / "tokenizer.model")  # Meta's: one folder up
    record = hf_checkpoints.meta_to_orbax(src=src, dst=tmp_path / "orbax")
    assert record["format"] == "meta" and (tmp_path / "orbax" / "tokenizer.model").is_file()
    _assert_logits_close(_logits(_restore(tmp_path / "orbax"), config), reference)


def test_convert_command_imports_and_reports_a_bad_source(hf_dirs, tmp_path, capsys):
    from xlscale_cli import main

    path, _, reference = hf_dirs[False]
    assert main.main(["convert", "hf-to-orbax", os.fspath(path), os.fspath(tmp_path / "o")]) == 0
    assert "INIT_CHECKPOINT=" in capsys.readouterr().out
    _assert_logits_close(
        _logits(_restore(tmp_path / "o"), sizes.get_config(f"hf:{path}")), reference
    )
    assert (
        main.main(["convert", "hf-to-orbax", os.fspath(tmp_path), os.fspath(tmp_path / "x")]) == 2
    )
    assert f"{tmp_path}/config.json: no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_cpt_from_an_imported_model_exports_and_generates_what_infer_does(
    tiny_data, tmp_path, monkeypatch, seqio_registry
):
    torch = pytest.importorskip("torch")
    LlamaForCausalLM = pytest.importorskip("transformers").LlamaForCausalLM

    from pipelines import vocab as vocab_lib
    from trainer import infer as infer_lib
    from trainer import model_spec
    from trainer import train as train_lib
    from trainer.checkpoints import CheckpointConfig
    from trainer.data import DataConfig
    from trainer.partitioning import MeshConfig
    from trainer.schedules import ScheduleConfig

    monkeypatch.setenv(hf_cache.CACHE_ENV, os.fspath(tmp_path / "cache"))
    published = tmp_path / "published"  # a "published" English model with its tokenizer
    source = _hf_model(
        tied=False,
        vocab_size=512,
        hidden_size=32,
        intermediate_size=88,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    source.save_pretrained(published, safe_serialization=True)
    # A published LLaMA's own tokenizer layout (unk 0, <s> 1, </s> 2, no pad), trained here on
    # the fixture: its <s> is the start token of every training document, prompt and export.
    _llama_tokenizer(tiny_data, published / "tokenizer.model")
    spec = model_spec.ModelSpec(size=f"hf:{published}")
    vocab_path = os.fspath(published / "tokenizer.model")
    result = train_lib.train(
        model_dir=tmp_path / "cpt",
        model=spec,
        data=DataConfig(
            mixture_or_task="lm_fr",
            task_feature_lengths={"targets": 64},
            batch_size=8,
            vocab_path=vocab_path,
            corpora_dir=tiny_data["corpora"],
            langs=("en", "fr"),
        ),
        train_steps=3,
        schedule=ScheduleConfig(peak=3e-3),
        checkpoint=CheckpointConfig(period=3),
        mesh=MeshConfig(num_devices=1),
        run=train_lib.RunInfo(strategy="cpt", source_lang="en", target_lang="fr"),
        init_checkpoint=f"hf:{published}",
        loop=LoopConfig(log_every=1),
    )
    assert result.completed
    from pipelines import streams

    assert streams.decoder_start_id("lm_fr") == 1
    (batch,) = streams.eval_batches(task="lm_fr", sequence_length=64, batch_size=4, max_tokens=64)
    starts = (batch["decoder_positions"] == 0) & (batch["decoder_segment_ids"] > 0)
    assert starts.any() and (batch["decoder_input_tokens"][starts] == 1).all()
    run = json.loads((tmp_path / "cpt" / "run.json").read_text())
    record = run["init_import"]
    assert record["source"] == os.fspath(published.resolve()) and record["format"] == "hf"
    assert run["init_params_hash"] == record["params_hash"]
    assert run["params_total"] == sum(p.numel() for p in source.parameters())
    assert Path(run["init_checkpoint"]).parent == tmp_path / "cache"

    hf_checkpoints.orbax_to_hf(src=os.fspath(tmp_path / "cpt"), dst=tmp_path / "export")
    assert (tmp_path / "export" / "tokenizer.model").read_bytes() == Path(vocab_path).read_bytes()
    exported = LlamaForCausalLM.from_pretrained(tmp_path / "export").eval()
    prompts = ["Everyone has the right", "Tous les"]
    decoded = infer_lib.infer(
        model_dir=tmp_path / "infer",
        model=spec,
        vocab_path=vocab_path,
        source=infer_lib.InferSource(prompts=prompts),
        checkpoint=os.fspath(tmp_path / "cpt"),
        decoding=infer_lib.InferDecoding(max_decode_len=24, batch_size=2),
        mesh=MeshConfig(num_devices=1),
    )
    # The exported directory is itself a size and an INIT_CHECKPOINT, decoding the same tokens.
    from_export = infer_lib.infer(
        model_dir=tmp_path / "infer_export",
        model=model_spec.ModelSpec(size=f"hf:{tmp_path / 'export'}"),
        vocab_path=os.fspath(tmp_path / "export" / "tokenizer.model"),
        source=infer_lib.InferSource(prompts=prompts),
        checkpoint=f"hf:{tmp_path / 'export'}",
        decoding=infer_lib.InferDecoding(max_decode_len=24, batch_size=2),
        mesh=MeshConfig(num_devices=1),
    )
    assert [r["tokens"] for r in from_export] == [r["tokens"] for r in decoded]
    vocabulary = vocab_lib.load_vocab(vocab_path)
    eos = int(vocabulary.eos_id)
    assert (exported.config.bos_token_id, exported.config.eos_token_id, eos) == (1, 2, 2)
    for prompt, ours in zip(prompts, decoded, strict=True):
        # Training put <s> in front of every document and trainer.infer in front of every
        # prompt, as transformers does: generation starts from [<s>, *prompt].
        ids = [exported.config.bos_token_id, *vocabulary.encode(prompt)]
        with torch.no_grad():
            out = exported.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones((1, len(ids)), dtype=torch.long),  # 0 is no padding here
                max_new_tokens=24 - (len(ids) - 1),
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=0,
            )[0, len(ids) :].tolist()
        expected = []
        for token in out:
            if token in (eos, 0):
                break
            expected.append(token)
        assert len(ours["tokens"]) >= 3
        assert ours["tokens"] == expected, prompt


def _llama_tokenizer(tiny_data, path: Path) -> Path:
    """A SentencePiece model in LLaMA's id layout, trained on the fixture's en and fr text."""
    import sentencepiece as spm

    from pipelines.corpora import paths

    files = [
        os.fspath(paths.mono_file(tiny_data["corpora"], lang, "train")) for lang in ("en", "fr")
    ]
    spm.SentencePieceTrainer.train(
        input=",".join(files),
        model_prefix=os.fspath(path.with_suffix("")),
        vocab_size=320,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return path


def test_a_llama_layout_tokenizer_can_be_a_runs_vocabulary(tmp_path):
    import sentencepiece as spm

    from pipelines import vocab as vocab_lib

    text = tmp_path / "text.txt"
    text.write_text("All human beings are born free and equal in dignity and rights.\n" * 50)
    spm.SentencePieceTrainer.train(
        input=os.fspath(text),
        model_prefix=os.fspath(tmp_path / "llama"),
        vocab_size=28,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    vocabulary = vocab_lib.load_vocab(tmp_path / "llama.model")
    assert (vocabulary.eos_id, vocabulary.unk_id) == (2, 0)
    spm.SentencePieceTrainer.train(
        input=os.fspath(text),
        model_prefix=os.fspath(tmp_path / "odd"),
        vocab_size=28,
        unk_id=3,
        bos_id=1,
        eos_id=2,
        pad_id=0,
        minloglevel=2,
    )
    with pytest.raises(ValueError, match="pad/eos/unk = 0/2/3 are no known layout; allowed: t5"):
        vocab_lib.load_vocab(tmp_path / "odd.model")


def test_orbax_to_hf_keeps_the_imported_models_token_ids_and_generation_config(hf_dirs, tmp_path):
    # A model without tokenizer.model used to come back with bos 0 and eos
    # null, and without its generation_config.json, so `generate` behaved differently.
    source = shutil.copytree(hf_dirs[False][0], tmp_path / "published")
    original = json.loads((source / "config.json").read_text())
    generation = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3, "max_length": 40}
    (source / "generation_config.json").write_text(json.dumps(generation))
    assert not (source / "tokenizer.model").exists()
    hf_checkpoints.hf_to_orbax(src=source, dst=tmp_path / "orbax")
    hf_checkpoints.orbax_to_hf(src=os.fspath(tmp_path / "orbax"), dst=tmp_path / "hf")
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    assert [exported[k] for k in ids] == [original.get(k) for k in ids]
    assert (original["bos_token_id"], original["eos_token_id"]) == (1, 2)
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text()) == generation


def test_orbax_to_hf_writes_a_generation_config_from_the_runs_vocabulary(
    hf_dirs, tmp_path, tiny_data
):
    from pipelines import vocab as vocab_lib

    hf_checkpoints.hf_to_orbax(src=hf_dirs[False][0], dst=tmp_path / "orbax")
    hf_checkpoints.orbax_to_hf(
        src=os.fspath(tmp_path / "orbax"), dst=tmp_path / "hf", vocab_path=tiny_data["vocab"]
    )
    vocabulary = vocab_lib.load_vocab(tiny_data["vocab"])  # xlscale's layout: pad 0, eos 1
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    expected = {"bos_token_id": 0, "eos_token_id": int(vocabulary.eos_id), "pad_token_id": 0}
    assert {k: config[k] for k in expected} == expected
    assert {k: generation[k] for k in expected} == expected


def test_convert_advice_names_absolute_paths_when_given_relative_ones(
    hf_dirs, tmp_path, monkeypatch, capsys
):
    # INIT_CHECKPOINT='orbax' as advised failed at the first save.
    from xlscale_cli import main

    shutil.copytree(hf_dirs[False][0], tmp_path / "published")
    monkeypatch.chdir(tmp_path)
    assert main.main(["convert", "hf-to-orbax", "published", "orbax"]) == 0
    out = capsys.readouterr().out
    dst = tmp_path / "orbax"
    assert f"wrote {dst} " in out
    assert f"INIT_CHECKPOINT='{dst}' MODEL_SIZE='hf:{dst}'" in out
