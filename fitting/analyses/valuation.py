"""The MT paper's guide for valuing pretraining data (Isik et al. 2024, §3.5).

Given (pretraining tokens, downstream score) pairs of finetuned checkpoints, in order:

1. fewer than three pairs: the log-law's three coefficients cannot be fitted yet — keep
   pretraining, finetuning and scoring checkpoints (`too_few_points`);
2. the law cannot be fitted even to the first points, or the scores are non-monotonic from the
   start beyond noise: the data look misaligned with the task; compare the best finetuned
   checkpoint with the non-pretrained baseline to see what this data is worth (`misaligned`);
3. the law fits: predict the score at larger Dp and the Dp needed for a target score; if the
   target is out of reach the data is not worth pretraining on for it (`law_fits`);
4. the law fits the first points but a later one leaves it beyond noise: the data is not
   sufficiently aligned, stop pretraining on it (`law_breaks`).

"Beyond noise" means a log-space deviation above `tolerance` (default 5%, about one BLEU point at
BLEU 20).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fitting.checks import as_points
from fitting.laws import formulas
from fitting.laws.downstream_laws import SCORES, DownstreamFit, fit_bleu_law

VERDICTS = ("too_few_points", "misaligned", "law_fits", "law_breaks")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The guide's conclusion for one pretraining dataset and task.

    Attributes:
      kind: one of VERDICTS.
      explanation: a human-readable account of the decision and the recommendation.
      fit: the log-law fit used (None for too_few_points).
      best_score, best_Dp: the best finetuned checkpoint so far.
      baseline: the non-pretrained model's score, when given; gain: best_score − baseline.
      predictions: larger Dp → predicted score (law_fits only).
      target, dp_for_target: the requested score and the Dp the law needs for it (None when the
        law never reaches it).
      break_index, break_Dp: first point that leaves the law (law_breaks only).
    """

    kind: str
    explanation: str
    fit: DownstreamFit | None = None
    best_score: float = math.nan
    best_Dp: float = math.nan
    baseline: float | None = None
    gain: float | None = None
    predictions: dict[float, float] = dataclasses.field(default_factory=dict)
    target: float | None = None
    dp_for_target: float | None = None
    break_index: int | None = None
    break_Dp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("fit", "predictions")}
        out["fit"] = self.fit.to_dict() if self.fit else None
        out["predictions"] = [[k, v] for k, v in self.predictions.items()]
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in out.items()
        }


def dp_for_score(params: dict[str, float], score: float) -> float | None:
    """Pretraining tokens at which the log-law reaches `score` (None if it never does)."""
    beta, alpha, log_a = params["beta"], params["alpha"], params["log_A"]
    if not (score > 0 and beta != 0 and alpha != 0):
        return None
    q = score ** (1.0 / beta)
    log_dp = (q - log_a) / alpha
    if not np.isfinite(log_dp) or log_dp > 700:
        return None
    dp = math.exp(log_dp)
    pred = float(formulas.log_law(dp, **params))
    return dp if np.isfinite(pred) and abs(math.log(pred / score)) < 1e-6 else None


def assess(
    Dp: Sequence[float],
    scores: Sequence[float],
    *,
    baseline: float | None = None,
    target: float | None = None,
    tolerance: float = 0.05,
    n_fit: int = 4,
    horizons: Sequence[float] = (2.0, 10.0),
    metric: str = "bleu",
) -> Verdict:
    """Applies the §3.5 guide to a pretraining dataset's (Dp, score) sequence.

    Args:
      Dp: pretraining tokens of each finetuned checkpoint.
      scores: the downstream score (BLEU, ROUGE, COMET) after finetuning each checkpoint.
      baseline: the score of the same finetuning without pretraining.
      target: the score one hopes to reach.
      tolerance: relative (log-space) deviation counted as beyond noise.
      n_fit: points used to fit the law (the rest test it); at least 3.
      horizons: multiples of the largest Dp at which to predict.
      metric: the score's name: one of `fitting.laws.downstream_laws.SCORES` (the guide values
        data by translation scores; BLEU's parts and the cross-entropy get no verdict).

    Raises:
      ValueError: a metric outside `SCORES`.
    """
    if metric not in SCORES:
        raise ValueError(f"no valuation verdict for {metric!r}: the guide is for {SCORES}")
    n = len(Dp)
    best_i = int(np.nanargmax(scores)) if n else -1
    best = dict(
        best_score=float(scores[best_i]) if n else math.nan,
        best_Dp=float(Dp[best_i]) if n else math.nan,
        baseline=baseline,
        gain=(float(scores[best_i]) - baseline) if n and baseline is not None else None,
        target=target,
    )
    if n < 3:
        return Verdict(
            "too_few_points",
            f"{n} (Dp, score) pair(s): the log-law has three coefficients, so at least three "
            "finetuned checkpoints are needed. Keep pretraining, and finetune and score further "
            "checkpoints.",
            **best,
        )
    if np.any(np.asarray(scores, float) <= 0):
        zeros = int(np.sum(np.asarray(scores, float) <= 0))
        text = (
            f"Misaligned: {zeros} of {n} finetuned checkpoints score 0, which no log-law "
            f"(log(A·Dp^α))^β describes, so the scaling law cannot value this data (§3.5, 2a). "
            f"Best finetuned checkpoint: score {best['best_score']:.4g} at Dp={best['best_Dp']:.4g}"
        )
        if baseline is not None:
            text += f"; the non-pretrained baseline scores {baseline:.4g} ({best['gain']:+.4g})."
        else:
            text += "; compare it with a non-pretrained baseline to value this data."
        return Verdict("misaligned", text, **best)
    pts = as_points({"Dp": Dp, "score": scores}, n_params=3, law="valuation")
    order = np.argsort(pts["Dp"], kind="stable")
    dp, sc = pts["Dp"][order], pts["score"][order]
    k = max(3, min(n_fit, n))
    fit = fit_bleu_law(dp, sc, n_fit=k)
    fit_dev = np.abs(fit.residuals[:k])
    early_drop = np.any(np.diff(np.log(sc[:k])) < -tolerance)
    if (
        not fit.converged
        or not np.all(np.isfinite(fit_dev))
        or np.any(fit_dev > tolerance)
        or early_drop
    ):
        why = (
            "the scores fall by more than the noise tolerance between early checkpoints"
            if early_drop
            else "the log-law does not fit even the first checkpoints"
        )
        text = (
            f"Misaligned: {why} (tolerance {tolerance:.0%}), so the scaling law cannot describe "
            f"this data and more pretraining may make the task worse. Best finetuned checkpoint: "
            f"score {best['best_score']:.4g} at Dp={best['best_Dp']:.4g}"
        )
        if baseline is not None:
            text += (
                f"; the non-pretrained baseline scores {baseline:.4g}, so pretraining on this data "
                f"is worth {best['gain']:+.4g}."
            )
        else:
            text += "; compare it with a non-pretrained baseline to value this data."
        return Verdict("misaligned", text, fit=fit, **best)
    held = np.abs(fit.residuals[k:])
    bad = np.flatnonzero(~np.isfinite(held) | (held > tolerance))
    if bad.size:
        i = k + int(bad[0])
        return Verdict(
            "law_breaks",
            f"Law breaks: the log-law fits the first {k} checkpoints but the checkpoint at "
            f"Dp={dp[i]:.4g} deviates by {fit.residuals[i]:+.3f} in log score (tolerance "
            f"{tolerance:.0%}). The pretraining data is not sufficiently aligned with the task; "
            f"pretraining further on it may not help. Best so far: {best['best_score']:.4g} at "
            f"Dp={best['best_Dp']:.4g}.",
            fit=fit,
            break_index=i,
            break_Dp=float(dp[i]),
            **best,
        )
    preds = {float(h * dp[-1]): float(fit.predict(h * dp[-1])) for h in horizons}
    text = (
        f"Law fits: f(Dp) = (log A + α·log Dp)^β with log A={fit.params['log_A']:.4g}, "
        f"α={fit.params['alpha']:.4g}, β={fit.params['beta']:.4g} fits all {n} checkpoints within "
        f"{tolerance:.0%}. Predicted: "
        + ", ".join(f"{v:.4g} at Dp={d:.4g}" for d, v in preds.items())
        + "."
    )
    dp_target = None
    if target is not None:
        dp_target = dp_for_score(fit.params, target)
        if dp_target is None:
            text += f" The law never reaches the target {target:.4g}: not worth pretraining on this data for it."
        elif dp_target <= dp[-1]:
            text += f" The target {target:.4g} is already reached (law: Dp={dp_target:.4g})."
        else:
            text += (
                f" Reaching the target {target:.4g} needs Dp={dp_target:.4g} "
                f"({dp_target / dp[-1]:.3g}× the current); keep pretraining until then."
            )
    return Verdict("law_fits", text, fit=fit, predictions=preds, dp_for_target=dp_target, **best)
