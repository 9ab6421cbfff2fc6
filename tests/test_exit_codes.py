"""One error presentation for every command: a known refusal is its message on stderr,
prefixed by the command, with the exit code of its class (`rundir.exits`); the traceback only with
`--verbose` or `XLSCALE_DEBUG=1`; a bug keeps its traceback.

The table runs `xlscale` in this process (the refusals come before anything is compiled); one
case runs the real `python -m trainer.train` to check the process's own exit status and stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from lease_files import lease_holder, write_lease
from tiny_runs import tiny_train

from rundir import exits
from trainer import divergence
from trainer import train as train_lib
from xlscale_cli import main

pytestmark = pytest.mark.usefixtures("clean_gin")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def sleeper():
    other = subprocess.Popen(["sleep", "3600"])  # outlives any start-up; killed at teardown
    yield other.pid
    other.kill()
    other.wait()


def _diverged(plan, **kwargs):
    raise divergence.NonFiniteError(f"step 3: the loss was not finite; {divergence.ADVICE}")


def _preempted(plan, **kwargs):
    return train_lib.TrainResult(model_dir=str(plan.model_dir), step=3, tokens=1, completed=False)


CASES = {
    # case -> (extra flags, what the trainer does past its checks, exit class, stderr's start)
    "typo": (["--gin.TRAIN_STEP=3"], None, "configuration", "gin macro TRAIN_STEP"),
    "scheme": (["--gin.MODEL_DIR='s3://b/run'"], None, "configuration", "MODEL_DIR='s3://b/run'"),
    "replay": (["--gin.REPLAY_RATIO=0.5"], None, "configuration", "REPLAY_RATIO (train.RunInfo"),
    "lease": ([], None, "contract", "MODEL_DIR {run} is in use by another training job"),
    "divergence": ([], _diverged, "divergence", "step 3: the loss was not finite"),
    "preemption": ([], _preempted, "preemption", None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_refusal_class_is_one_message_and_its_exit_code(
    case, tiny_data, tmp_path, monkeypatch, capsys, sleeper
):
    flags, after_checks, kind, first = CASES[case]
    run = tmp_path / "run"
    if case == "lease":
        write_lease(run, lease_holder(sleeper))
    monkeypatch.setattr(
        train_lib,
        "_run",
        after_checks or (lambda *a, **k: pytest.fail("the refusal came too late")),
    )
    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    code = main.main(tiny_train(tiny_data, run, *flags))
    err = capsys.readouterr().err
    assert code == exits.CLASSES[kind].code, err
    if first is None:
        assert err == ""
        return
    assert err.startswith(f"xlscale train: {first.format(run=run)}"), err
    assert "Traceback" not in err and "In call to configurable" not in err
    assert len(err.splitlines()) <= 2, err


def test_verbose_and_xlscale_debug_print_the_traceback(tiny_data, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    argv = tiny_train(tiny_data, tmp_path / "run", "--gin.TRAIN_STEP=3")
    assert main.main([*argv, "--verbose"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "xlscale train: gin macro TRAIN_STEP" in err
    monkeypatch.setenv(exits.DEBUG_ENV, "1")
    assert main.main(argv) == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_bug_keeps_its_traceback(tiny_data, tmp_path, monkeypatch):
    def bug(plan, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(train_lib, "_run", bug)
    with pytest.raises(ZeroDivisionError):
        main.main(tiny_train(tiny_data, tmp_path / "run"))


def test_every_class_has_its_own_documented_code():
    codes = [c.code for c in exits.CLASSES.values()]
    assert len(set(codes)) == len(codes) and exits.BUG not in codes
    assert exits.PREEMPTED == train_lib.PREEMPTED_EXIT_CODE == 75
    assert set(exits.REFUSALS.values()) <= set(exits.CLASSES)
    with open(os.path.join(REPO, "docs", "interfaces.md")) as f:
        doc = f.read()
    for c in exits.CLASSES.values():
        assert f"| {c.name} | {c.code} |" in doc


@pytest.mark.slow
def test_the_trainer_process_exits_with_the_class_code(tiny_data, tmp_path, sleeper):
    run = tmp_path / "run"
    # A holder whose heartbeat stays fresh however long the new process takes to start (over
    # 60 s on a slow 2-core machine, more than half of `LeaseConfig.stale_after_s`).
    write_lease(run, lease_holder(sleeper, heartbeat=time.time() + 600))
    argv = tiny_train(tiny_data, run)[1:]
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.train", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, exits.DEBUG_ENV: "", "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300,
    )
    assert proc.returncode == exits.CLASSES["contract"].code, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("python -m trainer")]
    assert lines and lines[0].startswith(f"python -m trainer.train: MODEL_DIR {run} is in use")
    assert "Traceback" not in proc.stderr
