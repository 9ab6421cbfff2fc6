"""Sweep manifests: parsing, expansion, stable ids, dependencies, budgets and the rendered argv."""

import shlex
import textwrap

import pytest

from launch import sweep
from launch.runs import gin_literal

BASE = """
[sweep]
name = "t"
seq_len = 128
runs_dir = "RUNS"
gin_files = ["experiments/tiny.gin"]

[vars]
DATA_DIR = ""

[gin]
DATA_DIR = "${DATA_DIR}"
EVAL_PERIOD = 10

[axes]
sizes = ["llama2_cpu_d64", "llama2_cpu_d96"]
target_langs = ["zh"]

[[grid]]
strategies = ["source", "scratch", "cpt"]

[[grid]]
strategies = ["cpt_replay"]
sizes = ["llama2_cpu_d64"]
replay_ratios = [0.0, 0.1, 0.3]

[budget]
steps = 50
batch_size = 8
"""


def load(text=BASE, tmp_path=None, **kwargs):
    path = tmp_path / "m.toml"
    path.write_text(textwrap.dedent(text))
    return sweep.load_manifest(path, **kwargs)


def ids(runs):
    return [r.run_id for r in runs]


def test_expansion_is_the_product_of_the_axes(tmp_path):
    runs = sweep.expand(load(tmp_path=tmp_path))
    by_strategy = {}
    for r in runs:
        by_strategy.setdefault(r.strategy, []).append(r)
    assert {k: len(v) for k, v in by_strategy.items()} == {
        "source": 2,
        "scratch": 2,
        "cpt": 2,
        "cpt_replay": 3,
    }
    assert sorted(r.coord("replay_ratio") for r in by_strategy["cpt_replay"]) == [0.0, 0.1, 0.3]
    assert all(r.coord("target_lang") is None for r in by_strategy["source"])
    assert all(r.coord("target_lang") == "zh" for r in by_strategy["scratch"])
    assert len(set(ids(runs))) == len(runs)


def test_ids_are_stable_and_change_with_any_setting(tmp_path):
    first = ids(sweep.expand(load(tmp_path=tmp_path)))
    again = ids(sweep.expand(load(tmp_path=tmp_path)))
    assert first == again
    # Run ids do not depend on where runs or data live: runs_dir and variable values.
    moved = sweep.expand(
        load(tmp_path=tmp_path, runs_dir="elsewhere", variables={"DATA_DIR": "/d"})
    )
    assert ids(moved) == first
    assert all(r.model_dir.startswith("elsewhere/") for r in moved)
    for change in [
        ("steps = 50", "steps = 51"),
        ("batch_size = 8", "batch_size = 4"),
        ("seq_len = 128", "seq_len = 64"),
        ("EVAL_PERIOD = 10", "EVAL_PERIOD = 11"),
        ('gin_files = ["experiments/tiny.gin"]', "gin_files = []"),
    ]:
        changed = ids(sweep.expand(load(BASE.replace(*change), tmp_path=tmp_path)))
        assert len(changed) == len(first)
        assert not set(changed) & set(first), change


def test_a_changed_source_changes_its_dependents_only(tmp_path):
    text = BASE + "\n[strategies.source]\ngin = { PEAK_LR = 1e-3 }\n"
    before = {r.run_id: r for r in sweep.expand(load(tmp_path=tmp_path))}
    after = {r.run_id: r for r in sweep.expand(load(text, tmp_path=tmp_path))}
    same = set(before) & set(after)
    assert {before[i].strategy for i in same} == {"scratch"}


def test_dependencies_come_first_and_point_at_the_source_checkpoint(tmp_path):
    runs = sweep.expand(load(tmp_path=tmp_path, variables={"DATA_DIR": "/data"}))
    position = {r.run_id: i for i, r in enumerate(runs)}
    by_id = {r.run_id: r for r in runs}
    dependents = [r for r in runs if r.strategy in ("cpt", "cpt_replay")]
    assert len(dependents) == 5
    for run in dependents:
        (parent_id,) = run.depends_on
        parent = by_id[parent_id]
        assert parent.strategy == "source" and parent.size == run.size
        assert position[parent_id] < position[run.run_id]
        assert f"--gin.INIT_CHECKPOINT='{parent.model_dir}'" in run.argv()
    assert all(not r.depends_on for r in runs if r.strategy in ("source", "scratch"))


def test_missing_parents_are_added(tmp_path):
    text = BASE.replace('strategies = ["source", "scratch", "cpt"]', 'strategies = ["scratch"]')
    runs = sweep.expand(load(text, tmp_path=tmp_path))
    sources = [r for r in runs if r.strategy == "source"]
    assert [r.size for r in sources] == ["llama2_cpu_d64"]  # only the replay size needs one
    assert runs.index(sources[0]) < min(i for i, r in enumerate(runs) if r.strategy == "cpt_replay")


def test_topological_order_rejects_missing_dependencies(tmp_path):
    runs = sweep.expand(load(tmp_path=tmp_path))
    cpt = next(r for r in runs if r.strategy == "cpt")
    assert sweep.topological_order(list(reversed(runs)))[0].depends_on == ()
    with pytest.raises(ValueError, match="not in the sweep"):
        sweep.topological_order([cpt])


def test_argv_is_the_exact_trainer_command(tmp_path):
    runs = sweep.expand(load(tmp_path=tmp_path, variables={"DATA_DIR": "/data dir"}))
    run = next(r for r in runs if r.strategy == "cpt_replay" and r.coord("replay_ratio") == 0.1)
    argv = run.argv("python")
    assert argv[:5] == [
        "python",
        "-m",
        "trainer.train",
        "--gin_file=experiments/cpt_replay.gin",
        "--gin_file=experiments/tiny.gin",
    ]
    flags = argv[5:]
    assert flags[0] == f"--gin.MODEL_DIR='RUNS/{run.run_id}'"
    assert "--gin.MODEL_SIZE='llama2_cpu_d64'" in flags
    assert "--gin.TARGET_LANG='zh'" in flags
    assert "--gin.REPLAY_RATIO=0.1" in flags
    assert "--gin.SEED=0" in flags
    assert "--gin.TRAIN_STEPS=50" in flags
    assert "--gin.BATCH_SIZE=8" in flags
    assert "--gin.TASK_FEATURE_LENGTHS={'targets': 128}" in flags
    assert "--gin.DATA_DIR='/data dir'" in flags
    assert "--gin.EVAL_PERIOD=10" in flags
    # The trainer's own flag parser splits it back into the same files and bindings.
    gin_entry = pytest.importorskip("trainer.gin_entry")
    files, bindings, _ = gin_entry.split_flags(shlex.split(shlex.join(argv[3:])))
    assert files == ["experiments/cpt_replay.gin", "experiments/tiny.gin"]
    assert "DATA_DIR='/data dir'" in bindings


def test_variables_must_be_given_for_real_runs_but_not_dry_runs(tmp_path):
    manifest = load(tmp_path=tmp_path)
    assert manifest.missing_variables() == ["DATA_DIR"]
    run = sweep.expand(manifest)[0]
    with pytest.raises(ValueError, match="--var DATA_DIR"):
        run.argv()
    assert "--gin.DATA_DIR='${DATA_DIR}'" in run.argv(allow_missing=True)
    with pytest.raises(ValueError, match="not declared"):
        load(tmp_path=tmp_path, variables={"NOPE": "x"})


def test_gin_literals():
    assert gin_literal("a'b") == '"a\'b"'
    assert gin_literal("@recipes.lm_task()") == "@recipes.lm_task()"
    assert gin_literal("%TARGET_LANG") == "%TARGET_LANG"
    assert gin_literal(True) == "True"
    assert gin_literal(3e-4) == "0.0003"
    assert gin_literal({"targets": 64, "x": [1, "a"]}) == "{'targets': 64, 'x': [1, 'a']}"
    with pytest.raises(TypeError):
        gin_literal(object())


def test_budget_rules(tmp_path):
    text = BASE.replace("steps = 50\nbatch_size = 8", "tokens_per_param = 2\nbatch_tokens = 1024")
    runs = sweep.expand(load(text, tmp_path=tmp_path))
    d64 = next(r for r in runs if r.size == "llama2_cpu_d64" and r.strategy == "source")
    n = d64.counts.params_non_embedding
    assert n == 131392
    assert d64.batch_size == 1024 // 128
    assert d64.steps == -(-2 * n // 1024)  # ceil
    assert d64.tokens == d64.steps * 1024
    assert d64.flops == 6 * n * d64.tokens

    tokens = BASE.replace("steps = 50", "tokens = 10000")
    run = sweep.expand(load(tokens, tmp_path=tmp_path))[0]
    assert run.steps == 10 and run.tokens == 10 * 8 * 128

    bands = BASE.replace(
        "steps = 50\nbatch_size = 8",
        "steps = 5\nbatch_tokens_bands = [[200000, 512], [inf, 2048]]",
    )
    sizes = {r.size: r.batch_size for r in sweep.expand(load(bands, tmp_path=tmp_path))}
    assert sizes == {"llama2_cpu_d64": 4, "llama2_cpu_d96": 16}


def test_budget_layers_replace_their_group(tmp_path):
    text = BASE + textwrap.dedent("""
        [strategies.scratch]
        budget = { tokens = 2048 }

        [[override]]
        where = { strategy = "cpt", size = "llama2_cpu_d96" }
        budget = { steps = 7 }
        gin = { EVAL_PERIOD = 1 }
        """)
    runs = sweep.expand(load(text, tmp_path=tmp_path))
    steps = {(r.strategy, r.size): r.steps for r in runs}
    assert steps[("scratch", "llama2_cpu_d64")] == 2
    assert steps[("cpt", "llama2_cpu_d96")] == 7
    assert steps[("cpt", "llama2_cpu_d64")] == 50
    cpt96 = next(r for r in runs if r.strategy == "cpt" and r.size == "llama2_cpu_d96")
    assert ("EVAL_PERIOD", "1") in cpt96.bindings


def test_excludes_and_custom_shapes(tmp_path):
    text = BASE.replace(
        'sizes = ["llama2_cpu_d64", "llama2_cpu_d96"]', 'sizes = ["mini", "llama2_cpu_d96"]'
    )
    text = text.replace('sizes = ["llama2_cpu_d64"]', 'sizes = ["mini"]')
    text += textwrap.dedent("""
        [gin.MODEL_OVERRIDES]
        vocab_size = 512

        [sizes.mini]
        base = "llama2_cpu_d64"
        d_model = 32
        d_ff = 96
        num_layers = 1

        [[exclude]]
        where = { strategy = "cpt_replay", replay_ratio = [0.0, 0.3] }
        """)
    runs = sweep.expand(load(text, tmp_path=tmp_path, variables={"DATA_DIR": "/d"}))
    mini = next(r for r in runs if r.size == "mini" and r.strategy == "source")
    assert "--gin.MODEL_SIZE='llama2_cpu_d64'" in mini.argv()
    overrides = (
        "--gin.MODEL_OVERRIDES={'d_ff': 96, 'd_model': 32, 'num_layers': 1, 'vocab_size': 512}"
    )
    assert overrides in mini.argv()
    # one layer (attention, SwiGLU, two norms) and the final norm; embeddings in and out
    assert mini.counts.params_non_embedding == 4 * 32 * 32 + 3 * 32 * 96 + 3 * 32
    assert mini.counts.params_total == mini.counts.params_non_embedding + 2 * 512 * 32
    d96 = next(r for r in runs if r.size == "llama2_cpu_d96" and r.strategy == "source")
    assert "--gin.MODEL_OVERRIDES={'vocab_size': 512}" in d96.argv()
    assert [r.coord("replay_ratio") for r in runs if r.strategy == "cpt_replay"] == [0.1]


def test_equal_values_of_different_toml_types_are_the_same_run(tmp_path):
    floats = ids(sweep.expand(load(tmp_path=tmp_path)))
    ints = ids(
        sweep.expand(load(BASE.replace("[0.0, 0.1, 0.3]", "[0, 0.1, 0.3]"), tmp_path=tmp_path))
    )
    assert ints == floats


def test_select_keeps_dependencies(tmp_path):
    runs = sweep.expand(load(tmp_path=tmp_path))
    chosen = sweep.select(runs, ["cpt_replay_*replay10*"])
    assert [r.strategy for r in chosen] == ["source", "cpt_replay"]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ('strategies = ["source", "scratch", "cpt"]', 'strategies = ["sauce"]'),
            "unknown strategy",
        ),
        (("[budget]", "[budget]\ntokens = 5"), "exactly one of"),
        (("EVAL_PERIOD = 10", "TRAIN_STEPS = 10"), "set by the sweep"),
        (("[axes]", "[axes]\nsize = [1]"), "unknown keys"),
        (("replay_ratios = [0.0, 0.1, 0.3]", ""), "needs axis 'replay_ratios'"),
        (('name = "t"', 'name = "t"\nfamily = "gpt"'), "family"),
        (('"llama2_cpu_d96"]', '"llama2_nope"]'), "llama2_nope"),
        (
            ("[budget]", "[sizes.llama2_cpu_d96]\nbase = 'llama2_cpu_d96'\nwidth = 3\n[budget]"),
            "width",
        ),
    ],
)
def test_bad_manifests_are_rejected_with_a_clear_message(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        sweep.expand(load(BASE.replace(*change), tmp_path=tmp_path))


@pytest.mark.parametrize(
    "table, message",
    [
        ('sbatch_lines = "--exclusive"', r"\[slurm\] sbatch_lines: '--exclusive': give a list"),
        (
            'sbatch_lines = ["--exclusive", "constraint=h100"]',
            r"m.toml \[slurm\] sbatch_lines 'constraint=h100': give one sbatch long option",
        ),
        ('sbatch_lines = ["--qos=a\\n--qos=b"]', r"sbatch_lines '--qos=a\\n--qos=b': give one"),
        ("sbatch_lines = [3]", r"sbatch_lines 3: give each sbatch option as a string"),
        ('sbatch_lines = ["--nodes=4"]', r"--nodes is set by --nodes, not by an extra"),
        ('sbatch_line = ["--exclusive"]', r"\[slurm\]: unknown keys \['sbatch_line'\]"),
    ],
)
def test_bad_sbatch_lines_name_the_manifest_key_and_value(tmp_path, table, message):
    with pytest.raises(ValueError, match=message):
        load(BASE + f"\n[slurm]\n{table}\n", tmp_path=tmp_path)


def test_sbatch_lines_of_the_manifest_reach_every_run(tmp_path):
    table = '\n[slurm]\nsbatch_lines = ["#SBATCH --constraint=h100", "--gres gpu:4"]\n'
    runs = sweep.expand(load(BASE + table, tmp_path=tmp_path))
    assert {r.sbatch_lines for r in runs} == {("--constraint=h100", "--gres gpu:4")}
    assert ids(runs) == ids(sweep.expand(load(tmp_path=tmp_path)))


def test_unknown_manifest_name_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="cpt_paper"):
        sweep.resolve_manifest_path("no_such_manifest")
    assert sweep.resolve_manifest_path("cpt_paper").name == "cpt_paper.toml"
