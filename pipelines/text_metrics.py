"""Text metrics for the translation tasks: sacreBLEU BLEU, chrF++, and a Unicode-aware ROUGE-L.

- BLEU is sacreBLEU's corpus BLEU with the `13a` tokenizer, or `zh` for Chinese targets.
- chrF++ is sacreBLEU's chrF with word n-grams up to 2 (`word_order=2`).
- ROUGE-L: rouge-score's default tokenizer keeps only `[a-z0-9]`, which zeroes Chinese and breaks
  Romanian/Russian words apart, so we implement ROUGE-L ourselves: text is lower-cased; Han,
  kana and other CJK ideographs become one token per character; every other script is split into
  runs of Unicode word characters. The score is the mean over segments of the LCS-based
  F-measure (beta = 1, as rouge-score), times 100. The LCS uses a bit-parallel algorithm
  (Allison–Dix / Hyyrö), linear in the length of one side per token of the other.

All scores are on the 0–100 scale, as sacreBLEU reports them.

Tasks that are not translations score decoded text with their own metrics: `TASK_SCORERS`
(SuperGLUE: `pipelines.superglue_metrics`), which `trainer.downstream` asks by task name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import sacrebleu

from pipelines import superglue_metrics

# Scripts written without spaces between words, scored per character.
_CJK = (
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3100-\u312f"  # Bopomofo
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-G
)
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")


def bleu_tokenizer(target_lang: str) -> str:
    """Returns sacreBLEU's tokenizer for a target language: `zh` for Chinese, else `13a`."""
    return "zh" if target_lang == "zh" else "13a"


def bleu(targets: Sequence[str], predictions: Sequence[str], *, target_lang: str = "en") -> float:
    """Corpus BLEU (sacreBLEU, one reference per segment)."""
    return sacrebleu.corpus_bleu(
        list(predictions), [list(targets)], tokenize=bleu_tokenizer(target_lang)
    ).score


# The parts of corpus BLEU logged beside it (`eval/<task>/<part>`): the brevity penalty (0-1), the
# 1- to 4-gram precisions (0-100) and the hypothesis and reference lengths (tokens).
BLEU_PARTS = ("bleu_bp", "bleu_p1", "bleu_p2", "bleu_p3", "bleu_p4", "bleu_sys_len", "bleu_ref_len")


def bleu_parts(
    targets: Sequence[str], predictions: Sequence[str], *, target_lang: str = "en"
) -> dict[str, float]:
    """Corpus BLEU (`"bleu"`) and what it is made of (`BLEU_PARTS`), from one sacreBLEU call.

    The MT paper's Remark 2 reads BLEU moving against cross-entropy partly as a length effect: a
    BLEU change can come from the brevity penalty while the n-gram precisions hold still, which
    only the parts tell apart.
    """
    b = sacrebleu.corpus_bleu(
        list(predictions), [list(targets)], tokenize=bleu_tokenizer(target_lang)
    )
    out = {"bleu": b.score, "bleu_bp": b.bp}
    out.update({f"bleu_p{n}": p for n, p in enumerate(b.precisions, start=1)})
    out.update({"bleu_sys_len": float(b.sys_len), "bleu_ref_len": float(b.ref_len)})
    return out


def chrf_pp(targets: Sequence[str], predictions: Sequence[str]) -> float:
    """Corpus chrF++ (sacreBLEU chrF with `word_order=2`)."""
    return sacrebleu.corpus_chrf(list(predictions), [list(targets)], word_order=2).score


def rouge_tokenize(text: str) -> list[str]:
    """Lower-cases and splits `text`: one token per CJK character, else Unicode word runs."""
    return _TOKEN.findall(text.lower())


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists (bit-parallel)."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, tok in enumerate(b):
        masks[tok] = masks.get(tok, 0) | (1 << i)
    full = (1 << len(b)) - 1
    v = full
    for tok in a:
        u = v & masks.get(tok, 0)
        v = ((v + u) | (v - u)) & full
    return len(b) - v.bit_count()


def rouge_l_f(target: str, prediction: str) -> float:
    """ROUGE-L F-measure (0–1) of one prediction against one reference."""
    ref, hyp = rouge_tokenize(target), rouge_tokenize(prediction)
    lcs = lcs_length(ref, hyp)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(hyp), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def rouge_l(targets: Sequence[str], predictions: Sequence[str]) -> float:
    """Mean segment ROUGE-L F-measure, times 100."""
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    if not targets:
        return 0.0
    return 100.0 * sum(map(rouge_l_f, targets, predictions)) / len(targets)


def translation_metrics(
    targets: Sequence[str], predictions: Sequence[str], *, target_lang: str = "en"
) -> dict[str, float]:
    """The seqio metric function of the `mt_*` tasks: `{"bleu", "chrf", "rougeL"}` and BLEU's
    parts (`BLEU_PARTS`), so that T5X's summaries carry them too."""
    return {
        **bleu_parts(targets, predictions, target_lang=target_lang),
        "chrf": chrf_pp(targets, predictions),
        "rougeL": rouge_l(targets, predictions),
    }


# task name -> scorer(inputs, targets, predictions) -> {metric: value} for decoded tasks that are
# not translations (their metrics are not BLEU's): SuperGLUE's official metrics.
TASK_SCORERS: dict[str, Callable[..., dict[str, float]]] = dict(superglue_metrics.SCORERS)


def task_scorer(task: str) -> Callable[..., dict[str, float]] | None:
    """The task's own scorer of decoded text, or None for the translation metrics."""
    return TASK_SCORERS.get(task)
