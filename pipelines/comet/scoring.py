"""COMET scores from the project's side: run `pipelines/comet/worker.py` in COMET's own environment.

unbabel-comet 2.2.7 needs numpy<2, transformers<5, protobuf<5 and torchmetrics<0.11, which the
project's pinned JAX/TF stack cannot share, and the model and trainer packages must not import
torch. So COMET lives in a side environment (`make comet-env` builds `.comet-venv/` from
`pipelines/comet/requirements.txt`), and each scoring call starts its interpreter on the worker
script with the triples as JSON, as T5X is run beside the project.

Settings (a sweep manifest's `[settings]`, `launch.run_settings`):
  - `COMET_MODEL`: a local COMET checkpoint, `<model dir>/checkpoints/model.ckpt` (e.g.
    Unbabel/wmt22-comet-da fetched on a machine with network access); nothing is downloaded.
    A checkpoint builds its encoder from the `pretrained_model` its hyper-parameters name
    (`xlm-roberta-large` for wmt22-comet-da) before loading all weights from itself, so that
    encoder's `config.json` and tokenizer (not its weights) must be on disk too, in the Hugging
    Face hub cache the worker sees (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    `~/.cache/huggingface/hub`):

        <cache>/models--Unbabel--wmt22-comet-da/snapshots/<rev>/hparams.yaml
        <cache>/models--Unbabel--wmt22-comet-da/snapshots/<rev>/checkpoints/model.ckpt  (COMET_MODEL)
        <cache>/models--xlm-roberta-large/snapshots/<rev>/{config.json, sentencepiece.bpe.model,
            tokenizer.json}
        <cache>/models--<org>--<name>/refs/main   (the <rev> of each)

    which `huggingface-cli download Unbabel/wmt22-comet-da` and `huggingface-cli download
    xlm-roberta-large config.json sentencepiece.bpe.model tokenizer.json` leave on a machine
    with network access (copy the cache over). `random_model.py --hub-cache` builds the same
    layout around a random model (tests/test_comet.py).
  - `COMET_PYTHON`: the side environment's interpreter (gin setting, else the `COMET_PYTHON`
    environment variable, else `.comet-venv/bin/python` of this checkout when it exists).

Scores are reported on the MT paper's 0-100 scale (its Figs. 1 and 7): COMET's own scores × 100.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pipelines.comet import worker as comet_worker
from pipelines.comet.random_model import RANDOM_MARKER

# COMET's scores (about 0-1) -> the MT paper's scale.
COMET_SCALE = 100.0
COMET_PYTHON_ENV = "COMET_PYTHON"
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".comet-venv"
WORKER = Path(comet_worker.__file__).resolve()
BATCH_SIZE = 16
# The translation tasks' prompt (`pipelines.tasks`): COMET reads the bare source sentence.
_PROMPT = re.compile(r"^translate [A-Za-z]+ to [A-Za-z]+: ")
_BUILD_HINT = "run `make comet-env` (builds .comet-venv/ from pipelines/comet/requirements.txt)"


class CometError(RuntimeError):
    """COMET could not score: a missing interpreter or package, or the worker failed."""


@dataclasses.dataclass(frozen=True)
class CometScores:
    """COMET on the MT paper's 0-100 scale.

    Attributes:
      segments: one score per (source, translation, reference) triple, × 100.
      system: the system score (the mean of the segment scores, as COMET defines it), × 100.
      model: the checkpoint that scored them.
    """

    segments: tuple[float, ...]
    system: float
    model: str


def source_of(inputs: str) -> str:
    """The source sentence of a translation task's input: without its `translate X to Y: `
    prompt (COMET scores source, translation and reference, not the model's prompt)."""
    return _PROMPT.sub("", inputs)


def comet_python(setting: str | None = None) -> str:
    """The side environment's interpreter: `setting` (`COMET_PYTHON`), else `$COMET_PYTHON`,
    else `.comet-venv/bin/python` of this checkout.

    Raises:
      CometError: none of them names an existing file (says how to build one).
    """
    chosen = setting or os.environ.get(COMET_PYTHON_ENV)
    if not chosen:
        default = DEFAULT_VENV / "bin" / "python"
        if not default.exists():
            raise CometError(
                f"COMET_PYTHON is not set and {default} does not exist: {_BUILD_HINT}, or set "
                "COMET_PYTHON to a Python with unbabel-comet"
            )
        return os.fspath(default)
    if not Path(chosen).is_file():
        raise CometError(f"COMET_PYTHON = {chosen!r}: no such interpreter; {_BUILD_HINT}")
    return chosen


def check_model(model: str) -> Path:
    """The checkpoint file `COMET_MODEL` names.

    Raises:
      FileNotFoundError: no file there (one line naming COMET_MODEL and the path).
    """
    path = Path(model).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"COMET_MODEL = {model!r}: no such file (a COMET checkpoint, "
            "<model dir>/checkpoints/model.ckpt, e.g. of Unbabel/wmt22-comet-da)"
        )
    return path


def is_random_model(model: str | os.PathLike) -> bool:
    """Whether `model` is a randomly initialised test model (`pipelines.comet.random_model`), whose
    scores say nothing about translation quality."""
    return (Path(model).expanduser().parent.parent / RANDOM_MARKER).is_file()


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:]) or "(no output on stderr)"


def score(
    model: str,
    *,
    sources: Sequence[str],
    predictions: Sequence[str],
    targets: Sequence[str],
    python: str | None = None,
    batch_size: int = BATCH_SIZE,
) -> CometScores:
    """Scores translations with the COMET checkpoint `model`, in the side environment.

    Args:
      model: `COMET_MODEL`, a local `checkpoints/model.ckpt`.
      sources, predictions, targets: the source sentences, the system's translations and the
        references, aligned.
      python: `COMET_PYTHON` (None: `$COMET_PYTHON` or `.comet-venv/bin/python`).
      batch_size: triples COMET scores together.

    Returns:
      The segment and system scores × 100 (the MT paper's scale).

    Raises:
      FileNotFoundError: `model` is not a file.
      CometError: no interpreter, no `comet` in it, or the worker failed (its last stderr lines).
    """
    path = check_model(model)
    interpreter = comet_python(python)
    samples = [
        {"src": s, "mt": p, "ref": t} for s, p, t in zip(sources, predictions, targets, strict=True)
    ]
    request = {"model": os.fspath(path.resolve()), "samples": samples, "batch_size": batch_size}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = subprocess.run(
            [interpreter, "-I", os.fspath(WORKER)],
            input=json.dumps(request, ensure_ascii=False),
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    except OSError as e:
        raise CometError(f"COMET_PYTHON = {interpreter!r} cannot run: {e}; {_BUILD_HINT}") from e
    if done.returncode == comet_worker.EXIT_NO_COMET:
        raise CometError(
            f"COMET_PYTHON = {interpreter!r} has no `comet` package (unbabel-comet): {_BUILD_HINT}"
        )
    if done.returncode != 0:
        raise CometError(
            f"COMET worker ({interpreter}) failed with exit code {done.returncode} on "
            f"COMET_MODEL = {model!r}: {_last_lines(done.stderr)}"
        )
    try:
        reply = json.loads(done.stdout)
        raw, system = reply["scores"], reply["system_score"]
    except (ValueError, KeyError, TypeError) as e:
        raise CometError(
            f"COMET worker ({interpreter}) replied no scores ({e}): {done.stdout[-200:]!r}"
        ) from e
    return CometScores(
        segments=tuple(COMET_SCALE * float(s) for s in raw),
        system=COMET_SCALE * float(system) if system is not None else float("nan"),
        model=os.fspath(path),
    )
