"""SuperGLUE read from its two real layouts (a prepared TFDS data dir, the HF `super_glue` files),
registered as seqio tasks and a mixture, decoded text scored with the official metrics.

The fixtures (tests/fixtures/superglue, `make_fixtures.py`) were prepared by TFDS's own
`super_glue` builder from SuperGLUE-zip-layout JSON lines, and the HF files written from them."""

import os
import shutil

import pytest
import seqio

from pipelines import superglue_metrics, superglue_sources, superglue_text, tasks
from trainer import downstream

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "superglue")
TFDS_DIR = os.path.join(FIXTURES, "tfds")
HF_ROOT = os.path.join(FIXTURES, "hf")
TASKS = sorted(superglue_text.TASK_CONFIGS)
# Parquet with flat and struct `idx`, JSON lines with lists, integer spans.
HF_COMPARED = ("super_glue_boolq", "super_glue_multirc", "super_glue_record", "super_glue_wsc")

MULTIRC_PARAGRAPH = "Sent 1: Tom has a red car. Sent 2: He drives it daily. "
RECORD_INPUTS = (
    "record query: The @placeholder opened in 1889. entities: Eiffel Tower, France, Paris "
    "passage: Paris is in France. The Eiffel Tower is tall. It opened in 1889"
)


def _texts(task, split="validation"):
    return [
        (ex.inputs, ex.target)
        for ex in downstream.text_examples(task, split=split, max_examples=None)
    ]


@pytest.fixture(scope="module")
def data(fixture_data):
    return fixture_data(langs=["en"], vocab_size=300)


@pytest.fixture
def from_tfds(seqio_registry, data):
    names = tasks.register_tasks(
        vocabulary=data[1], corpora_dir=TFDS_DIR, langs=[], pairs=[], source="tfds"
    )
    downstream._EXAMPLES.clear()
    return names


def test_tfds_layout_registers_every_task_and_the_mixture(from_tfds):
    assert sorted(from_tfds) == TASKS
    mixture = seqio.get_mixture_or_task(superglue_sources.MIXTURE)
    rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
    assert rates == {t: float(superglue_sources.TRAIN_EXAMPLES[t]) for t in TASKS}


@pytest.mark.slow
def test_tfds_text_pairs_of_three_tasks(from_tfds):
    assert sorted(_texts("super_glue_cb")) == [
        ("cb hypothesis: It did not rain. premise: It rained.", "contradiction"),
        ("cb hypothesis: The ground is wet. premise: It rained.", "neutral"),
        ("cb hypothesis: Water fell. premise: It rained.", "entailment"),
    ]
    assert sorted(_texts("super_glue_multirc")) == [
        (
            f"multirc question: How often does Tom drive? answer: Daily paragraph: "
            f"{MULTIRC_PARAGRAPH}",
            "True",
        ),
        (
            f"multirc question: What colour is the car? answer: Blue paragraph: "
            f"{MULTIRC_PARAGRAPH}",
            "False",
        ),
        (
            f"multirc question: What colour is the car? answer: Red paragraph: {MULTIRC_PARAGRAPH}",
            "True",
        ),
    ]
    record = _texts("super_glue_record")
    assert (RECORD_INPUTS, "Eiffel Tower") in record and (RECORD_INPUTS, "Tower") in record
    assert len(record) == 3  # one pair per answer: 1 + 2
    assert {t for _, t in _texts("super_glue_record", split="test")} == {"<unk>"}


@pytest.mark.slow
def test_tokenized_task_rows_end_in_eos(from_tfds):
    ds = seqio.get_mixture_or_task("super_glue_rte").get_dataset(
        sequence_length={"inputs": 32, "targets": 32}, split="train", shuffle=False, num_epochs=1
    )
    rows = list(ds.as_numpy_iterator())
    assert len(rows) == 1
    assert rows[0]["inputs"][-1] == 1 and len(rows[0]["inputs"]) == 32  # truncated, EOS kept
    vocabulary = seqio.get_mixture_or_task("super_glue_rte").output_features["targets"].vocabulary
    targets = rows[0]["targets"].tolist()
    assert targets[-1] == 1 and vocabulary.decode(targets[:-1]) == "entailment"


@pytest.mark.slow
def test_hf_files_give_the_same_pairs_as_tfds(seqio_registry, data, from_tfds):
    want = {t: _texts(t) for t in HF_COMPARED}
    names = superglue_sources.register(
        vocabulary=data[1], corpora_dir=HF_ROOT, source="hf", shuffle_buffer_size=8
    )
    downstream._EXAMPLES.clear()
    assert sorted(names) == TASKS
    files = superglue_sources.hf_files(superglue_sources.hf_root(HF_ROOT))
    assert files["record", "validation"][0].endswith("record/validation.jsonl")
    assert files["cb", "train"][0].endswith("cb/train-00000-of-00001.parquet")
    for task in HF_COMPARED:
        assert _texts(task) == want[task], task


def test_local_corpora_with_super_glue_beside_them(seqio_registry, data, tmp_path):
    corpora, vocabulary = data
    root = tmp_path / "corpora"
    shutil.copytree(corpora, root)
    shutil.copytree(os.path.join(HF_ROOT, "aps", "super_glue", "cb"), root / "super_glue" / "cb")
    names = tasks.register_tasks(vocabulary=vocabulary, corpora_dir=root, langs=["en"], pairs=[])
    assert "super_glue_cb" in names and "super_glue_boolq" not in names
    assert [t.name for t in seqio.get_mixture_or_task("super_glue").tasks] == ["super_glue_cb"]
    # Without SuperGLUE files nothing is registered.
    names = tasks.register_tasks(vocabulary=vocabulary, corpora_dir=corpora, langs=["en"], pairs=[])
    assert not [n for n in names if n.startswith("super_glue")]


def test_decoded_predictions_scored_officially(from_tfds):
    examples = downstream.text_examples("super_glue_record", split="validation", max_examples=None)
    perfect = downstream.score("super_glue_record", examples, [ex.target for ex in examples])
    assert perfect == {"f1": 100.0, "em": 100.0, "score": 100.0}
    # One prediction per query (decoding gives the same one to each answer's pair).
    predictions = ["France" if "country" in ex.inputs else "Paris" for ex in examples]
    assert downstream.score("super_glue_record", examples, predictions)["em"] == 50.0
    examples = downstream.text_examples("super_glue_wsc", split="validation", max_examples=None)
    scores = downstream.score("super_glue_wsc", examples, ["True"] * len(examples))
    assert scores == {"accuracy": 50.0, "score": 50.0}
    assert superglue_metrics.average({"a": 50.0, "b": 100.0}) == 75.0
