"""A quiet terminal: the commands print the project's own lines; TensorFlow's native
start-up lines, tf_text's SentencePiece line and other libraries' warnings go to the third-party
log (`pipelines.native_logs`, `xlscale_cli.terminal`). The smoke demo's terminal is checked by
`tests/test_studies_cpt_smoke.py`, which already runs it."""

from __future__ import annotations

import copy
import logging
import os
import pickle
import subprocess
import sys

import pytest

from pipelines import native_logs
from xlscale_cli import terminal


def _fd2_identity():
    st = os.fstat(native_logs.STDERR_FD)
    return st.st_dev, st.st_ino


def test_stderr_to_moves_native_writes_and_puts_fd2_back(tmp_path):
    before = _fd2_identity()
    outer, inner = tmp_path / "outer.log", tmp_path / "inner.log"
    with native_logs.stderr_to(outer):
        os.write(native_logs.STDERR_FD, b"native line\n")
        with native_logs.stderr_to(inner):  # nested: stays where the outer block put it
            os.write(native_logs.STDERR_FD, b"nested line\n")
        os.write(native_logs.STDERR_FD, b"after nested\n")
    assert _fd2_identity() == before
    assert outer.read_text() == "native line\nnested line\nafter nested\n"
    assert not inner.exists()


def test_stderr_to_puts_fd2_back_when_the_block_raises(tmp_path):
    before = _fd2_identity()
    with pytest.raises(RuntimeError, match="inside"):
        with native_logs.stderr_to(tmp_path / "log"):
            raise RuntimeError("inside")
    assert _fd2_identity() == before


def test_third_party_records_below_error_stay_off_the_terminal():
    keep = terminal._Terminal()

    def record(name, level):
        return logging.LogRecord(name, level, __file__, 1, "message", None, None)

    assert {"trainer", "rundir", "evals", "xlscale_cli"} <= terminal.project_packages()
    assert not {"absl", "orbax", "jax", "tensorflow"} & terminal.project_packages()
    assert keep.filter(record("trainer.checkpoints", logging.WARNING))
    assert keep.filter(record("rundir.lease", logging.INFO))
    assert not keep.filter(record("absl", logging.WARNING))  # orbax's read-only notices
    assert not keep.filter(record("jax._src.xla_bridge", logging.WARNING))
    assert keep.filter(record("absl", logging.ERROR))  # an error still shows
    assert not terminal._ThirdParty().filter(record("absl", logging.ERROR))


def test_line_formats_tell_project_lines_from_third_party_ones():
    ours = (
        "2026-11-27 06:12:53,025 INFO platform cpu: 1 x cpu (1 device, 1 process)\n"
        "[demo] zero-shot 1/8: source_smoke_d48_s0-3242181df0 step 24\n"
        "[sweep 4/15 done | ETA 1m19s] start scratch_smoke_d32_zh_s0-66150c4156: 24 steps\n"
        "[sweep 0/15 done]   source_smoke_d16_s0-f13ed6d3dc step 3/24, loss 6.6552\n"
        "xlscale train: MODEL_DIR is required\n"
    )
    theirs = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795759462.055131   26714 cudart_stub.cc:31] Could not find cuda drivers",
        "normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty. use identity normalization.",
        "WARNING:absl:Given directory is read only=/runs/x/checkpoints",
    ]
    assert terminal.foreign_lines(ours) == []
    assert terminal.foreign_lines("\n".join(theirs)) == theirs


def test_vocabulary_tokenizes_in_pipelines_as_seqio_does(tiny_data):
    """The tokenizer built once, eagerly, gives the Python tokens inside a pipeline (traced
    twice), decodes back, and the vocabulary still pickles and compares as seqio's."""
    import seqio
    import tensorflow as tf

    from pipelines import vocab as vocab_lib

    vocab = vocab_lib.load_vocab(tiny_data["vocab"], extra_ids=100)
    texts = ["Tous les êtres humains naissent libres", "All human beings are born free", "é"]
    data = tf.data.Dataset.from_tensor_slices(texts).map(vocab.encode_tf, num_parallel_calls=2)
    for _ in range(2):
        assert [list(ids) for ids in data.as_numpy_iterator()] == [vocab.encode(t) for t in texts]
    assert vocab.decode_tf(tf.constant(vocab.encode(texts[0]))).numpy().decode() == texts[0]
    plain = seqio.SentencePieceVocabulary(tiny_data["vocab"], extra_ids=100)
    for other in (pickle.loads(pickle.dumps(vocab)), copy.deepcopy(vocab), plain):
        assert other == vocab and vocab == other
    again = pickle.loads(pickle.dumps(vocab))
    assert list(again.encode_tf(tf.constant(texts[1])).numpy()) == vocab.encode(texts[1])


@pytest.mark.slow
def test_train_terminal_holds_only_project_lines(tiny_data, tmp_path, run_quietly):
    """A 3-step `xlscale train`: its terminal holds the project's lines only (a terminal without
    this routing held 9 third-party ones), and the third-party log holds TensorFlow's start-up lines and tf_text's."""
    third_party = tmp_path / "third_party.log"
    shown = run_quietly(
        "train",
        "--gin_file=experiments/cpt_source_en.gin",
        "--gin_file=experiments/tiny.gin",
        f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
        f"--gin.DATA_DIR='{tiny_data['corpora']}'",
        f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
        "--gin.TRAIN_STEPS=3",
        env={**os.environ, native_logs.THIRD_PARTY_LOG_ENV: str(third_party)},
    )
    assert "INFO step 3/3 | loss" in shown
    kept = third_party.read_text()
    assert "absl::InitializeLog()" in kept and "precompiled_charsmap is empty" in kept


def test_remote_runs_staged_tensorboard_directory_goes_even_unclosed(gcs_bucket):
    """A run on object storage stages its TensorBoard events in a local `xlscale-tb-*`
    directory: removed at `close`, and also when a writer that was never closed goes away."""
    import gc

    from trainer.metrics_log import MetricsWriter

    staged = []
    for name in ("closed", "dropped"):
        writer = MetricsWriter(f"{gcs_bucket}/{name}", is_chief=True)
        writer.write({"step": 1, "train/loss": 1.5})
        staged.append(writer._tb_dir)
        assert os.path.basename(staged[-1]).startswith("xlscale-tb-")
        assert os.listdir(staged[-1])  # the events file
        if name == "closed":
            writer.close()
        del writer
    gc.collect()
    assert [d for d in staged if os.path.exists(d)] == []


def test_stderr_to_a_file_it_cannot_open_changes_nothing(tmp_path):
    before = _fd2_identity()
    with pytest.raises(FileNotFoundError):
        with native_logs.stderr_to(tmp_path / "no such directory" / "log"):
            pass
    assert _fd2_identity() == before
    with native_logs.stderr_to(tmp_path / "log"):  # the next block still moves fd 2
        os.write(native_logs.STDERR_FD, b"line\n")
    assert (tmp_path / "log").read_text() == "line\n"


def test_processes_the_tests_start_keep_temporary_files_in_pytests_directory(tmp_path_factory):
    code = "import tempfile; print(tempfile.gettempdir())"
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    base = tmp_path_factory.getbasetemp()
    assert os.path.commonpath([shown.strip(), base]) == str(base), (shown, base)
