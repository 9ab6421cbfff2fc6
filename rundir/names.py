"""Every name under a run directory (`MODEL_DIR`) and under a runs directory.

The trainer writes these, `fitting`, `launch`, `studies` and `evals` read them: each is spelled
here once (docs/interfaces.md, "Training outputs").
"""

from __future__ import annotations

# MODEL_DIR/...
RUN_FILE = "run.json"  # what the run is (model, counts, strategy, units, fingerprint)
METRICS_FILE = "metrics.jsonl"  # one JSON record per logged step
COMPLETED_FILE = "COMPLETED"  # written last, on success: {"step", "tokens"}
CONFIG_FILE = "config.gin"  # the resolved gin config (`config.<step>.gin` after an amendment)
LEASE_FILE = "LEASE"  # the one writer's lease (`rundir.lease`)
TB_SUBDIR = "tb"  # TensorBoard event files
CHECKPOINTS_SUBDIR = "checkpoints"  # orbax steps `checkpoints/<step>/`
SET_ASIDE_SUBDIR = "checkpoints_set_aside"  # `<step>.corrupt`, `<step>.nonfinite`
CHECKSUMS_FILE = "xlscale_checksums.json"  # inside each committed step (`rundir.checksums`)
ZEROSHOT_SUBDIR = "zeroshot"  # `zeroshot/<step>.json` (`rundir.zeroshot`)
LAUNCH_FILE = "launch.json"  # the launcher's own record of how the run was started
# A request that the run stop (checkpoint saved, no COMPLETED) and not be started again while it
# exists: the trainer polls it (`rundir.stop_request`); `xlscale sweep run --adaptive` writes it.
STOP_REQUEST_FILE = "STOP_REQUESTED"
# A finetune's best validation step: metric, rule, step, value, whether its checkpoint is kept
# (`launch.best_checkpoint`, written by a `[[select]]` with `at = "best"`).
BEST_CHECKPOINT_FILE = "best_checkpoint.json"
LOG_FILE = "train.log"  # the local launcher's process log of the run (`launch.launchers`)
EVAL_METRICS_FILE = "eval_metrics.jsonl"  # `trainer.eval`: one record per evaluated step
INFER_FILE = "infer.jsonl"  # `trainer.infer`: one decoded example (or LM continuation) a line
SCORES_FILE = "scores.json"  # `trainer.infer`: the scores of `infer.jsonl` against its targets
PREDICTIONS_SUBDIR = "predictions"  # `trainer.downstream`: `predictions/<task>_<step>.jsonl`
# The keys of each line of a predictions file (and of `infer.jsonl`).
PREDICTION_INPUTS = "inputs"  # the source text
PREDICTION_TARGET = "target"  # the reference
PREDICTION_OUTPUT = "prediction"  # the decoded text

# RUNS_DIR/...
SELECTION_FILE = "selection.json"  # a sweep's `[[select]]` choices
ADAPTIVE_SUBDIR = "adaptive"  # `xlscale sweep run --adaptive`'s logs (`launch.adaptive`):
ADAPTIVE_DECISIONS_FILE = "decisions.jsonl"  # one decision (run, RUN/SKIP/STOP, why) a line
ADAPTIVE_FITS_FILE = "fits.jsonl"  # one refit (chip-hours spent, params, 95% intervals) a line
ADAPTIVE_SESSION_FILE = "session.json"  # the thresholds, hardware and fit settings in force
ADAPTIVE_ERROR_FILE = "steering_error.txt"  # the traceback of steering that stopped mid-sweep


def predictions_file(task: str, step: int) -> str:
    """The name of the predictions file of `task` decoded at `step` (in `PREDICTIONS_SUBDIR`)."""
    return f"{task}_{int(step)}.jsonl"


def parse_predictions_file(name: str) -> tuple[str, int] | None:
    """(task, step) of a `predictions_file` name; None for any other name."""
    stem, dot, suffix = name.rpartition(".")
    task, _, step = stem.rpartition("_")
    if not dot or suffix != "jsonl" or not task or not step.isdigit():
        return None
    return task, int(step)


def amended_config_file(step: int) -> str:
    """Where the `config.gin` in force before an amended resume at `step` is kept."""
    return f"config.{int(step)}.gin"
