"""The MT paper's (Isik et al. 2024) printed laws, the conditions they are for, and its Dp grid.

Tables 3-6 print, per pretraining mixture, language pair and finetuning size Df, T5-3B's BLEU
log-law f(Dp) = (log(A·Dp^α))^β (Tables 3 and 5) and its cross-entropy power law
L(Dp) = E + A/Dp^α (Tables 4 and 6), as `fitting.reports.paper_values.MT_T5_3B_LAWS` holds them.
This module names those conditions (`PAPER_MODEL`, `PAPER_TASKS`, `PAPER_METRICS`), the
mt_paper manifest's checkpoints in the paper's tokens (`grid_dp`), the Dp units a law may be read
in (`candidate_units`), and evaluates the laws (`evaluate`): what both the comparison with a fit
(`fitting.reports.mt_paper_series`) and the paper's consistency check
(`fitting.reports.mt_paper_comparison`) start from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fitting.laws import formulas
from fitting.reports.paper_values import MT_DP, MT_T5_3B_LAWS

PAPER_MODEL = "t5_3b"  # Tables 3-6 are T5-3B's; the paper prints no T5-770M coefficients
PAPER_TASKS = {"mt_en_de": "WMT-17 en-de", "mt_en_fr": "WMT-15 en-fr", "mt_en_ro": "WMT-16 en-ro"}
FIG5_TASKS = ("mt_en_de", "mt_en_fr")  # Fig. 5: en-de (left) and en-fr (right) only
# metric -> (table key in MT_T5_3B_LAWS, fitting law, its parameters in the paper's order)
PAPER_METRICS = {
    "bleu": ("bleu", "log_law", ("log_A", "alpha", "beta")),
    "loss": ("ce", "power_law", ("E", "A", "alpha")),
}
METRIC_LABELS = {"bleu": "BLEU", "loss": "CE", "rouge_l": "ROUGE-L", "comet": "COMET"}


def grid_dp() -> np.ndarray:
    """The mt_paper manifest's checkpoints in paper tokens (steps × 256 × 512)."""
    return np.asarray(MT_DP["grid_steps"], float) * MT_DP["batch"] * MT_DP["length"]


def candidate_units() -> dict[str, float]:
    """Dp units to try: name -> paper tokens per unit (every power of ten from 1 to 1e12 tokens,
    one 512-token example, one 256 × 512-token step)."""
    names = {0: "tokens", 3: "thousand tokens", 6: "million tokens", 9: "billion tokens"}
    units = {names.get(k, f"1e{k} tokens"): 10.0**k for k in range(13)}
    units["examples (512-token sequences)"] = float(MT_DP["length"])
    units["steps (256 × 512 tokens)"] = float(MT_DP["batch"] * MT_DP["length"])
    return units


def paper_laws(metric: str) -> list[tuple[tuple[str, str, int], dict[str, float]]]:
    """The usable printed laws of `metric` ("bleu" or "loss"): (mixture, task, Df) -> params."""
    key, _, names = PAPER_METRICS[metric]
    return [
        (cond, dict(zip(names, row[key], strict=True)))
        for cond, row in MT_T5_3B_LAWS.items()
        if row[key] is not None
    ]


def evaluate(metric: str, dp_tokens: Sequence[float], tokens_per_unit: float = 1.0) -> np.ndarray:
    """Every printed law of `metric` at `dp_tokens` given in that unit: [laws, points]."""
    _, law, _ = PAPER_METRICS[metric]
    dp = np.asarray(dp_tokens, float) / tokens_per_unit
    return np.stack([formulas.predict(law, p, dp) for _, p in paper_laws(metric)])
