"""One token budget per recipe: the sweep's `[budget]` and the trainer's gin path give a run the
same steps, because the N that tokens-per-parameter multiplies is one setting (`PARAM_BASIS`,
`modeling.family.PARAM_BASES`) that the sweep binds and the trainer records.

Pure computations (manifest expansion, gin parsing, parameter counting): nothing is compiled.
"""

from __future__ import annotations

import math

import gin
import pytest

from launch import sweep
from llama_jax import sizes
from modeling import family as family_lib
from trainer import fingerprint, gin_entry, jobs, validation

pytestmark = pytest.mark.usefixtures("clean_gin")

LLAMA = family_lib.get("llama2")
PAPER_SIZES = [name for name in sizes.SIZES if LLAMA.nominal_params(name) is not None]


def _macro(name: str):
    value = gin_entry.macro_value(name)
    return value.scoped_configurable_fn() if hasattr(value, "scoped_configurable_fn") else value


def gin_steps(size: str, *, batch_size: int | None = None, basis: str | None = None) -> int:
    """The steps `trainer.train` computes for `size` from experiments/cpt_source_en.gin (the paper
    recipe, TRAIN_STEPS None): its BATCH_SIZE, TOKENS_PER_PARAM and PARAM_BASIS as gin resolves
    them (or as given), N from the model's counts (`jobs.plan_job`'s arguments)."""
    extra = [f"--gin.PARAM_BASIS={basis!r}"] if basis else []
    gin_entry.parse(
        [
            "--gin_file=experiments/cpt_source_en.gin",
            "--gin.MODEL_DIR='/xl/run'",
            f"--gin.MODEL_SIZE={size!r}",
            "--gin.VOCAB_PATH='/xl/vocab.model'",
            *extra,
        ],
        job="train",
    )
    assert _macro("TRAIN_STEPS") is None
    total, non_embedding = LLAMA.param_counts(LLAMA.get_config(size))
    return jobs.resolve_train_steps(
        train_steps=None,
        tokens_per_param=_macro("TOKENS_PER_PARAM"),
        tokens_per_step=(batch_size or _macro("BATCH_SIZE")) * _macro("SEQUENCE_LENGTH"),
        params_total=total,
        params_non_embedding=non_embedding,
        params_nominal=LLAMA.nominal_params(size),
        param_basis=_macro("PARAM_BASIS"),
        size=size,
    )


def test_the_size_table_has_the_papers_42_sizes():
    assert len(PAPER_SIZES) == 42


@pytest.mark.slow
def test_every_paper_size_gets_the_same_steps_from_the_sweep_and_from_gin():
    runs = sweep.expand(sweep.load_manifest("cpt_paper"))
    sources = {r.size: r for r in runs if r.strategy == "source"}
    assert sorted(sources) == sorted(PAPER_SIZES)
    for size, run in sources.items():
        bindings = dict(run.bindings)
        assert bindings["PARAM_BASIS"] == "'nominal'" and bindings["TOKENS_PER_PARAM"] == "20"
        gin.clear_config()
        steps = gin_steps(size)
        # The gin path's own batch (recipes.paper_batch_size) is the sweep's band.
        assert _macro("BATCH_SIZE") == run.batch_size, size
        assert (size, run.steps) == (size, steps)
        # 20 tokens per nominal parameter, whole batches (the paper's "5B ... 100B tokens").
        nominal = LLAMA.nominal_params(size)
        assert steps == math.ceil(20 * nominal / (run.batch_size * 2048))


@pytest.mark.parametrize("basis", ["non_embedding", "total"])
def test_other_bases_agree_too(basis, tmp_path):
    text = sweep.resolve_manifest_path("cpt_paper").read_text()
    path = tmp_path / "m.toml"
    path.write_text(text.replace('param_basis = "nominal"', f'param_basis = "{basis}"'))
    runs = [r for r in sweep.expand(sweep.load_manifest(path)) if r.strategy == "source"]
    assert len(runs) == 42
    for run in runs:
        assert dict(run.bindings)["PARAM_BASIS"] == repr(basis)
        gin.clear_config()
        assert run.steps == gin_steps(run.size, batch_size=run.batch_size, basis=basis), run.size


def test_the_basis_changes_the_steps_it_used_to_change_silently():
    """llama2_1393m: 20 × 1,393M nominal tokens in 2M-token batches, against 20 × its exact
    non-embedding count (the gin default before the recipe said 'nominal')."""
    nominal = gin_steps("llama2_1393m")
    gin.clear_config()
    exact = gin_steps("llama2_1393m", basis="non_embedding")
    _, non_embedding = LLAMA.param_counts(LLAMA.get_config("llama2_1393m"))
    assert nominal == math.ceil(20 * 1393e6 / 2**21)
    assert exact == math.ceil(20 * non_embedding / 2**21)
    assert exact != nominal


def test_nominal_needs_a_size_with_a_nominal_count():
    counts = dict(params_total=1000, params_non_embedding=800, tokens_per_step=100)
    kwargs = dict(train_steps=None, tokens_per_param=20, **counts)
    assert jobs.resolve_train_steps(**kwargs) == 160
    assert jobs.resolve_train_steps(**kwargs, param_basis="total") == 200
    with pytest.raises(validation.ConfigError, match="PARAM_BASIS.*llama2_tiny.*no nominal"):
        jobs.resolve_train_steps(**kwargs, param_basis="nominal", size="llama2_tiny")
    with pytest.raises(validation.ConfigError, match="PARAM_BASIS.*allowed"):
        jobs.resolve_train_steps(**kwargs, param_basis="paper")
    # A bound TRAIN_STEPS needs no N at all.
    assert jobs.resolve_train_steps(**{**kwargs, "train_steps": 7}, param_basis="nominal") == 7


def test_a_manifest_cannot_set_the_basis_through_gin(tmp_path):
    text = sweep.resolve_manifest_path("cpt_languages").read_text()
    path = tmp_path / "m.toml"
    path.write_text(text.replace("[gin]\n", '[gin]\nPARAM_BASIS = "total"\n', 1))
    with pytest.raises(ValueError, match="PARAM_BASIS is set by the sweep"):
        sweep.load_manifest(path)


def test_a_fingerprint_from_before_param_basis_still_resumes():
    new = {"param_basis": "nominal", "total_steps": 10, "train_steps": 10}
    stored = {"total_steps": 10, "train_steps": 10}
    defaults = {"param_basis": "non_embedding"}
    assert (
        fingerprint.check_resume(stored=stored, new=new, policy=None, model_dir="d", step=5) is None
    )
    same = {**new, "param_basis": "non_embedding"}
    assert (
        fingerprint.check_resume(
            stored=stored, new=same, policy=None, model_dir="d", step=5, defaults=defaults
        )
        is None
    )
    # Once recorded, another basis is another run unless the policy allows it.
    with pytest.raises(validation.ConfigError, match="param_basis.*'non_embedding' -> 'nominal'"):
        fingerprint.check_resume(stored=same, new=new, policy=None, model_dir="d", step=5)
    assert fingerprint.check_resume(
        stored=same, new=new, policy="train_steps", model_dir="d", step=5
    )


def test_budgets_and_the_trainer_share_one_list_of_bases():
    from launch import budgets

    assert budgets.PARAM_BASES is family_lib.PARAM_BASES
    with pytest.raises(ValueError, match="param_basis"):
        budgets.resolve(
            {"tokens_per_param": 20, "batch_size": 8, "param_basis": "paper"}, where="t"
        )


def test_run_ids_do_not_change_with_the_recorded_basis():
    """PARAM_BASIS and TOKENS_PER_PARAM restate the budget (TRAIN_STEPS is bound too): runs keep
    the ids they had before the trainer recorded them, so existing sweep directories match."""
    from launch import sweep

    runs = sorted(sweep.expand(sweep.load_manifest("smoke", runs_dir="/r")), key=lambda r: r.run_id)
    assert dict(runs[0].bindings)["PARAM_BASIS"] == "'non_embedding'"
    assert [r.run_id for r in runs[:3]] == [
        "cpt_replay_smoke_d32_zh_replay0_s0-9a089f5b41",
        "cpt_replay_smoke_d32_zh_replay10_s0-bb4004c787",
        "cpt_replay_smoke_d32_zh_replay30_s0-8f6dc5e8a4",
    ]


def test_one_steps_rule_serves_the_sweep_and_the_trainer(monkeypatch):
    """`modeling.family.budget_steps` is the rule: tokens (or tokens per parameter × N) in whole
    batches, rounded up, at least one step; both the trainer and the sweep's budgets call it."""
    from launch import budgets

    assert family_lib.budget_steps(tokens_per_step=100, tokens_per_param=20, params=800) == 160
    assert family_lib.budget_steps(tokens_per_step=100, tokens=16_001) == 161
    assert family_lib.budget_steps(tokens_per_step=100, tokens=1) == 1
    with pytest.raises(ValueError, match="exactly one"):
        family_lib.budget_steps(tokens_per_step=100, tokens=1, tokens_per_param=1, params=1)
    with pytest.raises(ValueError, match="parameter count"):
        family_lib.budget_steps(tokens_per_step=100, tokens_per_param=20)
    calls = []

    def rule(**kwargs):
        calls.append(kwargs)
        return 7

    monkeypatch.setattr(family_lib, "budget_steps", rule)
    monkeypatch.setattr(budgets, "budget_steps", rule)
    budget = {"tokens_per_param": 20, "batch_tokens": 1000}
    assert budgets.steps_and_batch(
        budget, budgets.resolve(budget, where="t"), params=800, seq_len=100, where="t"
    ) == (7, 10)
    kwargs = dict(tokens_per_step=100, params_total=1000, params_non_embedding=800)
    assert jobs.resolve_train_steps(train_steps=None, tokens_per_param=20, **kwargs) == 7
    assert calls == [dict(tokens_per_step=1000, tokens_per_param=20.0, params=800)] + [
        dict(tokens_per_step=100, tokens_per_param=20, params=800)
    ]
