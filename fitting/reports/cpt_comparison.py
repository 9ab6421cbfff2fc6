"""The CPT paper (Zheng et al. 2024) beside a fit of real runs, and the paper beside itself.

`rows(result)` sets every number of the paper a `fitting.reports.fit_all.fit_runs` result can be
compared with beside ours: Table 2 with all its parameters (the from-scratch Chinchilla law's E,
A, B, α, β; the CPT law's B', β', γ, with E, A, α fixed from the first stage as the paper fixes
them), Table 2(b)'s allocation exponents and eqs. 8-9's prefactors, eq. 3's frontier, Fig. 2's
FLOPs saved and the headline rows of `fitting.reports.paper_headlines`, and §5.2's forgetting
(1.4B: English loss 2.40 → 3.68). Each row says whether the two are comparable — the same target
language, N basis, sizes, tokens and compute range as the paper's — and if not, why, naming the
fit's span against the paper's (`fitting.reports.paper_values.CPT_SETUP`).

`consistency()` is the paper against itself: its Table 2 evaluated at its own sizes and token
counts (`fitting.analyses.cpt_consistency`) against the claims its text makes from the same runs
— the 25-50% FLOPs saved, the 5.5B example, eq. 3's exponents, CPT below scratch throughout
training — and against the allocation it derives from it (Table 2(b), eqs. 8-9). A fit that
recovers Table 2 therefore cannot agree with the claims it contradicts; `section` prints both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fitting.analyses import cpt_consistency as consistency_lib
from fitting.analyses.allocation import compute_optimal
from fitting.formats import fmt, markdown_table
from fitting.reports import paper_headlines
from fitting.reports.paper_values import CPT_HEADLINES, CPT_SETUP, CPT_TABLE2

PAPER_SIZES = tuple(m * 1e6 for m in CPT_SETUP["sizes_m"])
TOKENS_PER_PARAM = CPT_SETUP["tokens_per_param"]
# A fit on fewer sizes than this cannot pin the N term (A, α) nor γ; the paper used 42.
MIN_SIZES = 5
# Sizes at which the consistency section evaluates Table 2: the paper's smallest, its 1.4B (§5.2,
# Figs. 3-4, 6), its largest (the 5.5B example).
CHECK_SIZES = (PAPER_SIZES[0], 1393e6, PAPER_SIZES[-1])
# Where eq. 3's implied frontier starts in each run: 0.1% of it (the paper manifests' log-spaced
# evaluations, Fig. 1's early curves) and 5% (the end of the paper's warm-up).
FRONTIER_STARTS = (1e-3, 0.05)


def _b(x: float) -> str:
    """Tokens in billions as the paper writes them (0.23B, 9.9B, 111B)."""
    x = x / 1e9
    return f"{x:.0f}B" if x >= 10 else f"{x:.2g}B"


def _size(n: float) -> str:
    """A model size as the paper names it (49M, 1.4B, 5.5B)."""
    return f"{n / 1e6:.0f}M" if n < 1e9 else f"{n / 1e9:.2g}B"


def _range(lo: float, hi: float) -> str:
    return f"{fmt(float(lo), 2)}–{fmt(float(hi), 2)}"


# --- comparability --------------------------------------------------------------------------------

PAPER_N = (PAPER_SIZES[0], PAPER_SIZES[-1])
PAPER_RUN_END_TOKENS = (TOKENS_PER_PARAM * PAPER_N[0], TOKENS_PER_PARAM * PAPER_N[1])
PAPER_RUN_END_COMPUTE = tuple(6.0 * n * TOKENS_PER_PARAM * n for n in PAPER_N)


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


# --- the paper against itself ---------------------------------------------------------------------


def _finding(claim: str, paper: str, table2: str, consistent: bool) -> dict[str, Any]:
    return {"claim": claim, "paper": paper, "table2": table2, "consistent": bool(consistent)}


def consistency_numbers() -> dict[str, Any]:
    """What Table 2 implies at the paper's own sizes and tokens (unrounded), for the claims."""
    s, c = CPT_TABLE2["scratch"], CPT_TABLE2["cpt"]
    sizes = np.asarray(CHECK_SIZES)
    ends = TOKENS_PER_PARAM * sizes
    example = CPT_HEADLINES["example_5p5b"]
    scratch_end, cpt_end = consistency_lib.losses(s, c, sizes, ends)
    frontier = {}
    for start in FRONTIER_STARTS:
        for group in ("scratch", "cpt"):
            pick = 0 if group == "scratch" else 1

            def loss(n, d, pick=pick):
                return consistency_lib.losses(s, c, n, d)[pick]

            frontier[(group, start)] = consistency_lib.implied_frontier(
                loss, PAPER_SIZES, tokens_per_param=TOKENS_PER_PARAM, start_fraction=start
            )
    c_top = 6.0 * PAPER_SIZES[-1] * TOKENS_PER_PARAM * PAPER_SIZES[-1]
    eq3 = CPT_HEADLINES["frontier"]
    return {
        "sizes": sizes.tolist(),
        "run_end_tokens": ends.tolist(),
        "crossover": consistency_lib.crossover_tokens(s, c, sizes).tolist(),
        "loss_end": {"scratch": scratch_end.tolist(), "cpt": cpt_end.tolist()},
        "flops_saved_end": consistency_lib.flops_saved(s, c, sizes, ends).tolist(),
        "saved_window": [
            consistency_lib.saved_window(s, c, float(n), CPT_HEADLINES["flops_saved"][::-1])
            for n in sizes
        ],
        "example_scratch_tokens": float(
            consistency_lib.scratch_tokens(s, c, example["n_params"], example["cpt_tokens"])
        ),
        "frontier": frontier,
        "eq3_at_top": {
            g: eq3[g][0] * c_top ** -eq3[g][1] for g in ("scratch", "cpt")
        },  # eq. 3 at the 5.5B run's last compute
        "c_top": c_top,
        "allocation": {
            "scratch": compute_optimal(s, law="chinchilla").to_dict(),
            "cpt": compute_optimal(consistency_lib.cpt_params(s, c), law="cpt").to_dict(),
        },
    }


def consistency(numbers: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The paper's claims against its own Table 2: `claim`, `paper` (as printed), `table2` (what
    Table 2 gives at the paper's sizes and tokens, computed), `consistent`."""
    v = numbers if numbers is not None else consistency_numbers()
    names = [_size(n) for n in v["sizes"]]
    lo, hi = CPT_HEADLINES["flops_saved"]
    saved_end = v["flops_saved_end"]
    windows = [
        f"{n}: {_b(a)}–{_b(b)} tokens ({a / e:.1%}–{b / e:.1%} of its run)"
        for n, (a, b), e in zip(names, v["saved_window"], v["run_end_tokens"], strict=True)
    ]
    out = [
        _finding(
            "Fig. 2, §1, §4.3, §7: CPT saves 25–50% of the FLOPs at equal loss, along training",
            f"{lo:.0%}–{hi:.0%}",
            "at 20×N (the end of each run): "
            + ", ".join(f"{n} {x:.0%}" for n, x in zip(names, saved_end, strict=True))
            + f" (CPT needs more compute); {lo:.0%}–{hi:.0%} only early: "
            + "; ".join(windows),
            all(lo <= x <= hi for x in saved_end),
        )
    ]
    example = CPT_HEADLINES["example_5p5b"]
    d_pt = v["example_scratch_tokens"]
    out.append(
        _finding(
            "§1: the 5.5B model after 70B CPT tokens reaches the loss of 110B tokens from scratch",
            f"{_b(example['scratch_tokens'])} scratch tokens",
            f"{d_pt:.3g} = {_b(d_pt)} scratch tokens (FLOPs saved {1 - example['cpt_tokens'] / d_pt:.0%}, "
            f"not {1 - example['cpt_tokens'] / example['scratch_tokens']:.0%})",
            abs(d_pt / example["scratch_tokens"] - 1) <= 0.1,
        )
    )
    eq3 = CPT_HEADLINES["frontier"]
    fr = v["frontier"]
    first = FRONTIER_STARTS[0]
    parts = [
        f"from {start:.1%} of each run: {fr[('scratch', start)]['g']:.2g} / "
        f"{fr[('cpt', start)]['g']:.2g}"
        for start in FRONTIER_STARTS
    ]
    gs, gc = fr[("scratch", first)]["g"], fr[("cpt", first)]["g"]
    out.append(
        _finding(
            "§4.2, eq. 3: frontier exponents g (scratch / CPT) 'nearly unchanged'",
            f"{eq3['scratch'][1]} / {eq3['cpt'][1]}",
            "k·C^−g fitted the paper's way to Table 2's curves of its 42 sizes, "
            + "; ".join(parts),
            all(abs(fr[(g, first)]["g"] / eq3[g][1] - 1) <= 0.1 for g in ("scratch", "cpt"))
            and abs(gs / gc - 1) <= 0.1,
        )
    )
    top = v["eq3_at_top"]
    l_end = v["loss_end"]
    out.append(
        _finding(
            "§1, §4.1, §4.2: CPT below scratch throughout training at every size "
            "(eq. 3: a lower k, the same g)",
            f"eq. 3 at the 5.5B run's end (C = {v['c_top']:.2g}): CPT {top['cpt']:.2f} vs "
            f"scratch {top['scratch']:.2f}",
            "CPT below scratch only for D < "
            + ", ".join(f"{_b(x)} ({n})" for n, x in zip(names, v["crossover"], strict=True))
            + "; at 20×N CPT is above: "
            + ", ".join(
                f"{n} {c_:.2f} vs {s_:.2f}"
                for n, c_, s_ in zip(names, l_end["cpt"], l_end["scratch"], strict=True)
            ),
            all(x >= e for x, e in zip(v["crossover"], v["run_end_tokens"], strict=True)),
        )
    )
    for law in ("scratch", "cpt"):
        a = v["allocation"][law]
        n_coef, pa, d_coef, pb = CPT_TABLE2["eq8_9"][law]
        eq = "eq. 8" if law == "scratch" else "eq. 9"
        got = (a["n_coef"], a["a"], a["d_coef"], a["b"])
        printed = (n_coef, pa, d_coef, pb)
        out.append(
            _finding(
                f"Table 2(b), {eq}: the {law} allocation derived from Table 2(a)",
                f"N_opt = {n_coef}·C^{pa}, D_opt = {d_coef}·C^{pb}",
                f"N_opt = {a['n_coef']:.3g}·C^{a['a']:.3g}, D_opt = {a['d_coef']:.3g}·"
                f"C^{a['b']:.3g}",
                all(abs(x / y - 1) <= 0.03 for x, y in zip(got, printed, strict=True)),
            )
        )
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


def consistency_section(findings: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """report.md lines: the paper's claims against its own Table 2."""
    findings = consistency() if findings is None else findings
    bad = sum(not f["consistent"] for f in findings)
    lines = [
        "## Paper consistency: the CPT paper's claims against its own Table 2",
        "",
        f"Table 2's laws evaluated at the paper's own sizes ({', '.join(_size(n) for n in CHECK_SIZES)} "
        f"of its {len(PAPER_SIZES)}) and token counts (20×N). {bad} of {len(findings)} claims "
        "contradict the table; a fit that recovers Table 2 contradicts them too, so a mismatch "
        "of ours with such a claim is the paper's, not the fit's.",
        "",
    ]
    lines += markdown_table(
        ("claim", "paper", "Table 2 gives", "verdict"),
        (
            (
                f["claim"],
                f["paper"],
                f["table2"],
                "consistent" if f["consistent"] else "**contradicts**",
            )
            for f in findings
        ),
    )
    return [*lines, ""]


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
