"""A gin value the trainer cannot take is refused before anything runs: one line on stderr naming
the flag, the value and what is allowed, exit 2 (`rundir.exits`, "configuration").

A value of the wrong type (`gin_types`), a flag or a gin file line gin cannot parse
(`gin_checks.explain_syntax_error`), a step count that is not an integer and a checkpoint period
that is not positive used to end in tracebacks (exit 1) or to run silently (`TRAIN_STEPS=10.5`
trained 10 steps). The cases run `xlscale train` in this process, as tests/test_exit_codes.py
does; one runs the real `python -m trainer.train` for the process's own exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tiny_runs import REPO, tiny_train

from rundir import exits
from trainer import train as train_lib
from xlscale_cli import main

pytestmark = pytest.mark.usefixtures("clean_gin")

CONFIGURATION = exits.CLASSES["configuration"].code
# case -> (the flag, what the line says is allowed)
CASES = {
    "string step count": ("--gin.TRAIN_STEPS='ten'", "allowed: an integer or None"),
    "fractional step count": ("--gin.TRAIN_STEPS=10.5", "allowed: an integer or None"),
    "unparsable flag": ("--gin.TRAIN_STEPS=((", "allowed: --gin.NAME=VALUE with VALUE"),
    "negative checkpoint period": ("--gin.CHECKPOINT_PERIOD=-2", "allowed: a positive integer"),
}


def _refused(argv, monkeypatch, capsys) -> list[str]:
    """stderr of `xlscale train ARGV`, which must be refused as a configuration with exit 2
    before the run starts."""
    monkeypatch.setattr(train_lib, "_run", lambda *a, **k: pytest.fail("the run started"))
    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    code = main.main(argv)
    err = capsys.readouterr().err
    assert code == CONFIGURATION, err
    assert "Traceback" not in err and "In call to configurable" not in err, err
    return err.splitlines()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_gin_value_is_one_line_naming_the_flag_and_the_value(
    case, tiny_data, tmp_path, monkeypatch, capsys
):
    flag, allowed = CASES[case]
    macro, value = flag.removeprefix("--gin.").split("=", 1)
    run = tmp_path / "run"
    lines = _refused(tiny_train(tiny_data, run, flag), monkeypatch, capsys)
    assert len(lines) == 1, lines
    assert lines[0].startswith("xlscale train: ") and allowed in lines[0], lines
    assert macro in lines[0] and value in lines[0], lines
    assert not run.exists()


def test_a_gin_file_line_gin_cannot_parse_names_the_file_and_the_line(
    tiny_data, tmp_path, monkeypatch, capsys
):
    mine = tmp_path / "mine.gin"
    mine.write_text("# steps\nTRAIN_STEPS = 1 2\n")
    argv = tiny_train(tiny_data, tmp_path / "run", f"--gin_file={mine}")
    assert _refused(argv, monkeypatch, capsys) == [
        f"xlscale train: gin cannot parse the statement in {mine}:2 'TRAIN_STEPS = 1 2': "
        "Expected newline; allowed: gin statements (NAME = VALUE, configurable.param = VALUE, "
        "include, import)"
    ]


@pytest.mark.slow
def test_the_trainer_process_refuses_an_unparsable_flag_with_exit_2(tiny_data, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.train", *tiny_train(tiny_data, run)[1:], "--gin.SEED=(("],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, exits.DEBUG_ENV: "", "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300,
    )
    assert proc.returncode == CONFIGURATION, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "python -m trainer.train: --gin.SEED=((: gin cannot parse it (a bracket or a string is "
        "not closed); allowed: --gin.NAME=VALUE with VALUE a Python literal (strings quoted: "
        "--gin.NAME=\"'text'\"), a %MACRO or an @configurable()"
    )
    assert not run.exists()
