"""The CPT paper (Zheng et al. 2024) beside a fit of real runs.

`rows(result)` sets every number of the paper a `fitting.reports.fit_all.fit_runs` result can be
compared with beside ours: Table 2 with all its parameters (the from-scratch Chinchilla law's E,
A, B, α, β; the CPT law's B', β', γ, with E, A, α fixed from the first stage as the paper fixes
them [q:cpt.table2_fixed] [q:cpt.s3_2_fixed]), Table 2(b)'s allocation exponents and eqs. 8-9's
prefactors, eq. 3's frontier, Fig. 2's FLOPs saved and the headline rows of `fitting.reports.paper_headlines`, and
§5.2's forgetting (1.4B: English loss 2.40 → 3.68 [q:cpt.s5_2_forgetting]). Each row says whether
the two are comparable — the same target language, N basis, sizes, tokens and compute range as
the paper's — and if not, why, naming the fit's span against the paper's
(`fitting.reports.paper_values.CPT_SETUP`, the paper's runs as `fitting.reports.cpt_paper_runs`
reads them). `comparison_lines` renders the rows as report.md tables.

The paper against itself (its claims against its own Table 2, `consistency()`) is
`fitting.reports.cpt_self_consistency`; its names are re-exported here, and `section` prints
both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fitting.formats import fmt, markdown_table
from fitting.reports import paper_headlines
from fitting.reports.cpt_paper_runs import (
    CHECK_SIZES,
    PAPER_N,
    PAPER_RUN_END_COMPUTE,
    PAPER_RUN_END_TOKENS,
    PAPER_SIZES,
    TOKENS_PER_PARAM,
)
from fitting.reports.cpt_self_consistency import (  # re-exported: the paper against itself
    FRONTIER_STARTS,
    NEARLY_UNCHANGED,
    WHAT_DECIDES,
    _laws,  # noqa: F401  (tests/test_cpt_paper_comparison.py evaluates the box through it)
    consistency,
    consistency_numbers,
    consistency_section,
    gamma_sensitivity,
    table2_box,
)
from fitting.reports.paper_values import (
    CPT_HEADLINES,
    CPT_SETUP,
    CPT_TABLE2,
    CPT_TABLE2_PRINTED,
)

__all__ = [
    "CHECK_SIZES",
    "CPT_TABLE2_PRINTED",
    "FRONTIER_STARTS",
    "MIN_SIZES",
    "NEARLY_UNCHANGED",
    "PAPER_N",
    "PAPER_RUN_END_COMPUTE",
    "PAPER_RUN_END_TOKENS",
    "PAPER_SIZES",
    "TABLE2_NOTES",
    "TOKENS_PER_PARAM",
    "WHAT_DECIDES",
    "comparison_lines",
    "consistency",
    "consistency_numbers",
    "consistency_section",
    "fit_reasons",
    "forgetting_rows",
    "gamma_sensitivity",
    "headline_rows",
    "languages",
    "rows",
    "section",
    "table2_box",
    "table2_rows",
]

# A fit on fewer sizes than this cannot pin the N term (A, α) nor γ; the paper used 42.
MIN_SIZES = 5


def _range(lo: float, hi: float) -> str:
    return f"{fmt(float(lo), 2)}–{fmt(float(hi), 2)}"


# --- comparability --------------------------------------------------------------------------------


def _lang_basis(result: Mapping[str, Any], lang: str, *, basis: bool) -> list[str]:
    why = []
    if lang != CPT_SETUP["target_lang"]:
        why.append(f"target {lang} vs the paper's {CPT_SETUP['target_lang']}")
    n_basis = result.get("n_basis", "exact")
    if basis and n_basis != CPT_TABLE2["n_basis"]:
        why.append(f"N basis {n_basis} (non-embedding counts) vs the paper's nominal Table 4 sizes")
    return why


def _sizes(n_sizes: int, lo: float, hi: float) -> list[str]:
    inside = 0.9 * PAPER_N[0] <= lo and hi <= 1.1 * PAPER_N[1]
    if n_sizes >= MIN_SIZES and inside:
        return []
    return [
        f"fitted on {n_sizes} size{'s' if n_sizes != 1 else ''} {_range(lo, hi)} vs the paper's "
        f"{len(PAPER_SIZES)} sizes {_range(*PAPER_N)}"
    ]


def _tokens(lo: float, hi: float) -> list[str]:
    if hi >= PAPER_RUN_END_TOKENS[0]:
        return []
    return [
        f"tokens {_range(lo, hi)} vs the paper's runs to 20×N, ending at "
        f"{_range(*PAPER_RUN_END_TOKENS)}"
    ]


def fit_reasons(result: Mapping[str, Any], lang: str, entry: Mapping[str, Any] | None) -> list[str]:
    """Why a language's L(N, D) fit (a `chinchilla` or `cpt` entry of `result`) is not on the
    footing of the paper's Table 2 (empty: comparable)."""
    why = _lang_basis(result, lang, basis=True)
    span = (entry or {}).get("span")
    if span:
        why += _sizes(span["n_sizes"], *span["N"]) + _tokens(*span["D"])
    return why


def _compute_reasons(result: Mapping[str, Any], lang: str) -> list[str]:
    why = _lang_basis(result, lang, basis=True)
    groups = (result.get("compute") or {}).get(lang) or {}
    cs = [c for g in groups.values() for c in (g.get("C") or ())]
    if cs and max(cs) < PAPER_RUN_END_COMPUTE[0]:
        why.append(
            f"compute {_range(min(cs), max(cs))} FLOPs vs the paper's runs ending at "
            f"{_range(*PAPER_RUN_END_COMPUTE)}"
        )
    return why


def _transfer_reasons(result: Mapping[str, Any], lang: str) -> list[str]:
    why = _lang_basis(result, lang, basis=False)
    curves = ((result.get("transfer") or {}).get(lang) or {}).get("curves") or []
    if curves:
        sizes = [c["n_params"] for c in curves]
        tokens = [t for c in curves for t in c.get("tokens", ()) if t]
        why += _sizes(len(set(sizes)), min(sizes), max(sizes))
        if tokens:
            why += _tokens(min(tokens), max(tokens))
    return why


def _example_reasons(result: Mapping[str, Any], lang: str) -> list[str]:
    example = CPT_HEADLINES["example_5p5b"]
    why = _lang_basis(result, lang, basis=True)
    for law in ("chinchilla", "cpt"):
        span = ((result.get(law) or {}).get(lang) or {}).get("span")
        if span and (
            span["N"][1] < 0.9 * example["n_params"] or span["D"][1] < example["cpt_tokens"]
        ):
            why.append(
                f"{law} fitted on N {_range(*span['N'])}, D {_range(*span['D'])}: 5.5B and "
                "70B tokens are an extrapolation"
            )
            break
    return why


# --- rows -----------------------------------------------------------------------------------------


def _row(
    lang: str, quantity: str, paper: Any, ours: Any, why: Sequence[str], note: str = ""
) -> dict[str, Any]:
    return {
        "lang": lang,
        "quantity": quantity,
        "paper": paper,
        "ours": ours,
        "comparable": ours is not None and not why,
        "why": list(why) if ours is not None else ["no value from these runs", *why],
        "note": note,
    }


def _get(entry: Any, *keys: str) -> Any:
    for key in keys:
        entry = (entry or {}).get(key)
    return entry


TABLE2_NOTES = {
    "E": "in the loss's units: the corpus and the tokenizer (the paper's 36,152-piece en+zh)",
    "A": "fixed for CPT from the scratch fit (eqs. 6-7)",
    "alpha": "fixed for CPT from the scratch fit (eqs. 6-7)",
}


def table2_rows(result: Mapping[str, Any], lang: str) -> list[dict[str, Any]]:
    """Table 2(a) (both laws, every parameter), Table 2(b) and eqs. 8-9 against a language's fits."""
    chin = _get(result, "chinchilla", lang)
    cpt = _get(result, "cpt", lang)
    out = []
    why_s = fit_reasons(result, lang, chin)
    p = _get(chin, "fit", "params") or {}
    for name in ("E", "A", "B", "alpha", "beta"):
        out.append(
            _row(
                lang,
                f"Table 2 scratch {name}",
                CPT_TABLE2["scratch"][name],
                p.get(name),
                why_s,
                TABLE2_NOTES.get(name, ""),
            )
        )
    why_c = fit_reasons(result, lang, cpt)
    q = _get(cpt, "fit", "params") or {}
    for name, key in (("B", "B'"), ("beta", "β'"), ("gamma", "γ")):
        out.append(_row(lang, f"Table 2 CPT {key}", CPT_TABLE2["cpt"][name], q.get(name), why_c))
    for law, entry, why in (("scratch", chin, why_s), ("cpt", cpt, why_c)):
        alloc = _get(entry, "allocation") or {}
        valid = alloc.get("valid", True)
        a, b = CPT_TABLE2["allocation"][law]
        n_coef, _, d_coef, _ = CPT_TABLE2["eq8_9"][law]
        eq = "eq. 8" if law == "scratch" else "eq. 9"
        for quantity, paper, key in (
            (f"Table 2(b) a ({law}, N_opt ∝ C^a)", a, "a"),
            (f"Table 2(b) b ({law}, D_opt ∝ C^b)", b, "b"),
            (f"{eq} N_opt prefactor ({law})", n_coef, "n_coef"),
            (f"{eq} D_opt prefactor ({law})", d_coef, "d_coef"),
        ):
            out.append(_row(lang, quantity, paper, alloc.get(key) if valid else None, why))
    return out


_HEADLINE_REASONS = {
    "frontier_k": _compute_reasons,
    "frontier_g": _compute_reasons,
    "frontier_ratio": _compute_reasons,
    "flops_saved": _transfer_reasons,
    "example_5p5b": _example_reasons,
    "example_5p5b_exact": _example_reasons,
}


def headline_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`paper_headlines.rows` with each row's comparability and its reasons."""
    out = []
    for r in paper_headlines.rows(result):
        lang = r["lang"]
        if r["note"] in _HEADLINE_REASONS:
            why = _HEADLINE_REASONS[r["note"]](result, lang)
        else:  # Appendix B: the CPT runs' fits
            why = fit_reasons(result, lang, _get(result, "cpt", lang))
        out.append(_row(lang, r["quantity"], r["paper"], r["ours"], why, r["note"]))
    return out


def forgetting_rows(result: Mapping[str, Any], lang: str) -> list[dict[str, Any]]:
    """§5.2: a plain CPT run's source-language loss at its start and end (the replay step's curve
    of replay ratio 0, the size nearest 1.4B) against the paper's 1.4B, 2.40 → 3.68."""
    paper = CPT_HEADLINES["forgetting_1p4b"]
    curves = [c for c in _get(result, "replay", lang) or [] if not c.get("replay_ratio")]
    if not curves:
        return []
    c = min(curves, key=lambda c: abs(np.log(c["n_params"] / paper["n_params"])))
    why = _lang_basis(result, lang, basis=True)
    if abs(c["n_params"] / paper["n_params"] - 1) > 0.1:
        why.append(f"N {fmt(c['n_params'], 3)} vs the paper's 1.4B (forgetting grows as N shrinks)")
    quantity = "§5.2 source-language loss, start … end of plain CPT"
    ours = (c["source_start"], c["source_final"])
    return [_row(lang, quantity, (paper["start"], paper["end"]), ours, why)]


def languages(result: Mapping[str, Any]) -> list[str]:
    """Target languages with anything to compare: an L(N, D) fit, a frontier, transfer, replay."""
    keys = ("chinchilla", "cpt", "compute", "transfer", "replay")
    return sorted({lang for k in keys for lang in (result.get(k) or {})})


def rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every comparable number of the CPT paper beside ours, per language: `lang`, `quantity`,
    `paper`, `ours` (None: the runs give none), `comparable` (bool), `why` (the reasons it is
    not, each naming our span and the paper's), `note` (a `paper_headlines.NOTES` key or a
    short caveat)."""
    out = []
    heads = headline_rows(result)
    for lang in languages(result):
        if _get(result, "chinchilla", lang) or _get(result, "cpt", lang):
            out += table2_rows(result, lang)
        out += [r for r in heads if r["lang"] == lang]
        out += forgetting_rows(result, lang)
    return out


# --- markdown -------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return " … ".join(fmt(v) for v in value)
    return fmt(value)


def _table(table: Sequence[Mapping[str, Any]]) -> list[str]:
    def row(r: Mapping[str, Any]) -> list[str]:
        notes = [*r["why"]]
        if r["note"] in paper_headlines.NOTES:
            notes.append(paper_headlines.NOTES[r["note"]])
        elif r["note"]:
            notes.append(r["note"])
        comparable = "yes" if r["comparable"] else "no"
        return [
            r["lang"],
            r["quantity"],
            _cell(r["paper"]),
            _cell(r["ours"]),
            comparable,
            "; ".join(notes),
        ]

    header = ("language", "quantity", "paper", "ours", "comparable", "why not / note")
    return markdown_table(header, map(row, table), right=("paper", "ours"))


def comparison_lines(result: Mapping[str, Any]) -> list[str]:
    """Markdown lines: the comparison tables (Table 2, eqs. 8-9 and §5.2; the headline numbers),
    every row with its comparability; nothing when no row has a value of ours."""
    table = rows(result)
    if not any(r["ours"] is not None for r in table):
        return []
    heads = {r["quantity"] for r in headline_rows(result)}
    return [
        "## The CPT paper beside our fits: Table 2, eqs. 8-9, §5.2",
        "",
        f"The paper's values are for a {CPT_SETUP['target_lang']} target, {len(PAPER_SIZES)} "
        f"LLaMA2 sizes {_range(*PAPER_N)} (nominal N) trained on 20×N tokens; 'comparable' "
        "needs the same language, N basis, sizes and token range.",
        "",
        *_table([r for r in table if r["quantity"] not in heads]),
        "",
        "## The CPT paper's headline numbers beside ours",
        "",
        *_table([r for r in table if r["quantity"] in heads]),
        "",
    ]


def section(result: Mapping[str, Any]) -> list[str]:
    """report.md lines: `comparison_lines`, then the paper-consistency section (only with them)."""
    lines = comparison_lines(result)
    return lines + consistency_section() if lines else []
