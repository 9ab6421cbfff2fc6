"""The `xlscale` console script: a closed stdout ends a command quietly (`xlscale sizes | head`)."""

import subprocess
import sys
from pathlib import Path

from xlscale_cli import main

ROOT = Path(__file__).resolve().parent.parent  # `python -m` finds xlscale_cli from here


def test_sizes_into_a_reader_that_closes_early_prints_no_traceback():
    # The reader closes before the command writes anything, as `head` does once it has its lines.
    proc = subprocess.Popen(
        [sys.executable, "-m", "xlscale_cli.main", "sizes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == main.BROKEN_PIPE_EXIT, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_sizes_into_an_open_pipe_still_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "xlscale_cli.main", "sizes"],
        capture_output=True,
        cwd=ROOT,
        text=True,
        timeout=60,
        check=True,
    )
    assert "llama2_49m" in out.stdout and out.stderr == ""
