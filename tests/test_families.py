"""The model-family protocol (`modeling.family`): both families satisfy it, their counts agree
with the initialised trees, and the registry imports a family only when asked."""

import subprocess
import sys

import jax
import pytest

from llama_jax import counting as llama_counting
from modeling import family as family_lib
from trainer import model_spec, recipes, validation

# Tiny shapes of each family, with distinct dimensions.
TINY = {"llama2": ("llama2_tiny", {"vocab_size": 96}), "t5": ("t5_tiny", {"vocab_size": 112})}


@pytest.mark.parametrize("name", sorted(family_lib.FAMILIES))
def test_every_family_satisfies_the_protocol(name):
    family = family_lib.get(name)
    assert isinstance(family, family_lib.ModelFamily)
    assert family.name == name
    assert family.feature_keys[-1] == "targets"
    assert TINY[name][0] in family.sizes()
    assert family.axis_rules()  # non-empty rules, as the partitioner needs


def test_families_differ_where_the_papers_do():
    llama, t5 = family_lib.get("llama2"), family_lib.get("t5")
    assert (llama.feature_keys, llama.default_seq_len) == (("targets",), 2048)
    assert (t5.feature_keys, t5.default_seq_len) == (("inputs", "targets"), 512)
    assert (
        llama.nominal_params("llama2_49m") == 49e6 and llama.nominal_params("llama2_tiny") is None
    )
    assert t5.paper_recipe("t5_770m", seq_len=512) is None


@pytest.mark.parametrize("name", sorted(TINY))
def test_counts_agree_with_the_initialised_tree(name):
    size, overrides = TINY[name]
    family = family_lib.get(name)
    wrapper = model_spec.build_model(
        model_spec.ModelSpec(family=name, size=size, overrides=overrides)
    )
    config = family.get_config(size, **overrides)
    assert wrapper.family == name and wrapper.feature_keys == family.feature_keys
    params = wrapper.abstract_variables()["params"]
    total, non_embedding = family.param_counts(config)
    assert wrapper.param_counts() == (total, non_embedding)
    assert llama_counting.count_tree(params) == total
    embedding = config.vocab_size * config.d_model
    assert 0 < non_embedding <= total - embedding
    six_n, with_attention = family.flops_per_token(config, seq_len=16)
    assert wrapper.flops_per_token(seq_len=16) == (six_n, with_attention)
    assert 0 < six_n < with_attention <= family.cost_per_token(config, seq_len=16)


def test_decoder_only_flops_are_six_n_plus_causal_attention():
    family = family_lib.get("llama2")
    config = family.get_config("llama2_tiny")
    _, non_embedding = family.param_counts(config)
    six_n, with_attention = family.flops_per_token(config, seq_len=32)
    assert six_n == 6 * non_embedding
    heads_width = config.num_heads * config.head_size
    assert with_attention - six_n == 6 * config.num_layers * 32 * heads_width
    output = 6 * config.d_model * config.vocab_size
    assert family.cost_per_token(config, seq_len=32) == with_attention + output


def test_unknown_family_names_the_allowed_ones():
    with pytest.raises(ValueError, match="'gpt'.*llama2, t5"):
        family_lib.get("gpt")
    with pytest.raises(ValueError, match="'gpt'.*llama2"):
        model_spec.build_model(model_spec.ModelSpec(family="gpt", size="x"))


def test_paper_batch_size_asks_the_family():
    # CPT paper bands: 1M tokens up to 1B parameters, 2M to 2.5B, 4M above (2^20 ... 2^22).
    assert recipes.paper_batch_size(model_size="llama2_992m", seq_len=2048) == 512
    assert recipes.paper_batch_size(model_size="llama2_1239m", seq_len=2048) == 1024
    assert recipes.paper_batch_size(model_size="llama2_5534m", seq_len=1024) == 4096
    with pytest.raises(validation.ConfigError, match="MODEL_SIZE.*llama2_49m"):
        recipes.paper_batch_size(model_size="llama2_7b", seq_len=2048)
    with pytest.raises(validation.ConfigError, match="BATCH_SIZE"):
        recipes.paper_batch_size(model_size="t5_770m", seq_len=512, family="t5")


def test_registry_imports_no_family_until_asked():
    code = (
        "import sys\n"
        "from modeling import family\n"
        "family.names(); family.check_name('t5')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('llama_jax', 't5_jax'))))\n"
        "family.get('t5')\n"
        "print('t5_jax.family' in sys.modules, 'llama_jax.family' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split("\n")[:2] == ["[]", "True False"]


def test_a_new_family_is_one_registry_line(tmp_path, monkeypatch):
    (tmp_path / "toy_family.py").write_text(
        "from t5_jax.family import T5Family\n"
        "class Toy(T5Family):\n"
        "    name = 'toy'\n"
        "FAMILY = Toy()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = {**family_lib.FAMILIES, "toy": "toy_family"}
    toy = family_lib.get("toy", registry=registry)
    assert toy.name == "toy" and isinstance(toy, family_lib.ModelFamily)
    with pytest.raises(ValueError, match="toy"):
        family_lib.get("gpt", registry=registry)


def test_wrappers_share_one_loss_over_their_logits():
    # `loss_fn` and `score_batch` live once on the base class; each kind defines `_logits`.
    import jax.numpy as jnp

    from modeling.models import DecoderOnlyModel, EncoderDecoderModel, LossOutput, TransformerModel

    for cls in (DecoderOnlyModel, EncoderDecoderModel):
        assert issubclass(cls, TransformerModel)
        assert cls.loss_fn is TransformerModel.loss_fn
        assert cls.score_batch is TransformerModel.score_batch
        assert cls._logits is not TransformerModel._logits
    out = LossOutput(loss_sum=jnp.ones(()), z_loss_sum=jnp.zeros(()), weight_sum=jnp.ones(()))
    assert len(jax.tree_util.tree_leaves(out)) == 3  # a pytree, as the jitted steps return it


def test_attention_kernel_reaches_both_configs_and_overrides_win():
    from trainer import model_spec

    for family, size in (("llama2", "llama2_tiny"), ("t5", "t5_tiny")):
        spec = model_spec.ModelSpec(family=family, size=size, attention_kernel="splash")
        assert model_spec.build_model(spec).config.attention_kernel == "splash"
        spec = model_spec.ModelSpec(
            family=family,
            size=size,
            attention_kernel="splash",
            overrides={"attention_kernel": "xla"},
        )
        assert model_spec.build_model(spec).config.attention_kernel == "xla"
        with pytest.raises(ValueError, match="attention_kernel must be one of"):
            model_spec.build_model(
                model_spec.ModelSpec(family=family, size=size, attention_kernel="flash")
            )
