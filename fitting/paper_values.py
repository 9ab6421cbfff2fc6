"""The papers' published values the study reports compare with (kept in one place, as printed).

`CPT_TABLE2`: the CPT paper's (Zheng et al. 2024) Table 2, fits on 40 LLaMA2 sizes (50M-5.5B,
zh target), its compute-optimal allocation exponents (a, b) for scratch and CPT, and the
prefactors of its eqs. 8-9 (N_opt = n_coef·C^a, D_opt = d_coef·C^b). All of them are on the
paper's N basis, its Table 4 nominal sizes: compare fits made with `n_basis="nominal"`.
`MT_EN_FR`: the MT paper's (Isik et al. 2024) numbers for T5-3B en-fr (Tables 3-6, §5).
"""

from __future__ import annotations

CPT_TABLE2 = {
    "scratch": {"E": 1.55, "A": 420.0, "B": 719.5, "alpha": 0.40, "beta": 0.30},
    "cpt": {"B": 433.3, "beta": 0.20, "gamma": 0.08},
    "allocation": {"scratch": (0.429, 0.571), "cpt": (0.385, 0.615)},
    # eqs. 8-9: (n_coef, a, d_coef, b)
    "eq8_9": {"scratch": (0.324, 0.429, 0.514, 0.571), "cpt": (4.79, 0.385, 0.035, 0.615)},
    "n_basis": "nominal",
}

MT_EN_FR = {
    "bleu_err_max_aligned": 0.061,  # largest held-out error of the log-law at alignment 1.0
    "bleu_err_max_en_de_ro": 0.025,  # English-only pretraining, en-de / en-ro
    "en_fr_bleu": {  # Table 3 / Table 5: (Df tokens, log A, alpha, beta, prediction error)
        "mix_en_50_fr_50": [
            (42e6, -1.82e4, 898.0, 0.42, 0.061),
            (210e6, -2.33e4, 1.21e3, 0.40, 0.013),
        ],
        "mix_en_100": [(42e6, 1.00, 2.57e-5, 1.11e4, 0.042), (210e6, -6.38e7, 3.43e6, 0.20, 0.034)],
    },
    "dp_range": (25_000 * 256 * 512, 1_000_000 * 256 * 512),  # steps x batch x 512 tokens
}
