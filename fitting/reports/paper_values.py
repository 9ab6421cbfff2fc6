"""The papers' published values the study reports compare with (kept in one place, as printed).

Every value is kept as the paper prints it (`*_PRINTED`: the digits, trailing zeros included, so
that `fitting.printed_box` knows how far each may lie off), with its float beside it.

`CPT_TABLE2`: the CPT paper's (Zheng et al. 2024) Table 2 [q:cpt.table2_scratch]
[q:cpt.table2_cpt], fits on its LLaMA2 sizes (zh target), its compute-optimal allocation
exponents (a, b) for scratch and CPT [q:cpt.table2b], and the prefactors of its eqs. 8-9
[q:cpt.s5_1_eqs8_9] (N_opt = n_coef·C^a, D_opt = d_coef·C^b). We read all of them as on Table 4's
nominal sizes (`n_basis`), because §2.1 sizes its runs by them [q:cpt.s2_1_tokens_20x] and the
paper names no other N; compare fits made with `n_basis="nominal"`.
`CPT_APPENDIX_B`: its Appendix B Table 3 [q:cpt.appB_table3], the fitting errors of the
Chinchilla law and of its extended (CPT) law on the pretraining-from-scratch and the CPT runs,
with the fitted γ. `CPT_HEADLINES`: its eq. 3 loss-compute frontier constants, the FLOPs saved
range and the 5.5B token example. `MT_EN_FR`: the MT paper's (Isik et al. 2024) numbers for T5-3B
en-fr (Tables 3-6, §5).

`ERROR_DEFINITIONS` says, per printed error figure, how far the paper defines it and so what a
report may set against it: a figure is compared only through a quantity computed the paper's way
on our runs; where the paper leaves its definition open, the reports print no comparison.
"""

from __future__ import annotations

from fitting.printed_box import Printed


def _floats(printed):
    """The same nesting of dicts and tuples with each printed string as its float."""
    if isinstance(printed, str):
        return Printed(printed).value
    if isinstance(printed, dict):
        return {k: _floats(v) for k, v in printed.items()}
    if isinstance(printed, tuple):
        return tuple(_floats(v) for v in printed)
    return printed


# Table 2 as printed. γ: Table 2 prints 0.08 [q:cpt.table2_cpt] and App. B 0.080 for the extended
# law fitted to the CPT runs [q:cpt.appB_gamma]; we read App. B's as the same fit printed to one
# more digit, because App. B fits it "using the same procedures described in Section" 3.3
# [q:cpt.appB_procedure], and take its tighter interval (0.0795-0.0805). With Table 2's digits
# alone (0.075-0.085) every range of `fitting.reports.cpt_comparison.consistency` widens, and its
# FLOPs-saved and 5.5B verdicts become undetermined (`cpt_comparison.gamma_sensitivity`). B' is
# Table 2's 433.3; §4.3 prints it as 433 [q:cpt.s4_3_params].
CPT_TABLE2_PRINTED = {
    "scratch": {"E": "1.55", "A": "420.0", "B": "719.5", "alpha": "0.40", "beta": "0.30"},
    "cpt": {"B": "433.3", "beta": "0.20", "gamma": "0.080"},
    "allocation": {"scratch": ("0.429", "0.571"), "cpt": ("0.385", "0.615")},
    # eqs. 8-9: (n_coef, a, d_coef, b)
    "eq8_9": {
        "scratch": ("0.324", "0.429", "0.514", "0.571"),
        "cpt": ("4.79", "0.385", "0.035", "0.615"),
    },
}
CPT_GAMMA_TABLE2 = "0.08"  # Table 2's own digits of γ (the box above takes App. B's 0.080)
CPT_TABLE2 = {**_floats(CPT_TABLE2_PRINTED), "n_basis": "nominal"}

# Appendix B, Table 3 ("fitting error in Huber loss") [q:cpt.appB_table3]: per run set, each
# law's error and γ.
CPT_APPENDIX_B = {
    "pretraining": {"chinchilla": 0.0090, "cpt_law": 0.0094, "gamma": -0.005},
    "cpt": {"chinchilla": 0.0108, "cpt_law": 0.0093, "gamma": 0.080},
}

# The CPT paper's headline numbers (zh target), as printed; `fitting.reports.paper_headlines`
# sets them beside the fitted ones, `fitting.reports.cpt_comparison.consistency` against Table 2.
CPT_HEADLINES_PRINTED = {
    # §4.2, eq. 3's pure power L = k·C^(−g) [q:cpt.s4_2_eq3_values] through "the lowest loss at
    # each compute level" [q:cpt.s4_2_eq3_fit], C in training FLOPs: group -> (k, g).
    "frontier": {"scratch": ("33.69907", "0.0579"), "cpt": ("31.9594", "0.0575")},
    # "25% to 50%" at equal loss: of tokens "throughout the whole training process" (§1,
    # [q:cpt.s1_tokens_saved]), of FLOPs "during CPT" (§4.3, [q:cpt.s4_3_flops_saved]; Fig. 2
    # [q:cpt.fig2_caption]), of "training resources" (§7, [q:cpt.s7_saving]); in percent.
    "flops_saved": ("25", "50"),
    # §1 [q:cpt.s1_example_5p5b]: 70B CPT tokens of the 5.5B model reach the loss of 110B from
    # scratch. We read "the 5.5B model" as Table 4's 5534M row [q:cpt.table4_sizes] (its largest),
    # on its nominal N; tokens in billions.
    "example_5p5b": {"n_params_m": "5534", "cpt_tokens_b": "70", "scratch_tokens_b": "110"},
    # §5.2 [q:cpt.s5_2_forgetting]: the 1.4B model's English loss from 2.40 to 3.68 during plain
    # CPT (we read the 1.4B model as Table 4's 1393M row).
    "forgetting_1p4b": {"n_params_m": "1393", "start": "2.40", "end": "3.68"},
}
_HEAD = _floats(CPT_HEADLINES_PRINTED)
CPT_HEADLINES = {
    "frontier": _HEAD["frontier"],
    "flops_saved": tuple(x / 100 for x in _HEAD["flops_saved"]),
    "example_5p5b": {
        "n_params": _HEAD["example_5p5b"]["n_params_m"] * 1e6,
        "cpt_tokens": _HEAD["example_5p5b"]["cpt_tokens_b"] * 1e9,
        "scratch_tokens": _HEAD["example_5p5b"]["scratch_tokens_b"] * 1e9,
    },
    "forgetting_1p4b": {
        "n_params": _HEAD["forgetting_1p4b"]["n_params_m"] * 1e6,
        "start": _HEAD["forgetting_1p4b"]["start"],
        "end": _HEAD["forgetting_1p4b"]["end"],
    },
}

# The CPT paper's setup: the nominal sizes of its Table 4 [q:cpt.table4_sizes] (42 rows, where
# its text says 40 sizes [q:cpt.abstract_sizes] [q:cpt.table1_caption]), trained on 20 tokens per
# parameter [q:cpt.s2_1_tokens_20x] on a zh target from en checkpoints. Batches of 1M/2M/4M
# tokens by size band [q:cpt.table1_bands]; the band edges (≤ 1B, ≤ 2.5B, above) and M = 2^20
# are ours: Table 1 prints "50M-1B", "1B-2.5B", "2.7B-5.5B" and leaves M undefined.
CPT_SETUP = {
    "sizes_m": tuple(
        int(m)
        for m in "49 66 86 105 125 137 166 194 208 234 259 301 334 368 512 591 616 670 711 766 "
        "806 879 992 1085 1239 1393 1542 1736 1743 1944 1963 2112 2191 2452 2791 2808 3227 3647 "
        "4016 4248 4657 5534".split()
    ),
    "tokens_per_param": 20,
    "batch_tokens": ((1e9, 2**20), (2.5e9, 2**21), (float("inf"), 2**22)),  # (N up to, batch)
    "target_lang": "zh",
    "source_lang": "en",
}
# Table 1's model counts per band [q:cpt.table1_bands] (23 + 12 + 5 = 40), against Table 4's 42
# sizes: `fitting.reports.cpt_comparison.consistency` sets them side by side.
CPT_TABLE1_BANDS = {"50M-1B": 23, "1B-2.5B": 12, "2.7B-5.5B": 5}

MT_EN_FR = {
    # §5's "prediction error at most ..." [q:mt.s5_error_bounds] [q:mt.s5_error_en_de_ro] (not
    # recomputable: see ERROR_DEFINITIONS["mt"]).
    "bleu_err_max_aligned": 0.061,  # largest held-out error of the log-law at alignment 1.0
    "bleu_err_max_en_de_ro": 0.025,  # English-only pretraining, en-de / en-ro
    "en_fr_bleu": {  # Table 3 / Table 5: (Df tokens, log A, alpha, beta, prediction error)
        "mix_en_50_fr_50": [
            (42e6, -1.82e4, 898.0, 0.42, 0.061),
            (210e6, -2.33e4, 1.21e3, 0.40, 0.013),
        ],
        "mix_en_100": [(42e6, 1.00, 2.57e-5, 1.11e4, 0.042), (210e6, -6.38e7, 3.43e6, 0.20, 0.034)],
    },
    # The mt_paper manifest's checkpoint grid (launch/manifests/mt_paper.toml, init_steps 25k-1M)
    # in tokens, steps x 256 x 512 (`MT_DP`); the paper lists no checkpoints, only its
    # pretraining length (1M steps; ro-MC4 510k [q:mt.s4_pretrain]).
    "dp_range": (25_000 * 256 * 512, 1_000_000 * 256 * 512),
}
# Dp, the MT paper's pretraining data size, in tokens: we read it as pretraining steps x batch 256
# x sequence length 512, because §4 pretrains in batches of 256 sequences of 512 [q:mt.s4_pretrain]
# and maps each checkpoint one-to-one to "the number of pretraining tokens seen" [q:mt.s4_one_pass];
# the paper does not write the product. It pretrains 1M steps (ro-MC4: 510k) and does not list
# the checkpoints it finetunes; `grid_steps` are the mt_paper manifest's (launch/manifests/
# mt_paper.toml [axes] init_steps), ours, not the paper's.
MT_DP = {
    "batch": 256,
    "length": 512,
    "max_steps": 1_000_000,
    "max_steps_ro": 510_000,
    "grid_steps": (25_000, 50_000, 100_000, 200_000, 300_000, 500_000, 750_000, 1_000_000),
}
# How we evaluate the MT paper's laws, where it does not say: `log` in f(Dp) = (log(A·Dp^α))^β
# [q:mt.eq1_log_law] and in its tables' log A [q:mt.tables_log_a] is the natural logarithm
# (`fitting.laws.formulas.log_law`; the paper never states the base; under it Tables 3 and 5 give
# BLEU 1.59-40.9 over the manifest's grid, in base 10 most of their values are undefined:
# `fitting.reports.mt_paper_comparison`), and the downstream cross-entropy of eq. 3
# [q:mt.eq3_ce_law] is per target token in nats (the paper names no unit).

# What each paper's printed error figure is, as far as the paper says, and what may be compared.
ERROR_DEFINITIONS = {
    "mt": (
        "The MT paper's 'prediction error' (Tables 3-6, and the bounds §5 quotes from them) is "
        "said only to be 'computed via the Huber loss' [q:mt.s4_error_via_huber] (δ = 0.1 for "
        "BLEU; 1e-3 in the text [q:mt.s4_huber] [q:mt.appA2_delta], 1e-5 in Tables 4 and 6 "
        "[q:mt.tables_ce_delta], "
        "for the cross-entropy) with the held-out checkpoints used 'to evaluate the accuracy of "
        "the laws' [q:mt.s4_first_four]. It does not say whether the residuals are of the score "
        "or of its log (its fits' are of the log, App. A.2 [q:mt.appA2_log_residuals]), nor how "
        "the points are combined (sum or mean), and its cross-entropy errors (~1e-12) cannot be "
        "log residuals of a loss in nats. The value cannot be recomputed, so no error value here "
        "is set against it."
    ),
    "cpt_appendix_b": (
        "The CPT paper's Appendix B errors are the Huber loss (δ = 1e-3) of the log-loss "
        "residuals [q:cpt.s3_3_huber] of each law fitted 'across all trained models' "
        "[q:cpt.appB_procedure] (which points of a run it fits the paper does not say; ours fit "
        "every evaluation), but with δ = 1e-3 a mean per point of 0.009 would need log "
        "residuals near 9 (a factor e^9 in the loss), so the values are normalised in a way it "
        "does not state (a sum over its points, perhaps). Only the ratio of the two laws' errors "
        "on the same points is independent of that normalisation; that ratio is what is compared."
    ),
}

# The MT paper's fitted downstream laws for T5-3B (its Tables 3-6, Appendix C.3), as printed:
# (pretraining mixture, WMT task, Df tokens) -> {"bleu": (log A, α, β) of f(Dp) = (log(A·Dp^α))^β,
# "ce": (E, A, α) of L(Dp) = E + A/Dp^α}; None where the table prints no usable row (the reason in
# MT_T5_3B_UNUSABLE; e.g. [q:mt.table3_ro_3m]). Dp in tokens (`MT_DP`). The paper gives no
# T5-770M coefficients (Figs. 8-9 only).
_MT_T5_3B_PRINTED = {
    # (pretraining mixture, WMT task) -> rows (Df, bleu (log A, α, β), ce (E, A, α))
    ("mix_en_50_de_50", "mt_en_de"): (
        (6_000_000, ("-180.75", "9.00", "0.75"), ("3.21e-5", "35.45", "0.64")),
        (31_000_000, ("-1.68e3", "84.04", "0.49"), ("3.28e-5", "4.70e2", "0.78")),
        (3_000_000_000, ("-1.64e8", "9.91e6", "0.19"), ("2.24e-5", "2.56e-2", "0.36")),
    ),
    ("mix_en_50_fr_50", "mt_en_fr"): (
        (42_000_000, ("-1.82e4", "8.98e2", "0.42"), ("2.72e-5", "2.01e6", "1.18")),
        (210_000_000, ("-2.33e4", "1.21e3", "0.40"), ("2.57e-5", "1.75e7", "1.30")),
        (21_000_000_000, ("5.08e3", "4.61e8", "0.16"), ("1.11e-7", "3.41e-5", "1.82e-2")),
    ),
    ("mix_en_50_ro_50", "mt_en_ro"): (
        (625_000, ("-36.02", "1.77", "1.28"), ("2.45e-5", "0.49", "0.41")),
        (3_000_000, None, ("2.62e-5", "2.40", "0.49")),
        (312_000_000, ("-1.82e4", "9.04e2", "0.40"), ("2.08e-5", "3.94", "0.53")),
    ),
    ("mix_en_100", "mt_en_de"): (
        (6_000_000, ("-1.88", "0.15", "3.30"), ("3.22e-13", "3.18e-3", "0.15")),
        (31_000_000, ("-1.81e4", "896.12", "0.28"), ("3.24e-5", "5.20e-3", "0.20")),
        (3_000_000_000, ("1.02e-7", "104.92", "0.42"), ("2.24e-5", "2.56e-2", "0.36")),
    ),
    ("mix_en_100", "mt_en_fr"): (
        (42_000_000, None, ("3.49e-5", "1.05e-2", "0.25")),
        (210_000_000, ("-6.38e7", "3.43e6", "0.20"), ("4.24e-5", "19.39", "0.66")),
        (21_000_000_000, None, ("1.26e-7", "2.59e-5", "4.81e-3")),
    ),
    ("mix_en_100", "mt_en_ro"): (
        (625_000, ("-10.54", "0.55", "1.12"), ("5.79e-12", "1.03e-3", "7.76e-2")),
        (3_000_000, ("-40.41", "2.11", "0.79"), ("1.78e-12", "9.98e-4", "8.33e-2")),
        (312_000_000, ("3.61", "8.17e5", "0.19"), ("5.85e-5", "1.37e3", "0.88")),
    ),
}
MT_T5_3B_PRINTED = {
    (mixture, task, df): {"bleu": bleu, "ce": ce}
    for (mixture, task), rows in _MT_T5_3B_PRINTED.items()
    for df, bleu, ce in rows
}
MT_T5_3B_LAWS = {key: _floats(row) for key, row in MT_T5_3B_PRINTED.items()}
MT_T5_3B_UNUSABLE = {
    ("mix_en_50_ro_50", "mt_en_ro", 3_000_000, "bleu"): "Table 3 prints log A as '-0.115.03'",
    ("mix_en_100", "mt_en_fr", 42_000_000, "bleu"): (
        "Table 5's (1.00, 2.57e-5, 1.11e4) gives BLEU > 500 over the manifest's Dp grid"
    ),
    ("mix_en_100", "mt_en_fr", 21_000_000_000, "bleu"): (
        "Table 5's (204.81, 3.80e14, 9.97e-3) gives a flat BLEU of 1.4 (no law to recover)"
    ),
}
