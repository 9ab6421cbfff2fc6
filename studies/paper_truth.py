"""What the synthetic paper-scale study's runs follow: the CPT laws with their noise (`Truth`),
the MT paper's downstream laws per (model, mixture, task, Df) (`mt_truth`, Tables 3-6 or a stated
stand-in), and the learning rate a grid makes best (`BEST_LR`).

The cross-entropy is always a stand-in: Tables 4 and 6 give 2e-5 to 2e-4 nats at the paper's Dp
(in tokens, the unit its BLEU tables need), and no Dp unit makes them and the BLEU tables both
plausible (`fitting.reports.mt_paper_comparison.consistency`). The synthetic CE keeps every ratio of
the printed laws (between rows and along Dp) times one factor `CE_SCALE`, which puts the smallest
value over the manifest's grid at 1 nat, so the runs' CE is on a real run's scale. `studies.paper_study` writes the
runs from them and `studies.paper_check` checks that the fits recover them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fitting.laws import formulas as laws
from fitting.laws import synthetic
from fitting.reports import mt_paper_comparison, paper_values

# Learning-rate grid coordinate -> the value the synthetic runs make best (the gin defaults).
BEST_LR = {"BASE_LR": 1.0, "PEAK_LR": 1e-3}
# Stand-ins where the MT paper prints no coefficients: score factor of a pretraining mixture
# against the task's balanced mixture, and of T5-770M against T5-3B (cross-entropy: 1/factor).
MIXTURE_FACTOR = {
    "mix_en_100": 0.8,
    "mix_de_100": 0.7,
    "mix_fr_100": 0.6,
    "mix_ro_100": 0.5,
    "mix_en_30_fr_70": 0.95,
    "mix_en_70_fr_30": 0.9,
}
MODEL_FACTOR = {"t5_3b": 1.0, "t5_770m": 0.85}
BALANCED = {
    "mt_en_de": "mix_en_50_de_50",
    "mt_en_fr": "mix_en_50_fr_50",
    "mt_en_ro": "mix_en_50_ro_50",
}
# The printed CE laws' (Tables 4, 6) factor to a plausible scale: 1 nat at their smallest value
# over the manifest's Dp grid (in tokens), used only where no Dp unit makes the CE plausible.
CE_SCALE = (
    1.0
    if mt_paper_comparison.ce_unit()
    else 1.0 / float(np.min(mt_paper_comparison.evaluate("loss", mt_paper_comparison.grid_dp())))
)
# metric -> law name in fitting.laws, and its parameter names in the paper's order.
MT_LAWS = {
    "bleu": ("log_law", ("log_A", "alpha", "beta")),
    "loss": ("power_law", ("E", "A", "alpha")),
}


@dataclasses.dataclass(frozen=True)
class Truth:
    """The laws the synthetic runs follow, and their noise (σ of the lognormal factor)."""

    scratch: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: dict(synthetic.SCRATCH)
    )
    cpt: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(synthetic.CPT))
    source: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(synthetic.SOURCE))
    sigma: float = 0.001
    mt_sigma: float = 5e-5


@dataclasses.dataclass(frozen=True)
class MTLaw:
    """A downstream law a synthetic series follows: `params` of `law`, and where they come from
    (`source`: "paper Table N" or a stand-in's description)."""

    law: str
    params: Mapping[str, float]
    source: str

    @property
    def from_paper(self) -> bool:
        """Whether the coefficients are the paper's own (not a stand-in)."""
        return self.source.startswith("paper")

    def __call__(self, dp: float | np.ndarray) -> np.ndarray:
        return laws.predict(self.law, dict(self.params), dp)


def _scaled(law: str, params: Mapping[str, float], factor: float) -> dict[str, float]:
    """The same law times `factor`: (log A·k^(1/β), α·k^(1/β), β) for scores, (kE, kA, α) for CE."""
    p = dict(params)
    if law == "log_law":
        s = factor ** (1.0 / p["beta"])
        return {"log_A": p["log_A"] * s, "alpha": p["alpha"] * s, "beta": p["beta"]}
    return {"E": p["E"] * factor, "A": p["A"] * factor, "alpha": p["alpha"]}


def _paper_row(mixture: str, task: str, df: int) -> dict[str, Any]:
    """The paper's row for a condition; Df matches a printed size within 5% (a manifest may give
    the exact pairs × 512, e.g. 3,023,966,208 for the printed 3B)."""
    for (m, t, printed), row in paper_values.MT_T5_3B_LAWS.items():
        if (m, t) == (mixture, task) and abs(df / printed - 1) < 0.05:
            return row
    return {}


def _paper_law(mixture: str, task: str, df: int, metric: str) -> MTLaw | None:
    law, names = MT_LAWS[metric]
    row = _paper_row(mixture, task, df).get("bleu" if metric == "bleu" else "ce")
    if row is None:
        return None
    table = {("bleu", True): 3, ("bleu", False): 5, ("loss", True): 4, ("loss", False): 6}
    source = f"paper Table {table[metric, mixture != 'mix_en_100']}"
    params = dict(zip(names, row, strict=True))
    if metric == "loss" and CE_SCALE != 1.0:  # the printed scale is not nats: a stand-in
        return MTLaw(
            law,
            _scaled(law, params, CE_SCALE),
            f"stand-in ({source} × {CE_SCALE:.3g}: its printed CE is not on a nats scale)",
        )
    return MTLaw(law, params, source)


def mt_truth(size: str, mixture: str, task: str, df: int, metric: str) -> MTLaw:
    """The law a synthetic (model, pretraining mixture, task, Df) series follows for `metric`
    ("bleu" or "loss"): the MT paper's T5-3B coefficients (Tables 3-6) where it prints usable
    ones; otherwise a stand-in, the balanced mixture's law scaled by `MIXTURE_FACTOR`; T5-770M
    (no coefficients in the paper) is T5-3B's law scaled by `MODEL_FACTOR`."""
    base = _paper_law(mixture, task, df, metric)
    if base is None:
        balanced = _paper_law(BALANCED[task], task, df, metric)
        if balanced is not None:
            factor, via = MIXTURE_FACTOR.get(mixture, 1.0), balanced
        else:  # no balanced row: the English-only one, rescaled to the mixture
            via = _paper_law("mix_en_100", task, df, metric)
            factor = MIXTURE_FACTOR.get(mixture, 1.0) / MIXTURE_FACTOR["mix_en_100"]
        k = factor if metric == "bleu" else 1.0 / factor
        base = MTLaw(via.law, _scaled(via.law, via.params, k), f"stand-in ({via.source} × {k:.3g})")
    model_k = MODEL_FACTOR[size] if metric == "bleu" else 1.0 / MODEL_FACTOR[size]
    if model_k == 1.0:
        return base
    return MTLaw(
        base.law,
        _scaled(base.law, base.params, model_k),
        f"stand-in (T5-3B's {base.source} × {model_k:.3g})",
    )
