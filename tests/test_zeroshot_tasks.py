"""The local zero-shot tasks (`evals.local_tasks`) and the paper's task map (`evals.paper_tasks`):
real files from a hand-written corpora directory and the committed UDHR fixture, loaded through
lm-evaluation-harness 0.4.13 offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals import local_tasks, paper_tasks
from pipelines.corpora import layout, paths

# 12 English lines of 10..21 words and 12 Chinese lines of 20..53 characters, all distinct.
EN_LINES = [" ".join(f"w{line}x{i}" for i in range(10 + line)) for line in range(12)]
ZH_LINES = [
    "".join(chr(0x4E00 + 97 * line + i) for i in range(20 + 3 * line)) for line in range(12)
]
EN_ZH_PAIRS = [(f"English sentence number {i}.", f"中文句子第{i}号" + "好" * i) for i in range(9)]


@pytest.fixture
def corpora(tmp_path) -> Path:
    """A corpora directory with en and zh validation text and an en-zh pair (validation + test)."""
    root = tmp_path / "corpora"
    layout.write_lines(paths.mono_file(root, "en", "validation"), EN_LINES)
    layout.write_lines(paths.mono_file(root, "zh", "validation"), ZH_LINES)
    layout.write_pairs(paths.parallel_file(root, "en-zh", "validation"), EN_ZH_PAIRS[:5])
    layout.write_pairs(paths.test_file(root, "en-zh"), EN_ZH_PAIRS[5:])
    return root


def read_docs(directory: Path, task: str) -> list[dict]:
    lines = (directory / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def files_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_items_have_four_distinct_choices_and_one_gold(corpora, tmp_path):
    tasks = local_tasks.write_local_tasks(corpora, tmp_path / "t", langs=["en", "zh"], items=10)
    assert tasks.tasks == {"xl_cont_en": "en", "xl_cont_zh": "zh", "xl_trans_zh": "zh"}
    assert tasks.skipped == {}
    for task in tasks.tasks:
        docs = read_docs(tasks.dir, task)
        assert 4 <= len(docs) <= 10, task
        for doc in docs:
            assert len(doc["choices"]) == 4
            assert len(set(doc["choices"])) == 4, doc  # the gold never equals a distractor
            assert doc["gold"] in range(4)
    # The cap binds where there is text for more; the gold sits at varied positions.
    assert len(read_docs(tasks.dir, "xl_cont_en")) == 10
    golds = [d["gold"] for t in tasks.tasks for d in read_docs(tasks.dir, t)]
    assert len(set(golds)) > 1


def test_continuation_split_rules_by_language(corpora, tmp_path):
    """en is cut by words and the choice follows the context after a space; zh is cut by
    characters and follows with nothing in between; gold = the passage's true ending."""
    tasks = local_tasks.write_local_tasks(corpora, tmp_path / "t", langs=["en", "zh"], items=50)
    assert local_tasks.split_rule("zh").unit == "character"
    assert local_tasks.split_rule("fr") is local_tasks.WORDS
    for task, lines, joiner in (("xl_cont_en", EN_LINES, " "), ("xl_cont_zh", ZH_LINES, "")):
        for doc in read_docs(tasks.dir, task):
            gold = doc["choices"][doc["gold"]]
            text = doc["context"] + joiner + gold
            (line,) = [line for line in lines if text in line]
            for distractor in set(doc["choices"]) - {gold}:
                assert doc["context"] + joiner + distractor not in line
        yaml_text = (tasks.dir / f"{task}.yaml").read_text(encoding="utf-8")
        assert f"target_delimiter: {json.dumps(joiner)}" in yaml_text
    # The en lines of 10..21 words make one passage each; the longest zh lines make two.
    assert len(read_docs(tasks.dir, "xl_cont_en")) == len(EN_LINES)
    assert len(read_docs(tasks.dir, "xl_cont_zh")) > len(ZH_LINES)


def test_translation_items_pair_the_english_with_its_translation(corpora, tmp_path):
    tasks = local_tasks.write_local_tasks(corpora, tmp_path / "t", langs=["en", "zh"], items=50)
    truth = dict(EN_ZH_PAIRS)
    docs = read_docs(tasks.dir, "xl_trans_zh")
    assert len(docs) == len(EN_ZH_PAIRS)  # validation and test pairs both count
    for doc in docs:
        english = doc["context"].removeprefix("English: ").removesuffix("\nChinese:")
        assert doc["choices"][doc["gold"]] == truth[english]
    assert local_tasks.task_info(tasks.dir, "xl_trans_zh")["kind"] == "translation"
    assert not any(t.startswith("xl_trans_en") for t in tasks.tasks)  # no en-en pair


def test_deterministic_bytes_and_seed(corpora, tmp_path):
    out = tmp_path / "t"
    local_tasks.write_local_tasks(corpora, out, langs=["en", "zh"], items=6, seed=3)
    first = files_bytes(out)
    local_tasks.write_local_tasks(corpora, out, langs=["en", "zh"], items=6, seed=3)
    assert files_bytes(out) == first
    assert not [name for name in first if name.endswith(".tmp")]
    local_tasks.write_local_tasks(corpora, out, langs=["en", "zh"], items=6, seed=4)
    assert files_bytes(out)["xl_cont_en.jsonl"] != first["xl_cont_en.jsonl"]


def test_index_round_trip_and_stale_tasks_removed(corpora, tmp_path):
    out = tmp_path / "t"
    local_tasks.write_local_tasks(corpora, out, langs=["en", "zh"], items=5)
    assert local_tasks.read_local_tasks(out) == {
        "xl_cont_en": "en",
        "xl_cont_zh": "zh",
        "xl_trans_zh": "zh",
    }
    info = local_tasks.task_info(out, "xl_cont_zh")
    assert info["language"] == "zh" and info["kind"] == "continuation"
    assert (info["choices"], info["chance"], info["n"]) == (4, 0.25, 5)
    assert info["source"] == str(paths.mono_file(corpora, "zh", "validation"))
    with pytest.raises(ValueError, match=r"xl_cont_fr.*xl_cont_en"):
        local_tasks.task_info(out, "xl_cont_fr")
    # Rewriting for en only leaves no zh task for lm-eval to find.
    local_tasks.write_local_tasks(corpora, out, langs=["en"], items=5)
    assert local_tasks.read_local_tasks(out) == {"xl_cont_en": "en"}
    assert sorted(p.name for p in out.iterdir()) == [
        "tasks.json",
        "xl_cont_en.jsonl",
        "xl_cont_en.yaml",
    ]
    with pytest.raises(ValueError, match="tasks.json"):
        local_tasks.read_local_tasks(tmp_path / "nowhere")


def test_too_few_items_is_skipped(tmp_path):
    root = tmp_path / "corpora"
    layout.write_lines(paths.mono_file(root, "fr", "validation"), EN_LINES[:3] + ["trop court"])
    tasks = local_tasks.write_local_tasks(root, tmp_path / "t", langs=["fr"], items=10)
    assert tasks.tasks == {}
    assert "xl_cont_fr" in tasks.skipped and "fewer than 4" in tasks.skipped["xl_cont_fr"]
    assert not (tmp_path / "t" / "xl_cont_fr.yaml").exists()


def test_missing_language_names_corpora_language_and_file(corpora, tmp_path):
    expected = paths.mono_file(corpora, "ru", "validation")
    with pytest.raises(ValueError) as err:
        local_tasks.write_local_tasks(corpora, tmp_path / "t", langs=["en", "ru"], items=5)
    assert str(corpora) in str(err.value) and "'ru'" in str(err.value)
    assert str(expected) in str(err.value)
    assert not (tmp_path / "t" / "tasks.json").exists()  # nothing written for the other language


def test_committed_fixture_gives_en_and_zh_tasks(tmp_path):
    """The CPT smoke demo's corpora (UDHR fixture) with its `items=24`."""
    from pipelines.corpora.fixture import write_fixture_corpora

    corpora = write_fixture_corpora(tmp_path / "data")
    tasks = local_tasks.write_local_tasks(corpora, tmp_path / "t", langs=["en", "zh"], items=24)
    assert tasks.tasks == {"xl_cont_en": "en", "xl_cont_zh": "zh", "xl_trans_zh": "zh"}
    for task in tasks.tasks:
        n = local_tasks.task_info(tasks.dir, task)["n"]
        assert 4 <= n <= 24 and n == len(read_docs(tasks.dir, task)), (task, n)


def test_data_build_hook_writes_under_the_data_root(tmp_path):
    from pipelines.corpora.fixture import write_fixture_corpora
    from xlscale_cli import data

    corpora = write_fixture_corpora(tmp_path)
    lines: list[str] = []
    status = data.write_zeroshot_tasks(
        corpora, data_dir=str(tmp_path), langs=["en", "zh"], items=8, log=lines.append
    )
    assert status == 0
    assert local_tasks.read_local_tasks(tmp_path / "zeroshot_tasks") == {
        "xl_cont_en": "en",
        "xl_cont_zh": "zh",
        "xl_trans_zh": "zh",
    }
    assert str(tmp_path / "zeroshot_tasks") in lines[-1]


@pytest.fixture
def offline_lm_eval(tmp_path, monkeypatch):
    """lm_eval with `datasets` offline and its cache under tmp_path."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    import lm_eval.tasks

    return lm_eval.tasks


@pytest.mark.slow
def test_lm_eval_loads_the_local_tasks_offline(corpora, tmp_path, offline_lm_eval):
    tasks = local_tasks.write_local_tasks(corpora, tmp_path / "t", langs=["en", "zh"], items=6)
    manager = offline_lm_eval.TaskManager(include_path=str(tasks.dir), include_defaults=False)
    assert set(tasks.tasks) <= set(manager.all_tasks)
    built = offline_lm_eval.get_task_dict(sorted(tasks.tasks), manager)
    assert set(built) == set(tasks.tasks)
    for name, task in built.items():
        docs = list(task.test_docs())
        assert docs == [
            {k: d[k] for k in docs[0]} for d in read_docs(tasks.dir, name)
        ]  # same docs, same order
        doc = docs[0]
        choices = task.doc_to_choice(doc)
        assert choices == doc["choices"] and task.doc_to_target(doc) == doc["gold"]
        assert task.doc_to_text(doc) == doc["context"]
        assert sorted(m["metric"] for m in task.config.metric_list) == ["acc", "acc_norm"]
        # The requests lm-eval sends the model: (context, delimiter + choice) per choice.
        task.build_all_requests(limit=1, rank=0, world_size=1)
        joiner = "" if name == "xl_cont_zh" else " "
        assert [i.args for i in task.instances] == [(doc["context"], joiner + c) for c in choices]


@pytest.mark.slow
def test_paper_tasks_are_lm_eval_tasks(offline_lm_eval):
    known = set(offline_lm_eval.TaskManager().all_tasks)
    mapped = {t for tasks in paper_tasks.PAPER_TASKS.values() for t in tasks}
    assert mapped <= known, sorted(mapped - known)
    assert set(paper_tasks.CHANCE) == mapped
    assert set(paper_tasks.OMITTED) == set(paper_tasks.PAPER_TASKS) == {"en", "zh", "fr", "ru"}


def test_paper_task_map():
    assert paper_tasks.paper_tasks("fr") == ["xnli_fr", "xwinograd_fr", "hellaswag_fr"]
    # The paper leaves XCOPA and PIQA out for fr and ru; PIQA is English only.
    for lang in ("fr", "ru"):
        assert not [t for t in paper_tasks.paper_tasks(lang) if t.startswith(("xcopa", "piqa"))]
    assert "piqa" in paper_tasks.paper_tasks("en") and "xcopa_zh" in paper_tasks.paper_tasks("zh")
    # zh PIQA is Global PIQA's Simplified-Chinese cloze set; zh HellaSwag stays unmatched.
    zh_piqa = "global_piqa_parallel_cloze_cmn_hans"
    assert zh_piqa in paper_tasks.paper_tasks("zh")
    assert paper_tasks.benchmark_family(zh_piqa) == "global_piqa"
    assert paper_tasks.CHANCE[zh_piqa] == 0.5 and paper_tasks.task_language(zh_piqa) == "zh"
    assert "HellaSwag" in paper_tasks.OMITTED["zh"]
    assert paper_tasks.benchmark_family("hellaswag_ru") == "hellaswag"
    assert paper_tasks.CHANCE["xnli_zh"] == pytest.approx(1 / 3)
    assert paper_tasks.CHANCE["hellaswag"] == 0.25 and paper_tasks.CHANCE["piqa"] == 0.5
    assert paper_tasks.task_language("hellaswag") == "en"
    assert paper_tasks.task_language("xstorycloze_ru") == "ru"
    assert paper_tasks.task_language("xl_cont_zh") is None
    with pytest.raises(ValueError, match=r"'de'.*en, fr, ru, zh"):
        paper_tasks.paper_tasks("de")
    table = paper_tasks.markdown_table()
    assert table.count("\n") == 2 + len(paper_tasks.PAPER_TASKS)
    assert "`xcopa_zh`" in table and "left out by the paper" in table
