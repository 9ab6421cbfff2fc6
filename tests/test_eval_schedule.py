"""The evaluation schedule: periodic steps, or log-spaced ones dense early, and step 0 on demand."""

import collections
import math

import pytest

from trainer import eval_schedule
from trainer.data import EvalConfig


def test_log_spaced_schedule_gives_the_asked_points_from_the_first_permille():
    # A 1M-step run, 20 points from 0.1% (step 1000) on: even in log(step), the last at the end.
    steps = sorted(eval_schedule.log_spaced_steps(total=1_000_000, points=20, start_fraction=1e-3))
    assert len(steps) == 20 and steps[0] == 1000 and steps[-1] == 1_000_000
    ratios = [b / a for a, b in zip(steps, steps[1:], strict=False)]
    assert ratios == pytest.approx([10 ** (3 / 19)] * 19, rel=1e-3)
    # Rounding merges steps of a short run: never more than asked, never past the end.
    short = eval_schedule.log_spaced_steps(total=10, points=20, start_fraction=0.1)
    assert short == frozenset(range(1, 11))


def test_eval_steps_join_the_period_the_log_grid_and_step_zero():
    config = EvalConfig(tasks=("lm_en",), period=1000, at_start=True, schedule="log")
    steps = eval_schedule.eval_steps(config, total=100_000)
    assert steps[:3] == [0, 100, 144]  # step 0, then log-spaced from 0.1% of the run
    assert {*range(1000, 100_001, 1000)} <= set(steps) and steps[-1] == 100_000
    log = eval_schedule.log_spaced_steps(total=100_000, points=20, start_fraction=1e-3)
    assert set(steps) == {0, *range(1000, 100_001, 1000), *log} and len(log) == 20
    assert eval_schedule.eval_steps(EvalConfig(tasks=("lm_en",), period=0), total=7) == [7]
    assert eval_schedule.eval_steps(EvalConfig(), total=7) == []  # nothing to evaluate
    assert eval_schedule.eval_steps(EvalConfig(tasks=("lm_en",)), total=0) == []  # no step 0
    assert math.isclose(EvalConfig().log_start, 1e-3)


def test_unknown_schedule_names_the_setting_and_the_allowed_values():
    with pytest.raises(ValueError, match="EVAL_SCHEDULE = 'cosine'.*'periodic', 'log'"):
        EvalConfig(schedule="cosine")


def test_mt_paper_finetunes_evaluate_at_several_steps_of_each_recipe():
    # The best validation checkpoint is chosen among these (launch.best_checkpoint): step 0 (the
    # checkpoint before finetuning, EVAL_AT_START) and 16 points of 2^18 steps or 6 of 300.
    from launch import sweep
    from rundir.run_record import FINETUNES
    from studies.paper_study import eval_steps

    manifest = sweep.load_manifest("mt_paper", variables={"DATA_DIR": "/d", "VOCAB_PATH": "/v"})
    wanted = {
        "raffel_2^18": [0, *range(16384, 2**18 + 1, 16384)],
        "paper_300": [0, 50, 100, 150, 200, 250, 300],
    }
    seen = collections.Counter()
    for run in sweep.expand(manifest):
        recipe = run.coord("FINETUNE_RECIPE")
        if run.strategy in FINETUNES and seen[recipe] < 20:  # a sample of each suffices
            assert eval_steps(run) == wanted[recipe], run.run_id
            seen[recipe] += 1
    assert set(seen) == set(wanted)
