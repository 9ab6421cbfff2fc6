"""Text metrics: equal to sacreBLEU where sacreBLEU defines them; ROUGE-L sees every script."""

import random

import pytest
import sacrebleu

from pipelines import text_metrics

REFS = [
    "The quick brown fox jumps over the lazy dog.",
    "Everyone has the right to life, liberty and security of person.",
    "No one shall be held in slavery or servitude.",
]
HYPS = [
    "The fast brown fox jumped over the lazy dog.",
    "Everyone has a right to life, freedom and security of the person.",
    "Nobody shall be held in slavery.",
]
ZH_REFS = ["人人有权享有生命、自由和人身安全。", "任何人不得使为奴隶或奴役。"]
ZH_HYPS = ["人人享有生命、自由和人身安全的权利。", "任何人不得被奴役。"]


def _lcs_dp(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = (
                table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
            )
    return table[-1][-1]


def test_bleu_equals_sacrebleu_13a():
    expected = sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="13a").score
    assert text_metrics.bleu(REFS, HYPS, target_lang="de") == pytest.approx(expected, abs=1e-12)
    assert 0 < expected < 100


def test_bleu_uses_zh_tokenizer_for_chinese():
    expected = sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="zh").score
    got = text_metrics.bleu(ZH_REFS, ZH_HYPS, target_lang="zh")
    assert got == pytest.approx(expected, abs=1e-12)
    # With 13a, whole Chinese sentences are single tokens and BLEU collapses.
    assert got > sacrebleu.corpus_bleu(ZH_HYPS, [ZH_REFS], tokenize="13a").score


def test_chrf_pp_equals_sacrebleu():
    expected = sacrebleu.corpus_chrf(HYPS, [REFS], word_order=2).score
    assert text_metrics.chrf_pp(REFS, HYPS) == pytest.approx(expected, abs=1e-12)
    assert expected != sacrebleu.corpus_chrf(HYPS, [REFS]).score  # the ++ matters


def test_rouge_tokenizer_is_unicode_aware():
    assert text_metrics.rouge_tokenize("Științele și artele, Ελλάδα!") == [
        "științele",
        "și",
        "artele",
        "ελλάδα",
    ]
    assert text_metrics.rouge_tokenize("人人有权 Freedom 2024") == [
        "人",
        "人",
        "有",
        "权",
        "freedom",
        "2024",
    ]
    assert text_metrics.rouge_tokenize("Права человека") == ["права", "человека"]


def test_rouge_l_chinese_is_nonzero_and_exact_on_known_case():
    score = text_metrics.rouge_l(ZH_REFS, ZH_HYPS)
    assert 0 < score < 100
    # By hand: ref 4 chars, hyp 3, LCS "人权" = 2, so P = 2/3, R = 2/4, F = 2PR/(P+R).
    assert text_metrics.rouge_l_f("人人有权", "人的权") == pytest.approx(
        2 * (2 / 3) * 0.5 / (2 / 3 + 0.5)
    )
    assert text_metrics.rouge_l(["identical text"], ["identical text"]) == pytest.approx(100.0)
    assert text_metrics.rouge_l(["abc"], ["xyz"]) == 0.0


def test_lcs_matches_dynamic_programming():
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 40))]
        b = [rng.choice("abcde") for _ in range(rng.randint(0, 70))]
        assert text_metrics.lcs_length(a, b) == _lcs_dp(a, b)


def test_bleu_parts_are_sacrebleus_brevity_penalty_and_precisions():
    # Remark 2 of the MT paper needs BLEU's parts: a short hypothesis set has bp < 1.
    short = [h.split(".")[0].rsplit(" ", 2)[0] for h in HYPS]
    expected = sacrebleu.corpus_bleu(short, [REFS], tokenize="13a")
    out = text_metrics.bleu_parts(REFS, short, target_lang="de")
    assert set(out) == {"bleu", *text_metrics.BLEU_PARTS}
    assert out["bleu"] == pytest.approx(expected.score, abs=1e-12)
    assert out["bleu_bp"] == pytest.approx(expected.bp) and 0 < out["bleu_bp"] < 1
    assert [out[f"bleu_p{n}"] for n in range(1, 5)] == pytest.approx(expected.precisions)
    assert (out["bleu_sys_len"], out["bleu_ref_len"]) == (expected.sys_len, expected.ref_len)


def test_translation_metrics_bundle():
    out = text_metrics.translation_metrics(REFS, HYPS, target_lang="en")
    assert set(out) == {"bleu", "chrf", "rougeL", *text_metrics.BLEU_PARTS}
    assert all(0 < out[k] < 100 for k in ("bleu", "chrf", "rougeL", "bleu_p1"))
    with pytest.raises(ValueError):
        text_metrics.rouge_l(REFS, HYPS[:1])


def test_durations_print_one_way_in_every_progress_line():
    from rundir.durations import format_duration

    assert [format_duration(s) for s in (12.4, 185, 3725, 90061)] == [
        "12s",
        "3m05s",
        "1h02m",
        "25h01m",
    ]
    assert {format_duration(v) for v in (None, float("nan"), float("inf"))} == {"?"}
