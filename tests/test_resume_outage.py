"""An outage while a resume opens its checkpoints is a storage failure: one short report and
exit 74 (`rundir.exits`), never a traceback and exit 1, nor a step taken for corrupt.

The store is a real bucket of the test GCS API server (`tests/gcs_server.py`), stopped at the
moment the checkpoints are opened: while the plan decides to resume (listing the steps and
reading their integrity records), and while the trainer opens its store for the resume.
"""

from __future__ import annotations

import os
import shlex
import types

import gin
import jax
import jax.numpy as jnp
import pytest
from tiny_runs import tiny_train

from rundir import exits, storage
from trainer import checkpoints
from trainer import plan as plan_lib
from trainer import restore as restore_lib
from trainer import train as train_lib
from trainer.checkpoints import CheckpointConfig, CheckpointStore
from xlscale_cli import main

STORAGE = exits.CLASSES["storage"].code


def _saved_run(bucket: str) -> tuple[str, object]:
    """A run directory in the bucket whose checkpoints hold step 1 (with its record)."""
    model_dir = f"{bucket}/runs/outage"
    directory = checkpoints.checkpoints_dir(model_dir)
    store = CheckpointStore(directory, CheckpointConfig(period=1))
    try:
        store.save(1, params={"w": jnp.ones(4)}, opt_state={"m": jnp.zeros(2)}, train_state={})
    finally:
        store.close()
    return model_dir, directory


def _short_report(error: BaseException, capsys) -> list[str]:
    """The report `exits.present` prints for `error`; fails unless it is the storage class's."""
    assert exits.present(error, prog="xlscale train") == STORAGE
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("xlscale train: storage unreachable: "), lines
    assert len(lines) <= exits.MAX_LINES and "Traceback" not in "\n".join(lines), lines
    return lines


def test_listing_and_reading_records_in_an_outage_are_storage_failures(
    gcs_server, gcs_bucket, fast_retries, capsys
):
    model_dir, directory = _saved_run(gcs_bucket)
    assert checkpoints.committed_step(model_dir) == 1
    # What a resume does first: decide from the steps and their records; open the store to write
    # (which lists them and sets aside those without a record); read-only readers list them too.
    opens = {
        "resume decision": lambda: checkpoints.committed_step(model_dir),
        "writer": lambda: CheckpointStore(directory, CheckpointConfig()),
        "reader": lambda: CheckpointStore(directory, CheckpointConfig(), read_only=True),
        "kept steps": lambda: restore_lib.kept_steps(model_dir),
    }
    gcs_server.stop()
    try:
        for what, opening in opens.items():
            with pytest.raises(storage.StorageError) as e:
                opening()
            assert e.value.cause == "unreachable", what
            assert os.fspath(directory) in _short_report(e.value, capsys)[0], what
    finally:
        gcs_server.start()
    assert checkpoints.committed_step(model_dir) == 1  # nothing was set aside


def test_an_outage_while_the_trainer_opens_its_store_exits_74_in_a_few_lines(
    gcs_server, gcs_bucket, fast_retries, tiny_data, monkeypatch, capsys
):
    # The real `xlscale train` in this process; the replay check, planning and compiling are
    # stubbed (what the plan reads is tested above), and the store goes away as the resume opens
    # its checkpoints.
    model_dir, directory = _saved_run(gcs_bucket)
    resume = types.SimpleNamespace(
        model_dir=storage.as_path(model_dir),
        job=None,
        checkpoint=CheckpointConfig(period=1),
        resuming=True,
        resume_step=1,
    )
    monkeypatch.setattr(train_lib, "_check_replay", lambda **kwargs: None)  # imports seqio
    monkeypatch.setattr(train_lib.plan_lib, "build_run_plan", lambda **kwargs: resume)
    monkeypatch.setattr(plan_lib, "describe", lambda plan: "a resume")
    monkeypatch.setattr(train_lib.jobs, "compile_plan", lambda job: job)
    opening = CheckpointStore.__init__

    def outage_while_opening(self, *args, **kwargs):
        gcs_server.stop()
        opening(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointStore, "__init__", outage_while_opening)
    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    argv = tiny_train(tiny_data, model_dir)
    gin.clear_config()
    try:
        code = main.main(argv)
    finally:
        gin.clear_config()
        monkeypatch.setattr(CheckpointStore, "__init__", opening)
        gcs_server.start()
    err = capsys.readouterr().err
    own = [line for line in err.splitlines() if line.startswith(("xlscale train: ", "  "))]
    assert code == STORAGE, err
    assert "Traceback" not in err and len(own) <= 5, err
    assert own[0].startswith("xlscale train: storage unreachable: opening checkpoints in "), own
    assert own[1] == f"  {storage.CAUSES['unreachable']}", own
    # Where a rerun resumes: the step the plan found, not "no checkpoint was complete yet".
    assert own[2].startswith(f"  last complete checkpoint: step 1 ({directory / '1'})"), own
    head, _, command = own[-1].partition(": ")
    assert head == "  to resume once it is fixed", own
    assert shlex.split(command) == ["xlscale", *argv], own
    assert jax.process_count() == 1 and checkpoints.committed_step(model_dir) == 1
