"""Parameter counts and FLOPs per token against the initialised parameter trees."""

import math

import jax
import jax.numpy as jnp
import pytest
from flax.linen import partitioning as nn_partitioning

from llama_jax.config import LlamaConfig
from llama_jax.counting import (
    count_tree,
    embedding_paths,
    flops_per_token,
    matmul_flops_per_token,
    param_counts,
)
from llama_jax.model import Llama
from llama_jax.sizes import get_config
from modeling import axes

TINY = LlamaConfig(vocab_size=61, d_model=24, d_ff=40, num_heads=6, num_kv_heads=2, num_layers=3)


def _abstract_variables(config: LlamaConfig, length: int = 8):
    tokens = jax.ShapeDtypeStruct((1, length), jnp.int32)
    return jax.eval_shape(lambda t: Llama(config).init(jax.random.PRNGKey(0), t), tokens)


def _check_counts(config, params):
    counts = param_counts(config)
    embedding = sum(math.prod(params[m][p].shape) for m, p in embedding_paths())
    assert count_tree(params) == counts.total
    assert embedding == counts.embedding == 2 * config.vocab_size * config.d_model
    assert counts.non_embedding == counts.total - counts.embedding


@pytest.mark.parametrize("scan", [False, True])
def test_counts_equal_initialised_tree(scan):
    config = TINY.replace(scan_layers=scan)
    # The abstract init has exactly the real init's shapes, without compiling anything.
    _check_counts(config, _abstract_variables(config)["params"])


@pytest.mark.slow
def test_real_init_has_counted_tree_and_fan_in_scales():
    config = TINY.replace(vocab_size=257, d_model=64, d_ff=96, num_heads=4, num_kv_heads=2)
    # Optimisation level 0 only shortens XLA:CPU's slow compile of jax.random; values are equal.
    init = jax.jit(Llama(config).init, compiler_options={"xla_backend_optimization_level": 0})
    params = init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    _check_counts(config, params)
    layer = params["layers_2"]
    assert float(jnp.std(params["token_embedder"]["embedding"])) == pytest.approx(1.0, rel=0.05)
    for kernel, fan_in in [
        (layer["attention"]["query"], 64),
        (layer["attention"]["out"], 4 * 16),
        (layer["mlp"]["w1"], 64),
        (layer["mlp"]["w2"], 96),
        (params["lm_head"]["kernel"], 64),
    ]:
        assert float(jnp.std(kernel)) == pytest.approx(fan_in**-0.5, rel=0.15)
    assert bool(jnp.all(layer["ffn_norm"]["scale"] == 1.0))


def test_counts_with_explicit_head_dim():
    config = TINY.replace(head_dim=6, num_kv_heads=None)  # attention width 36 != d_model 24
    _check_counts(config, _abstract_variables(config)["params"])


@pytest.mark.parametrize("name", ["llama2_49m", "llama2_1085m", "llama2_4016m", "llama2_5534m"])
def test_counts_equal_paper_size_trees_abstractly(name):
    config = get_config(name, scan_layers=True)  # tracing one scanned block keeps this fast
    variables = _abstract_variables(config)
    _check_counts(config, variables["params"])
    # Exact count for the smallest size by hand: 8 * (4*512^2 + 3*512*3072 + 2*512) + 512.
    if name == "llama2_49m":
        assert param_counts(config).non_embedding == 46_146_048


def test_every_parameter_has_logical_axes_of_matching_rank():
    variables = _abstract_variables(TINY.replace(scan_layers=True))
    names = nn_partitioning.get_axis_names(variables["params_axes"])
    flat_params = jax.tree_util.tree_leaves_with_path(variables["params"])
    flat_names = dict(
        jax.tree_util.tree_leaves_with_path(
            names, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
        )
    )
    assert len(flat_params) == len(flat_names)
    for path, leaf in flat_params:
        spec = flat_names[path]
        assert len(spec) == leaf.ndim, path
        assert set(spec) <= set(axes.ALL_AXES), path
    assert tuple(flat_names[next(p for p, _ in flat_params if "w1" in str(p))]) == (
        axes.LAYERS,
        axes.EMBED,
        axes.MLP,
    )


def test_flops_per_token_formulas():
    config = get_config("llama2_49m")
    flops = flops_per_token(config, seq_len=2048)
    assert flops.six_n == 6 * 46_146_048
    # PaLM appendix B, 12*L*H*Q*T halved for causal attention: 6 * 8 layers * 2048 * 8 * 64.
    assert flops.with_attention == 6 * 46_146_048 + 6 * 8 * 2048 * 8 * 64
    assert matmul_flops_per_token(config, seq_len=2048) == flops.with_attention + 6 * 512 * 36152
    assert flops_per_token(config, seq_len=1024).with_attention < flops.with_attention
