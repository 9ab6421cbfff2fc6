"""Readers of run directories and TensorBoard event files, on directories written by the tests."""

import json
import struct

import numpy as np
import pytest
from fit_inputs import RUN_META

from fitting.checks import FitInputError
from fitting.laws import formulas, synthetic
from fitting.readers import event_files, points, run_dirs


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    synthetic.write_study(root, sizes=(3e7, 1e8, 3e8), evals=5, replay_ratios=(0.05, 0.5))
    return root


def test_read_runs_and_tidy_table(study):
    runs = run_dirs.read_runs(study)
    by_id = {r.run_id: r for r in runs}
    assert {r.strategy for r in runs} == {
        "source",
        "scratch",
        "cpt",
        "cpt_replay",
        "pretrain",
        "finetune",
        "finetune_scratch",
    }
    assert by_id["scratch_01_1e+08"].completed is not None
    rows = run_dirs.tidy(runs)
    scratch = [r for r in rows if r["run_id"] == "scratch_01_1e+08"]
    assert len(scratch) == 5
    row = scratch[-1]
    assert row["strategy"] == "scratch" and row["language"] == "zh"
    assert row["n_params"] == 1e8 and row["n_params_total"] == 1.25e8
    assert row["tokens"] == pytest.approx(20 * 1e8)
    assert row["flops"] == pytest.approx(6 * 1e8 * 20 * 1e8)
    assert set(row["losses"]) == {"lm_zh"} and row["tokens_by_task"] == {"lm_zh": row["tokens"]}
    ft = [r for r in rows if r["strategy"] == "finetune"][0]
    assert set(ft["scores"]) == {"mt_en_fr/bleu"} and "mt_en_fr" in ft["losses"]
    np.testing.assert_array_equal(
        run_dirs.column(scratch, "step"), sorted(run_dirs.column(scratch, "step"))
    )


def test_points_use_target_tokens_for_replay_and_every_eval(study):
    runs = run_dirs.read_runs(study)
    replay = [r for r in runs if r.run_id == "replay_50"][0]
    tgt = points.curve(replay)
    assert tgt.task == "lm_zh"
    rec = replay.evals()[-1]
    assert tgt.tokens[-1] == pytest.approx(rec["tokens_by_task"]["lm_zh"])
    assert tgt.tokens[-1] == pytest.approx(0.5 * rec["tokens"])
    src = points.curve(replay, task="lm_en")
    np.testing.assert_allclose(src.fraction, 0.5)
    pts = points.pool(points.curves(runs, strategies=("scratch",), language="zh"))
    assert len(pts) == 3 * 5 and len(set(pts.runs)) == 3
    np.testing.assert_allclose(pts.C, 6 * pts.N * pts.D)
    series = points.downstream_series(runs, metric="bleu")
    assert len(series) == 1 and series[0].key == ("mix_en_50_fr_50", "mt_en_fr", "300")
    assert len(series[0].Dp) == 8 and np.all(np.diff(series[0].Dp) > 0)
    assert series[0].baseline is not None
    np.testing.assert_allclose(
        series[0].values, formulas.log_law(series[0].Dp, **synthetic.BLEU), rtol=0.05
    )


def _masked_crc(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _write_events(path, events):
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for step, tag, value, as_tensor in events:
            if as_tensor:  # TF2 summaries (T5X, clu) store a rank-0 float tensor
                tensor = tensor_pb2.TensorProto(
                    dtype=1,
                    tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                    tensor_content=struct.pack("<f", value),
                )
                val = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
            else:
                val = summary_pb2.Summary.Value(tag=tag, simple_value=value)
            data = event_pb2.Event(
                step=step, wall_time=1.0, summary=summary_pb2.Summary(value=[val])
            ).SerializeToString()
            header = struct.pack("<Q", len(data))
            f.write(header + struct.pack("<I", _masked_crc(header)) + data)
            f.write(struct.pack("<I", _masked_crc(data)))
        f.write(b"\x10\x00")  # a truncated record at the end is ignored


def test_tensorboard_reader_t5x_layout_and_run_fallback(tmp_path):
    run = tmp_path / "t5x_run"
    _write_events(
        run / "train" / "events.out.tfevents.1.host",
        [(100, "loss", 3.0, False), (200, "loss", 2.5, True)],
    )
    _write_events(
        run / "training_eval" / "lm_fr" / "events.out.tfevents.2.host",
        [(100, "loss", 3.5, True), (200, "loss", 3.25, True)],
    )
    scalars = event_files.read_tensorboard(run)
    assert scalars["loss"] == [(100, 3.0), (200, 2.5)]
    assert scalars["eval/lm_fr/loss"] == [(100, 3.5), (200, 3.25)]
    (run / "run.json").write_text(json.dumps(RUN_META))
    r = run_dirs.read_run(run)  # no metrics.jsonl: falls back to the events
    c = points.curve(r)
    np.testing.assert_allclose(c.loss, [3.5, 3.25])
    np.testing.assert_allclose(c.tokens, [100 * 32, 200 * 32])
    np.testing.assert_allclose(c.flops, 6e8 * c.tokens)


def test_bad_run_directories_name_the_run(tmp_path):
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "empty_run" / "run.json").write_text("{}")
    with pytest.raises(FitInputError, match=r"run 'empty_run'.*no metrics.jsonl"):
        run_dirs.read_runs(tmp_path)
    (tmp_path / "empty_run" / "run.json").unlink()
    (tmp_path / "empty_run" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(FitInputError, match=r"run 'empty_run'.*but no run.json"):
        run_dirs.read_runs(tmp_path)
    (tmp_path / "empty_run" / "run.json").write_text('{"strategy": "scratch"')
    with pytest.raises(FitInputError, match=r"run 'empty_run': run.json is not valid JSON"):
        run_dirs.read_runs(tmp_path)
    (tmp_path / "empty_run" / "run.json").write_text("{}")
    (tmp_path / "empty_run" / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(FitInputError, match=r"run 'empty_run': metrics.jsonl line 2 is not JSON"):
        run_dirs.read_runs(tmp_path)
    # a truncated last line (a run still writing) is dropped, not an error
    (tmp_path / "empty_run" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "tok')
    assert len(run_dirs.read_runs(tmp_path)[0].records) == 1
    with pytest.raises(FitInputError, match="does not exist"):
        run_dirs.read_runs(tmp_path / "missing")


def test_bad_values_in_runs_name_run_and_step(tmp_path):
    meta = {
        "strategy": "scratch",
        "target_lang": "zh",
        "params_non_embedding": 1e8,
        "components": ["lm_zh"],
    }
    run = tmp_path / "nan_run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(meta))
    recs = [
        {"step": 10, "tokens": 1e6, "eval/lm_zh/loss": 4.0},
        {"step": 20, "tokens": 2e6, "eval/lm_zh/loss": float("nan")},
    ]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    runs = run_dirs.read_runs(tmp_path)
    with pytest.raises(FitInputError, match=r"run 'nan_run' step 20: eval/lm_zh/loss = nan"):
        points.curve(runs[0])
    (run / "run.json").write_text(json.dumps({**meta, "params_non_embedding": None}))
    with pytest.raises(FitInputError, match=r"run 'nan_run': run.json has no positive"):
        points.curve(run_dirs.read_runs(tmp_path)[0])


def test_finetunes_of_several_df_at_equal_steps_are_separate_series(study, tmp_path):
    # The MT paper finetunes 300 steps on sets of several sizes Df: each Df is its own series,
    # with the baseline of the same Df.
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(study, root)
    for sub in root.iterdir():
        meta_file = sub / "run.json"
        meta = json.loads(meta_file.read_text())
        if meta["strategy"] in ("finetune", "finetune_scratch"):
            for df in (6_000_000, 31_000_000):
                copy = root / f"{sub.name}_df{df}"
                shutil.copytree(sub, copy)
                (copy / "run.json").write_text(json.dumps({**meta, "finetune_tokens": df}))
            shutil.rmtree(sub)
    series = points.downstream_series(run_dirs.read_runs(root), metric="bleu")
    keys = sorted(s.key for s in series)
    assert keys == [
        ("mix_en_50_fr_50", "mt_en_fr", "300 steps, Df 31000000"),
        ("mix_en_50_fr_50", "mt_en_fr", "300 steps, Df 6000000"),
    ]
    assert all(len(s.Dp) == 8 and s.baseline is not None for s in series)
    assert points.finetune_group({"train_steps": 300}) == "300"


def test_the_fit_point_rule_is_stated_and_configurable(study):
    """Default: every evaluation after the first token (today's rule, unchanged); `per_run`
    evens out the runs' shares (1: final losses only), `min_fraction` drops early evaluations."""
    runs = run_dirs.read_runs(study)
    cs = points.curves(runs, strategies=("scratch",), language="zh")
    default = points.pool(cs, rule=points.PointRule())
    assert len(default) == len(points.pool(cs)) == 3 * 5
    last = points.pool(cs, rule=points.PointRule(per_run=1))
    assert len(last) == 3 and sorted(last.D) == sorted(c.tokens[-1] for c in cs)
    two = points.pool(cs, rule=points.PointRule(per_run=2))
    assert len(two) == 6 and set(last.D) <= set(two.D)
    late = points.pool(cs, rule=points.PointRule(min_fraction=0.5))
    top = {c.run_id: c.tokens.max() for c in cs}
    assert 3 <= len(late) < 15
    assert all(d >= 0.5 * top[r] for d, r in zip(late.D, late.runs, strict=True))
    rule = points.PointRule(per_run=3)
    assert rule.select(np.array([0.0, 10, 20, 30, 40])).tolist() == [1, 3, 4]
    assert points.PointRule().select(np.array([0.0, 10, 20])).tolist() == [1, 2]
    assert points.PointRule().describe() == "every evaluation of a run after its first token"
    assert "only its last one" in points.PointRule(per_run=1).describe()
    assert points.PointRule(per_run=2).to_dict()["per_run"] == 2
    for bad in ({"per_run": 0}, {"min_fraction": 1.5}, {"min_tokens": -1.0}):
        with pytest.raises(ValueError):
            points.PointRule(**bad)


def test_read_runs_warns_of_what_it_drops_and_names_a_file_as_not_a_directory(tmp_path):
    # a torn last line is named with its step; --runs naming a file is not "missing".
    run = tmp_path / "torn"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"strategy": "scratch", "target_lang": "zh"}))
    (run / "metrics.jsonl").write_text('{"step": 10, "eval/lm_zh/loss": 3.0}\n{"step": 20, "tok')
    scan = run_dirs.scan_runs(tmp_path)
    assert [len(r.records) for r in scan.runs] == [1]
    (warning,) = scan.warnings
    assert (
        "run 'torn'" in warning
        and "step 20" in warning
        and "may have held an evaluation" in warning
    )
    assert "last complete record is step 10" in warning
    (run / "metrics.jsonl").write_text('{"step": 20, "tok')  # nothing complete: skipped
    with pytest.raises(FitInputError, match=r"run 'torn'.*no complete records.*skipped"):
        run_dirs.scan_runs(tmp_path)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(FitInputError, match="a_file is not a directory"):
        run_dirs.read_runs(tmp_path / "a_file")


def test_the_trainers_event_files_need_no_tensorflow_even_where_it_is_installed(tmp_path):
    # A fresh process (TensorFlow installed, not imported) writes a run's scalars as the trainer
    # does on prepared data; TensorBoard's writer must not import TensorFlow on the way.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from trainer.event_files import scalar_writer\n"
        "w = scalar_writer(sys.argv[1])\n"
        "w.write_scalars(100, {'eval/lm_fr/loss': 3.5})\n"
        "w.write_scalars(200, {'eval/lm_fr/loss': 3.25})\n"
        "w.close()\n"
        "print('tensorflow' in sys.modules)\n"
    )
    logdir = tmp_path / "run" / "tb"
    out = subprocess.run(
        [sys.executable, "-c", code, str(logdir)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    scalars = event_files.read_tensorboard(tmp_path / "run")
    assert scalars["eval/lm_fr/loss"] == [(100, 3.5), (200, 3.25)]
