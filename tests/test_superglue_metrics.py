"""SuperGLUE's official metrics on decoded text against hand-computed values, and the routing of
decoded SuperGLUE tasks to them (not to BLEU) in `trainer.downstream.score`."""

import pytest

from pipelines import superglue_metrics as m
from pipelines import text_metrics
from trainer import downstream


def test_accuracy_tasks():
    got = m.score("super_glue_boolq", ["a", "b", "c", "d"], ["True", "False"] * 2, ["True"] * 4)
    assert got == {"accuracy": 50.0, "score": 50.0}


def test_cb_accuracy_and_macro_f1_averaged():
    targets = ["entailment", "contradiction", "neutral", "entailment"]
    predictions = ["entailment", "neutral", "neutral", "banana"]
    # entailment: tp 1, fn 1 -> F1 2/3; contradiction: fn 1 -> 0; neutral: tp 1, fp 1 -> 2/3.
    got = m.score("super_glue_cb", [""] * 4, targets, predictions)
    assert got["accuracy"] == pytest.approx(50.0)
    assert got["f1"] == pytest.approx(100 * (2 / 3 + 0 + 2 / 3) / 3)
    assert got["score"] == pytest.approx((50.0 + 100 * 4 / 9) / 2)


def test_multirc_f1a_over_options_and_em_per_question():
    q1 = "multirc question: What colour? answer: {} paragraph: Tom has a red car."
    q2 = "multirc question: How often? answer: {} paragraph: Tom has a red car."
    inputs = [q1.format("Red"), q1.format("Blue"), q2.format("Daily"), q2.format("Never")]
    targets = ["True", "False", "True", "False"]
    predictions = ["True", "False", "True", "True"]
    # options: tp 2, fp 1, fn 0 -> F1a 4/5; questions: q1 all right, q2 not -> EM 1/2.
    got = m.score("super_glue_multirc", inputs, targets, predictions)
    assert got["f1a"] == pytest.approx(80.0)
    assert got["em"] == pytest.approx(50.0)
    assert got["score"] == pytest.approx(65.0)
    assert m.multirc_question(inputs[0]) == m.multirc_question(inputs[1])
    assert m.multirc_question(inputs[0]) != m.multirc_question(inputs[2])


def test_record_best_over_answers_per_query():
    a, b = "record query: A @placeholder. passage: x", "record query: B @placeholder. passage: x"
    inputs = [a, a, b]
    targets = ["Eiffel Tower", "Tower", "France"]
    # Pairs of one query share inputs and carry the same prediction.
    predictions = ["the tower!", "the tower!", "Paris France"]
    got = m.score("super_glue_record", inputs, targets, predictions)
    # query a: "tower" matches "Tower" exactly (EM 1, F1 1); query b: F1 2·(1/2·1)/(3/2) = 2/3.
    assert got["em"] == pytest.approx(50.0)
    assert got["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert got["score"] == pytest.approx((got["em"] + got["f1"]) / 2)


def test_normalize_answer_as_squad():
    assert m.normalize_answer("  The  Eiffel-Tower, an icon. ") == "eiffeltower icon"


def test_average_is_mean_of_task_scores():
    assert m.average({"super_glue_cb": 60.0, "super_glue_rte": 80.0}) == 70.0
    with pytest.raises(ValueError):
        m.average({})


def test_every_task_has_a_scorer_and_is_routed_from_decoding():
    from pipelines import superglue_text

    assert set(m.SCORERS) == set(superglue_text.TASK_CONFIGS)
    assert text_metrics.task_scorer("super_glue_rte") is m.SCORERS["super_glue_rte"]
    assert text_metrics.task_scorer("mt_en_fr") is None
    examples = [downstream.TextExample(inputs="rte ...", target="entailment", source="")] * 2
    got = downstream.score("super_glue_rte", examples, ["entailment", "not_entailment"])
    assert got == {"accuracy": 50.0, "score": 50.0}
