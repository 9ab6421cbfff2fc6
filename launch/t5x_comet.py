"""COMET for real T5X runs: `python -m launch.t5x_comet <t5x.train flags>`.

T5X decodes a finetune's validation split at each evaluation (`infer_eval`) and scores it with the
task's seqio metrics (BLEU, chrF++, ROUGE-L); COMET cannot run there (its own environment, torch).
So a finetune whose manifest sets `[settings] COMET_MODEL` (`launch.t5x_runner`) runs this module:
it starts `python -m t5x.train` with the same flags, and when that succeeded it scores every
inference output T5X wrote, seqio's `MODEL_DIR/inference_eval/<task>-<step:06>.jsonl` (one
`{"input": {"inputs_pretokenized", ...}, "target", "output"}` per example), with the project's
COMET worker (`pipelines.comet.scoring`, the MT paper's 0-100 scale), and writes:

- `inference_eval/<task>/events.out.tfevents.*.xlscale-comet`: the scalar `eval/comet` at the
  step, beside seqio's `eval/bleu`, so `fitting.readers.t5x_runs` gives `eval/<task>/comet` as
  xlscale's trainer logs it (`trainer.downstream`);
- `inference_eval/<task>-<step:06>.comet.json`: the model, the system and segment scores (an
  output already scored is skipped, so a rerun scores only new steps).

`python -m launch.t5x_comet --score MODEL_DIR` scores a finished T5X run without training. The
COMET checkpoint is `$XLSCALE_COMET_MODEL`, its interpreter `$COMET_PYTHON` (else the checkout's
`.comet-venv`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from etils import epath

from launch import t5x_runner
from pipelines.comet import scoring as comet_scoring
from rundir import storage

INFERENCE_EVAL_DIR = "inference_eval"  # T5X's, as `fitting.readers.t5x_runs` reads it
TAG = "eval/comet"
_OUTPUTS = re.compile(r"^(?P<task>.+)-(?P<step>\d+)\.jsonl$")
SCORES_SUFFIX = ".comet.json"


def _text(value: Any) -> str:
    if isinstance(value, list):  # seqio may log a one-element list for a string feature
        value = value[0] if value else ""
    return value if isinstance(value, str) else str(value)


def triples(path: epath.Path) -> tuple[list[str], list[str], list[str]]:
    """(sources, translations, references) of one seqio inference file: the source is the input's
    `inputs_pretokenized` without its prompt, the translation T5X's `output` (`prediction` in
    some seqio versions), the reference the postprocessed `target`."""
    sources, outputs, targets = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        example = row.get("input") or {}
        sources.append(comet_scoring.source_of(_text(example.get("inputs_pretokenized", ""))))
        outputs.append(_text(row.get("output", row.get("prediction", ""))))
        targets.append(_text(row.get("target", example.get("targets_pretokenized", ""))))
    return sources, outputs, targets


def _write_scalar(directory: epath.Path, step: int, value: float) -> None:
    """One event file with `eval/comet` at `step`, as `tf.summary.scalar` writes it."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(os.fspath(directory), filename_suffix=f".{step}.xlscale-comet")
    writer.add_event(event_pb2.Event(step=step, summary=scalar_pb(TAG, value)))
    writer.close()


def score_model_dir(
    model_dir: str | os.PathLike, *, comet_model: str, python: str | None = None
) -> dict[tuple[str, int], float]:
    """Scores every inference output of a T5X MODEL_DIR not scored yet (see the module
    docstring); returns {(task, step): COMET (0-100)} of those scored now.

    Raises:
      FileNotFoundError: no COMET checkpoint at `comet_model` (names COMET_MODEL).
      pipelines.comet.scoring.CometError: no side environment, or COMET failed.
    """
    root = storage.as_path(model_dir, name="MODEL_DIR") / INFERENCE_EVAL_DIR  # local or gs://
    done = {}
    for path in sorted(root.glob("*.jsonl")) if root.is_dir() else ():
        match = _OUTPUTS.match(path.name)
        record = path.with_name(path.name.removesuffix(".jsonl") + SCORES_SUFFIX)
        if not match or record.exists():
            continue
        task, step = match.group("task"), int(match.group("step"))
        sources, outputs, targets = triples(path)
        scores = comet_scoring.score(
            comet_model, sources=sources, predictions=outputs, targets=targets, python=python
        )
        _write_scalar(root / task, step, scores.system)
        record.write_text(
            json.dumps(
                {
                    "model": scores.model,
                    "task": task,
                    "step": step,
                    "system": scores.system,
                    "segments": list(scores.segments),
                }
            )
            + "\n"
        )
        done[(task, step)] = scores.system
    return done


def model_dir_of(flags: Sequence[str]) -> str:
    """The `--gin.MODEL_DIR=...` of `t5x.train` flags (a gin string literal)."""
    for flag in flags:
        if flag.startswith("--gin.MODEL_DIR="):
            return str(ast.literal_eval(flag.split("=", 1)[1]))
    raise ValueError("launch.t5x_comet: the t5x.train flags give no --gin.MODEL_DIR")


def main(argv: Sequence[str] | None = None) -> int:
    """`<t5x.train flags>`: train, then score; `--score MODEL_DIR`: score only. Returns the exit
    code (t5x.train's when it failed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    comet_model = os.environ.get(t5x_runner.COMET_MODEL_ENV)
    if not comet_model:
        print(f"launch.t5x_comet: set {t5x_runner.COMET_MODEL_ENV}", file=sys.stderr)
        return 2
    if argv[:1] == ["--score"] and len(argv) == 2:
        model_dir = argv[1]
    else:
        model_dir = model_dir_of(argv)
        code = subprocess.call([sys.executable, "-m", t5x_runner.MODULE, *argv])
        if code != 0:
            return code
    python = os.environ.get(t5x_runner.COMET_PYTHON_ENV)
    for (task, step), value in score_model_dir(
        model_dir, comet_model=comet_model, python=python
    ).items():
        print(f"COMET {task} step {step}: {value:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
