"""The step loop's contract (`trainer.loop`) and the run plan built from gin without compiling
(`trainer.plan`)."""

from __future__ import annotations

import gin
import pytest

from trainer import divergence, jobs, loop, validation
from trainer import plan as plan_lib
from trainer import train as train_lib
from trainer.steps import StepConfig


class Recorder:
    """A fake run: steps return their number as metrics; everything done is listed in `events`."""

    def __init__(self, *, start=0, total=10, stop_at=None, poison=None):
        self.events: list[tuple] = []
        self.step = start
        self.stop_at, self.poison = stop_at, poison
        self.asked: list[int] = []
        self.records: list[int] = []
        self.unsaved: list[int] = []
        self.saved: dict[int, list[int]] = {}
        self.loop = loop.StepLoop(
            start=start,
            total=total,
            run_step=self.run_step,
            sync=self.sync,
            should_stop=self.should_stop,
            on_first_step=lambda step, m: self.events.append(("first", step)),
        )

    def run_step(self):
        self.step += 1
        return self.step

    def should_stop(self, step):
        self.asked.append(step)
        return step == self.stop_at

    def sync(self, pending):
        self.events.append(("sync", [s for s, _ in pending]))
        if self.poison in [m for _, m in pending]:
            raise divergence.NonFiniteError(f"step {self.poison}")

    def log(self, info):
        self.events.append(("log", info.step))
        self.records.append(info.step)
        self.unsaved.append(info.step)

    def save(self, info):
        self.events.append(("checkpoint", info.step))
        self.saved[info.step] = list(self.unsaved)
        self.unsaved.clear()


def _hooked(**kwargs) -> Recorder:
    r = Recorder(**kwargs)
    r.loop.add_hook("log", r.log, every=2)
    r.loop.add_hook("checkpoint", r.save, when=lambda i: i.last or i.stopping or i.step % 4 == 0)
    return r


def test_metrics_are_synced_once_before_the_hooks_that_act_and_hooks_run_in_order():
    r = _hooked(total=8)
    assert r.loop.run() == 8
    assert r.events == [
        ("first", 1),
        ("sync", [1, 2]),
        ("log", 2),
        ("sync", [3, 4]),
        ("log", 4),
        ("checkpoint", 4),
        ("sync", [5, 6]),
        ("log", 6),
        ("sync", [7, 8]),
        ("log", 8),
        ("checkpoint", 8),
    ]
    # A checkpoint carries the records logged since the previous one, its own step's included.
    assert r.saved == {4: [2, 4], 8: [6, 8]}
    assert r.asked == list(range(1, 8))  # asked every step but the last


def test_a_stop_saves_at_its_step_and_ends_the_loop():
    r = _hooked(total=10, stop_at=5)
    assert r.loop.run() == 5
    assert r.events[-2:] == [("sync", [5]), ("checkpoint", 5)]
    assert r.saved == {4: [2, 4], 5: []}


def test_a_non_finite_sync_comes_before_any_save():
    r = _hooked(total=8, poison=4)
    with pytest.raises(divergence.NonFiniteError, match="step 4"):
        r.loop.run()
    assert ("checkpoint", 4) not in r.events and r.saved == {}
    assert r.events[-1] == ("sync", [3, 4])


def test_a_resumed_loop_counts_from_its_start():
    r = _hooked(start=6, total=8)
    assert r.loop.run() == 8
    assert r.events[0] == ("first", 7) and r.saved == {8: [8]}


def test_a_step_time_floor_sleeps_what_each_step_left_of_it(monkeypatch):
    # A fake clock: each step takes 0.03 s; the floor of 0.1 s sleeps the other 0.07 after it,
    # none after the last step. Counted, not timed.
    clock, slept = [0.0], []
    monkeypatch.setattr(loop.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(loop.time, "sleep", lambda s: slept.append(round(s, 6)))

    def step():
        clock[0] += 0.03
        return 0

    steps = loop.StepLoop(
        start=0,
        total=4,
        run_step=step,
        sync=lambda pending: None,
        should_stop=lambda s: False,
        min_step_seconds=0.1,
    )
    assert steps.run() == 4
    assert slept == [0.07, 0.07, 0.07]


def test_a_hook_takes_every_or_when_not_both():
    r = Recorder()
    with pytest.raises(ValueError, match="exactly one of every= and when="):
        r.loop.add_hook("x", r.log)
    with pytest.raises(ValueError, match="exactly one"):
        r.loop.add_hook("x", r.log, every=2, when=lambda i: True)
    assert not loop.periodic(0)(loop.StepInfo(step=4, last=False, stopping=False))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_nonfinite": "ignore"}, "on_nonfinite"),
        ({"max_skipped_fraction": 1.5}, "max_skipped_fraction"),
        ({"log_every": 0}, r"LOG_EVERY \(loop.LoopConfig.log_every\) = 0"),
        ({"min_step_seconds": -1.0}, r"MIN_STEP_SECONDS \(loop.LoopConfig.min_step_seconds\) = -1"),
    ],
)
def test_loop_config_refuses_bad_values_naming_them(kwargs, message):
    with pytest.raises(validation.ConfigError, match=message):
        loop.LoopConfig(**kwargs)


def test_a_run_plan_is_built_from_gin_without_compiling(tiny_data, tmp_path, monkeypatch):
    """`train` from the tiny gin experiment, stopped where the plan is handed to `_run`."""
    from trainer import gin_entry

    planned = []

    def capture(plan, **kwargs):
        planned.append(plan)
        return train_lib.TrainResult(
            model_dir=str(plan.model_dir), step=0, tokens=0, completed=False
        )

    def no_compile(**kwargs):
        raise AssertionError("compiled")

    monkeypatch.setattr(train_lib, "_run", capture)
    monkeypatch.setattr(jobs, "compile_job", no_compile)
    model_dir = tmp_path / "run"
    try:
        config = gin_entry.parse(
            [
                "--gin_file=experiments/cpt_source_en.gin",
                "--gin_file=experiments/tiny.gin",
                f"--gin.MODEL_DIR='{model_dir}'",
                f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
                f"--gin.DATA_DIR='{tiny_data['corpora']}'",
                "--gin.BATCH_SIZE=16",
                "--gin.NUM_MICROBATCHES=2",
                "--gin.LOG_EVERY=3",
            ],
            job="train",
        )
        gin_entry.call(train_lib.train, config)
    finally:
        gin.clear_config()
    (plan,) = planned
    assert isinstance(plan, plan_lib.RunPlan) and not plan.resuming and plan.amendment is None
    assert plan.job.step == StepConfig(num_microbatches=2, num_components=1)
    assert plan.loop == loop.LoopConfig(log_every=3)
    assert plan.job.components == ["lm_en"] and plan.job.spec.size == "llama2_tiny"
    assert plan.job.total_steps == plan.fingerprint["total_steps"] > 0
    # The step's settings enter the fingerprint whole, as top-level keys; the loop's do not.
    assert plan.fingerprint["num_microbatches"] == 2 and plan.fingerprint["z_loss"] == 0.0
    assert "num_components" not in plan.fingerprint and "log_every" not in plan.fingerprint
    assert plan.prepared is None and plan.vocab_hash == plan.fingerprint["vocab_sha256"]
    assert plan_lib.describe(plan).endswith("fresh start")
