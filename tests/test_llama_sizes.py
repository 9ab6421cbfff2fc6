"""The size table against the CPT paper's Table 4, the lookup, the recipe and `xlscale sizes`."""

import pytest

from llama_jax import sizes
from llama_jax.counting import param_counts
from xlscale_cli.main import main as xlscale_main

# Appendix D, Table 4 of Zheng et al. 2024 ("Breaking Language Barriers"), copied from the paper
# independently of llama_jax/sizes.py: size (M), hidden, intermediate, heads, layers.
PAPER_TABLE_4 = """
49 512 3072 8 8
66 576 3584 9 9
86 640 3584 10 10
105 640 3584 10 13
125 640 3584 10 16
137 768 4608 12 12
166 768 4608 12 15
194 768 4608 12 18
208 896 5120 14 14
234 896 5120 14 16
259 896 5120 14 18
301 1024 5632 16 16
334 1024 5632 16 18
368 1024 5632 16 20
512 1280 7168 10 18
591 1280 7168 10 21
616 1408 7680 11 18
670 1280 7168 10 24
711 1408 7680 11 21
766 1536 8704 12 19
806 1408 7680 11 24
879 1536 8704 12 22
992 1536 8704 12 25
1085 1792 9728 14 20
1239 1792 9728 14 23
1393 1792 9728 14 26
1542 2048 11264 16 22
1736 2176 11776 17 22
1743 2048 11264 16 25
1944 2048 11264 16 28
1963 2176 11776 17 25
2112 2304 12800 18 24
2191 2176 11776 17 28
2452 2304 12800 18 28
2791 2304 12800 18 32
2808 2560 13824 20 26
3227 2560 13824 20 30
3647 2560 13824 20 34
4016 2688 14848 22 34
4248 2688 14848 21 36
4657 2816 15360 22 36
5534 3072 16896 24 36
"""
PAPER_ROWS = [tuple(int(v) for v in line.split()) for line in PAPER_TABLE_4.strip().splitlines()]


def test_paper_table_has_42_rows_and_all_are_in_sizes():
    assert len(PAPER_ROWS) == 42
    paper_names = {name for name, row in sizes.SIZES.items() if row.nominal_m is not None}
    assert paper_names == {f"llama2_{m}m" for m, *_ in PAPER_ROWS}


@pytest.mark.parametrize("row", PAPER_ROWS, ids=[f"llama2_{r[0]}m" for r in PAPER_ROWS])
def test_paper_size_shapes_exact(row):
    nominal, hidden, intermediate, heads, layers = row
    config = sizes.get_config(f"llama2_{nominal}m")
    assert sizes.SIZES[f"llama2_{nominal}m"].nominal_m == nominal
    assert (config.d_model, config.d_ff, config.num_heads, config.num_layers) == (
        hidden,
        intermediate,
        heads,
        layers,
    )
    # LLaMA2 as the paper uses it: MHA (no GQA), its vocabulary and context, no fudged shapes.
    assert config.kv_heads == heads
    assert config.vocab_size == 36152
    assert config.max_len == 2048
    expected_head_dim = hidden // heads if hidden % heads == 0 else 128
    assert config.head_size == expected_head_dim


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="llama2_49m.*llama2_5534m.*llama2_tiny"):
        sizes.get_config("llama2_50m")


def test_overrides_apply_and_validate():
    config = sizes.get_config("llama2_tiny", vocab_size=101, scan_layers=True)
    assert (config.vocab_size, config.scan_layers, config.d_model) == (101, True, 32)
    with pytest.raises(ValueError, match="remat_policy"):
        sizes.get_config("llama2_tiny", remat_policy="sometimes")
    with pytest.raises(ValueError, match="divide"):
        sizes.get_config("llama2_tiny", num_kv_heads=3)


def test_cpu_demo_sizes_span_more_than_ten_x():
    counts = [
        param_counts(sizes.get_config(name)).non_embedding
        for name in sizes.SIZES
        if name.startswith("llama2_cpu_")
    ]
    assert len(counts) >= 4
    assert counts == sorted(counts)
    assert counts[-1] / counts[0] > 10


@pytest.mark.parametrize(
    "name, batch_tokens, batch_size",
    [
        ("llama2_49m", 2**20, 512),
        ("llama2_992m", 2**20, 512),
        ("llama2_1085m", 2**21, 1024),
        ("llama2_2452m", 2**21, 1024),
        ("llama2_2791m", 2**22, 2048),
        ("llama2_5534m", 2**22, 2048),
    ],
)
def test_paper_recipe_bands(name, batch_tokens, batch_size):
    recipe = sizes.paper_recipe(name)
    nominal = sizes.SIZES[name].nominal_m
    assert recipe.tokens == 20 * nominal * 10**6
    assert (recipe.batch_tokens, recipe.batch_size) == (batch_tokens, batch_size)
    assert recipe.train_steps == -(-recipe.tokens // batch_tokens)


def test_recipe_basis_ours_uses_exact_non_embedding_count():
    recipe = sizes.paper_recipe("llama2_49m", basis="ours")
    assert recipe.params == param_counts(sizes.get_config("llama2_49m")).non_embedding
    with pytest.raises(ValueError):
        sizes.paper_recipe("llama2_49m", basis="nominal")


def test_cli_prints_every_size_with_both_counts(capsys):
    assert xlscale_main(["sizes"]) == 0
    out = capsys.readouterr().out
    for name in sizes.SIZES:
        assert f"\n{name} " in out
    # the 49M row: paper label, our non-embedding and total counts, steps at 2048 context.
    line = next(line for line in out.splitlines() if line.startswith("llama2_49m "))
    counts = param_counts(sizes.get_config("llama2_49m"))
    assert f"{counts.non_embedding:,}" in line and f"{counts.total:,}" in line
    assert " 49 " in line and "1,048,576" in line and line.rstrip().endswith(" 935")
    assert "excludes the input embedding and the untied output projection" in out


def test_cli_unknown_name_fails_with_valid_names(capsys):
    assert xlscale_main(["sizes", "llama2_nope"]) == 2
    assert "llama2_49m" in capsys.readouterr().err
