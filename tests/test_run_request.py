"""`train`'s inputs travel whole (`trainer.run_request.RunRequest`): a gin binding of each family
of fields reaches the run's plan, and a hook object registered on the step loop acts at its steps.

The plans are built as users start runs (`gin_entry.parse` of the tiny experiment, then
`gin_entry.call(train)`), stopped where the plan is handed to `_run`: nothing is compiled,
trained or written.
"""

from __future__ import annotations

import gin
import pytest

from modeling import family as family_lib
from trainer import gin_entry, loop, run_request
from trainer import plan as plan_lib
from trainer import train as train_lib

pytestmark = pytest.mark.usefixtures("clean_gin")


def _plan(tiny_data, tmp_path, monkeypatch, bindings: list[str]) -> plan_lib.RunPlan:
    """The plan `train` builds from the tiny experiment with `bindings` added."""
    planned, requests = [], []

    def capture(plan, **kwargs):
        planned.append(plan)
        return train_lib.TrainResult(
            model_dir=str(plan.model_dir), step=0, tokens=0, completed=False
        )

    build = plan_lib.build_run_plan

    def build_whole(**kwargs):
        requests.append(kwargs)
        return build(**kwargs)

    monkeypatch.setattr(train_lib, "_run", capture)
    monkeypatch.setattr(train_lib.plan_lib, "build_run_plan", build_whole)
    try:
        config = gin_entry.parse(
            [
                "--gin_file=experiments/cpt_source_en.gin",
                "--gin_file=experiments/tiny.gin",
                f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
                f"--gin.DATA_DIR='{tiny_data['corpora']}'",
                *bindings,
            ],
            job="train",
        )
        gin_entry.call(train_lib.train, config)
    finally:
        gin.clear_config()
    # The planner was handed the request whole, and nothing else.
    ((request,),) = [tuple(r.values()) for r in requests]
    assert isinstance(request, run_request.RunRequest) and list(requests[0]) == ["request"]
    (plan,) = planned
    assert plan.model_dir == request.model_dir
    return plan


def test_model_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    overrides = "{'vocab_size': 512, 'max_len': 128, 'num_layers': 1}"
    plan = _plan(tiny_data, tmp_path, monkeypatch, [f"--gin.MODEL_OVERRIDES={overrides}"])
    assert plan.job.spec.size == "llama2_tiny" and plan.job.spec.overrides["num_layers"] == 1
    assert plan.job.model.config.num_layers == 1


def test_data_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(tiny_data, tmp_path, monkeypatch, ["--gin.BATCH_SIZE=16"])
    assert plan.job.data.batch_size == 16 and plan.job.data.vocab_path == str(tiny_data["vocab"])
    assert plan.job.components == ["lm_en"]


def test_length_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(
        tiny_data,
        tmp_path,
        monkeypatch,
        ["--gin.TRAIN_STEPS=None", "--gin.TOKENS_PER_PARAM=0.5", "--gin.PARAM_BASIS='total'"],
    )
    assert plan.job.length == run_request.RunLength(None, 0.5, "total")
    expected = family_lib.budget_steps(
        tokens_per_step=plan.job.data.batch_size * plan.job.data.seq_len,
        tokens_per_param=0.5,
        params=plan.job.params_total,
    )
    assert plan.job.total_steps == expected == plan.fingerprint["total_steps"]
    assert plan.fingerprint["param_basis"] == "total"


def test_optimizer_and_schedule_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(
        tiny_data,
        tmp_path,
        monkeypatch,
        ["--gin.PEAK_LR=1e-3", "--gin.optimizers.OptimizerConfig.weight_decay=0.0"],
    )
    assert plan.job.schedule.peak == 1e-3 and plan.job.optimizer.weight_decay == 0.0


def test_checkpoint_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(
        tiny_data, tmp_path, monkeypatch, ["--gin.CHECKPOINT_PERIOD=4", "--gin.KEEP_LAST=3"]
    )
    assert (plan.checkpoint.period, plan.checkpoint.keep_last) == (4, 3)


def test_mesh_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(
        tiny_data, tmp_path, monkeypatch, ["--gin.partitioning.MeshConfig.device_memory_gib=64.0"]
    )
    assert plan.mesh.device_memory_gib == 64.0
    # A known device memory: the job's plan estimated the step against it.
    assert plan.job.memory is not None and plan.job.memory.total < 64 * 2**30


def test_eval_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(
        tiny_data, tmp_path, monkeypatch, ["--gin.EVAL_PERIOD=5", "--gin.EVAL_AT_START=True"]
    )
    assert plan.job.evaluation.period == 5 and plan.job.evaluation.at_start
    assert plan.job.evaluation.tasks == ["lm_en"] and plan.job.eval_batch_size is not None


def test_step_and_loop_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(
        tiny_data,
        tmp_path,
        monkeypatch,
        [
            "--gin.LOG_EVERY=3",
            "--gin.ON_NONFINITE='skip'",
            "--gin.NUM_MICROBATCHES=2",
            "--gin.BATCH_SIZE=16",
        ],
    )
    assert plan.loop == loop.LoopConfig(log_every=3, on_nonfinite="skip")
    assert plan.job.step.num_microbatches == 2


def test_run_info_bindings_reach_the_plan(tiny_data, tmp_path, monkeypatch):
    plan = _plan(
        tiny_data,
        tmp_path,
        monkeypatch,
        ["--gin.SEED=7", "--gin.train_script.RunInfo.languages=['en']"],
    )
    assert plan.run.strategy == "source" and list(plan.run.languages) == ["en"]
    assert plan.seed == 7 == plan.fingerprint["seed"] and plan.gin_config


class _Every(loop.StepHook):
    """A hook object acting every `every` steps (the base class's `when`)."""

    name = "every"

    def __init__(self, every: int):
        self.every = every
        self.steps: list[int] = []

    def __call__(self, info: loop.StepInfo) -> None:
        self.steps.append(info.step)


class _AtEnd(loop.StepHook):
    """A hook object with its own `when`: the last step and a stop."""

    name = "end"

    def __init__(self, calls: list):
        self.calls = calls

    def when(self, info: loop.StepInfo) -> bool:
        return info.last or info.stopping

    def __call__(self, info: loop.StepInfo) -> None:
        self.calls.append(("end", info.step))


def test_a_registered_hook_object_is_called_at_its_steps():
    calls: list = []
    every = _Every(3)
    steps = loop.StepLoop(
        start=0,
        total=10,
        run_step=lambda: 0,
        sync=lambda pending: calls.append(("sync", [s for s, _ in pending])),
        should_stop=lambda step: False,
    )
    steps.add(every)
    steps.add(_AtEnd(calls))
    assert [hook.name for hook in steps.hooks] == ["every", "end"]
    assert steps.run() == 10
    assert every.steps == [3, 6, 9]
    # Synced once before the hooks that act; the last step's hook after it.
    assert calls == [
        ("sync", [1, 2, 3]),
        ("sync", [4, 5, 6]),
        ("sync", [7, 8, 9]),
        ("sync", [10]),
        ("end", 10),
    ]
