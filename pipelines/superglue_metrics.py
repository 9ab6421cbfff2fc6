"""SuperGLUE's official metrics on decoded text, per task and averaged (Wang et al. 2019, Table 1).

Predictions are the model's decoded strings; references the text-to-text targets of
`pipelines.superglue_text`. A prediction that is no label name counts as wrong (T5's
`string_label_to_class_id` maps it to class -1). All scores are on the 0-100 scale.

| task | metrics | the task's score |
|---|---|---|
| BoolQ, COPA, RTE, WiC, WSC | accuracy | accuracy |
| CB | accuracy, macro-F1 over its three classes | their mean |
| MultiRC | F1a (binary F1 over every answer option), EM (questions with every option right) | mean |
| ReCoRD | token F1 and exact match, each the best over the record's answers | mean |

MultiRC and ReCoRD score groups of pairs: the options of one question share its question and
paragraph text, and the pairs of one ReCoRD record (one per answer) share identical inputs, so
both group by what the inputs say (T5 groups by the records' `idx`, which decoding does not
carry). ReCoRD answers are normalised as SQuAD's and ReCoRD's official scripts do (lower case, no
punctuation, no articles, single spaces). The SuperGLUE average is the mean of the tasks' scores.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Mapping, Sequence

from pipelines import superglue_text

SCORE = "score"  # the task's SuperGLUE score: the mean of its metrics


def _check(targets: Sequence[str], predictions: Sequence[str]) -> None:
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")


def accuracy(targets: Sequence[str], predictions: Sequence[str]) -> float:
    """Percentage of predictions equal to their target (after stripping whitespace)."""
    _check(targets, predictions)
    if not targets:
        return 0.0
    right = sum(t.strip() == p.strip() for t, p in zip(targets, predictions, strict=True))
    return 100.0 * right / len(targets)


def _f1(tp: int, fp: int, fn: int) -> float:
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def macro_f1(targets: Sequence[str], predictions: Sequence[str], labels: Sequence[str]) -> float:
    """Mean over `labels` of each label's F1 (one-vs-rest); an unknown prediction is a false
    negative for its target's label and a false positive for none."""
    _check(targets, predictions)
    scores = []
    for label in labels:
        tp = sum(
            t == label and p.strip() == label for t, p in zip(targets, predictions, strict=True)
        )
        fp = sum(
            t != label and p.strip() == label for t, p in zip(targets, predictions, strict=True)
        )
        fn = sum(
            t == label and p.strip() != label for t, p in zip(targets, predictions, strict=True)
        )
        scores.append(_f1(tp, fp, fn))
    return 100.0 * sum(scores) / len(scores)


def _cb(inputs, targets, predictions) -> dict[str, float]:
    del inputs
    acc = accuracy(targets, predictions)
    f1 = macro_f1(targets, predictions, superglue_text.LABELS["cb"])
    return {"accuracy": acc, "f1": f1, SCORE: (acc + f1) / 2}


def _accuracy_only(inputs, targets, predictions) -> dict[str, float]:
    del inputs
    acc = accuracy(targets, predictions)
    return {"accuracy": acc, SCORE: acc}


_MULTIRC = re.compile(r"^(multirc question: .*?) answer: .*? (paragraph: .*)$", re.S)


def multirc_question(inputs: str) -> str:
    """The question an option belongs to: its inputs without the answer."""
    m = _MULTIRC.match(inputs)
    return f"{m.group(1)} {m.group(2)}" if m else inputs


def _multirc(inputs, targets, predictions) -> dict[str, float]:
    _check(targets, predictions)
    truth = [t.strip() == "True" for t in targets]
    said = [p.strip() == "True" for p in predictions]
    tp = sum(t and s for t, s in zip(truth, said, strict=True))
    fp = sum(s and not t for t, s in zip(truth, said, strict=True))
    fn = sum(t and not s for t, s in zip(truth, said, strict=True))
    f1a = 100.0 * _f1(tp, fp, fn)
    right: dict[str, bool] = {}
    for x, t, p in zip(inputs, targets, predictions, strict=True):
        q = multirc_question(x)
        right[q] = right.get(q, True) and t.strip() == p.strip()
    em = 100.0 * sum(right.values()) / len(right) if right else 0.0
    return {"f1a": f1a, "em": em, SCORE: (f1a + em) / 2}


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD/ReCoRD answer normalisation: lower case, punctuation and articles removed, single
    spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, answer: str) -> float:
    """Bag-of-tokens F1 (0-1) of normalised prediction and answer."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(answer).split()
    common = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def _record(inputs, targets, predictions) -> dict[str, float]:
    _check(targets, predictions)
    groups: dict[str, tuple[str, list[str]]] = {}
    for x, t, p in zip(inputs, targets, predictions, strict=True):
        groups.setdefault(x, (p, []))[1].append(t)
    f1 = em = 0.0
    for prediction, answers in groups.values():
        f1 += max(token_f1(prediction, a) for a in answers)
        em += max(float(normalize_answer(prediction) == normalize_answer(a)) for a in answers)
    n = max(len(groups), 1)
    f1, em = 100.0 * f1 / n, 100.0 * em / n
    return {"f1": f1, "em": em, SCORE: (f1 + em) / 2}


Scorer = Callable[[Sequence[str], Sequence[str], Sequence[str]], dict[str, float]]

# seqio task name -> scorer(inputs, targets, predictions) -> {metric: value, "score": ...}.
SCORERS: dict[str, Scorer] = {
    "super_glue_boolq": _accuracy_only,
    "super_glue_cb": _cb,
    "super_glue_copa": _accuracy_only,
    "super_glue_multirc": _multirc,
    "super_glue_record": _record,
    "super_glue_rte": _accuracy_only,
    "super_glue_wic": _accuracy_only,
    "super_glue_wsc": _accuracy_only,
}


def score(
    task: str, inputs: Sequence[str], targets: Sequence[str], predictions: Sequence[str]
) -> dict[str, float]:
    """The official metrics of a SuperGLUE task and its score (`"score"`), all 0-100."""
    return SCORERS[task](list(inputs), list(targets), list(predictions))


def average(task_scores: Mapping[str, float]) -> float:
    """The SuperGLUE average: the mean of the tasks' scores (`score`'s `"score"`)."""
    if not task_scores:
        raise ValueError("no SuperGLUE task scores to average")
    return sum(task_scores.values()) / len(task_scores)
