"""Resume checks what it resumes: the run fingerprint and `RESUME_POLICY`.

One module-scoped finished 4-step constant-LR run on one device serves every test (compiling is
what costs time): the refusal tests fail before anything is compiled or written, and the others
resume copies of it, which reuse its compiled step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import pytest
from resume_runs import CONSTANT, STEPS, base_kwargs

from rundir import records as rundir_records
from trainer import fingerprint, model_spec, validation
from trainer import train as train_lib

pytestmark = pytest.mark.usefixtures("compilation_cache")


def snapshot(model_dir):
    """The files a refused resume must leave alone."""
    names = ("config.gin", "run.json", "metrics.jsonl", "COMPLETED")
    files = {name: (model_dir / name).read_bytes() for name in names}
    files["checkpoints"] = sorted(p.name for p in (model_dir / "checkpoints").iterdir())
    return files


@pytest.mark.slow
def test_fingerprint_is_stored_with_what_defines_the_run(finished):
    fp = rundir_records.read_run_json(finished)["fingerprint"]
    assert fp["model"]["size"] == "llama2_tiny" and fp["total_steps"] == STEPS
    assert fp["data"]["mixture_or_task"] == "lm_en" and fp["data"]["batch_size"] == 8
    assert fp["schedule"] == dataclasses.asdict(CONSTANT) and fp["optimizer"]["name"] == "adamw"
    assert fp["process_count"] == 1 and fp["seed"] == 0
    assert "mesh" not in fp and "log_every" not in fp and "checkpoint" not in fp


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, expected",
    [
        ("mixture", "data.mixture_or_task [MIXTURE_OR_TASK_NAME"),
        ("lr", "schedule.peak: 0.003 -> 0.001"),
        ("batch", "data.batch_size [BATCH_SIZE (data.DataConfig.batch_size)]: 8 -> 16"),
    ],
)
def test_changed_settings_are_refused_and_nothing_is_written(
    finished, tiny_data, seqio_registry, change, expected
):
    kwargs = base_kwargs(tiny_data)
    changes = {
        "mixture": {"data": dataclasses.replace(kwargs["data"], mixture_or_task="lm_fr")},
        "lr": {"schedule": dataclasses.replace(CONSTANT, peak=1e-3)},
        "batch": {"data": dataclasses.replace(kwargs["data"], batch_size=16)},
    }
    before = snapshot(finished)
    with pytest.raises(validation.ConfigError) as e:
        train_lib.train(model_dir=finished, **{**kwargs, **changes[change]})
    message = str(e.value)
    assert expected in message, message
    assert "resume refused" in message and "--gin.RESUME_POLICY=" in message
    assert snapshot(finished) == before


def test_all_changes_are_listed_together(finished, tiny_data, seqio_registry):
    kwargs = base_kwargs(tiny_data)
    data = dataclasses.replace(kwargs["data"], mixture_or_task="lm_fr", batch_size=16)
    with pytest.raises(validation.ConfigError) as e:
        train_lib.train(
            model_dir=finished,
            **{**kwargs, "data": data, "schedule": dataclasses.replace(CONSTANT, peak=1e-3)},
        )
    message = str(e.value)
    for line in ("'lm_en' -> 'lm_fr'", "8 -> 16", "0.003 -> 0.001"):
        assert line in message, message
    assert "data.batch_size,data.mixture_or_task,schedule.peak" in message


def test_different_model_size_is_refused_before_restoring(finished, tiny_data, seqio_registry):
    before = snapshot(finished)
    model = model_spec.ModelSpec(
        size="llama2_cpu_d64", overrides={"vocab_size": 512, "max_len": 128}
    )
    with pytest.raises(validation.ConfigError) as e:
        train_lib.train(model_dir=finished, **base_kwargs(tiny_data, model=model))
    message = str(e.value)
    assert "model.size [MODEL_SIZE (models.ModelSpec.size)]: 'llama2_tiny' -> 'llama2_cpu_d64'" in (
        message
    )
    assert "another model" in message
    assert snapshot(finished) == before


@pytest.mark.slow
def test_more_steps_of_a_cosine_run_are_refused_even_with_the_policy(
    finished, tiny_data, seqio_registry, tmp_path
):
    # A cosine run's directory: the check reads only run.json's fingerprint, so the finished
    # run's copy with its schedule renamed serves without compiling a second step.
    model_dir = tmp_path / "cosine"
    shutil.copytree(finished, model_dir)
    info = rundir_records.read_run_json(model_dir)
    info["fingerprint"]["schedule"]["name"] = "cosine"
    rundir_records.write_run_json(model_dir, info)
    before = snapshot(model_dir)
    cosine = dataclasses.replace(CONSTANT, name="cosine")
    for policy in (None, "train_steps"):
        with pytest.raises(validation.ConfigError) as e:
            train_lib.train(
                model_dir=model_dir,
                resume_policy=policy,
                **base_kwargs(tiny_data, train_steps=6, schedule=cosine),
            )
        message = str(e.value)
        assert "total_steps: 4 -> 6" in message and "learning rate would jump" in message
        assert "'cosine' schedule" in message and "--gin.RESUME_POLICY" not in message
    assert snapshot(model_dir) == before


def test_unknown_policy_name_is_an_error(finished, tiny_data, seqio_registry):
    with pytest.raises(validation.ConfigError, match="'train_step'.*allowed: policies"):
        train_lib.train(model_dir=finished, resume_policy="train_step", **base_kwargs(tiny_data))


def test_identical_configuration_resumes_as_before(finished, tiny_data, seqio_registry, tmp_path):
    model_dir = tmp_path / "copy"
    shutil.copytree(finished, model_dir)
    before = snapshot(model_dir)
    result = train_lib.train(model_dir=model_dir, **base_kwargs(tiny_data))
    assert result.completed and result.step == STEPS
    assert snapshot(model_dir) == before


def test_run_without_fingerprint_resumes_with_a_warning(
    finished, tiny_data, seqio_registry, tmp_path, caplog
):
    model_dir = tmp_path / "old"
    shutil.copytree(finished, model_dir)
    info = rundir_records.read_run_json(model_dir)
    del info["fingerprint"]
    rundir_records.write_run_json(model_dir, info)
    with caplog.at_level(logging.WARNING, logger="trainer.fingerprint"):
        result = train_lib.train(model_dir=model_dir, **base_kwargs(tiny_data, seed=1))
    assert result.completed
    assert "has no fingerprint" in caplog.text
    assert "fingerprint" not in rundir_records.read_run_json(model_dir)


@pytest.mark.slow
def test_extending_a_constant_lr_run_is_recorded_as_an_amendment(
    finished, tiny_data, seqio_registry, tmp_path
):
    model_dir = tmp_path / "constant"
    shutil.copytree(finished, model_dir)
    config_before = (model_dir / "config.gin").read_text()
    longer = base_kwargs(tiny_data, train_steps=6)
    with pytest.raises(validation.ConfigError, match="RESUME_POLICY=\"'train_steps'\""):
        train_lib.train(model_dir=model_dir, **longer)

    result = train_lib.train(model_dir=model_dir, resume_policy="train_steps", **longer)
    assert result.completed and result.step == 6
    run = rundir_records.read_run_json(model_dir)
    assert run["train_steps"] == 6 and run["fingerprint"]["total_steps"] == 6
    assert run["amendments"] == [
        {
            "step": STEPS,
            "changes": {
                "train_steps": {"old": 4, "new": 6},
                "total_steps": {"old": 4, "new": 6},
            },
            "policy": "train_steps",
        }
    ]
    assert (model_dir / f"config.{STEPS}.gin").read_text() == config_before
    records = rundir_records.read_metrics(model_dir)
    assert [r["step"] for r in records] == [2, 4, 6]
    assert records[-1]["learning_rate"] == pytest.approx(3e-3)
    assert json.loads((model_dir / "COMPLETED").read_text())["step"] == 6

    # The amended run resumes as it now is; the old settings are refused.
    again = train_lib.train(model_dir=model_dir, **longer)
    assert again.completed and again.step == 6
    with pytest.raises(validation.ConfigError, match="total_steps: 6 -> 4"):
        train_lib.train(model_dir=model_dir, **base_kwargs(tiny_data))


def _fp(**changes):
    fp = {
        "model": {"family": "llama2", "size": "s", "overrides": {}, "dropout_rate": None},
        "data": {"mixture_or_task": "lm_en", "batch_size": 8},
        "schedule": {"name": "constant", "peak": 1e-3},
        "total_steps": 10,
        "process_count": 2,
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            fp[section] = {**fp[section], field: value}
        else:
            fp[key] = value
    return fp


def test_diff_uses_dotted_keys_and_compares_values_whole():
    old, new = _fp(), _fp(data__batch_size=16, model__overrides={"d_ff": 96}, seed=1)
    assert fingerprint.diff_fingerprints(old, new) == [
        ("data.batch_size", 8, 16),
        ("model.overrides", {}, {"d_ff": 96}),
        ("seed", "<absent>", 1),
    ]
    assert fingerprint.diff_fingerprints(new, new) == []


def test_host_count_may_change_only_with_global_host_sharding(tmp_path):
    with pytest.raises(validation.ConfigError, match="process_count: 2 -> 1"):
        fingerprint.check_resume(
            stored=_fp(), new=_fp(process_count=1), policy=None, model_dir=tmp_path, step=4
        )
    old = _fp(data__host_sharding="global")
    amendment = fingerprint.check_resume(
        stored=old, new={**old, "process_count": 1}, policy=None, model_dir=tmp_path, step=4
    )
    assert amendment.changes == (("process_count", 2, 1),)


def test_setting_added_since_the_run_started_is_accepted_at_its_default(tmp_path):
    new = _fp(data__host_sharding="per_host")
    defaults = {"data": {"host_sharding": "per_host", "batch_size": 512}}
    kwargs = dict(stored=_fp(), model_dir=tmp_path, step=4, policy=None, defaults=defaults)
    assert fingerprint.check_resume(new=new, **kwargs) is None
    with pytest.raises(validation.ConfigError, match="data.host_sharding: '<absent>' -> 'global'"):
        fingerprint.check_resume(new=_fp(data__host_sharding="global"), **kwargs)


def test_resume_policy_macro_reaches_train(tiny_data):
    import gin

    from trainer import gin_entry

    try:
        config = gin_entry.parse(
            [
                "--gin_file=experiments/cpt_source_en.gin",
                "--gin_file=experiments/tiny.gin",
                "--gin.MODEL_DIR='/xl/run'",
                f"--gin.VOCAB_PATH='{tiny_data['vocab']}'",
                f"--gin.DATA_DIR='{tiny_data['corpora']}'",
                "--gin.RESUME_POLICY='train_steps'",
            ],
            job="train",
        )
        assert "train_script.train.resume_policy = %RESUME_POLICY" in config.config_str
        assert gin_entry.macro_value("RESUME_POLICY") == "train_steps"
    finally:
        gin.clear_config()


def test_fingerprint_holds_the_vocabulary_contents(finished, tiny_data):
    import hashlib
    from pathlib import Path

    fp = rundir_records.read_run_json(finished)["fingerprint"]
    expected = hashlib.sha256(Path(tiny_data["vocab"]).read_bytes()).hexdigest()
    assert fp["vocab_sha256"] == expected


@pytest.mark.parametrize("policy", [None, "paths"])
def test_another_vocabulary_at_the_same_path_is_refused(
    finished, tiny_data, seqio_registry, tmp_path, other_vocab, policy
):
    # Same VOCAB_PATH, other contents; 'paths' allows moved files only.
    model_dir = tmp_path / "run"
    shutil.copytree(finished, model_dir)
    vocab_path = tmp_path / "vocab.model"
    shutil.copyfile(tiny_data["vocab"], vocab_path)
    info = rundir_records.read_run_json(model_dir)
    info["fingerprint"]["data"]["vocab_path"] = str(vocab_path)
    rundir_records.write_run_json(model_dir, info)
    old_hash = info["fingerprint"]["vocab_sha256"]
    shutil.copyfile(other_vocab, vocab_path)  # replaced in place
    before = snapshot(model_dir)
    kwargs = base_kwargs(tiny_data)
    kwargs["data"] = dataclasses.replace(kwargs["data"], vocab_path=str(vocab_path))
    with pytest.raises(validation.ConfigError) as e:
        train_lib.train(model_dir=model_dir, resume_policy=policy, **kwargs)
    message = str(e.value)
    new_hash = fingerprint.vocab_sha256(vocab_path)
    assert "vocab_sha256 [VOCAB_PATH (data.DataConfig.vocab_path)]: " in message
    assert f"'{old_hash}' -> '{new_hash}'" in message and old_hash != new_hash
    assert f"VOCAB_PATH '{vocab_path}' holds another vocabulary" in message
    assert "--gin.RESUME_POLICY" not in message  # no policy allows it
    assert snapshot(model_dir) == before


def test_a_moved_vocabulary_with_the_same_contents_resumes_under_paths(
    finished, tiny_data, seqio_registry, tmp_path, other_vocab
):
    model_dir = tmp_path / "run"
    shutil.copytree(finished, model_dir)
    kwargs = base_kwargs(tiny_data)
    moved = tmp_path / "moved.model"
    shutil.copyfile(tiny_data["vocab"], moved)
    kwargs["data"] = dataclasses.replace(kwargs["data"], vocab_path=str(moved))
    result = train_lib.train(model_dir=model_dir, resume_policy="paths", **kwargs)
    assert result.completed
    kwargs["data"] = dataclasses.replace(kwargs["data"], vocab_path=str(other_vocab))
    with pytest.raises(validation.ConfigError, match="holds another vocabulary"):
        train_lib.train(model_dir=model_dir, resume_policy="paths", **kwargs)


def test_a_run_from_before_the_vocabulary_hash_resumes_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer.fingerprint"):
        amendment = fingerprint.check_resume(
            stored=_fp(), new=_fp(vocab_sha256="ab" * 32), policy=None, model_dir=tmp_path, step=4
        )
    assert amendment is None and "predates vocab_sha256" in caplog.text


def test_a_finetune_from_before_the_recipe_resumes_with_a_warning(tmp_path, caplog):
    # `run.finetune_recipe` was added after finetunes had started; theirs ran the 300 steps that
    # `finetune.gin` now names 'paper_300', so a resume is not refused for the new key.
    stored = _fp(run={"strategy": "finetune"})
    new = _fp(run={"strategy": "finetune", "finetune_recipe": "paper_300"})
    with caplog.at_level(logging.WARNING, logger="trainer.fingerprint"):
        amendment = fingerprint.check_resume(
            stored=stored,
            new=new,
            policy=None,
            model_dir=tmp_path,
            step=4,
            defaults={"run": {"strategy": "pretrain", "finetune_recipe": None}},
        )
    assert amendment is None and "predates run.finetune_recipe" in caplog.text


def test_a_torn_row_of_the_newest_checkpoint_is_logged_again_on_resume(
    finished, tiny_data, seqio_registry, tmp_path, caplog
):
    # The last row (step 4) is also the newest checkpoint's; cut in half it
    # Used to be dropped for good, since the resume starts after it.
    model_dir = tmp_path / "torn"
    shutil.copytree(finished, model_dir)
    path = model_dir / "metrics.jsonl"
    whole = path.read_text()
    assert [json.loads(line)["step"] for line in whole.splitlines()] == [2, 4]
    path.write_text(whole[: len(whole) - len(whole.splitlines()[-1]) // 2 - 1])
    with caplog.at_level(logging.WARNING):
        result = train_lib.train(model_dir=model_dir, **base_kwargs(tiny_data))
    assert result.completed
    assert path.read_text() == whole  # the row comes back whole, once
    assert "re-logged 1 record (step 4)" in caplog.text


def test_each_checkpoint_holds_the_rows_logged_since_the_previous_one(finished):
    logged = rundir_records.read_metrics(finished)
    for step in (2, 4):
        saved = json.loads(
            (finished / "checkpoints" / str(step) / "train_state" / "metadata").read_text()
        )
        assert saved["records"] == [r for r in logged if step - 2 < r["step"] <= step]


@pytest.mark.slow
def test_relative_model_dir_and_init_checkpoint_are_made_absolute_before_anything_runs(
    finished, tiny_data, seqio_registry, tmp_path, monkeypatch
):
    # Orbax refuses relative paths, which used to surface at the first save.
    shutil.copytree(finished, tmp_path / "rel")
    monkeypatch.chdir(tmp_path)
    longer = base_kwargs(tiny_data, train_steps=6)
    result = train_lib.train(model_dir="rel", resume_policy="train_steps", **longer)
    assert result.completed and result.model_dir == str(tmp_path / "rel")
    assert (tmp_path / "rel" / "checkpoints" / "6").is_dir()
    result = train_lib.train(
        model_dir="fresh", init_checkpoint="rel@4", **base_kwargs(tiny_data, train_steps=2)
    )
    assert result.completed and (tmp_path / "fresh" / "checkpoints" / "2").is_dir()
    run = rundir_records.read_run_json(tmp_path / "fresh")
    assert run["init_checkpoint"] == str(tmp_path / "rel") and run["init_step"] == 4
