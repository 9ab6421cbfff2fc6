"""The CPT paper (Zheng et al. 2024) against itself: its claims checked against its own tables.

`consistency()` evaluates the paper's Table 2 at its own sizes and token counts
(`fitting.analyses.cpt_consistency`) against the claims its text makes from the same runs -- the
25-50% FLOPs saved, the 5.5B example, eq. 3's exponents, CPT below scratch throughout training --
against the allocation it derives from it (Table 2(b), eqs. 8-9), and Table 1's model counts
against Table 4. Each claim is quoted (`fitting.paper_quotes`) and judged over every value
Table 2's printed digits allow (`fitting.printed_box`), never at the printed point alone: the
crossover goes as the power 1/(β' − β) ≈ −10 of the printed values, so rounding alone moves it by
two decades. Eq. 3's exponents depend on a choice of ours, where the frontier starts in each run
(`FRONTIER_STARTS`), and are judged over that range. `gamma_sensitivity` names the verdicts that
rest on reading App. B's γ as Table 2's, and `consistency_section` renders all of it for
report.md.

This check needs no fit of ours: it is the paper's numbers only, apart from the comparison of a
fit with the paper (`fitting.reports.cpt_comparison`, which prints this section after its own).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fitting import paper_quotes, printed_box
from fitting.analyses import cpt_consistency as consistency_lib
from fitting.analyses.allocation import compute_optimal
from fitting.formats import markdown_table
from fitting.reports.cpt_paper_runs import CHECK_SIZES, PAPER_SIZES, TOKENS_PER_PARAM, size_name
from fitting.reports.paper_values import (
    CPT_GAMMA_TABLE2,
    CPT_HEADLINES,
    CPT_HEADLINES_PRINTED,
    CPT_SETUP,
    CPT_TABLE1_BANDS,
    CPT_TABLE2,
    CPT_TABLE2_PRINTED,
)


def _b(x: float) -> str:
    """Tokens in billions, two figures below 10B (0.23B, 9.9B, 111B)."""
    x = x / 1e9
    return f"{x:.0f}B" if x >= 10 else f"{x:.2g}B"


# Where eq. 3's implied frontier starts in each run, ours: the paper fits "the lowest loss at each
# compute level" [q:cpt.s4_2_eq3_fit] without saying from which point of its runs. 0.1% (the
# paper manifests' first log-spaced evaluations, Fig. 1's early curves), 5% (the end of the
# warm-up [q:cpt.s2_1_schedule]), 20%, and the run ends only (1.0).
FRONTIER_STARTS = (1e-3, 0.05, 0.2, 1.0)
# "Nearly unchanged" [q:cpt.s4_2_unchanged] read by us as within 10% of each other.
NEARLY_UNCHANGED = 0.10
WHAT_DECIDES = {
    "digits": "the printed digits of Table 2 (each value ± half its last digit)",
    "start": "where the frontier starts (ours: 0.1%, 5%, 20% of each run, or its end), at the "
    "printed values; the box of printed digits only widens the range",
    "counts": "exact counts (nothing rounded)",
}


def _start(start: float) -> str:
    return "the run ends" if start >= 1 else f"{start:.1%}".replace(".0%", "%")


def table2_box(*, gamma: str | None = None) -> dict[str, tuple[float, float]]:
    """The values Table 2's printed digits allow (`fitting.printed_box`): the scratch law's E, A,
    B, alpha, beta and the CPT law's cpt_B, cpt_beta, cpt_gamma; γ from App. B's 0.080 unless
    `gamma` gives other printed digits (e.g. Table 2's own "0.08")."""
    printed = CPT_TABLE2_PRINTED
    values: dict[str, str] = dict(printed["scratch"])
    values |= {f"cpt_{k}": v for k, v in printed["cpt"].items()}
    if gamma is not None:
        values["cpt_gamma"] = gamma
    return printed_box.box(values)


def _laws(point: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(scratch, cpt) parameter mappings of a point of `table2_box` (arrays or floats)."""
    scratch = {k: point[k] for k in ("E", "A", "B", "alpha", "beta")}
    return scratch, {k: point[f"cpt_{k}"] for k in ("B", "beta", "gamma")}


def _over(bounds: Mapping[str, tuple[float, float]], fn, samples: int) -> np.ndarray:
    """`fn(scratch, cpt, point)` at every point of `bounds` (`printed_box.points`)."""
    point = printed_box.points(bounds, samples=samples)
    scratch, cpt = _laws(point)
    return np.asarray(fn(scratch, cpt, point), np.float64)


def _size_box(n: float) -> tuple[float, float]:
    """A Table 4 size printed in millions (49, 1393, 5534): ± 0.5M."""
    return printed_box.interval(f"{round(n / 1e6)}e6")


def _allocation_range(bounds, law: str, samples: int) -> dict[str, tuple[float, float]]:
    """Ranges of eqs. 8-9's (n_coef, a, d_coef, b) over the box (`compute_optimal` per point)."""
    point = printed_box.points(bounds, samples=samples)
    scratch, cpt = _laws(point)
    rows = []
    for i in range(len(point["E"])):
        s = {k: float(v[i]) for k, v in scratch.items()}
        c = {k: float(v[i]) for k, v in cpt.items()}
        params = s if law == "scratch" else consistency_lib.cpt_params(s, c)
        a = compute_optimal(params, law="chinchilla" if law == "scratch" else "cpt")
        rows.append((a.n_coef, a.a, a.d_coef, a.b))
    values = np.asarray(rows, np.float64)
    return {k: printed_box.span(values[:, i]) for i, k in enumerate(("n_coef", "a", "d_coef", "b"))}


def consistency_numbers(*, gamma: str | None = None, samples: int = printed_box.SAMPLES) -> dict:
    """What Table 2 implies at the paper's own sizes and tokens: at its printed values
    (unrounded arithmetic) and, as (min, max) `*_range`s, over every value its printed digits
    allow (`table2_box`, with each size ± 0.5M and the 5.5B example's 70B ± 0.5B)."""
    s, c = CPT_TABLE2["scratch"], CPT_TABLE2["cpt"]
    bounds = table2_box(gamma=gamma)
    sizes = np.asarray(CHECK_SIZES)
    ends = TOKENS_PER_PARAM * sizes
    example = CPT_HEADLINES["example_5p5b"]
    scratch_end, cpt_end = consistency_lib.losses(s, c, sizes, ends)
    crossover_range, saved_range = [], []
    for n in sizes:
        sized = {**bounds, "N": _size_box(n)}
        ratio = _over(
            sized,
            lambda s_, c_, p: (
                consistency_lib.crossover_tokens(s_, c_, p["N"]) / (TOKENS_PER_PARAM * p["N"])
            ),
            samples,
        )
        crossover = _over(
            sized, lambda s_, c_, p: consistency_lib.crossover_tokens(s_, c_, p["N"]), samples
        )
        saved = _over(
            sized,
            lambda s_, c_, p: consistency_lib.flops_saved(
                s_, c_, p["N"], TOKENS_PER_PARAM * p["N"]
            ),
            samples,
        )
        crossover_range.append(
            {"tokens": printed_box.span(crossover), "over_run_end": printed_box.span(ratio)}
        )
        saved_range.append(printed_box.span(saved))
    printed = CPT_HEADLINES_PRINTED["example_5p5b"]
    example_box = {
        **bounds,
        "N": printed_box.interval(f"{printed['n_params_m']}e6"),
        "D": printed_box.interval(f"{printed['cpt_tokens_b']}e9"),
    }
    example_range = printed_box.span(
        _over(
            example_box,
            lambda s_, c_, p: consistency_lib.scratch_tokens(s_, c_, p["N"], p["D"]),
            samples,
        )
    )
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
        "gamma": gamma or CPT_TABLE2_PRINTED["cpt"]["gamma"],
        "sizes": sizes.tolist(),
        "run_end_tokens": ends.tolist(),
        "crossover": consistency_lib.crossover_tokens(s, c, sizes).tolist(),
        "crossover_range": crossover_range,
        "loss_end": {"scratch": scratch_end.tolist(), "cpt": cpt_end.tolist()},
        "flops_saved_end": consistency_lib.flops_saved(s, c, sizes, ends).tolist(),
        "flops_saved_end_range": saved_range,
        "saved_window": [
            consistency_lib.saved_window(s, c, float(n), CPT_HEADLINES["flops_saved"][::-1])
            for n in sizes
        ],
        "example_scratch_tokens": float(
            consistency_lib.scratch_tokens(s, c, example["n_params"], example["cpt_tokens"])
        ),
        "example_range": example_range,
        "frontier": frontier,
        "eq3_at_top": {
            g: eq3[g][0] * c_top ** -eq3[g][1] for g in ("scratch", "cpt")
        },  # eq. 3 at the 5.5B run's last compute
        "c_top": c_top,
        "allocation": {
            "scratch": compute_optimal(s, law="chinchilla").to_dict(),
            "cpt": compute_optimal(consistency_lib.cpt_params(s, c), law="cpt").to_dict(),
        },
        "allocation_range": {
            law: _allocation_range(bounds, law, samples) for law in ("scratch", "cpt")
        },
    }


def _finding(
    claim: str, quotes: Sequence[str], paper: str, table2: str, verdict: str, decided_by: str
) -> dict[str, Any]:
    for key in quotes:
        paper_quotes.quote(key)  # every claim cites an entry of the registry
    return {
        "claim": claim,
        "quotes": list(quotes),
        "paper": paper,
        "table2": table2,
        "verdict": verdict,
        "decided_by": decided_by,
    }


def _pct(x: float) -> str:
    return f"{x:+.0%}".replace("-", "−")


def _bands(sizes_m: Sequence[int]) -> list[int]:
    """Table 4's sizes counted in `CPT_SETUP`'s batch bands (≤ 1B, ≤ 2.5B, above; edges ours)."""
    edges = [edge for edge, _ in CPT_SETUP["batch_tokens"]]
    counts = [0] * len(edges)
    for m in sizes_m:
        counts[next(i for i, e in enumerate(edges) if m * 1e6 <= e)] += 1
    return counts


def consistency(numbers: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The paper's claims against its own Table 2 (and Table 1 against Table 4): `claim`,
    `quotes` (keys of `fitting.paper_quotes.QUOTES`: the paper's words), `paper` (as printed),
    `table2` (what the table gives: the range over every value its printed digits allow, and the
    value at the printed digits), `verdict` (one of `fitting.printed_box.VERDICTS`) and
    `decided_by` (what the verdict's range runs over: `WHAT_DECIDES`)."""
    v = numbers if numbers is not None else consistency_numbers()
    names = [size_name(n) for n in v["sizes"]]
    lo, hi = CPT_HEADLINES["flops_saved"]
    printed_saved = CPT_HEADLINES_PRINTED["flops_saved"]
    accepted_saved = (
        printed_box.interval(printed_saved[0])[0] / 100,
        printed_box.interval(printed_saved[1])[1] / 100,
    )
    windows = [
        f"{n}: {_b(a)}–{_b(b)} tokens ({a / e:.1%}–{b / e:.1%} of its run)"
        for n, (a, b), e in zip(names, v["saved_window"], v["run_end_tokens"], strict=True)
    ]
    saved = v["flops_saved_end_range"]
    out = [
        _finding(
            "CPT saves 25–50% at equal loss, throughout training (so at its end too)",
            ("cpt.s1_tokens_saved", "cpt.s4_3_flops_saved", "cpt.s7_saving"),
            f"{lo:.0%}–{hi:.0%}",
            "at 20×N (the end of each run): "
            + ", ".join(f"{n} {_pct(a)}…{_pct(b)}" for n, (a, b) in zip(names, saved, strict=True))
            + " (at the printed values "
            + ", ".join(_pct(x) for x in v["flops_saved_end"])
            + f"); at the printed values {lo:.0%}–{hi:.0%} only early: "
            + "; ".join(windows),
            printed_box.verdict_all(printed_box.verdict_of_range(r, accepted_saved) for r in saved),
            WHAT_DECIDES["digits"],
        )
    ]
    cross = v["crossover_range"]
    out.append(
        _finding(
            "CPT's loss below scratch's throughout training, at every size",
            ("cpt.s1_lower_loss", "cpt.s4_1_gap"),
            "below at every compute",
            "CPT below scratch only for D < "
            + ", ".join(
                f"{_b(r['tokens'][0])}–{_b(r['tokens'][1])} ({n}; its run ends at {_b(e)})"
                for n, r, e in zip(names, cross, v["run_end_tokens"], strict=True)
            )
            + " (at the printed values "
            + ", ".join(f"{_b(x)}" for x in v["crossover"])
            + "; there CPT is above at 20×N: "
            + ", ".join(
                f"{n} {c_:.2f} vs {s_:.2f}"
                for n, c_, s_ in zip(
                    names, v["loss_end"]["cpt"], v["loss_end"]["scratch"], strict=True
                )
            )
            + ")",
            printed_box.verdict_all(
                printed_box.verdict_of_range(r["over_run_end"], (1.0, math.inf)) for r in cross
            ),
            WHAT_DECIDES["digits"],
        )
    )
    example = CPT_HEADLINES["example_5p5b"]
    accepted = printed_box.interval(
        f"{CPT_HEADLINES_PRINTED['example_5p5b']['scratch_tokens_b']}e9"
    )
    d_pt, (d_lo, d_hi) = v["example_scratch_tokens"], v["example_range"]
    out.append(
        _finding(
            "the 5.5B model after 70B CPT tokens reaches the loss of 110B tokens from scratch",
            ("cpt.s1_example_5p5b",),
            f"{_b(example['scratch_tokens'])} scratch tokens",
            f"{_b(d_lo)}–{_b(d_hi)} scratch tokens (at the printed values {d_pt:.3g} = {_b(d_pt)}: "
            f"FLOPs saved {_pct(1 - example['cpt_tokens'] / d_pt)}, not "
            f"{_pct(1 - example['cpt_tokens'] / example['scratch_tokens'])})",
            printed_box.verdict_of_range((d_lo, d_hi), accepted),
            WHAT_DECIDES["digits"],
        )
    )
    eq3 = CPT_HEADLINES_PRINTED["frontier"]
    fr = v["frontier"]
    g = {grp: [fr[(grp, start)]["g"] for start in FRONTIER_STARTS] for grp in ("scratch", "cpt")}
    starts = " / ".join(_start(x) for x in FRONTIER_STARTS)
    for grp in ("scratch", "cpt"):
        found = (min(g[grp]), max(g[grp]))
        out.append(
            _finding(
                f"eq. 3's frontier exponent g ({grp}) follows from the same runs",
                ("cpt.s4_2_eq3_fit", "cpt.s4_2_eq3_values"),
                eq3[grp][1],
                f"k·C^−g fitted the paper's way to Table 2's curves of its {len(PAPER_SIZES)} "
                f"sizes, from {starts}: " + " / ".join(f"{x:.3g}" for x in g[grp]),
                printed_box.verdict_of_range(found, printed_box.interval(eq3[grp][1])),
                WHAT_DECIDES["start"],
            )
        )
    ratios = [a / b for a, b in zip(g["scratch"], g["cpt"], strict=True)]
    out.append(
        _finding(
            "eq. 3's exponents nearly unchanged by CPT (ours: within 10%)",
            ("cpt.s4_2_unchanged",),
            f"g(scratch) / g(CPT) = {float(eq3['scratch'][1]) / float(eq3['cpt'][1]):.3f}",
            f"from {starts}: " + " / ".join(f"{x:.3f}" for x in ratios),
            printed_box.verdict_of_range(
                (min(ratios), max(ratios)), (1 - NEARLY_UNCHANGED, 1 + NEARLY_UNCHANGED)
            ),
            WHAT_DECIDES["start"],
        )
    )
    for law in ("scratch", "cpt"):
        a = v["allocation"][law]
        ranges = v["allocation_range"][law]
        printed = dict(
            zip(("n_coef", "a", "d_coef", "b"), CPT_TABLE2_PRINTED["eq8_9"][law], strict=True)
        )
        eq = "eq. 8" if law == "scratch" else "eq. 9"

        def rng(key, ranges=ranges):
            return f"{ranges[key][0]:.3g}–{ranges[key][1]:.3g}"

        out.append(
            _finding(
                f"Table 2(b), {eq}: the {law} allocation derived from Table 2(a)",
                ("cpt.table2b", "cpt.s5_1_eqs8_9"),
                f"N_opt = {printed['n_coef']}·C^{printed['a']}, D_opt = {printed['d_coef']}·"
                f"C^{printed['b']}",
                f"N_opt = ({rng('n_coef')})·C^({rng('a')}), D_opt = ({rng('d_coef')})·"
                f"C^({rng('b')}) (at the printed values N_opt = {a['n_coef']:.3g}·C^{a['a']:.3g}, "
                f"D_opt = {a['d_coef']:.3g}·C^{a['b']:.3g})",
                printed_box.verdict_all(
                    printed_box.verdict_of_range(ranges[k], printed_box.interval(printed[k]))
                    for k in printed
                ),
                WHAT_DECIDES["digits"],
            )
        )
    counts = _bands(CPT_SETUP["sizes_m"])
    table1 = sum(CPT_TABLE1_BANDS.values())
    out.append(
        _finding(
            "Table 1's 40 models (23 + 12 + 5 by band) are Table 4's sizes",
            ("cpt.table1_bands", "cpt.table1_caption", "cpt.table4_sizes"),
            " + ".join(f"{n} ({band})" for band, n in CPT_TABLE1_BANDS.items()) + f" = {table1}",
            f"Table 4 lists {len(CPT_SETUP['sizes_m'])} sizes: "
            + " + ".join(
                f"{n} ({band})"
                for band, n in zip(("≤ 1B", "1–2.5B", "above 2.5B"), counts, strict=True)
            )
            + " in our bands (Table 1's edges, 1B and 2.5B, with each edge in the lower band)",
            printed_box.verdict_of_range((len(CPT_SETUP["sizes_m"]),) * 2, (table1, table1)),
            WHAT_DECIDES["counts"],
        )
    )
    return out


def gamma_sensitivity(findings: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(claim, verdict, verdict with Table 2's own γ digits) for each claim whose verdict changes
    when γ is read from Table 2's "0.08" (± 0.005) instead of App. B's "0.080" (± 0.0005): the
    verdicts that rest on our reading of App. B's γ as Table 2's."""
    wide = consistency(consistency_numbers(gamma=CPT_GAMMA_TABLE2, samples=512))
    return [
        (f["claim"], f["verdict"], w["verdict"])
        for f, w in zip(findings, wide, strict=True)
        if f["verdict"] != w["verdict"]
    ]


def consistency_section(findings: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """report.md lines: the paper's claims, in its words, against its own tables, each with the
    range the printed digits allow and its verdict, and the verdicts that rest on reading App. B's
    γ as Table 2's (`gamma_sensitivity`)."""
    findings = consistency() if findings is None else findings
    counts = {v: sum(f["verdict"] == v for f in findings) for v in printed_box.VERDICTS}
    lines = [
        "## Paper consistency: the CPT paper's claims against its own Table 2",
        "",
        "Table 2's laws evaluated at the paper's own sizes "
        f"({', '.join(size_name(n) for n in CHECK_SIZES)} of its {len(PAPER_SIZES)}) and token counts "
        "(20×N), over every value its printed digits allow: each value ± half its last printed "
        "digit (γ from App. B's 0.080), each size ± 0.5M; the range is the min … max over the "
        f"box's centre, its corners and {printed_box.SAMPLES:,} seeded points inside "
        "(`fitting.printed_box`). A claim is "
        f"*{printed_box.CONTRADICTED}* when no value in that box makes it true, "
        f"*{printed_box.CONSISTENT}* when every value does, and *{printed_box.UNDETERMINED}* "
        "otherwise. Here: "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + f" of {len(findings)} claims. A fit that recovers Table 2 inherits these verdicts: "
        "where a claim is contradicted at every value, a mismatch of ours with it is the "
        "paper's, not the fit's.",
        "",
    ]

    def claim(f: Mapping[str, Any]) -> str:
        places = ", ".join(dict.fromkeys(paper_quotes.quote(k).where for k in f["quotes"]))
        return f"{f['claim']} ({places})"

    lines += markdown_table(
        ("claim (quoted below)", "paper", "Table 2 gives", "verdict", "the range runs over"),
        (
            (
                claim(f),
                str(f["paper"]),
                f["table2"],
                f["verdict"] if f["verdict"] != printed_box.CONTRADICTED else f"**{f['verdict']}**",
                f["decided_by"],
            )
            for f in findings
        ),
    )
    changed = gamma_sensitivity(findings)
    if changed:
        lines += [
            "",
            "γ is App. B's 0.080 [q:cpt.appB_gamma], read by us as Table 2's 0.08 printed to one "
            "more digit (the same law fitted to the same runs by the same procedure "
            "[q:cpt.appB_procedure]). With Table 2's own digits (0.075–0.085) these verdicts "
            "change: " + "; ".join(f"{claim}: {a} → {b}" for claim, a, b in changed) + ".",
        ]
    keys = dict.fromkeys(k for f in findings for k in f["quotes"])
    lines += ["", "The paper's words, as the claims above cite them:", ""]
    lines += [f"- {paper_quotes.cite(k)}" for k in keys]
    return [*lines, ""]
