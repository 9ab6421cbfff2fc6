"""`run.json` as a typed record (`rundir.run_record`): real records of today's trainer (a source
run, a CPT-with-replay run, a finetune; `tests/fixtures/run_records/`) and a converter's come back
byte for byte, an older record lacking the newer fields reads with the defaults, unknown keys
survive, and `records.read_run_record` reads a run directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rundir import records
from rundir.run_record import FIELDS, RunRecord, Strategy

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run_records"
TRAINER_RECORDS = ("source", "cpt_replay", "finetune")


def _text(name: str) -> str:
    return (FIXTURES / f"{name}.json").read_text()


def _dumps(info) -> str:
    return json.dumps(info, indent=2) + "\n"  # as `records.write_run_json` writes it


@pytest.mark.parametrize("name", [*TRAINER_RECORDS, "older_source", "hf_import"])
def test_a_record_round_trips_byte_for_byte(name):
    info = json.loads(_text(name))
    out = RunRecord.from_json(info).to_json()
    assert out == info and list(out) == list(info)
    assert _dumps(out) == _text(name)


@pytest.mark.parametrize("name", TRAINER_RECORDS)
def test_a_record_built_from_its_fields_writes_the_trainers_json(name):
    # What `trainer.train` will write through `RunRecord(...).to_json()`: every field in the
    # trainer's order, the fingerprint last.
    info = json.loads(_text(name))
    built = RunRecord(**info)
    assert list(built.to_json()) == list(info)
    assert _dumps(built.to_json()) == _text(name)


def test_the_trainers_records_are_typed():
    src, replay, ft = (RunRecord.from_json(json.loads(_text(n))) for n in TRAINER_RECORDS)
    assert src.strategy is Strategy.SOURCE and replay.strategy is Strategy.CPT_REPLAY
    assert ft.strategy is Strategy.FINETUNE and ft.strategy == "finetune"
    assert replay.replay_ratio == 0.1 and replay.components == ("lm_en", "lm_fr")
    assert replay.language == "fr" and src.language == "en"
    assert ft.task_feature_lengths == {"inputs": 64, "targets": 32} and ft.finetune_tokens == 1500
    assert ft.fingerprint is not None and src.extra == {}


def test_an_older_record_gets_the_defaults_and_writes_back_as_it_was():
    info = json.loads(_text("older_source"))
    assert "finetune_unit" not in info and "fingerprint" not in info
    old = RunRecord.from_json(info)
    blank = RunRecord()
    for name in set(FIELDS) - set(info):
        assert getattr(old, name) == getattr(blank, name), name
    assert old.finetune_unit == "target" and old.fingerprint is None and old.amendments == ()
    assert old.tokens_paper_per_step is None and old.flops_per_token_attn is None
    assert not old.holds("finetune_unit") and old.holds("replay_ratio")
    assert "finetune_unit" not in old.to_json()
    # A field set after reading is written after the file's own keys.
    changed = dataclasses.replace(old, fingerprint={"model": {}})
    assert list(changed.to_json())[-1] == "fingerprint"


def test_unknown_keys_survive_and_unknown_strategies_stay_strings():
    info = {"model": "x", "runner": "t5x", "strategy": "distill", "checkpoint_steps": [1, 2]}
    rec = RunRecord.from_json(info)
    assert rec.extra == {"runner": "t5x", "checkpoint_steps": [1, 2]}
    assert rec.strategy == "distill" and not isinstance(rec.strategy, Strategy)
    assert rec.to_json() == info and list(rec.to_json()) == list(info)


def test_a_record_built_directly_leaves_out_unset_optional_fields():
    out = RunRecord(model="m", strategy=Strategy.CPT).to_json()
    assert list(out)[: len(FIELDS) - 9] == list(FIELDS[: len(FIELDS) - 9])
    assert "amendments" not in out and "fingerprint" not in out and "kind" not in out
    assert out["strategy"] == "cpt" and type(out["strategy"]) is str
    amended = RunRecord(model="m", fingerprint={"a": 1}, amendments=[{"step": 4}]).to_json()
    assert list(amended)[-2:] == ["fingerprint", "amendments"]
    assert amended["amendments"] == [{"step": 4}]


def test_read_run_record_reads_a_run_directory(tmp_path):
    info = json.loads(_text("cpt_replay"))
    records.write_run_json(tmp_path, info)
    rec = records.read_run_record(tmp_path)
    assert rec.to_json() == info == records.read_run_json(tmp_path)
    with pytest.raises(FileNotFoundError):
        records.read_run_record(tmp_path / "absent")
