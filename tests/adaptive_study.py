"""The tiny adaptive study: five tiny from-scratch runs (French, the fixture corpora) of the
sizes in `SIZES`; `manifest_text` is its sweep manifest."""

from __future__ import annotations

import json
import threading

from launch_fakes import size_section, tiny_sweep

SIZES = {  # name -> (d_model, num_layers): 4k to 100k non-embedding parameters
    "a_d16": (16, 1),
    "b_d32": (32, 1),
    "c_d32x2": (32, 2),
    "d_d48x2": (48, 2),
    "e_d64x2": (64, 2),
}
MANIFEST = (
    tiny_sweep(
        "adaptive_tiny",
        description="five tiny scratch runs (fr) for the adaptive sweep",
        runs_dir="RUNS_DIR",
    )
    + """PEAK_LR = 3e-3
EVAL_PERIOD = 6
EVAL_MAX_TOKENS = 1024
LOG_EVERY = 3
CHECKPOINT_PERIOD = 12

[axes]
sizes = SIZE_NAMES
target_langs = ["fr"]
seeds = [0]

[[grid]]
strategies = ["scratch"]

[budget]
steps = 24
batch_size = 8
"""
)


def manifest_text(runs_dir) -> str:
    """The tiny study's manifest with its runs in `runs_dir` and its sizes' sections."""
    text = MANIFEST.replace("RUNS_DIR", str(runs_dir))
    text = text.replace("SIZE_NAMES", json.dumps(list(SIZES)))
    for name, (width, layers) in SIZES.items():
        text += "\n" + size_section(name, d_model=width, d_ff=4 * width, num_layers=layers)
    return text


def caught_up(sweep, launcher, monkeypatch, timeout: float = 300.0) -> None:
    """Makes `launcher` (a `SequentialLauncher`) start each run only once the adaptive `sweep`
    has polled the runs as they are then (a poll that began after the launcher came to the run
    has ended), so its decisions about that run are in before the run starts, however fast or
    slow the trainer: a run the law already knows is skipped, never started, instead of racing
    the refit. A run may still be stopped mid-training where the watcher is quick enough."""
    cond = threading.Condition()
    began, ended = [0], [0]
    poll, attempt = sweep.poll, launcher.attempt

    def counted_poll():
        with cond:
            began[0] += 1
            mine = began[0]
        try:
            return poll()
        finally:
            with cond:
                ended[0] = mine
                cond.notify_all()

    def gated_attempt(run, progress):
        with cond:
            after = began[0]
            assert cond.wait_for(lambda: ended[0] > after, timeout), "the sweep stopped polling"
        return attempt(run, progress)

    monkeypatch.setattr(sweep, "poll", counted_poll)
    monkeypatch.setattr(launcher, "attempt", gated_attempt)
