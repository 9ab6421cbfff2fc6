"""SuperGLUE in T5's text-to-text form (the MT paper's Appendix B finetunes, its Fig. 6).

Each SuperGLUE record (TFDS `super_glue/<config>` and Hugging Face `super_glue` share one schema:
text fields, `label` as a class index with -1 for unlabelled test rows, `idx`) becomes one or more
`{"inputs", "targets"}` text pairs, as T5 defines them (Raffel et al. 2020, Appendix D;
`t5.data.preprocessors.glue`, `.wsc`, `.record`, and `t5.data.glue_utils`):

- BoolQ, CB, COPA, RTE: `"<task> key: value ..."` over the task's text fields sorted by name
  (`"cb hypothesis: ... premise: ..."`), the target the label's name (`"entailment"`, `"True"`,
  `"choice2"`); `"<unk>"` where the label is -1.
- MultiRC: `"multirc question: ... answer: ... paragraph: ..."` (that order, as T5 fixes it),
  `<br>` turned into a space and `<b>`/`</b>` removed; target `"True"`/`"False"`.
- WiC: `"wic sentence1: ... sentence2: ... word: ..."` (T5 leaves the character offsets out).
- WSC (`wsc.fixed`): T5's classification form, `"wsc text: ..."` with the candidate noun wrapped in
  `*` and the pronoun in `#` (`preprocessors.wsc`, which `glue_utils` assigns to `wsc.fixed`),
  target `"True"`/`"False"`. T5's released models instead generate the referent
  (`wsc_simple`), whose scoring needs the record's label beside the text; the classification form
  scores from the text alone, so it is the one here.
- ReCoRD: `"record query: ... entities: e1, e2 passage: ..."` with `@highlight` lines joined into
  sentences; one pair per answer (every answer is a correct target; `"<unk>"` when a record has
  none), so scoring groups pairs by their identical inputs and takes the best over the answers.
  Entities and answers are the sorted distinct texts, as TFDS stores them (the HF builder writes
  its entity set in no fixed order), so both sources give the same pairs.

Pure Python on dicts: `pipelines.superglue_sources` reads the records and feeds these functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

UNKNOWN = "<unk>"

# TFDS/HF config -> label names by class index (tensorflow_datasets `super_glue.py`, the same as
# the HF `super_glue` ClassLabel names).
LABELS: dict[str, tuple[str, ...]] = {
    "boolq": ("False", "True"),
    "cb": ("entailment", "contradiction", "neutral"),
    "copa": ("choice1", "choice2"),
    "multirc": ("False", "True"),
    "rte": ("entailment", "not_entailment"),
    "wic": ("False", "True"),
    "wsc.fixed": ("False", "True"),
}

# Text fields in the order T5 joins them: sorted names, or T5's fixed order (MultiRC, WiC).
_FIELDS: dict[str, tuple[str, ...]] = {
    "boolq": ("passage", "question"),
    "cb": ("hypothesis", "premise"),
    "copa": ("choice1", "choice2", "premise", "question"),
    "multirc": ("question", "answer", "paragraph"),
    "rte": ("hypothesis", "premise"),
    "wic": ("sentence1", "sentence2", "word"),
}

Pair = tuple[str, str]  # (inputs, targets)


def _label_name(config: str, label: int) -> str:
    return UNKNOWN if int(label) < 0 else LABELS[config][int(label)]


def _keyed(config: str, record: Mapping[str, Any]) -> list[Pair]:
    """T5's `glue` preprocessor: the benchmark name, then `key: value` per text field."""
    parts = [config]
    for key in _FIELDS[config]:
        parts += [f"{key}:", record[key]]
    inputs = " ".join(parts)
    if config == "multirc":
        inputs = re.sub(r"<(/)?b>", "", inputs.replace("<br>", " "))
    return [(inputs, _label_name(config, record["label"]))]


def _mark_span(text: str, span: str, index: int, mark: str) -> str:
    """Wraps `span`, which starts at whitespace-token `index` of `text`, in `mark`s (T5's
    `_mark_span`; the span is matched literally, where T5's pattern reads it as a regex)."""
    pattern = rf"^((?:\S+\s){{{int(index)}}})({re.escape(span)})"
    return re.sub(pattern, lambda m: f"{m.group(1)}{mark} {m.group(2)} {mark}", text, count=1)


def _wsc(record: Mapping[str, Any]) -> list[Pair]:
    """T5's `wsc`: `*` around the candidate (span 1), `#` around the pronoun (span 2)."""
    text = _mark_span(record["text"], record["span1_text"], record["span1_index"], "*")
    # Marking span 1 added two tokens before span 2 when span 1 comes first.
    span2_index = int(record["span2_index"]) + 2 * (
        int(record["span1_index"]) < int(record["span2_index"])
    )
    text = _mark_span(text, record["span2_text"], span2_index, "#")
    return [(f"wsc text: {text}", _label_name("wsc.fixed", record["label"]))]


def record_passage(passage: str) -> str:
    """ReCoRD's passage as one text: each `@highlight` line becomes a sentence (T5's `record`)."""
    passage = re.sub(r"([.?!\"'])\n@highlight\n", r"\1 ", passage)
    return passage.replace("\n@highlight\n", ". ")


def _record(record: Mapping[str, Any]) -> list[Pair]:
    """T5's `record`: one pair per answer, all with the same inputs."""
    inputs = " ".join(
        [
            "record query:",
            record["query"],
            "entities:",
            ", ".join(sorted(set(record["entities"]))),
            "passage:",
            record_passage(record["passage"]),
        ]
    )
    answers = sorted(set(record.get("answers") or ())) or [UNKNOWN]
    return [(inputs, answer) for answer in answers]


# TFDS/HF config -> record -> text pairs.
CONVERTERS: dict[str, Callable[[Mapping[str, Any]], list[Pair]]] = {
    **{config: (lambda r, c=config: _keyed(c, r)) for config in _FIELDS},
    "wsc.fixed": _wsc,
    "record": _record,
}
CONFIGS: tuple[str, ...] = tuple(CONVERTERS)

# seqio task name -> TFDS/HF config; WSC is read from `wsc.fixed` (spans that are substrings).
TASK_CONFIGS: dict[str, str] = {f"super_glue_{config.split('.')[0]}": config for config in CONFIGS}


def to_text(config: str, record: Mapping[str, Any]) -> list[Pair]:
    """The text-to-text pairs of one SuperGLUE record of `config` (a key of `CONVERTERS`)."""
    return CONVERTERS[config](record)


MIXTURE = "super_glue"  # every task, in proportion to its training examples


def eval_tasks(*, task: str) -> list[str]:
    """The tasks a SuperGLUE finetune evaluates and decodes: every task for the mixture
    `super_glue`, else the task itself (`experiments/superglue.gin` binds EVAL_TASKS to this; this
    module imports no TensorFlow, so parsing the gin file stays light)."""
    return sorted(TASK_CONFIGS) if task == MIXTURE else [task]
