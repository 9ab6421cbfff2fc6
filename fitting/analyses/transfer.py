"""What continual pre-training transfers (CPT paper Fig. 2) and what replay preserves (Fig. 4).

- At equal loss between a CPT run and the from-scratch run of the same size, FLOPs saved
  (C_PT − C_CPT)/C_PT and effectively transferred data D_PT − D_CPT, along training. The scratch
  curve is made monotone (running minimum of loss over compute) and inverted by linear
  interpolation in log space; CPT losses outside the scratch curve's range give NaN.
- The same measures from the fitted laws (`law_transfer`): D_PT solves L_scratch(N, D_PT) =
  L_CPT(N, D), with bootstrap intervals from the paired refits.
- Forgetting under replay: source-language loss against source-language compute (the run's FLOPs
  times the source share of its tokens), and the target side likewise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fitting.checks import FitInputError
from fitting.laws import robust_fit
from fitting.laws.robust_fit import FitResult
from fitting.readers.points import Curve


@dataclasses.dataclass(frozen=True)
class TransferCurve:
    """Equal-loss comparison of a CPT run with the from-scratch run of the same size.

    Attributes:
      run_id, reference_id: the CPT run and the from-scratch run.
      n_params: N of both.
      tokens, flops, loss: the CPT run's evaluations.
      tokens_pt, flops_pt: what the from-scratch run needed for the same loss (NaN outside range).
      flops_saved: (C_PT − C_CPT)/C_PT; transferred: D_PT − D_CPT.
    """

    run_id: str
    reference_id: str
    n_params: float
    tokens: np.ndarray
    flops: np.ndarray
    loss: np.ndarray
    tokens_pt: np.ndarray
    flops_pt: np.ndarray
    flops_saved: np.ndarray
    transferred: np.ndarray

    def to_dict(self) -> dict:
        """JSON-ready dict (NaN as null)."""
        out = {"run_id": self.run_id, "reference_id": self.reference_id, "n_params": self.n_params}
        for f in ("tokens", "flops", "loss", "tokens_pt", "flops_pt", "flops_saved", "transferred"):
            out[f] = [None if not np.isfinite(v) else float(v) for v in getattr(self, f)]
        return out


def _monotone(x: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points of a training curve where the loss reaches a new minimum (ordered by x)."""
    order = np.argsort(x)
    xs, ls = x[order], loss[order]
    keep, best = [], np.inf
    for i in range(len(xs)):
        if np.isfinite(ls[i]) and xs[i] > 0 and ls[i] < best:
            keep.append(i)
            best = ls[i]
    return xs[keep], ls[keep]


def _invert(x: np.ndarray, loss: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """x at which a monotone curve reaches each target loss, interpolating log x linearly in loss."""
    xs, ls = _monotone(x, loss)
    out = np.full(len(targets), np.nan)
    if len(xs) < 2:
        return out
    inside = (targets <= ls[0]) & (targets >= ls[-1])
    out[inside] = np.exp(np.interp(targets[inside], ls[::-1], np.log(xs[::-1])))
    return out


def equal_loss_transfer(cpt: Curve, scratch: Curve) -> TransferCurve:
    """FLOPs saved and effectively transferred data of `cpt` relative to `scratch` (same N)."""
    if cpt.n_params != scratch.n_params:
        raise FitInputError(
            f"transfer: run {cpt.run_id!r} (N={cpt.n_params:g}) and reference "
            f"{scratch.run_id!r} (N={scratch.n_params:g}) differ in size"
        )
    ok = cpt.tokens > 0
    c_cpt = np.where(np.isfinite(cpt.flops), cpt.flops, 6 * cpt.n_params * cpt.tokens)[ok]
    c_ref = np.where(
        np.isfinite(scratch.flops), scratch.flops, 6 * scratch.n_params * scratch.tokens
    )
    loss = cpt.loss[ok]
    flops_pt = _invert(c_ref, scratch.loss, loss)
    tokens_pt = _invert(scratch.tokens, scratch.loss, loss)
    return TransferCurve(
        run_id=cpt.run_id,
        reference_id=scratch.run_id,
        n_params=cpt.n_params,
        tokens=cpt.tokens[ok],
        flops=c_cpt,
        loss=loss,
        tokens_pt=tokens_pt,
        flops_pt=flops_pt,
        flops_saved=(flops_pt - c_cpt) / flops_pt,
        transferred=tokens_pt - cpt.tokens[ok],
    )


def transfer_pairs(cpt: Sequence[Curve], scratch: Sequence[Curve]) -> list[TransferCurve]:
    """Pairs every CPT curve with the first from-scratch curve of the same N and language."""
    out = []
    for c in cpt:
        refs = [s for s in scratch if s.n_params == c.n_params and s.language == c.language]
        if refs:
            out.append(equal_loss_transfer(c, sorted(refs, key=lambda s: s.run_id)[0]))
    return out


@dataclasses.dataclass(frozen=True)
class LawTransfer:
    """Transfer measures predicted by the fitted laws at (N, D), with bootstrap intervals.

    Attributes:
      N, D: where they are evaluated (D: CPT tokens).
      tokens_pt: from-scratch tokens reaching the CPT law's loss; flops_saved = 1 − D/D_PT
        (same N, so compute is proportional to tokens); transferred = D_PT − D.
      ci: quantity → (lo [P], hi [P]) percentile bands (empty without paired bootstrap samples).
    """

    N: np.ndarray
    D: np.ndarray
    tokens_pt: np.ndarray
    flops_saved: np.ndarray
    transferred: np.ndarray
    ci: dict[str, tuple[np.ndarray, np.ndarray]]


def _scratch_tokens(scratch: dict, cpt: dict, N: np.ndarray, D: np.ndarray) -> np.ndarray:
    loss = (
        cpt["E"] + cpt["A"] * N ** -cpt["alpha"] + cpt["B"] * D ** -cpt["beta"] * N ** -cpt["gamma"]
    )
    excess = loss - scratch["E"] - scratch["A"] * N ** -scratch["alpha"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(excess > 0, (scratch["B"] / excess) ** (1.0 / scratch["beta"]), np.nan)


def law_transfer(scratch: FitResult, cpt: FitResult, N, D, *, level: float = 0.95) -> LawTransfer:
    """FLOPs saved and transferred data implied by a Chinchilla fit and a CPT fit.

    Bootstrap sample b of the CPT fit was refitted with E, A, α of sample b of the scratch fit, so
    the pairs are consistent; bands use the first min(#scratch, #cpt) pairs.
    """
    if scratch.law != "chinchilla" or cpt.law != "cpt":
        raise FitInputError("law_transfer: needs a chinchilla fit and a cpt fit")
    N = np.asarray(N, np.float64)
    D = np.asarray(D, np.float64)
    dpt = _scratch_tokens(scratch.params, cpt.params, N, D)
    ci: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    pairs = list(zip(scratch.samples, cpt.samples, strict=False))
    if pairs:
        d_s = np.stack([_scratch_tokens(s, c, N, D) for s, c in pairs])
        q = (50 * (1 - level), 50 * (1 + level))
        with np.errstate(invalid="ignore", divide="ignore"):
            for name, v in (
                ("tokens_pt", d_s),
                ("flops_saved", 1 - D / d_s),
                ("transferred", d_s - D),
            ):
                lo, hi = np.nanpercentile(v, q, axis=0) if np.any(np.isfinite(v)) else (v[0], v[0])
                ci[name] = (lo, hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        return LawTransfer(N, D, dpt, 1 - D / dpt, dpt - D, ci)


@dataclasses.dataclass(frozen=True)
class ReplayCurve:
    """One replay run's source- and target-language curves against per-language compute.

    Attributes:
      run_id, replay_ratio, n_params: from run.json.
      source_compute, source_loss: source-language eval loss vs FLOPs allocated to the source.
      target_compute, target_loss: the same for the target language.
      source_start, source_peak, source_final: source loss at the first evaluation, its maximum,
        and at the last one (forgetting, then recovery).
      tail_fit: L = k·C^(−g) fitted to the source curve after its peak (the "scaling law of
        forgetting"), when at least three points follow the peak.
    """

    run_id: str
    replay_ratio: float
    n_params: float
    source_compute: np.ndarray
    source_loss: np.ndarray
    target_compute: np.ndarray
    target_loss: np.ndarray
    source_start: float
    source_peak: float
    source_final: float
    tail_fit: FitResult | None

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return {
            "run_id": self.run_id,
            "replay_ratio": self.replay_ratio,
            "n_params": self.n_params,
            "source_compute": self.source_compute.tolist(),
            "source_loss": self.source_loss.tolist(),
            "target_compute": self.target_compute.tolist(),
            "target_loss": self.target_loss.tolist(),
            "source_start": self.source_start,
            "source_peak": self.source_peak,
            "source_final": self.source_final,
            "tail_fit": self.tail_fit.to_dict() if self.tail_fit else None,
        }


def replay_curve(source: Curve, target: Curve) -> ReplayCurve:
    """Builds a replay run's curves from its source-task and target-task evaluations."""
    src_c = source.flops * source.fraction
    tgt_c = target.flops * target.fraction
    tail = None
    if len(source.loss):
        peak = int(np.argmax(source.loss))
        c_tail, l_tail = src_c[peak:], source.loss[peak:]
        ok = np.isfinite(c_tail) & (c_tail > 0)
        if len(np.unique(c_tail[ok])) >= 3:
            tail = robust_fit.fit_power(
                c_tail[ok], l_tail[ok], runs=[source.run_id] * int(ok.sum())
            )
    nan = float("nan")
    return ReplayCurve(
        run_id=source.run_id,
        replay_ratio=source.replay_ratio,
        n_params=source.n_params,
        source_compute=src_c,
        source_loss=source.loss,
        target_compute=tgt_c,
        target_loss=target.loss,
        source_start=float(source.loss[0]) if len(source.loss) else nan,
        source_peak=float(source.loss.max()) if len(source.loss) else nan,
        source_final=float(source.loss[-1]) if len(source.loss) else nan,
        tail_fit=tail,
    )
