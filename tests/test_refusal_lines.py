"""Every known refusal of an `xlscale` command is at most three lines on stderr, with
its class's exit code (`rundir.exits`) and a traceback only with `--verbose`.

Each case runs the real console module (`python -m xlscale_cli.main`) in a subprocess. Libraries
print their own log lines on stderr before a refusal (TensorFlow's and absl's C++ start-up lines,
orbax's read-only notices); those are matched by `_LIBRARY_LOG` and every other line counts. One
tiny training (module fixture) gives the checkpoint the `INIT_CHECKPOINT` cases point at.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tiny_runs import tiny_train

from fitting.laws import synthetic
from rundir import exits
from trainer import validation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGURATION = exits.CLASSES["configuration"].code
FIT_BAD_INPUT = 1  # `xlscale fit`'s own code for bad input (docs/interfaces.md)
# Log lines of TensorFlow/XLA (absl C++: `I0000 00:00:...`), absl's pre-init notice and orbax's
# absl warnings: not ours, and not part of the refusal.
_LIBRARY_LOG = re.compile(r"^([IWE]\d{4} \d|WARNING: All log messages before absl|WARNING:absl:)")


def xlscale(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop(exits.DEBUG_ENV, None)
    return subprocess.run(
        [sys.executable, "-m", "xlscale_cli.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refusal_lines(proc: subprocess.CompletedProcess, command: str) -> list[str]:
    """stderr less the libraries' log lines; fails unless that is the refusal, which starts with
    `xlscale <command>:`."""
    ours = [line for line in proc.stderr.splitlines() if not _LIBRARY_LOG.match(line)]
    assert ours and ours[0].startswith(f"xlscale {command}: "), proc.stderr
    assert "Traceback" not in proc.stderr and "In call to configurable" not in proc.stderr
    return ours


@pytest.fixture(scope="module")
def source_run(tiny_data, tiny_prepared, tmp_path_factory):
    """A 10-step tiny run with one checkpoint (step 10) and a 512-piece embedding, on prepared
    data (no TensorFlow imported)."""
    run = tmp_path_factory.mktemp("refusals") / "source"
    argv = tiny_train(tiny_data, run, "--gin.TRAIN_STEPS=10", prepared=tiny_prepared)
    proc = xlscale(*argv, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10"]
    return run


def _attempt_only(path):
    """A run directory as a refused attempt leaves it: no checkpoint, no metrics."""
    (path / "checkpoints").mkdir(parents=True)
    (path / "config.gin").write_text("")
    return path


# case -> (INIT_CHECKPOINT given `source` and `tmp`, extra flags, what stderr's first line holds)
INIT_CASES = {
    "vocabulary": (
        "{source}",
        ["--gin.MODEL_OVERRIDES={'vocab_size': 384, 'max_len': 128}"],
        "does not fit the model (2 parameters)",
    ),
    "missing": ("{tmp}/nowhere", [], "no directory"),
    "no_such_step": ("{source}@7", [], "no step 7 in"),
    "no_checkpoints": ("{tmp}/attempt", [], "no checkpoint in"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(INIT_CASES))
def test_init_checkpoint_refusals_are_at_most_three_lines(
    case, source_run, tiny_data, tiny_prepared, tmp_path
):
    spec, extra, first = INIT_CASES[case]
    _attempt_only(tmp_path / "attempt")
    spec = spec.format(source=source_run, tmp=tmp_path)
    run = tmp_path / "run"
    flags = (f"--gin.INIT_CHECKPOINT='{spec}'", *extra)  # on prepared data: no TensorFlow imported
    proc = xlscale(*tiny_train(tiny_data, run, *flags, prepared=tiny_prepared))
    assert proc.returncode == CONFIGURATION, proc.stderr[-3000:]
    lines = refusal_lines(proc, "train")
    assert len(lines) <= exits.MAX_LINES, lines
    assert f"INIT_CHECKPOINT {spec!r}" in lines[0] and first in lines[0]
    if case == "no_such_step":
        assert "(steps: [10])" in lines[0]  # what exists
    if case == "vocabulary":  # both mismatched parameters, each with both shapes
        assert sorted(line.split(":")[0].strip() for line in lines[1:]) == [
            "lm_head/kernel",
            "token_embedder/embedding",
        ]
        assert "(512, 32), model wants (384, 32)" in proc.stderr
    assert not list(run.glob("checkpoints/*"))  # refused before any step


@pytest.mark.slow
def test_eval_checkpoint_without_checkpoints_and_its_traceback_with_verbose(tiny_data, tmp_path):
    run = _attempt_only(tmp_path / "attempt")
    args = (
        "eval",
        "--gin_file=models/llama2.gin",
        "--gin_file=runs/eval.gin",
        "--gin.MODEL_SIZE='llama2_tiny'",
        "--gin.MODEL_OVERRIDES={'vocab_size': 512, 'max_len': 128}",
        f"--gin.MODEL_DIR='{run}'",
        "--gin.EVAL_TASKS=['lm_en']",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        "--gin.SEQUENCE_LENGTH=64",
        "--gin.BATCH_SIZE=8",
    )
    proc = xlscale(*args)
    assert proc.returncode == CONFIGURATION, proc.stderr[-3000:]
    assert refusal_lines(proc, "eval") == [f"xlscale eval: CHECKPOINT '{run}': no checkpoint in it"]
    verbose = xlscale(*args, "--verbose")
    assert verbose.returncode == CONFIGURATION
    assert "Traceback" in verbose.stderr and "CheckpointNotFoundError" in verbose.stderr
    assert verbose.stderr.rstrip().endswith(
        f"xlscale eval: CHECKPOINT '{run}': no checkpoint in it"
    )


@pytest.mark.slow
def test_fit_refusals_are_one_line_and_leave_no_out(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    empty = tmp_path / "empty_runs"
    _attempt_only(empty / "refused")
    cases = {
        # (--runs, --out) -> stderr's line
        (a_file, tmp_path / "o1"): f"xlscale fit: runs directory {a_file} is not a directory",
        (
            empty,
            a_file,
        ): f"xlscale fit: --out {a_file} is a file, not a directory: name a directory",
        (empty, tmp_path / "o2" / "deeper"): "xlscale fit: no run directories",
    }
    for (runs, out), line in cases.items():
        proc = xlscale("fit", "--runs", str(runs), "--out", str(out), "--bootstrap", "0")
        assert proc.returncode == FIT_BAD_INPUT, proc.stderr
        lines = refusal_lines(proc, "fit")
        assert len(lines) <= exits.MAX_LINES and lines[0].startswith(line), lines
        assert a_file.read_text() == ""
    assert "only config.gin, checkpoints" in proc.stderr  # the skipped attempt is named
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "empty_runs"]


@pytest.mark.slow
def test_fit_law_without_runs_removes_the_out_it_created(tmp_path):
    runs = synthetic.write_study(
        tmp_path / "runs", sizes=(3e7, 1e8), evals=3, replay_ratios=(), mt=False
    )
    proc = xlscale("fit", "--runs", str(runs), "--out", str(tmp_path / "o"), "--law", "replay")
    assert proc.returncode == FIT_BAD_INPUT, proc.stderr
    assert refusal_lines(proc, "fit")[0].startswith("xlscale fit: replay: no cpt_replay runs")
    assert not (tmp_path / "o").exists()
    (tmp_path / "kept").mkdir()  # an --out that existed before stays
    (tmp_path / "kept" / "mine.txt").write_text("x")
    proc = xlscale("fit", "--runs", str(runs), "--out", str(tmp_path / "kept"), "--law", "replay")
    assert proc.returncode == FIT_BAD_INPUT
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["mine.txt"]


def test_a_long_refusal_keeps_three_lines_and_the_traceback_has_it_all(capsys):
    parts = [f"  p{i}: checkpoint has shape (1,), model wants (2,)" for i in range(6)]
    error = validation.ConfigError("head:\n" + "\n".join(parts) + "\n  In call to configurable 'x'")
    assert exits.present(error, prog="xlscale train") == CONFIGURATION
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "xlscale train: head:",
        parts[0],
        f"  ... and 5 more lines ({exits.VERBOSE_FLAG} prints them all)",
    ]
    exits.present(error, prog="xlscale train", verbose=True)
    err = capsys.readouterr().err
    assert all(p in err for p in parts)


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (bit 15 of `SigCgt` in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (15 - 1)))


def test_sigterm_while_a_job_imports_is_a_preemption_in_one_line(tiny_data, tmp_path):
    # A SIGTERM while `xlscale train` is still importing JAX and TensorFlow, sent as soon as the
    # process has a handler (long before the imports end), is a preemption (75) in one line, with
    # nothing written.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    model_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "xlscale_cli.main", *tiny_train(tiny_data, model_dir)],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None, proc.stderr.read()
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == exits.PREEMPTED, err
    assert err.splitlines() == [
        "xlscale train: SIGTERM before the job started; nothing was written: start it again"
    ]
    assert not model_dir.exists()


def test_sigterm_while_tensorflow_imports_still_has_its_line_on_the_terminal(tmp_path):
    # TensorFlow imports with fd 2 pointed at the third-party log (its native start-up lines go
    # there); a SIGTERM at that moment still puts the preemption line on the terminal, not in
    # the log. The moment is chosen, not raced: the signal is sent from inside the redirect.
    third_party = tmp_path / "third_party.log"
    script = (
        "import os, signal, time\n"
        "from pipelines import native_logs\n"
        "from xlscale_cli import main\n"
        "main._preempted_before_start('xlscale train')\n"
        "with native_logs.stderr_to():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n"
    )
    env = {**os.environ, "XLSCALE_THIRD_PARTY_LOG": str(third_party)}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == exits.PREEMPTED, proc.stderr
    assert proc.stderr.splitlines() == [
        "xlscale train: SIGTERM before the job started; nothing was written: start it again"
    ]
    assert "SIGTERM" not in (third_party.read_text() if third_party.exists() else "")
