"""`KEEP_BEST`: beside the newest checkpoints, the one saved at the best evaluation of a metric is
kept (a finetune's best-step selection must find that step on disk), across restarts of
the store, on real orbax checkpoints."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from trainer import validation
from trainer.checkpoints import CheckpointConfig, CheckpointStore


def _save(store: CheckpointStore, step: int, best: float | None) -> None:
    store.save(
        step,
        params={"w": jnp.full(3, float(step))},
        opt_state={"m": jnp.zeros(2)},
        train_state={"step": step},
        best=best,
    )


def _steps_after(directory, config, saves) -> list[int]:
    store = CheckpointStore(directory, config)
    try:
        for step, best in saves:
            _save(store, step, best)
        store.wait()
        return store.all_steps()
    finally:
        store.close()


def test_the_best_evaluated_checkpoint_outlives_the_keep_last_policy(tmp_path):
    config = CheckpointConfig(period=1, keep_last=1, keep_best="loss")
    # Steps 1 and 3 were evaluated (losses 2.0 and 1.5), 2 and 4 were not; NaN never competes.
    assert _steps_after(tmp_path, config, [(1, 2.0), (2, None), (3, 1.5), (4, None)]) == [3, 4]
    # A restarted store reads the values back from the checkpoints: a better step replaces it,
    # a worse or non-finite one does not.
    assert _steps_after(tmp_path, config, [(5, 1.7), (6, float("nan"))]) == [3, 6]
    assert _steps_after(tmp_path, config, [(7, 1.2)]) == [7]


def test_max_mode_keeps_the_highest_and_without_keep_best_only_the_newest(tmp_path):
    best_max = CheckpointConfig(period=1, keep_last=1, keep_best="bleu", keep_best_mode="max")
    assert _steps_after(tmp_path / "max", best_max, [(1, 30.0), (2, 20.0), (3, None)]) == [1, 3]
    plain = CheckpointConfig(period=1, keep_last=1)
    assert _steps_after(tmp_path / "plain", plain, [(1, 30.0), (2, 20.0), (3, None)]) == [3]


def test_an_unknown_mode_is_refused_naming_the_macro():
    with pytest.raises(validation.ConfigError, match=r"KEEP_BEST_MODE .*'average'.*'min', 'max'"):
        CheckpointConfig(keep_best="loss", keep_best_mode="average")


@pytest.mark.slow
def test_a_run_keeps_the_checkpoint_of_its_best_evaluation(
    tiny_data, tiny_prepared, tmp_path, seqio_state
):
    # Through the trainer (on prepared data): evaluations every 2 steps of 8 and no periodic
    # checkpoint before the end; KEEP_BEST saves one at each evaluation and keeps the newest and
    # the best ('max' of the loss here, so that the best is not simply the newest: the loss falls).
    from tiny_runs import prepared_data, tiny_kwargs

    from rundir import records
    from trainer import checkpoints
    from trainer import train as train_lib
    from trainer.data import EvalConfig

    saved = seqio_state.snapshot()
    try:
        config = CheckpointConfig(period=100, keep_last=1, keep_best="loss", keep_best_mode="max")
        kwargs = tiny_kwargs(
            tiny_data,
            data=prepared_data(tiny_data, tiny_prepared),
            train_steps=8,
            checkpoint=config,
            evaluation=EvalConfig(tasks=("lm_en",), period=2, max_tokens=1024),
        )
        train_lib.train(model_dir=tmp_path / "run", **kwargs)
    finally:
        seqio_state.restore(saved)
    losses = {
        r["step"]: r["eval/lm_en/loss"]
        for r in records.read_metrics(tmp_path / "run")
        if "eval/lm_en/loss" in r
    }
    assert sorted(losses) == [2, 4, 6, 8]
    worst = max(losses, key=losses.get)
    store = CheckpointStore(checkpoints.checkpoints_dir(tmp_path / "run"), config, read_only=True)
    try:
        assert store.all_steps() == sorted({worst, 8}), losses
    finally:
        store.close()
