"""PNG figures of the fits, after the papers' figures (matplotlib, Agg canvas, no pyplot state).

- `loss_compute`: loss against compute for every run with the frontier and its fits (CPT Fig. 1);
- `transfer`: FLOPs saved and effectively transferred data along training (CPT Fig. 2);
- `replay`: source- and target-language loss against per-language compute (CPT Fig. 4);
- `isoloss`: IsoLoss contours with both compute-optimal frontiers (CPT Fig. 5);
- `downstream`: scores or cross-entropy against pretraining tokens with the fitted laws, held-out
  points hollow, the non-pretrained baseline dashed (MT Figs. 2–4);
- `downstream_grid`: the same as a grid of panels (rows: metrics, columns: pretraining data),
  one line style per finetuning size and the baselines black (the layout of MT Figs. 2–3);
- `score_vs_ce`: a translation score against downstream cross-entropy, log–log (MT Fig. 5).
Every figure title says when a fit did not converge.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fitting.analyses.allocation import compute_optimal, isoloss_grid
from fitting.analyses.frontier import Frontier
from fitting.analyses.transfer import ReplayCurve, TransferCurve
from fitting.laws.downstream_laws import DownstreamFit
from fitting.laws.robust_fit import FitResult
from fitting.readers.points import Curve
from rundir import storage

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


def compact_number(value: float) -> str:
    """A short tick label: 3 significant digits with a k/M/G/T suffix (250000 -> "250k"), so
    that the labels of a log axis spanning less than a decade do not run into each other."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _short_log_ticks(ax) -> None:
    """Labels log axes that span less than a decade: they would show no major tick at all."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    for axis, scale, limits in (
        (ax.xaxis, ax.get_xscale(), ax.get_xlim()),
        (ax.yaxis, ax.get_yscale(), ax.get_ylim()),
    ):
        lo, hi = sorted(limits)
        if scale == "log" and lo > 0 and hi / lo < 10:
            axis.set_major_locator(MaxNLocator(nbins=5))
            axis.set_major_formatter(FuncFormatter(lambda v, _: compact_number(v)))


def _save(fig, path):
    """Writes the figure as PNG to `path` (local or object storage: rendered in memory)."""
    for ax in fig.axes:
        _short_log_ticks(ax)
    path = storage.as_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    storage.write_bytes(path, buffer.getvalue())
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
    labelled: set[float] = set()
    for c in sorted(curves, key=lambda c: c.replay_ratio):
        shade = 0.35 + 0.65 * (ratios.index(c.replay_ratio) / max(len(ratios) - 1, 1))
        # Plain CPT and 0% replay are the same design: one legend entry per ratio.
        label = None if c.replay_ratio in labelled else f"replay {c.replay_ratio:.0%}"
        labelled.add(c.replay_ratio)
        ok = c.source_compute > 0
        if np.any(ok):
            ax1.plot(
                c.source_compute[ok], c.source_loss[ok], "-o", ms=3, color=cmap(shade), label=label
            )
        elif np.isfinite(c.source_final):
            # No source compute to plot against: show where forgetting left the source loss.
            ax1.axhline(
                c.source_final,
                ls="--",
                color=cmap(shade),
                label=None if label is None else f"{label} (final; no source compute)",
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
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
        else:  # say so on the figure, rather than leave an empty legend (the report says why)
            ax.text(0.02, 0.02, "no law has an interior compute optimum", fontsize=7,
                    transform=ax.transAxes)  # fmt: skip
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


@dataclasses.dataclass(frozen=True)
class SeriesStyle:
    """One (pretraining data, finetuning size) series of the MT figures and how to draw it.

    Attributes:
      label: legend text.
      Dp: pretraining tokens of each finetuned checkpoint.
      values: the metric of each checkpoint (same order as Dp).
      fit: the law fitted to the series, if any (None: points only, e.g. a BLEU of 0).
      baseline: the non-pretrained model's value (drawn as a black horizontal line).
      color, linestyle: the paper's convention is one colour per pretraining data and one line
        style per finetuning size (dotted, dashed, solid as Df grows).
    """

    label: str
    Dp: np.ndarray
    values: np.ndarray
    fit: DownstreamFit | None = None
    baseline: float | None = None
    color: str = "C0"
    linestyle: str = "--"


def _series(ax, s: SeriesStyle) -> None:
    dp, y = np.asarray(s.Dp, float), np.asarray(s.values, float)
    order = np.argsort(dp, kind="stable")
    dp, y = dp[order], y[order]
    fitted = np.ones(len(dp), bool) if s.fit is None else np.asarray(s.fit.fitted, bool)
    if len(fitted) != len(dp):
        fitted = np.ones(len(dp), bool)
    ax.plot(dp[fitted], y[fitted], "o", color=s.color, ms=4, label=s.label)
    ax.plot(dp[~fitted], y[~fitted], "o", mfc="none", color=s.color, ms=5)
    if s.fit is not None and len(dp):
        grid = np.geomspace(dp.min(), dp.max(), 200)
        with np.errstate(invalid="ignore", divide="ignore"):
            pred = s.fit.predict(grid)
        err = s.fit.prediction_error
        text = f"law{_flag(s.fit)}, held-out err {err:.3g}" if np.isfinite(err) else "law"
        ax.plot(grid, pred, s.linestyle, color=s.color, lw=1.2, label=text)
    elif len(dp) > 1:
        ax.plot(dp, y, s.linestyle, color=s.color, lw=0.8, alpha=0.5)
    if s.baseline is not None and np.isfinite(s.baseline):
        ax.axhline(s.baseline, color="black", ls=s.linestyle, lw=1)


def downstream_grid(
    cells: Sequence[Sequence[tuple[str, str, Sequence[SeriesStyle]]]],
    path: Path,
    *,
    title: str,
) -> Path:
    """A grid of downstream panels after the MT paper's Figs. 2–3.

    Each panel plots a metric against pretraining tokens Dp (log x): the points used for the fit
    filled, the held-out points hollow, the fitted law in the series' line style, and the
    non-pretrained baseline as a black horizontal line in the same style.

    Args:
      cells: rows of panels; a panel is (panel title, y label, series).
      path: where the PNG goes.
      title: the figure's title.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nrows = len(cells)
    ncols = max((len(r) for r in cells), default=1)
    fig = Figure(figsize=(5.0 * ncols, 3.6 * nrows))
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.06, top=0.93, wspace=0.25, hspace=0.35)
    for i, row in enumerate(cells):
        for j, (panel_title, ylabel, series) in enumerate(row):
            ax = fig.add_subplot(nrows, ncols, i * ncols + j + 1)
            for s in series:
                _series(ax, s)
            _log(ax, y=False)
            ax.set_xlabel("pretraining tokens Dp")
            ax.set_ylabel(ylabel)
            fits = [s.fit for s in series if s.fit is not None]
            failed = sum(not f.converged for f in fits)
            flags = f" [{failed} of {len(fits)} fits NOT CONVERGED]" if failed else ""
            ax.set_title(panel_title + flags, fontsize=9)
            ax.legend(fontsize=6, loc="best")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def score_vs_ce(
    series: Sequence[SeriesStyle],
    path: Path,
    *,
    ce: Mapping[str, Sequence[float]],
    baselines: Sequence[tuple[str, float, float]] = (),
    ylabel: str = "BLEU",
    title: str,
) -> Path:
    """A translation score against downstream cross-entropy, log–log (the MT paper's Fig. 5).

    Points of a series are joined in order of pretraining size, so a segment going up and to the
    right (score and cross-entropy both rising) shows the two metrics disagreeing. Points with a
    non-positive score cannot sit on a log axis; the title says how many were left out.

    Args:
      series: the score of each checkpoint (`values`), with its Dp, label and style.
      ce: series label → downstream cross-entropy of the same checkpoints (same order as `Dp`).
      baselines: (label, cross-entropy, score) of the non-pretrained models, drawn black.
      ylabel: the score's name.
      title: the figure's title.
    """
    fig, (ax,) = _figure()
    dropped = 0
    markers = "os^Dv<>p"
    for i, s in enumerate(series):
        x = np.asarray(ce[s.label], float)
        y = np.asarray(s.values, float)
        order = np.argsort(np.asarray(s.Dp, float), kind="stable")
        x, y = x[order], y[order]
        ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
        dropped += int(np.sum(~ok))
        ax.plot(
            x[ok],
            y[ok],
            s.linestyle,
            marker=markers[i % len(markers)],
            color=s.color,
            ms=4,
            lw=1,
            label=s.label,
        )
        if ok.any():  # the largest Dp, so the direction of travel is visible
            ax.plot(x[ok][-1], y[ok][-1], marker=markers[i % len(markers)], color=s.color, ms=8)
    for j, (label, x, y) in enumerate(baselines):
        if x > 0 and y > 0:
            ax.plot([x], [y], "*XP"[j % 3], color="black", ms=9, label=label)
        else:
            dropped += 1
    _log(ax)
    ax.set_xlabel("downstream cross-entropy (nats)")
    ax.set_ylabel(ylabel)
    note = f" ({dropped} point(s) with score 0 not shown)" if dropped else ""
    ax.set_title(title + note, fontsize=9)
    ax.legend(fontsize=6, loc="best")
    return _save(fig, path)


def zeroshot_strategies(entry: Mapping, path: Path, *, title: str) -> Path:
    """CPT paper Fig. 3 for one target language: acc_norm per benchmark and their mean, one bar
    per model (source, scratch, CPT), each benchmark's chance level dotted
    (`fitting.analyses.zeroshot_figures.fig3` entry)."""
    fig, (ax,) = _figure(size=(6.5, 4.5))
    groups = [*entry["benchmarks"], "average"]
    strategies = list(entry["acc_norm"])
    width = 0.8 / len(strategies)
    for j, s in enumerate(strategies):
        ys = [entry["acc_norm"][s][t] for t in entry["benchmarks"]] + [entry["average"][s]]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        ax.bar(xs, ys, width, color=_COLORS.get(s, "tab:gray"), label=s)
    for i, t in enumerate(entry["benchmarks"]):
        if entry["chance"].get(t):
            ax.hlines(entry["chance"][t], i - 0.45, i + 0.45, colors="black", linestyles=":")
    ax.set_xticks(range(len(groups)), groups, rotation=20, fontsize=8)
    ax.set_ylabel("acc_norm (dotted: chance)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def zeroshot_replay(entry: Mapping, path: Path, *, title: str) -> Path:
    """CPT paper Fig. 6: relative performance (acc_norm ÷ the best across every training setting
    of that size, the source-only and scratch models included) vs the source-language replay
    ratio, one panel per benchmark group, one line per benchmark plus the group's mean; the
    source-only model's mean at 100% and the scratch model's as a dashed level
    (`fitting.analyses.zeroshot_figures.fig6` entry)."""
    groups = entry["groups"]
    fig, axes = _figure(ncols=len(groups), size=(5.0, 4.0))
    xs = [100 * s["ratio"] for s in entry["settings"]]
    for ax, (group, tasks) in zip(axes, groups.items(), strict=True):
        for t in tasks:
            ax.plot(xs, [s["relative"][t] for s in entry["settings"]], "-o", ms=3, label=t)
        mean = [s["group_relative"][group] for s in entry["settings"]]
        ax.plot(xs, mean, "-s", color="black", lw=2, label="mean")
        for ref in entry.get("references", ()):  # in the denominator too
            value = ref["group_relative"][group]
            if ref["setting"] == "source":
                ax.plot([100], [value], "*", color="black", ms=10, label="source only (mean)")
            else:
                ax.axhline(value, color="gray", linestyle="--", label=f"{ref['setting']} (mean)")
        ax.set_xlabel("replay of the source language (% of tokens)")
        ax.set_ylabel("relative performance")
        ax.set_title(f"{title}: {group}", fontsize=9)
        ax.legend(fontsize=7)
    return _save(fig, path)
