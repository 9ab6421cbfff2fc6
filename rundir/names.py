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

# RUNS_DIR/...
SELECTION_FILE = "selection.json"  # a sweep's `[[select]]` choices


def amended_config_file(step: int) -> str:
    """Where the `config.gin` in force before an amended resume at `step` is kept."""
    return f"config.{int(step)}.gin"
