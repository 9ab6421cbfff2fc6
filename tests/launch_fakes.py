"""The launcher tests' sweep and trainer: `MANIFEST` (a small sweep of two sizes), `FakeTrainer`
(stands in for trainer.train) and `launch` (a LocalLauncher run with its progress text)."""

import io
import json
from pathlib import Path

from launch import launchers, status

MANIFEST = """
[sweep]
name = "unit"
seq_len = 16

[vars]
DATA_DIR = "/data"

[env]
XLSCALE_TEST_ENV = "${DATA_DIR}/x"

[gin]
DATA_DIR = "${DATA_DIR}"

[sizes.a]
base = "llama2_cpu_d64"
d_model = 16
d_ff = 32
num_heads = 2
num_layers = 1

[sizes.b]
base = "llama2_cpu_d64"
d_model = 32
d_ff = 64
num_heads = 2
num_layers = 2

[axes]
sizes = ["a", "b"]
target_langs = ["zh"]

[[grid]]
strategies = ["source", "scratch", "cpt"]

[[grid]]
strategies = ["cpt_replay"]
sizes = ["a"]
replay_ratios = [0.1]

[budget]
steps = 6
batch_size = 2
"""


def write_metrics(model_dir: Path, step: int, loss: float) -> None:
    with open(model_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "train/loss": loss, "eval/lm_zh/loss": loss + 1}) + "\n")


class FakeTrainer:
    """Stands in for trainer.train: resumes from MODEL_DIR/checkpoints/<step>, logs one metrics
    line per step, writes COMPLETED at the end; `fail_at[run_id] = k` makes the first attempt of
    that run stop after step k (checkpoint saved) with a non-zero exit."""

    def __init__(self, fail_at=None, raise_instead=False):
        self.fail_at = dict(fail_at or {})
        self.raise_instead = raise_instead
        self.calls = []

    def __call__(self, run, log_path):
        model_dir = Path(run.model_dir)
        init = dict(run.bindings).get("INIT_CHECKPOINT")
        if init is not None:  # CPT starts only from a finished source run
            assert (Path(init.strip("'")) / "COMPLETED").exists(), run.run_id
        checkpoints = model_dir / "checkpoints"
        checkpoints.mkdir(exist_ok=True)
        start = max((int(p.name) for p in checkpoints.iterdir()), default=0)
        self.calls.append((run.run_id, start))
        with open(log_path, "a") as log:
            log.write(f"training {run.run_id} from step {start}\n")
        for step in range(start + 1, run.steps + 1):
            write_metrics(model_dir, step, loss=10.0 / step)
            if self.fail_at.get(run.run_id) == step:
                (checkpoints / str(step)).mkdir()
                del self.fail_at[run.run_id]
                if self.raise_instead:
                    raise RuntimeError("simulated crash")
                return 75
        (model_dir / "COMPLETED").write_text(json.dumps({"step": run.steps, "tokens": run.tokens}))
        return 0


def launch(runs, runner, **kwargs):
    stream = io.StringIO()
    launcher = launchers.LocalLauncher(runner=runner, **kwargs)
    report = launcher.launch(runs, progress=status.Progress(runs, stream=stream))
    return report, stream.getvalue()
