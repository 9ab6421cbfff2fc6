"""COMET scoring inside COMET's own environment: one request on stdin, the scores on stdout.

unbabel-comet cannot share the project's environment (it needs numpy<2 and transformers<5), so
`pipelines.comet.scoring` runs this file with the side environment's interpreter (`make comet-env`,
`COMET_PYTHON`) as `python -I worker.py`. It uses only the standard library and `comet`
and imports nothing of the project.

Request (JSON on stdin): `{"model": "<dir>/checkpoints/model.ckpt", "samples": [{"src", "mt",
"ref"}, ...], "batch_size": 16}`. Reply (JSON on stdout, nothing else is printed there):
`{"scores": [per-segment score], "system_score": mean of scores}` on COMET's own scale (about
0-1). The Hugging Face hub is put offline before `comet` is imported, so nothing is downloaded:
the checkpoint and the encoder it names must be on disk.

Exit codes: 0 scored; 2 a bad request; 3 `comet` cannot be imported here (the wrong
interpreter); 4 the model failed to load or score (the reason is the last line on stderr).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import traceback
from pathlib import Path

EXIT_BAD_REQUEST = 2
EXIT_NO_COMET = 3
EXIT_FAILED = 4


def score(model_path: str, samples: list[dict], *, batch_size: int) -> dict:
    """Loads the COMET checkpoint at `model_path` (CPU, local files only) and scores `samples`.

    Returns:
      `{"scores": [...], "system_score": float}` as COMET's `predict` gives them.
    """
    import comet

    model = comet.load_from_checkpoint(model_path, local_files_only=True)
    prediction = model.predict(samples, batch_size=batch_size, gpus=0, progress_bar=False)
    return {
        "scores": [float(s) for s in prediction.scores],
        "system_score": float(prediction.system_score),
    }


def encoder_hint(model_path: str) -> str:
    """Where the encoder a checkpoint names must be, offline: a COMET checkpoint builds its encoder
    from `pretrained_model` of its `hparams.yaml` (`xlm-roberta-large` for wmt22-comet-da), whose
    config and tokenizer must then be a local directory or in the Hugging Face hub cache."""
    hparams = Path(model_path).parent.parent / "hparams.yaml"
    text = hparams.read_text(encoding="utf-8") if hparams.is_file() else ""
    match = re.search(r"^pretrained_model:\s*(\S+)", text, re.M)
    name = match.group(1).strip("'\"") if match else "?"
    home = os.environ.get("HF_HOME", os.path.join("~", ".cache", "huggingface"))
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub")
    return (
        f"the encoder {name!r} named by {hparams} must be on disk: a directory, or its "
        f"config.json and tokenizer in the Hugging Face hub cache {cache} "
        f"(models--{name.replace('/', '--')}/snapshots/<revision>/ and refs/main)"
    )


def main() -> int:
    """Reads the request, scores it, writes the reply; returns the exit code."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        request = json.load(sys.stdin)
        model_path = str(request["model"])
        samples = [
            {"src": str(s["src"]), "mt": str(s["mt"]), "ref": str(s["ref"])}
            for s in request["samples"]
        ]
        batch_size = int(request.get("batch_size", 16))
    except (ValueError, KeyError, TypeError) as e:
        print(f"comet_worker: bad request: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_BAD_REQUEST
    try:
        import comet  # noqa: F401
    except ImportError as e:
        print(f"comet_worker: cannot import comet with {sys.executable}: {e}", file=sys.stderr)
        return EXIT_NO_COMET
    # Libraries print banners; stdout carries the reply only.
    try:
        with contextlib.redirect_stdout(sys.stderr):
            reply = score(model_path, samples, batch_size=batch_size) if samples else None
    except Exception as e:  # the traceback, then the reason as the last line for the caller
        traceback.print_exc()
        hint = f"; {encoder_hint(model_path)}" if isinstance(e, OSError) else ""
        print(f"comet_worker: {type(e).__name__}: {e}{hint}", file=sys.stderr)
        return EXIT_FAILED
    json.dump(reply or {"scores": [], "system_score": None}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
