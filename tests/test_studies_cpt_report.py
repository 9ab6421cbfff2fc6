"""The CPT study's comparison with the paper on hand-made runs and fits (no training, no fits)."""

import re

from fitting.readers.run_data import RunData as RunRecord
from studies import cpt_report

PI = 3.141592653589793


def _run(strategy, lang, n, losses, **meta):
    """A run (`fitting.readers.run_data.RunData`): strategy, target language, metadata, eval records."""
    records = [
        {"step": s, "tokens": s * 1000, f"eval/lm_{k}/loss": v}
        for s, per_lang in losses.items()
        for k, v in per_lang.items()
    ]
    return RunRecord(
        run_id=f"{strategy}_{lang}_{n}",
        path=None,
        meta={"strategy": strategy, "target_lang": lang, "params_non_embedding": n, **meta},
        records=tuple(records),
    )


def _runs():
    n = 123456.789
    return [
        _run("source", "en", n, {10: {"en": 2.0 + PI / 10, "zh": 9.0}}),
        _run("scratch", "zh", n, {5: {"zh": 5.0}, 10: {"zh": 4.0 + PI / 100}}),
        _run("cpt", "zh", n, {5: {"zh": 4.5}, 10: {"zh": 3.0 + PI / 100}}),
        _run(
            "cpt_replay",
            "zh",
            n,
            {10: {"zh": 3.1 + PI / 1000, "en": 2.5 + PI / 1000}},
            source_lang="en",
            replay_ratio=0.3,
        ),
    ]


def test_cpt_beats_scratch_at_equal_steps():
    rows = cpt_report.cpt_vs_scratch(_runs(), "zh")
    assert [(r["evals_lower"], r["evals"]) for r in rows] == [(2, 2)]
    assert rows[0]["final_cpt"] < rows[0]["final_scratch"]


def test_comparison_tables_print_rounded_numbers():
    fits = {
        "chinchilla": {
            "zh": {
                "fit": {
                    "params": {"alpha": PI / 10, "beta": PI / 11, "E": PI / 2},
                    "ci": {"alpha": [PI / 12, PI / 9]},
                    "converged": True,
                }
            }
        },
        "cpt": {"zh": {"fit": {"params": {"beta": PI / 20, "gamma": PI / 50}, "converged": False}}},
    }
    text = cpt_report.comparison(fits, _runs(), "zh")
    assert "| 1.23e+05 | 3.031 | 4.031 | 2/2 |" in text  # N, CPT, scratch: 3-4 significant digits
    assert "| α (scratch) | 0.3142 [0.262, 0.349] | 0.4 |" in text
    assert "| CPT, replay 30% | 2.503 | 3.103 |" in text
    assert "Warning: the CPT fit did NOT converge" in text
    assert max_significant_digits(text) == 4


def max_significant_digits(text: str) -> int:
    """The most significant digits of any decimal number in `text` (reports round to 4)."""
    return max(len(m.replace(".", "").lstrip("0")) for m in re.findall(r"\d+\.\d+", text))


def test_table_2_comparison_says_which_n_basis_it_is_on():
    from fitting.readers import model_keys

    fits = {"chinchilla": {"zh": {"fit": {"params": {"alpha": 0.4, "beta": 0.3, "E": 1.5}}}}}
    exact = cpt_report.comparison(fits, _runs(), "zh")
    assert "Fitted on exact non-embedding N, not the paper's basis" in exact
    nominal = cpt_report.comparison({**fits, "n_basis": "nominal"}, _runs(), "zh")
    assert "Fitted on the paper's N basis as we read it (its Table 4 nominal sizes" in nominal
    # The demo fits on the paper's basis wherever every upstream run has a Table 4 size.
    assert model_keys.paper_basis(_runs()) == "exact"
    paper = [_run("scratch", "zh", 4.6e7, {}, family="llama2", model="llama2_49m")]
    assert model_keys.paper_basis(paper) == "nominal"


def test_step_zero_is_not_counted_as_cpt_being_lower():
    """At step 0 CPT is the source model and lower by construction: only trained evals count."""
    n = 1e6
    runs = [
        _run("scratch", "zh", n, {0: {"zh": 9.0}, 5: {"zh": 4.0}, 10: {"zh": 3.0}}),
        _run("cpt", "zh", n, {0: {"zh": 6.0}, 5: {"zh": 4.5}, 10: {"zh": 2.9}}),
    ]
    rows = cpt_report.cpt_vs_scratch(runs, "zh")
    assert [(r["evals_lower"], r["evals"]) for r in rows] == [(1, 2)]
    text = cpt_report.comparison({}, runs, "zh")
    assert "| 1e+06 | 2.9 | 3 | 1/2 |" in text and "(after step 0)" in text


def test_replay_wording_is_the_papers():
    """The paper's words on replay, quoted: 10–30% mitigates forgetting (§1), around 30% keeps
    the loss below its start (App. A), and §5.2's 1–5% already ends below the start beside it."""
    text = cpt_report.comparison({}, _runs(), "zh")
    assert "10–30%" in text and "around 30%" in text and "5–30%" not in text
    assert "even at 1–5% [q:cpt.s5_2_low_replay]" in text and "[q:cpt.appA_30pct]" in text


def test_appendix_b_is_compared_through_the_ratio_of_the_two_laws_errors():
    """The paper's Appendix B errors are not per-point means (δ = 1e-3 makes 0.009 impossible
    as one): only the ratio of the two laws' errors on the same points is set against it."""
    from fitting.reports import markdown as report

    b = {
        "chinchilla_fit": {"delta": 1e-3, "converged": True},
        "mean_huber_chinchilla": 2e-4,
        "mean_huber_cpt": 1.5e-4,
    }
    text = cpt_report.comparison({"cpt": {"zh": {"appendix_b": b}}}, _runs(), "zh")
    assert "ratio CPT law / Chinchilla 0.75." in text
    assert "0.0093 / 0.0108 = 0.8611" in text and "Only the ratios are comparable" in text
    section = "\n".join(
        report.cpt({"zh": {"fit": _fit(), "allocation": {"valid": False}, "appendix_b": b}})
    )
    assert "ratio CPT law / Chinchilla 0.75." in section
    assert "(mean Huber per point, CPT paper Appendix B)" not in section


def _fit():
    return {
        "params": {"beta": 0.2, "gamma": 0.08},
        "converged": True,
        "objective": 1e-3,
        "delta": 1e-3,
    }
