"""Task and mixture naming conventions (DESIGN.md), in one light module (no TensorFlow).

`lm_<lang>` (language modelling), `span_<lang>` (span corruption), `mt_<src>_<tgt>`
(translation). Readers of run directories (`fitting`, `trainer.downstream`, `studies`) parse
names here instead of repeating the patterns.
"""

from __future__ import annotations

import re

# ISO 639-1 code -> the language's English name (translation prompts, local zero-shot tasks).
LANG_NAMES: dict[str, str] = {
    "en": "English",
    "zh": "Chinese",
    "fr": "French",
    "ru": "Russian",
    "de": "German",
    "ro": "Romanian",
}

_MT_TASK = re.compile(r"^mt_([a-z]{2})_([a-z]{2})$")


def mt_pair(task: str) -> tuple[str, str] | None:
    """`(src, tgt)` of a translation task name `mt_<src>_<tgt>`, or None for any other name."""
    match = _MT_TASK.match(task)
    return (match.group(1), match.group(2)) if match else None
