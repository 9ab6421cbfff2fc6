"""Which checkpoint step a restore takes, and what it says about it.

- A step verifies only when its integrity record covers every file of the step: a file the
  record does not list (an entry dropped from the record, and that file then altered) is a
  mismatch like a bad checksum; resume sets the step aside and restores the previous one.
- `INIT_CHECKPOINT = DIR` and an evaluation of `DIR` without `@step` take the newest step with a
  record; when newer steps have none, one warning names the step used, the newer ones skipped and
  why, rather than falling back silently.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_runs import abstract_of, restore_latest_tiny, save_tiny_steps

from rundir import checksums
from trainer import checkpoints
from trainer import restore as restore_lib
from trainer.checkpoints import CheckpointConfig, CheckpointStore

PARAMS = {"b": jnp.ones(6), "w": jnp.arange(24.0).reshape(4, 6)}


def _params_at(step: int) -> dict:
    return jax.tree.map(lambda x: x * step, PARAMS)


def _saved(model_dir: Path, steps=(1, 2)) -> Path:
    """`model_dir/checkpoints` with `steps` saved by the trainer's store, each committed with its
    integrity record."""
    directory = Path(os.fspath(checkpoints.checkpoints_dir(model_dir)))
    save_tiny_steps(directory, PARAMS, steps)
    return directory


# Files of a step to drop from its record and damage: the params' array data that a restore
# reads (a flipped bit there fails the load), and the train state, which loads whatever it holds
# (a flipped bit there was restored "(verified)" with wrong values).
VICTIMS = {
    "array data": lambda step_dir: max(
        (p for p in (step_dir / "params" / "d").iterdir() if p.is_file()),
        key=lambda p: p.stat().st_size,
    ),
    "train state": lambda step_dir: step_dir / "train_state" / "metadata",
}


@pytest.mark.parametrize("victim", sorted(VICTIMS))
def test_a_file_missing_from_the_record_fails_verification_and_resume_takes_the_step_before(
    victim, tmp_path, caplog
):
    directory = _saved(tmp_path / "run")
    step_dir = directory / "2"
    # One file of the step: dropped from the record, then one bit of it flipped.
    victim = VICTIMS[victim](step_dir)
    record_path = step_dir / checksums.MANIFEST_FILE
    record = json.loads(record_path.read_text())
    del record["files"][victim.relative_to(step_dir).as_posix()]
    record_path.write_text(json.dumps(record))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))

    unlisted = f"step 2: file {victim} is not listed in its integrity record"
    with pytest.raises(checksums.CheckpointCorruptError, match=unlisted):
        checkpoints.check_init_checkpoint(f"{directory}@2", abstract_params=abstract_of(PARAMS))
    store = CheckpointStore(directory, CheckpointConfig(period=1, keep_last=10))
    try:
        with caplog.at_level(logging.INFO, logger="trainer.checkpoints"):
            step, params, opt_state, train_state = restore_latest_tiny(store, PARAMS)
        assert store.all_steps() == [1]
    finally:
        store.close()
    assert step == 1 and train_state == {"step": 1}
    for name, value in _params_at(1).items():
        np.testing.assert_array_equal(np.asarray(params[name]), np.asarray(value))
    np.testing.assert_array_equal(np.asarray(opt_state["m"]), np.full(3, 1.0))
    restored = [m for m in caplog.messages if m.startswith("restored checkpoint")]
    assert restored == ["restored checkpoint step 1 (verified)"]
    assert unlisted in caplog.text and "falling back to the previous step" in caplog.text
    assert [p.name for p in (tmp_path / "run" / checkpoints.SET_ASIDE_SUBDIR).iterdir()] == [
        "2.corrupt"
    ]


def _older_step_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_checkpoint_named_without_its_step_says_which_step_it_uses_past_an_unrecorded_one(
    tmp_path, caplog
):
    model_dir = tmp_path / "source"
    directory = _saved(model_dir, steps=(1, 2, 3))
    for step in (2, 3):  # committed without their records (older code, another tool)
        (directory / str(step) / checksums.MANIFEST_FILE).unlink()
    abstract = abstract_of(PARAMS)
    # What names the checkpoint -> (the step it resolves to, as the job does, and what the
    # message calls it).
    uses = {
        "INIT_CHECKPOINT": (
            lambda: checkpoints.check_init_checkpoint(
                os.fspath(model_dir), abstract_params=abstract
            )[1],
            f"INIT_CHECKPOINT {os.fspath(model_dir)!r}",
        ),
        # `xlscale eval` / `python -m trainer.eval` without @step (CHECKPOINT or MODEL_DIR).
        "eval": (
            lambda: restore_lib.resolve_step(model_dir, None, flag="CHECKPOINT"),
            f"CHECKPOINT {os.fspath(model_dir)!r}",
        ),
        # The restore of decoding and zero-shot scoring: resolves, then restores that step.
        "restore": (
            lambda: restore_lib.restore_params(model_dir, abstract_params=abstract).step,
            f"checkpoint {os.fspath(directory)!r}",
        ),
    }
    for use, source in uses.values():
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert use() == 1
        warnings = _older_step_warnings(caplog)
        assert len(warnings) == 1, warnings
        assert warnings[0] == (
            f"{source}: using step 1, the newest step with an integrity "
            f"record; skipped newer steps 2, 3: no integrity record ({checksums.MANIFEST_FILE}), "
            "so their files cannot be verified (name a step with '@STEP', or record files you "
            f"trust: xlscale convert record '{directory}@3')"
        )
    # Named with its step, or when the newest step has its record, nothing is said.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        checkpoints.check_init_checkpoint(f"{model_dir}@1", abstract_params=abstract)
        assert restore_lib.resolve_step(model_dir, 1, flag="CHECKPOINT") == 1
        assert checkpoints.check_init_checkpoint(
            os.fspath(_saved(tmp_path / "recorded")), abstract_params=abstract
        ) == (checkpoints.checkpoints_dir(tmp_path / "recorded"), 2)
    assert _older_step_warnings(caplog) == []
