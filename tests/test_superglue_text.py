"""SuperGLUE text-to-text preprocessing: every task's pairs against T5's definitions, written out
by hand (t5.data.preprocessors.glue / wsc / record, t5.data.glue_utils)."""

import pytest

from pipelines import superglue_text as sg


def test_boolq_sorted_fields_and_label_names():
    rec = {"question": "is it warm", "passage": "It is warm.", "idx": 3, "label": 1}
    assert sg.to_text("boolq", rec) == [("boolq passage: It is warm. question: is it warm", "True")]


def test_cb_three_labels_and_unlabelled_test_rows():
    rec = {"premise": "P.", "hypothesis": "H.", "idx": 0}
    assert sg.to_text("cb", {**rec, "label": 2}) == [("cb hypothesis: H. premise: P.", "neutral")]
    assert sg.to_text("cb", {**rec, "label": 1})[0][1] == "contradiction"
    assert sg.to_text("cb", {**rec, "label": -1})[0][1] == "<unk>"


def test_copa_fields_sorted_and_choice_labels():
    rec = {"premise": "I fell.", "choice1": "A.", "choice2": "B.", "question": "cause", "label": 0}
    assert sg.to_text("copa", rec) == [
        ("copa choice1: A. choice2: B. premise: I fell. question: cause", "choice1")
    ]


def test_multirc_fixed_order_and_html_removed():
    rec = {
        "paragraph": "<b>Sent 1: </b>Tom has a car.<br><b>Sent 2: </b>It is red.<br>",
        "question": "What colour?",
        "answer": "Red",
        "label": 1,
        "idx": {"paragraph": 0, "question": 0, "answer": 0},
    }
    assert sg.to_text("multirc", rec) == [
        (
            "multirc question: What colour? answer: Red paragraph: "
            "Sent 1: Tom has a car. Sent 2: It is red. ",
            "True",
        )
    ]


def test_rte_and_wic():
    rte = {"premise": "A man sleeps.", "hypothesis": "A man runs.", "label": 1}
    assert sg.to_text("rte", rte) == [
        ("rte hypothesis: A man runs. premise: A man sleeps.", "not_entailment")
    ]
    wic = {"word": "bank", "sentence1": "S1.", "sentence2": "S2.", "start1": 0, "end1": 1}
    assert sg.to_text("wic", {**wic, "label": 0}) == [
        ("wic sentence1: S1. sentence2: S2. word: bank", "False")
    ]


def test_wsc_marks_candidate_and_pronoun():
    text = "Mark told Pete many lies about himself . He should have been more truthful ."
    rec = {"text": text, "span1_index": 2, "span1_text": "Pete", "span2_index": 8, "label": 0}
    rec["span2_text"] = "He"
    assert sg.to_text("wsc.fixed", rec) == [
        (
            "wsc text: Mark told * Pete * many lies about himself . # He # should have been "
            "more truthful .",
            "False",
        )
    ]
    # The pronoun before the candidate: the candidate's index is not shifted.
    rec = {"text": "He said Bob left .", "span1_index": 2, "span1_text": "Bob", "label": 1}
    rec.update(span2_index=0, span2_text="He")
    assert sg.to_text("wsc.fixed", rec) == [("wsc text: # He # said * Bob * left .", "True")]


def test_record_one_pair_per_answer_and_highlights_joined():
    rec = {
        "passage": "Paris is in France.\n@highlight\nThe tower is tall\n@highlight\nIt opened",
        "query": "The @placeholder opened.",
        "entities": ["Paris", "France", "Paris"],  # any order, repeats: sorted, distinct
        "answers": ["Tower", "Eiffel Tower"],
    }
    inputs = (
        "record query: The @placeholder opened. entities: France, Paris passage: "
        "Paris is in France. The tower is tall. It opened"
    )
    assert sg.to_text("record", rec) == [(inputs, "Eiffel Tower"), (inputs, "Tower")]
    assert sg.to_text("record", {**rec, "answers": []}) == [(inputs, "<unk>")]


@pytest.mark.parametrize("task", sorted(sg.TASK_CONFIGS))
def test_every_task_has_a_converter(task):
    assert sg.TASK_CONFIGS[task] in sg.CONVERTERS
