"""PNG figures of the fits, after the papers' figures (matplotlib, Agg canvas, no pyplot state).

- `loss_compute`: loss against compute for every run with the frontier and its fits (CPT Fig. 1);
- `transfer`: FLOPs saved and effectively transferred data along training (CPT Fig. 2);
- `replay`: source- and target-language loss against per-language compute (CPT Fig. 4);
- `isoloss`: IsoLoss contours with both compute-optimal frontiers (CPT Fig. 5);
- `downstream`: scores or cross-entropy against pretraining tokens with the fitted laws, held-out
  points hollow, the non-pretrained baseline dashed (MT Figs. 2–4).
Every figure title says when a fit did not converge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fitting.allocation import compute_optimal, isoloss_grid
from fitting.downstream import DownstreamFit
from fitting.fit import FitResult
from fitting.frontier import Frontier
from fitting.points import Curve
from fitting.transfer import ReplayCurve, TransferCurve

_COLORS = {
    "source": "tab:green",
    "scratch": "tab:blue",
    "cpt": "tab:orange",
    "cpt_replay": "tab:red",
}


def _figure(ncols: int = 1, size: tuple[float, float] = (6.0, 4.5)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(size[0] * ncols, size[1]))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    # Fixed margins: automatic layout engines measure every tick label and cost seconds per figure.
    fig.subplots_adjust(left=0.1 / ncols + 0.04, right=0.97, bottom=0.12, top=0.9, wspace=0.3)
    return fig, axes


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _log(ax, *, x: bool = True, y: bool = True) -> None:
    """Log axes without minor tick labels (they overlap on short ranges)."""
    from matplotlib.ticker import NullFormatter

    for on, axis, set_scale in ((x, ax.xaxis, ax.set_xscale), (y, ax.yaxis, ax.set_yscale)):
        if on:
            set_scale("log")
            axis.set_minor_formatter(NullFormatter())


def _flag(fit: FitResult | DownstreamFit | None) -> str:
    return "" if fit is None or fit.converged else " [NOT CONVERGED]"


def loss_compute(
    curves: Mapping[str, Sequence[Curve]],
    frontiers: Mapping[str, Frontier],
    path: Path,
    *,
    title: str,
) -> Path:
    """Every run's loss against compute, frontier points and the fitted power laws (Fig. 1)."""
    fig, (ax,) = _figure()
    for group, cs in curves.items():
        color = _COLORS.get(group, "tab:gray")
        for i, c in enumerate(cs):
            ok = c.flops > 0
            ax.plot(
                c.flops[ok],
                c.loss[ok],
                color=color,
                alpha=0.45,
                lw=1,
                label=group if i == 0 else None,
            )
    flags = ""
    for group, fr in frontiers.items():
        color = _COLORS.get(group, "tab:gray")
        if len(fr.C):
            ax.plot(fr.C, fr.L, "o", color=color, ms=4, mfc="none")
            grid = np.geomspace(fr.C.min(), fr.C.max(), 100)
            if fr.power is not None:
                p = fr.power.params
                ax.plot(
                    grid,
                    fr.power.predict(grid),
                    ":",
                    color=color,
                    label=f"{group}: L={p['k']:.5g}·C^-{p['g']:.4g}",
                )
                flags += _flag(fr.power)
    _log(ax)
    ax.set_xlabel("compute C (FLOPs)")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title(title + flags)
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def transfer(curves: Sequence[TransferCurve], path: Path, *, title: str) -> Path:
    """FLOPs saved and effectively transferred data against CPT tokens, one line per size."""
    fig, (ax1, ax2) = _figure(2)
    for c in sorted(curves, key=lambda c: c.n_params):
        label = f"N={c.n_params:.3g}"
        ax1.plot(c.tokens, 100 * c.flops_saved, "-o", ms=3, label=label)
        ax2.plot(c.tokens, c.transferred, "-o", ms=3, label=label)
    _log(ax1, y=False)
    ax1.set_xlabel("CPT tokens D")
    ax1.set_ylabel("FLOPs saved (C_PT − C_CPT)/C_PT (%)")
    _log(ax2, y=False)
    ax2.set_xlabel("CPT tokens D")
    ax2.set_ylabel("effectively transferred data D_PT − D_CPT (tokens)")
    ax1.set_title(title)
    for ax in (ax1, ax2):
        ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def replay(curves: Sequence[ReplayCurve], path: Path, *, title: str) -> Path:
    """Source- and target-language loss against compute allocated to each language (Fig. 4)."""
    import matplotlib

    fig, (ax1, ax2) = _figure(2)
    cmap = matplotlib.colormaps["Blues"]
    ratios = sorted({c.replay_ratio for c in curves})
    for c in sorted(curves, key=lambda c: c.replay_ratio):
        shade = 0.35 + 0.65 * (ratios.index(c.replay_ratio) / max(len(ratios) - 1, 1))
        label = f"replay {c.replay_ratio:.0%}"
        ok = c.source_compute > 0
        ax1.plot(
            c.source_compute[ok], c.source_loss[ok], "-o", ms=3, color=cmap(shade), label=label
        )
        ok = c.target_compute > 0
        ax2.plot(
            c.target_compute[ok], c.target_loss[ok], "-o", ms=3, color=cmap(shade), label=label
        )
    for ax, which in ((ax1, "source"), (ax2, "target")):
        _log(ax)
        ax.set_xlabel(f"{which}-language compute (FLOPs × {which} share)")
        ax.set_ylabel(f"{which}-language validation loss")
        ax.legend(fontsize=7, loc="upper right")
    ax1.set_title(title)
    return _save(fig, path)


def isoloss(
    fits: Mapping[str, FitResult], path: Path, *, compute: tuple[float, float], title: str
) -> Path:
    """IsoLoss contours of each law over (C, N) with every law's efficient frontier (Fig. 5)."""
    fig, axes = _figure(len(fits))
    allocs = {name: compute_optimal(f) for name, f in fits.items()}
    c_grid = np.geomspace(*compute, 50)
    n_vals = [a.n_opt(c_grid) for a in allocs.values() if a.valid]
    lo = min([1e6] + [float(v.min()) / 10 for v in n_vals])
    hi = max([1e11] + [float(v.max()) * 10 for v in n_vals])
    for ax, (name, f) in zip(axes, fits.items(), strict=True):
        cc, nn, ll = isoloss_grid(f.law, f.params, compute=compute, n_params=(lo, hi))
        levels = np.unique(np.quantile(ll[np.isfinite(ll)], np.linspace(0.02, 0.9, 10)))
        cs = ax.contour(cc, nn, ll, levels=levels, cmap="viridis", linewidths=0.8)
        ax.clabel(cs, fontsize=6, fmt="%.3g")
        for other, a in allocs.items():
            if a.valid:
                ax.plot(
                    c_grid,
                    a.n_opt(c_grid),
                    lw=2,
                    color=_COLORS.get(other, "k"),
                    label=f"{other}: N_opt={a.n_coef:.4g}·C^{a.a:.4g}",
                )
        _log(ax)
        ax.set_xlabel("compute C (FLOPs)")
        ax.set_ylabel("parameters N")
        ax.set_title(f"{title}: {name} law IsoLoss{_flag(f)}")
        ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def downstream(
    series: Sequence[tuple[str, DownstreamFit, float | None]],
    path: Path,
    *,
    ylabel: str,
    title: str,
) -> Path:
    """Downstream metric against pretraining tokens with fitted laws; held-out points hollow."""
    fig, (ax,) = _figure()
    for i, (label, fit, baseline) in enumerate(series):
        color = f"C{i % 10}"
        ax.plot(fit.Dp[fit.fitted], fit.observed[fit.fitted], "o", color=color, label=label)
        ax.plot(fit.Dp[~fit.fitted], fit.observed[~fit.fitted], "o", mfc="none", color=color)
        grid = np.geomspace(fit.Dp.min(), fit.Dp.max() * 2, 200)
        ax.plot(
            grid,
            fit.predict(grid),
            "--",
            color=color,
            lw=1,
            label=f"law{_flag(fit)}, held-out error {fit.prediction_error:.3g}",
        )
        if baseline is not None:
            ax.axhline(baseline, color=color, ls=":", lw=1)
    _log(ax, y=False)
    ax.set_xlabel("pretraining tokens Dp")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=6, loc="lower right")
    return _save(fig, path)
