"""Divergence never reaches a checkpoint: a huge learning rate makes the
update infinite while loss and gradients are still finite; "stop" rolls back to the
last (finite) checkpoint, "skip" counts only applied updates and fails past a small fraction.

Short single-device runs of `llama2_tiny` (4 steps, no evaluation) sharing two compiled programs
(one per learning rate) through the shared persistent compilation cache (`compilation_cache`).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from tiny_runs import tiny_kwargs

from rundir import names
from rundir import records as rundir_records
from trainer import checkpoints, data, divergence
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import EvalConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig
from trainer.validation import ConfigError

pytestmark = pytest.mark.usefixtures("compilation_cache")

HUGE = ScheduleConfig(peak=3.4e38)  # the PEAK_LR: finite grads, infinite parameters
SANE = ScheduleConfig(peak=3e-3)
STEPS = 4
SKIP = LoopConfig(log_every=1, on_nonfinite="skip")


def short(tiny_data, **overrides):
    """`tiny_kwargs` for a 4-step single-device run, checkpointing and logging every step."""
    kwargs = dict(
        train_steps=STEPS,
        mesh=MeshConfig(num_devices=1),
        checkpoint=CheckpointConfig(period=1, keep_last=10),
        evaluation=EvalConfig(),
        loop=LoopConfig(log_every=1),
    )
    kwargs.update(overrides)
    return tiny_kwargs(tiny_data, **kwargs)


def saved_steps(model_dir):
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    )
    try:
        return store.all_steps()
    finally:
        store.close()


def restore(model_dir, step):
    """(params, opt_state, train_state) of checkpoint `step`, as saved."""
    store = checkpoints.CheckpointStore(
        checkpoints.checkpoints_dir(model_dir), CheckpointConfig(), read_only=True
    )
    try:
        meta = store._manager.item_metadata(step)
        abstract = {
            item: jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype),
                getattr(meta[item], "tree", None) or meta[item],
            )
            for item in ("params", "opt_state")
        }
        return store.restore(
            step, abstract_params=abstract["params"], abstract_opt_state=abstract["opt_state"]
        )
    finally:
        store.close()


def all_finite(tree):
    return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tree))


@pytest.mark.slow
def test_divergence_is_never_checkpointed_and_a_sane_restart_resumes_from_a_finite_step(
    tiny_data, tmp_path, seqio_registry
):
    model_dir = tmp_path / "huge"
    with pytest.raises(train_lib.NonFiniteError) as e:
        train_lib.train(model_dir=model_dir, **short(tiny_data, schedule=HUGE))
    message = str(e.value)
    # Step 1 has learning rate 0 (warm-up); step 2's update is the first to blow up, with a
    # finite loss and finite gradients.
    assert "non-finite update at step 2" in message
    assert "rolls back to step 1" in message and "PEAK_LR" in message
    assert saved_steps(model_dir) == [1]
    params, opt_state, train_state = restore(model_dir, 1)
    assert all_finite((params, opt_state))
    assert [r["step"] for r in rundir_records.read_metrics(model_dir)] == [1]
    assert not (model_dir / names.COMPLETED_FILE).exists()

    # What older code wrote: step 2 with infinite parameters. Resume must not trust it.
    store = checkpoints.CheckpointStore(checkpoints.checkpoints_dir(model_dir), CheckpointConfig())
    store.save(
        2,
        params=jax.tree.map(lambda p: p.at[(0,) * p.ndim].set(np.inf), params),
        opt_state=opt_state,
        train_state={**train_state, "step": 2, "data_position": 2},
    )
    store.close()
    assert saved_steps(model_dir) == [1, 2]

    # A saner learning rate is a change of the run's settings: the resume policy must allow it.
    with pytest.raises(ConfigError, match="schedule.peak"):
        train_lib.train(model_dir=model_dir, **short(tiny_data, schedule=SANE))
    result = train_lib.train(
        model_dir=model_dir, resume_policy="schedule", **short(tiny_data, schedule=SANE)
    )
    assert result.completed and result.step == STEPS
    assert saved_steps(model_dir) == [1, 2, 3, 4]
    assert all(all_finite(restore(model_dir, s)[:2]) for s in saved_steps(model_dir))
    assert (model_dir / checkpoints.SET_ASIDE_SUBDIR / "2.nonfinite").is_dir()
    records = rundir_records.read_metrics(model_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(np.isfinite(r["train/loss"]) for r in records)


@pytest.mark.slow
def test_skip_mode_fails_when_most_updates_diverge(tiny_data, tmp_path, seqio_registry):
    model_dir = tmp_path / "skip_huge"
    with pytest.raises(train_lib.NonFiniteError, match="MAX_SKIPPED_FRACTION") as e:
        train_lib.train(model_dir=model_dir, **short(tiny_data, schedule=HUGE, loop=SKIP))
    assert "2 of 3 updates were skipped" in str(e.value)
    assert "resumes from step 2" in str(e.value)
    assert not (model_dir / names.COMPLETED_FILE).exists()
    assert saved_steps(model_dir) == [1, 2]  # step 2's update was skipped: its state is step 1's
    assert all(all_finite(restore(model_dir, s)[:2]) for s in saved_steps(model_dir))
    records = rundir_records.read_metrics(model_dir)
    assert [(r["step"], r["train/skipped_updates"]) for r in records] == [(1, 0), (2, 1)]


@pytest.mark.slow
def test_skip_mode_counts_only_applied_updates(tiny_data, tmp_path, monkeypatch, seqio_registry):
    real = data.train_batches
    tokens = {}

    def poisoned(config, **kwargs):
        for i, batch in enumerate(real(config, **kwargs), start=kwargs["start_step"] + 1):
            tokens[i] = int((batch["decoder_loss_weights"] > 0).sum())
            if i == 3:  # out-of-range token ids: the embedding gather yields NaN
                batch["decoder_input_tokens"] = batch["decoder_input_tokens"].copy()
                batch["decoder_input_tokens"][:, 3] = 10_000
            yield batch

    monkeypatch.setattr(data, "train_batches", poisoned)
    model_dir = tmp_path / "skip_one"
    result = train_lib.train(model_dir=model_dir, **short(tiny_data, schedule=SANE, loop=SKIP))
    assert result.completed and (model_dir / names.COMPLETED_FILE).exists()
    records = rundir_records.read_metrics(model_dir)
    applied = [s for s in range(1, STEPS + 1) if s != 3]
    assert [r["tokens"] for r in records] == [
        sum(tokens[s] for s in applied if s <= r["step"]) for r in records
    ]
    assert records[-1]["tokens_by_task"] == {"lm_en": records[-1]["tokens"]}
    assert result.tokens == records[-1]["tokens"]
    assert [r["train/skipped_updates"] for r in records] == [0, 0, 1, 1]
    assert "train/loss" not in records[2]  # step 3 applied nothing: no loss to report
    assert all(np.isfinite(r["train/loss"]) for r in records if r["step"] != 3)


def test_skip_limits():
    divergence.check_skipped(step=12, skipped=1, max_fraction=0.05)  # one early skip is fine
    divergence.check_skipped(step=100, skipped=5, max_fraction=0.05)
    with pytest.raises(divergence.NonFiniteError, match="6 of 100 updates"):
        divergence.check_skipped(step=100, skipped=6, max_fraction=0.05)
    with pytest.raises(divergence.NonFiniteError, match="not marked COMPLETED"):
        divergence.check_applied(step=1, skipped=1)
    divergence.check_applied(step=2, skipped=1)
