"""The CPT paper's zero-shot benchmarks per language, as lm-evaluation-harness 0.4.13 task names.

The paper (Zheng et al. 2024, §2.3, §4.4 and Fig. 3; Appendix A and Fig. 6) evaluates zh, fr, ru
and en zero-shot on XNLI, multilingual Winogrande (XWinograd), multilingual HellaSwag (the
Okapi translations, Dac Lai et al. 2023), XStoryCloze, XCOPA and PIQA, reporting normalised
accuracy, with XCOPA and PIQA left out for fr and ru. Here each language maps to the tasks that
lm-eval 0.4.13 ships for it, the multilingual sets where they exist (Okapi's `hellaswag_fr` and
`hellaswag_ru`; Global PIQA's Simplified-Chinese cloze split for zh PIQA); what a language lacks
is said in `OMITTED`, and a test checks every name against lm-eval's own task index. `xlscale zeroshot --paper` picks these (the datasets come
from the Hugging Face hub, so they need a machine that reaches it or a warm HF cache).

Note: in lm-eval 0.4.13, the YAMLs of xnli, xwinograd, xstorycloze and xcopa list only `acc`
in their `metric_list`, so only `acc` is reported for them; hellaswag(_xx) and piqa report
`acc_norm` too.
"""

from __future__ import annotations

# Language -> lm-eval task names, in the paper's order of benchmarks.
PAPER_TASKS: dict[str, tuple[str, ...]] = {
    "en": ("xnli_en", "xwinograd_en", "hellaswag", "xstorycloze_en", "piqa"),
    "zh": (
        "xnli_zh",
        "xwinograd_zh",
        "xstorycloze_zh",
        "xcopa_zh",
        # PIQA in Chinese: Global PIQA (Chang et al. 2025), the parallel split's Simplified
        # Chinese set in cloze form (log-likelihood of each solution, as PIQA is scored); a
        # hand-built PIQA-format set, not a translation of PIQA's items.
        "global_piqa_parallel_cloze_cmn_hans",
    ),
    "fr": ("xnli_fr", "xwinograd_fr", "hellaswag_fr"),
    "ru": ("xnli_ru", "xwinograd_ru", "hellaswag_ru", "xstorycloze_ru"),
}

# Language -> what its task list leaves out of the paper's six benchmarks, and why.
OMITTED: dict[str, str] = {
    "en": (
        "XCOPA: lm-eval's xcopa has no English split (XCOPA translates COPA; the English "
        "original is super_glue's `copa`, a different task, so it is not substituted)."
    ),
    "zh": (
        "Multilingual HellaSwag: lm-eval 0.4.13's Okapi hellaswag_<lang> set has no Chinese, "
        "and no other Chinese HellaSwag ships with it (Okapi's arc_zh is ARC, not a paper "
        "benchmark). PIQA is matched by Global PIQA's cmn_hans set, not by PIQA's own items."
    ),
    "fr": (
        "XStoryCloze: no French split in lm-eval (xstorycloze covers en, ru, zh, es, ar, hi, id, "
        "te, sw, eu, my); XCOPA and PIQA: left out by the paper (no French split)."
    ),
    "ru": "XCOPA and PIQA: left out by the paper (no Russian split).",
}

# Task -> chance accuracy: the reciprocal of its number of choices.
_FAMILY_CHANCE: dict[str, float] = {
    "global_piqa": 1 / 2,
    "xnli": 1 / 3,
    "xwinograd": 1 / 2,
    "hellaswag": 1 / 4,
    "xstorycloze": 1 / 2,
    "xcopa": 1 / 2,
    "piqa": 1 / 2,
}


def benchmark_family(task: str) -> str:
    """The benchmark a task name belongs to (`xnli_zh` -> `xnli`,
    `global_piqa_parallel_cloze_cmn_hans` -> `global_piqa`): the longest known family prefix, else
    the name's first part."""
    known = [f for f in _FAMILY_CHANCE if task == f or task.startswith(f + "_")]
    return max(known, key=len) if known else task.split("_")[0]


CHANCE: dict[str, float] = {
    task: _FAMILY_CHANCE[benchmark_family(task)] for tasks in PAPER_TASKS.values() for task in tasks
}

# Benchmark family -> the paper's name for it, for tables.
BENCHMARK_NAMES: dict[str, str] = {
    "xnli": "XNLI",
    "xwinograd": "XWinograd",
    "hellaswag": "HellaSwag",
    "xstorycloze": "XStoryCloze",
    "xcopa": "XCOPA",
    "piqa": "PIQA",
    "global_piqa": "PIQA (Global PIQA)",
}

_TASK_LANGUAGE: dict[str, str] = {
    task: lang for lang, tasks in PAPER_TASKS.items() for task in tasks
}


def paper_tasks(lang: str) -> list[str]:
    """The lm-eval task names of the paper's benchmarks in `lang`.

    Raises:
      ValueError: `lang` is not one the paper evaluates (naming the supported ones).
    """
    if lang not in PAPER_TASKS:
        raise ValueError(
            f"language {lang!r}: the CPT paper's zero-shot benchmarks are mapped for "
            f"{', '.join(sorted(PAPER_TASKS))} only"
        )
    return list(PAPER_TASKS[lang])


def task_language(task: str) -> str | None:
    """The language of a paper task (`hellaswag` and `piqa` are English), or None for a name
    that is not one of `PAPER_TASKS`."""
    return _TASK_LANGUAGE.get(task)


def markdown_table() -> str:
    """The mapping as a Markdown table for the README: language | lm-eval tasks | left out."""
    rows = ["| language | lm-eval tasks | left out |", "|---|---|---|"]
    for lang, tasks in PAPER_TASKS.items():
        names = ", ".join(f"{BENCHMARK_NAMES[benchmark_family(t)]} `{t}`" for t in tasks)
        rows.append(f"| {lang} | {names} | {OMITTED.get(lang, '-')} |")
    return "\n".join(rows) + "\n"
