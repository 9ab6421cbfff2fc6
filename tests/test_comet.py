"""COMET through its side environment: the worker, the 0-100 scale, the errors, a finetune.

unbabel-comet cannot join the project's environment (numpy<2, transformers<5), so the session
builds COMET's own (`make comet-env`: `.comet-venv/`, once per checkout, under a lock for the
parallel workers) and a small randomly initialised COMET model of the real architecture
(`pipelines/comet/random_model.py`: wmt22-comet-da's RegressionMetric on a tiny XLM-R encoder with a
SentencePiece vocabulary trained on the UDHR fixture), offline. Its scores are random-weight
outputs: the tests check the wiring (triples in, COMET's own mean, × 100, errors), not quality.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipelines.comet import scoring as comet_scoring
from pipelines.comet import worker as comet_worker
from trainer import downstream

ROOT = Path(__file__).resolve().parent.parent
# pip's messages when PyPI cannot be reached: only then is the side environment skipped.
_OFFLINE = (
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
)
TRIPLES = [
    ("All human beings are born free.", "Tous les êtres humains naissent libres.", "Tous les "
     "êtres humains naissent libres et égaux en dignité et en droits."),
    ("Everyone has the right to life.", "Tout le monde a vie.", "Tout individu a droit à la vie."),
    ("No one shall be held in slavery.", "x y z", "Nul ne sera tenu en esclavage."),
]  # fmt: skip


@pytest.fixture(scope="session")
def comet_python():
    """The side environment's interpreter, built by `make comet-env` when missing or stale."""
    lock = Path(tempfile.gettempdir()) / "xlscale-comet-env.lock"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        done = subprocess.run(
            ["make", "-s", "comet-env", f"PYTHON={sys.executable}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        if any(s in done.stdout + done.stderr for s in _OFFLINE):
            pytest.skip(f"COMET's side environment cannot be installed (no PyPI here): {tail}")
        pytest.fail(f"make comet-env failed: {tail}")
    return os.fspath(ROOT / ".comet-venv" / "bin" / "python")


@pytest.fixture(scope="session")
def comet_model(comet_python, tmp_path_factory):
    """`checkpoints/model.ckpt` of a random COMET model built offline on the UDHR fixture."""
    from pipelines.corpora.fixture import load_fixture

    root = tmp_path_factory.mktemp("comet")
    text = root / "udhr.txt"
    paragraphs = [
        p for s in load_fixture()["segments"] for lang in ("en", "fr", "de")
        for p in s["paragraphs"][lang]
    ]  # fmt: skip
    text.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    script = ROOT / "pipelines" / "comet" / "random_model.py"
    done = subprocess.run(
        [comet_python, "-I", os.fspath(script), "--text", os.fspath(text), "--out", root / "m"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ckpt = Path(done.stdout.strip().splitlines()[-1])
    assert ckpt == (root / "m" / "checkpoints" / "model.ckpt").resolve() and ckpt.is_file()
    return os.fspath(ckpt)


@pytest.mark.slow
def test_the_worker_scores_with_the_random_model_and_the_trainer_reports_it_times_100(
    comet_python, comet_model, monkeypatch
):
    request = {
        "model": comet_model,
        "samples": [{"src": s, "mt": m, "ref": r} for s, m, r in TRIPLES],
        "batch_size": 2,
    }
    done = subprocess.run(
        [comet_python, "-I", os.fspath(comet_scoring.WORKER)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reply = json.loads(done.stdout)  # stdout carries the reply only
    scores = reply["scores"]
    assert len(scores) == len(TRIPLES)
    assert all(0.0 < s < 1.0 for s in scores)  # wmt22-comet-da's Sigmoid output
    assert reply["system_score"] == pytest.approx(sum(scores) / len(scores), abs=1e-12)
    assert len({round(s, 9) for s in scores}) > 1  # the scores depend on the triples
    assert comet_scoring.is_random_model(comet_model)

    # The project side, as the trainer calls it (COMET_PYTHON from the environment, the
    # fallback when no setting is given): COMET's system score x 100, the paper's 0-100 scale.
    monkeypatch.setenv(comet_scoring.COMET_PYTHON_ENV, comet_python)
    examples = [
        downstream.TextExample(inputs=f"translate English to French: {s}", target=r, source=s)
        for s, _, r in TRIPLES
    ]
    out = downstream.score("mt_en_fr", examples, [t[1] for t in TRIPLES], comet_model=comet_model)
    assert out["comet"] == pytest.approx(100 * reply["system_score"], abs=1e-6)
    assert out["comet"] == pytest.approx(100 * sum(scores) / len(scores), abs=1e-6)
    assert 0.0 < out["comet"] < 100.0
    assert {"bleu", "bleu_bp", "chrf", "rouge_l"} <= set(out)  # the others are unchanged


def test_a_missing_model_is_one_line_naming_comet_model(tmp_path):
    missing = tmp_path / "wmt22-comet-da" / "checkpoints" / "model.ckpt"
    examples = [downstream.TextExample(inputs="translate: a b", target="x y", source="a b")]
    with pytest.raises(FileNotFoundError) as e:
        downstream.score("mt_en_fr", examples, ["x y"], comet_model=os.fspath(missing))
    message = str(e.value)
    assert "\n" not in message and "COMET_MODEL" in message and os.fspath(missing) in message


@pytest.mark.slow
def test_a_missing_interpreter_is_one_line_naming_comet_python(comet_model, tmp_path, monkeypatch):
    nowhere = os.fspath(tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(comet_scoring.CometError) as e:
        downstream.comet_score(
            comet_model, sources=["a"], predictions=["b"], targets=["c"], comet_python=nowhere
        )
    message = str(e.value)
    assert "\n" not in message and "COMET_PYTHON" in message and nowhere in message
    assert "make comet-env" in message
    # Nothing set and no .comet-venv: says so, and how to build it.
    monkeypatch.delenv(comet_scoring.COMET_PYTHON_ENV, raising=False)
    monkeypatch.setattr(comet_scoring, "DEFAULT_VENV", tmp_path / "absent")
    with pytest.raises(comet_scoring.CometError, match=r"COMET_PYTHON is not set.*make comet-env"):
        comet_scoring.comet_python(None)


def test_an_interpreter_without_comet_is_one_line_naming_comet_python(comet_model):
    # This process's Python has no `comet` (the project's pins exclude it).
    with pytest.raises(comet_scoring.CometError) as e:
        comet_scoring.score(
            comet_model, sources=["a"], predictions=["b"], targets=["c"], python=sys.executable
        )
    message = str(e.value)
    assert "\n" not in message and "COMET_PYTHON" in message and "no `comet`" in message


def test_a_failing_worker_reports_its_last_stderr_lines(comet_model, tmp_path):
    # A stand-in interpreter that fails as the worker does (traceback, then the reason last),
    # without the seconds COMET's imports cost.
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\ncat > /dev/null\necho 'Traceback (most recent call last):' >&2\n"
        "echo 'comet_worker: Exception: hparams.yaml file is missing from /x!' >&2\n"
        f"exit {comet_worker.EXIT_FAILED}\n"
    )
    fake.chmod(0o755)
    with pytest.raises(comet_scoring.CometError) as e:
        comet_scoring.score(
            comet_model, sources=["a"], predictions=["b"], targets=["c"], python=os.fspath(fake)
        )
    message = str(e.value)
    assert "\n" not in message and f"exit code {comet_worker.EXIT_FAILED}" in message
    assert "COMET_MODEL" in message and "hparams.yaml file is missing" in message


@pytest.mark.slow
def test_a_finetune_logs_comet_into_metrics_jsonl(
    comet_python, comet_model, tiny_data, tmp_path, monkeypatch, seqio_state
):
    import gin

    from trainer import gin_entry
    from trainer import train as train_lib

    monkeypatch.setenv(comet_scoring.COMET_PYTHON_ENV, comet_python)
    model_dir = tmp_path / "ft"
    argv = [
        "--gin_file=experiments/mt_finetune.gin",
        "--gin_file=experiments/t5_tiny.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        "--gin.TASK='mt_en_fr'",
        "--gin.FINETUNE_TOKENS=256",
        "--gin.STRATEGY='finetune_scratch'",
        "--gin.DECODE_METHOD='greedy'",
        f"--gin.COMET_MODEL='{comet_model}'",
        "--gin.partitioning.MeshConfig.num_devices=1",
    ]
    saved = seqio_state.snapshot()
    gin.clear_config()
    try:
        gin_entry.call(train_lib.train, gin_entry.parse(argv, job="train"))
    finally:
        gin.clear_config()
        seqio_state.restore(saved)
    records = [json.loads(x) for x in (model_dir / "metrics.jsonl").read_text().splitlines()]
    comet = [r["eval/mt_en_fr/comet"] for r in records if "eval/mt_en_fr/comet" in r]
    assert len(comet) == 1 and math.isfinite(comet[0]) and 0.0 < comet[0] < 100.0
    assert "eval/mt_en_fr/bleu" in records[-1]


def _fake_t5x(root: Path, task: str, step: int) -> Path:
    """A stand-in `t5x.train` (T5X is not installed here) that leaves what its infer_eval leaves:
    seqio's JSONLogger file `inference_eval/<task>-<step:06>.jsonl` under MODEL_DIR."""
    lines = [
        {
            "input": {"inputs_pretokenized": f"translate English to French: {s}", "targets": [1]},
            "target": r,
            "output": m,
        }
        for s, m, r in TRIPLES
    ]
    package = root / "fake_t5x" / "t5x"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(
        "import ast, json, pathlib, sys\n"
        "flag = next(a for a in sys.argv if a.startswith('--gin.MODEL_DIR='))\n"
        "d = pathlib.Path(ast.literal_eval(flag.split('=', 1)[1])) / 'inference_eval'\n"
        "d.mkdir(parents=True, exist_ok=True)\n"
        f"rows = {json.dumps(lines, ensure_ascii=True)}\n"
        f"(d / '{task}-{step:06}.jsonl').write_text(''.join(json.dumps(r) + '\\n' for r in rows))\n"
    )
    return package.parent


@pytest.mark.slow
def test_the_wmt22_offline_layout_scores_a_t5x_runs_inference_outputs(
    comet_python, comet_model, tmp_path, monkeypatch
):
    # The real wmt22-comet-da offline: its checkpoint in the hub cache, naming the encoder
    # `xlm-roberta-large`, whose config and tokenizer (no weights) sit in the same cache. Here the
    # random model of the fixture, laid out so; the worker loads it with the hub offline.
    from t5x_run_dirs import write_t5x_run

    from fitting.readers import t5x_runs
    from launch import t5x_comet, t5x_runner

    cache = tmp_path / "hub"
    script = ROOT / "pipelines" / "comet" / "random_model.py"
    source = Path(comet_model).parent.parent
    done = subprocess.run(
        [comet_python, "-I", os.fspath(script), "--hub-cache", cache, "--from", source],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ckpt = Path(done.stdout.strip().splitlines()[-1])
    snapshot = cache / "models--Unbabel--wmt22-comet-da" / "snapshots" / ("0" * 40)
    assert ckpt == snapshot / "checkpoints" / "model.ckpt" and ckpt.is_file()
    assert "pretrained_model: xlm-roberta-large" in (snapshot / "hparams.yaml").read_text()
    encoder = cache / "models--xlm-roberta-large"
    assert (encoder / "refs" / "main").read_text() == "0" * 40
    assert {"config.json", "sentencepiece.bpe.model", "tokenizer.json"} <= {
        p.name for p in (encoder / "snapshots" / ("0" * 40)).iterdir()
    }
    assert comet_scoring.is_random_model(ckpt)

    # A T5X finetune run under the COMET wrapper: t5x.train (a stand-in) writes its inference
    # outputs, then they are scored into inference_eval/<task>/, where the T5X reader finds
    # eval/<task>/comet as the trainer logs it.
    model_dir = write_t5x_run(
        tmp_path, "ft", task="mt_en_fr", steps=300, ckpts=[300], ce={300: 2.0}, bleu=20.0
    )
    monkeypatch.setenv("PYTHONPATH", os.fspath(_fake_t5x(tmp_path, "mt_en_fr", 300)))
    monkeypatch.setenv("HF_HUB_CACHE", os.fspath(cache))
    monkeypatch.setenv(t5x_runner.COMET_MODEL_ENV, os.fspath(ckpt))
    monkeypatch.setenv(t5x_runner.COMET_PYTHON_ENV, comet_python)
    assert t5x_comet.main([f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=300"]) == 0
    scored = json.loads((model_dir / "inference_eval" / "mt_en_fr-000300.comet.json").read_text())
    assert scored["model"] == os.fspath(ckpt) and len(scored["segments"]) == len(TRIPLES)
    assert scored["system"] == pytest.approx(sum(scored["segments"]) / len(TRIPLES), abs=1e-6)
    assert all(0.0 < s < 100.0 for s in scored["segments"])  # x 100: the paper's scale
    record = next(r for r in t5x_runs.read_t5x_run(model_dir).records if r["step"] == 300)
    assert record["eval/mt_en_fr/comet"] == pytest.approx(scored["system"], abs=1e-4)
    assert record["eval/mt_en_fr/bleu"] == 20.0  # seqio's own metrics unchanged
    # Scored once: a rerun finds nothing new; and the layout is really what loads it: without the
    # encoder in the cache, the worker fails naming it.
    assert t5x_comet.score_model_dir(model_dir, comet_model=os.fspath(ckpt)) == {}
    monkeypatch.setenv("HF_HUB_CACHE", os.fspath(tmp_path / "empty"))
    with pytest.raises(comet_scoring.CometError, match="xlm-roberta-large"):
        comet_scoring.score(ckpt, sources=["a"], predictions=["b"], targets=["c"])
