"""Task and mixture naming conventions, in one light module (no TensorFlow).

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


def lm_task_name(lang: str) -> str:
    """Returns `lm_<lang>`."""
    return f"lm_{lang}"


def span_task_name(lang: str) -> str:
    """Returns `span_<lang>`."""
    return f"span_{lang}"


def mt_task_name(src: str, tgt: str) -> str:
    """Returns `mt_<src>_<tgt>`."""
    return f"mt_{src}_{tgt}"


_MT_TASK = re.compile(r"^mt_([a-z]{2})_([a-z]{2})$")


def mt_pair(task: str) -> tuple[str, str] | None:
    """`(src, tgt)` of a translation task name `mt_<src>_<tgt>`, or None for any other name."""
    match = _MT_TASK.match(task)
    return (match.group(1), match.group(2)) if match else None


_MIX = re.compile(r"^mix_((?:[a-z]{2}_\d+_?)+)$")
_SINGLE = re.compile(r"^(?:lm|span)_([a-z]{2})$")


def mixture_shares(name: str) -> dict[str, int] | None:
    """`{lang: pct}` of an MT pretraining mixture `mix_<lang>_<pct>[_<lang>_<pct>...]`, or None
    for any other name."""
    match = _MIX.match(name)
    if not match:
        return None
    parts = match.group(1).strip("_").split("_")
    return {parts[i]: int(parts[i + 1]) for i in range(0, len(parts), 2)}


def task_languages(name: str) -> list[str]:
    """Languages of a task or mixture name, in the name's order: `span_<lang>` / `lm_<lang>` →
    `[lang]`, `mt_<src>_<tgt>` → `[src, tgt]`, `mix_<lang>_<pct>_...` → its languages; `[]`
    for a name that follows none of these conventions."""
    single = _SINGLE.match(name)
    if single:
        return [single.group(1)]
    pair = mt_pair(name)
    if pair:
        return list(pair)
    return list(mixture_shares(name) or {})
