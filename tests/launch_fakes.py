"""The launcher tests' sweep and trainer: `MANIFEST` (a small sweep of two sizes), `FakeTrainer`
(stands in for trainer.train) and `launch` (a LocalLauncher run with its progress text); and the
pieces the test sweep manifests share (`DATA_SECTIONS`, `tiny_sweep`, `size_section`)."""

import io
import json
from pathlib import Path

from launch import launchers, status, sweep

# A manifest's `[vars]` and `[gin]` sections passing DATA_DIR and VOCAB_PATH (given by `--var`)
# to gin; a manifest adds its own gin settings after them.
DATA_SECTIONS = """[vars]
DATA_DIR = ""
VOCAB_PATH = ""

[gin]
DATA_DIR = "${DATA_DIR}"
VOCAB_PATH = "${VOCAB_PATH}"
"""


def with_prepared_data(manifest: str) -> str:
    """`manifest` (one with `DATA_SECTIONS`) whose runs read prepared data: a `PREPARED_DATA`
    variable, to be given by `--var` (the `tiny_prepared` fixture's directory), bound to the gin
    macro beside DATA_DIR and VOCAB_PATH. Its trainers then build no seqio task or tf.data
    pipeline (seconds of CPU each): for the sweeps whose subject is not seqio."""
    text = manifest.replace('VOCAB_PATH = ""\n', 'VOCAB_PATH = ""\nPREPARED_DATA = ""\n', 1)
    text = text.replace(
        'VOCAB_PATH = "${VOCAB_PATH}"\n',
        'VOCAB_PATH = "${VOCAB_PATH}"\nPREPARED_DATA = "${PREPARED_DATA}"\n',
        1,
    )
    assert text.count("PREPARED_DATA") == 3, "a manifest without DATA_SECTIONS"
    return text


def tiny_sweep(
    name: str, *, description: str = "", runs_dir: str = "", prepared: bool = False
) -> str:
    """The head of a manifest of tiny llama2 runs on the fixture corpora (`experiments/tiny.gin`,
    64-token sequences): its `[sweep]` section, then `DATA_SECTIONS` and tiny.gin's model
    overrides; the caller appends its other gin settings and sections. One text for the tiny
    sweeps of several helper modules, so that they stay alike. `prepared`: the runs read
    prepared data (`with_prepared_data`)."""
    text = (
        f'\n[sweep]\nname = "{name}"\n'
        + (f'description = "{description}"\n' if description else "")
        + 'family = "llama2"\n'
        + (f'runs_dir = "{runs_dir}"\n' if runs_dir else "")
        + 'seq_len = 64\ngin_files = ["experiments/tiny.gin"]\n\n'
        + DATA_SECTIONS
        + "MODEL_OVERRIDES = { vocab_size = 512, max_len = 128 }\nSEQUENCE_LENGTH = 64\n"
    )
    return with_prepared_data(text) if prepared else text


def size_section(name: str, *, d_model: int, d_ff: int, num_layers: int) -> str:
    """A manifest's `[sizes.<name>]` section: a llama2 shape of 2 heads based on
    `llama2_cpu_d64`, as the tiny test sweeps use."""
    return (
        f'[sizes.{name}]\nbase = "llama2_cpu_d64"\nd_model = {d_model}\nd_ff = {d_ff}\n'
        f"num_heads = 2\nnum_layers = {num_layers}\n"
    )


MANIFEST = f"""
[sweep]
name = "unit"
seq_len = 16

[vars]
DATA_DIR = "/data"

[env]
XLSCALE_TEST_ENV = "${{DATA_DIR}}/x"

[gin]
DATA_DIR = "${{DATA_DIR}}"

{size_section("a", d_model=16, d_ff=32, num_layers=1)}
{size_section("b", d_model=32, d_ff=64, num_layers=2)}
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


def smoke_runs(runs_dir: Path, *, data_dir: str, vocab_path: str) -> list:
    """The runs of the shipped `smoke` manifest with its DATA_DIR and VOCAB_PATH set and its run
    directories under `runs_dir`: a real sweep for the tests of the launchers' command lines."""
    manifest = sweep.load_manifest(
        "smoke",
        variables={"DATA_DIR": data_dir, "VOCAB_PATH": vocab_path},
        runs_dir=str(runs_dir),
    )
    return sweep.expand(manifest)


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
