"""The loss–compute frontier and its power laws (CPT paper eq. 3 and §4.2, Fig. 1).

The frontier is the lowest loss reached at each compute level across runs: compute is binned on a
log scale, each bin keeps its lowest-loss evaluation, and a bin stays on the frontier only if it
beats every lower-compute bin (a frontier point is never dominated by a cheaper one). Two laws are
fitted to it: L = E' + A'/C^γ (eq. 3) and the pure power L = k·C^(−g) the paper reports
(33.69907·C^−0.0579 from scratch, 31.9594·C^−0.0575 for CPT). The bootstrap resamples whole runs,
rebuilds the frontier and refits, starting each refit from the full fit's optimum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from fitting.checks import FitInputError
from fitting.laws import formulas, robust_fit
from fitting.laws.robust_fit import FitResult


@dataclasses.dataclass(frozen=True)
class Frontier:
    """Frontier points and the laws fitted to them.

    Attributes:
      C, L: frontier compute and loss (increasing C, decreasing L).
      runs: the run each frontier point comes from.
      loss_compute: fit of L = E' + A'/C^γ (None with fewer than 3 points).
      power: fit of L = k·C^(−g) (None with fewer than 2 points).
    """

    C: np.ndarray
    L: np.ndarray
    runs: tuple[str, ...]
    loss_compute: FitResult | None
    power: FitResult | None

    def to_dict(self) -> dict:
        """JSON-ready dict (unrounded)."""
        return {
            "C": self.C.tolist(),
            "L": self.L.tolist(),
            "runs": list(self.runs),
            "loss_compute": self.loss_compute.to_dict() if self.loss_compute else None,
            "power": self.power.to_dict() if self.power else None,
        }


def frontier_points(
    C, L, runs: Sequence[str], *, bins_per_decade: int = 8
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Lowest loss per log-compute bin, kept only where it beats all cheaper bins."""
    C = np.asarray(C, np.float64)
    L = np.asarray(L, np.float64)
    ok = np.isfinite(C) & np.isfinite(L) & (C > 0) & (L > 0)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return np.empty(0), np.empty(0), ()
    bins = np.floor(np.log10(C[idx]) * bins_per_decade).astype(int)
    keep = []
    for b in np.unique(bins):
        members = idx[bins == b]
        keep.append(int(members[np.argmin(L[members])]))
    keep.sort(key=lambda i: C[i])
    front, best = [], np.inf
    for i in keep:
        if L[i] < best:
            front.append(i)
            best = L[i]
    return C[front], L[front], tuple(runs[i] for i in front)


def fit_frontier(
    C,
    L,
    runs: Sequence[str],
    *,
    delta: float = 1e-3,
    bootstrap: int = 0,
    seed: int = 0,
    bins_per_decade: int = 8,
) -> Frontier:
    """Builds the frontier of (C, L) evaluations and fits both compute laws to it.

    Raises:
      FitInputError: mismatched lengths.
    """
    C = np.asarray(C, np.float64)
    L = np.asarray(L, np.float64)
    if not (len(C) == len(L) == len(runs)):
        raise FitInputError(
            f"frontier: mismatched lengths (C={len(C)}, L={len(L)}, runs={len(runs)})"
        )
    fc, fl, fr = frontier_points(C, L, runs, bins_per_decade=bins_per_decade)
    distinct = len(np.unique(fc))  # each law needs as many distinct C as it has parameters
    lc = robust_fit.fit_loss_compute(fc, fl, delta=delta, runs=fr) if distinct >= 3 else None
    pw = robust_fit.fit_power(fc, fl, delta=delta, runs=fr) if distinct >= 2 else None
    if bootstrap > 0 and (lc or pw):
        lc, pw = _bootstrap(C, L, list(runs), lc, pw, delta, bootstrap, seed, bins_per_decade)
    return Frontier(fc, fl, fr, lc, pw)


def _bootstrap(C, L, runs, lc, pw, delta, n_boot, seed, bins_per_decade):
    """Resamples runs, rebuilds the frontier, refits from the full fits' optima."""
    rng = np.random.default_rng(seed)
    ids = sorted(set(runs))
    members = {r: np.flatnonzero(np.asarray(runs) == r) for r in ids}
    samples: dict[str, list[dict[str, float]]] = {"loss_compute": [], "power": []}
    for _ in range(n_boot):
        draw = rng.integers(0, len(ids), size=len(ids))
        idx, labels = [], []
        for j, d in enumerate(draw):
            m = members[ids[d]]
            idx.append(m)
            labels.extend([f"{ids[d]}#{j}"] * len(m))
        idx = np.concatenate(idx)
        fc, fl, fr = frontier_points(C[idx], L[idx], labels, bins_per_decade=bins_per_decade)
        for name, base, spec in (
            ("loss_compute", lc, formulas.fit_spec("loss_compute")),
            ("power", pw, formulas.fit_spec("power")),
        ):
            if base is None or len(np.unique(fc)) < len(spec.names):
                continue
            start = np.array([[base.log_params[n] for n in spec.names]])
            try:
                res = robust_fit.fit_law(
                    spec,
                    [fc],
                    fl,
                    delta=delta,
                    runs=fr,
                    starts=start,
                    iters=40,
                    input_names=("C",),
                )
            except FitInputError:
                continue
            if res.converged:
                samples[name].append(res.params)
    out = []
    for name, base in (("loss_compute", lc), ("power", pw)):
        if base is None:
            out.append(None)
            continue
        s = tuple(samples[name])
        out.append(
            dataclasses.replace(
                base,
                ci=robust_fit.percentile_cis(s),
                samples=s,
                n_bootstrap=n_boot,
                n_bootstrap_converged=len(s),
            )
        )
    return out[0], out[1]
