"""T5X run directories written without T5X or TensorFlow (`write_t5x_run`): an operative
config.gin, one `events.out.tfevents.*` per summary directory with rank-0 float tensors and the
`scalars` plugin's metadata (`write_events`), and `checkpoint_<step>/` directories. Needs
tensorboard: importing this module skips the test without it."""

from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
from tensorboard.compat.proto import event_pb2  # noqa: E402
from tensorboard.plugins.scalar.summary_v2 import scalar_pb  # noqa: E402
from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: E402

# Shaped as T5X's operative config (gin_utils.summarize_gin_config): imports, `# Macros:`, then
# one `# Parameters for ...:` section per configurable, scoped bindings, `\` continuations.
PRETRAIN_GIN = """\
from __gin__ import dynamic_registration
import __main__ as train_script
from t5x import adafactor
from t5x import gin_utils
from t5x import models
from t5x import partitioning
from t5x import trainer
from t5x import utils
from t5x.examples.t5 import network

# Macros:
# ==============================================================================
BATCH_SIZE = 256
DROPOUT_RATE = 0.0
MIXTURE_OR_TASK_MODULE = 't5x_configs.t5x_tasks'
MIXTURE_OR_TASK_NAME = '{task}'
MODEL = @models.EncoderDecoderModel()
MODEL_DIR = '/runs/{run}'
OPTIMIZER = @adafactor.Adafactor()
TASK_FEATURE_LENGTHS = {{'inputs': 512, 'targets': 114}}
TRAIN_STEPS = {steps}
TRAIN_STEPS_RELATIVE = None
USE_CACHED_TASKS = False

# Parameters for models.EncoderDecoderModel:
# ==============================================================================
models.EncoderDecoderModel.loss_normalizing_factor = None
models.EncoderDecoderModel.module = @network.Transformer()
models.EncoderDecoderModel.optimizer_def = %OPTIMIZER
models.EncoderDecoderModel.z_loss = 0.0001

# Parameters for network.T5Config:
# ==============================================================================
network.T5Config.dropout_rate = %DROPOUT_RATE
network.T5Config.emb_dim = 1024
network.T5Config.head_dim = 64
network.T5Config.logits_via_embedding = False
network.T5Config.mlp_activations = ('gelu', 'linear')
network.T5Config.mlp_dim = 2816
network.T5Config.num_decoder_layers = 24
network.T5Config.num_encoder_layers = 24
network.T5Config.num_heads = 16
network.T5Config.vocab_size = 32128

# Parameters for utils.RestoreCheckpointConfig:
# ==============================================================================
utils.RestoreCheckpointConfig.path = []

# Parameters for train_script.train:
# ==============================================================================
train_script.train.eval_period = 1000
train_script.train.model = %MODEL
train_script.train.model_dir = %MODEL_DIR
train_script.train.total_steps = %TRAIN_STEPS

# Parameters for train/utils.DatasetConfig:
# ==============================================================================
train/utils.DatasetConfig.batch_size = %BATCH_SIZE
train/utils.DatasetConfig.mixture_or_task_name = %MIXTURE_OR_TASK_NAME
train/utils.DatasetConfig.split = 'train'
train/utils.DatasetConfig.task_feature_lengths = %TASK_FEATURE_LENGTHS
"""

FINETUNE_EXTRA = """
INITIAL_CHECKPOINT_PATH = \\
    '/runs/{parent}/checkpoint_{init}'

# Parameters for utils.RestoreCheckpointConfig:
# ==============================================================================
utils.RestoreCheckpointConfig.mode = 'specific'
utils.RestoreCheckpointConfig.path = %INITIAL_CHECKPOINT_PATH
"""


def write_events(directory: Path, points_by_tag: dict[str, list[tuple[int, float]]]) -> None:
    """One event file of scalar summaries, as `tf.summary.scalar` writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory))
    for tag, pts in points_by_tag.items():
        for step, value in pts:
            writer.add_event(event_pb2.Event(step=step, summary=scalar_pb(tag, value)))
    writer.close()


def loss_metrics(ce: float, *, frac: float = 0.8, z: float = 1e-3) -> dict[str, float]:
    """T5X's `compute_base_metrics` names for summed losses (loss_normalizing_factor None) whose
    per-real-token cross-entropy is `ce`."""
    return {
        "loss": 1000.0 * (ce + z),
        "cross_ent_loss": 1000.0 * ce,
        "cross_ent_loss_per_all_target_tokens": ce * frac,
        "non_padding_fraction/loss_weights": frac,
        "z_loss": 1000.0 * z,
        "accuracy": 0.5,
        "timing/seqs_per_second": 10.0,
    }


def write_t5x_run(
    root: Path,
    run: str,
    *,
    task: str,
    steps: int,
    ckpts: list[int],
    ce: dict[int, float],
    parent: str | None = None,
    init: int = 0,
    bleu: float | None = None,
    eval_task: str | None = None,
) -> Path:
    """A MODEL_DIR laid out as `t5x.train` leaves it."""
    d = root / run
    d.mkdir(parents=True)
    text = PRETRAIN_GIN.format(task=task, run=run, steps=steps)
    if parent:
        text += FINETUNE_EXTRA.format(parent=parent, init=init)
    (d / "config.gin").write_text(text)
    train = {}
    for step, value in ce.items():
        for k, v in {**loss_metrics(value), "learning_rate": 0.01}.items():
            train.setdefault(k, []).append((step, v))
    write_events(d / "train", train)
    evals = {}
    for step, value in ce.items():
        for k, v in loss_metrics(value + 0.1).items():
            evals.setdefault(k, []).append((step, v))
    write_events(d / "training_eval" / (eval_task or task), evals)
    if bleu is not None:
        write_events(
            d / "inference_eval" / (eval_task or task),
            {
                "eval/bleu": [(steps, bleu)],
                "eval/chrf": [(steps, 40.0)],
                "eval/rougeL": [(steps, 50.0)],
            },
        )
    for step in ckpts:
        (d / f"checkpoint_{step}").mkdir()
        (d / f"checkpoint_{step}" / "checkpoint").write_bytes(b"")
    return d
