"""A designed (or adaptive) sweep against the full sweep: estimates and intervals against compute.

Input: per sweep ("full", "designed", "adaptive", ...) a list of `fitting.design.snapshots.Snapshot`
(compute spent, fitted parameters, 95% intervals), one per refit. `section` writes the markdown
(the final fit of each sweep side by side: compute, each parameter's value and interval, whether
the other sweeps' values lie in the full sweep's interval), `plot` the figure: per parameter, its
estimate with the interval as a band (left) and the interval's relative width (right) against
chip-hours, every sweep in its own colour on the same axes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from fitting.design.snapshots import Snapshot
from fitting.formats import fmt, markdown_table
from fitting.reports import plots

FULL = "full"
_COLORS = ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red")


def _check(sweeps: Mapping[str, Sequence[Snapshot]]) -> None:
    empty = [name for name, snaps in sweeps.items() if not snaps]
    if not sweeps or empty:
        raise ValueError(f"design report: every sweep needs snapshots; empty: {empty or 'all'}")


def _names(sweeps: Mapping[str, Sequence[Snapshot]], params: Sequence[str] | None) -> list[str]:
    known = {n for snaps in sweeps.values() for n in snaps[-1].params}
    if params is None:
        first = next(iter(sweeps.values()))[-1]
        return [n for n in first.params if all(n in s[-1].params for s in sweeps.values())]
    unknown = [p for p in params if p not in known]
    if unknown:
        raise ValueError(f"design report: unknown parameters {unknown}; known: {sorted(known)}")
    return list(params)


def _interval(s: Snapshot, name: str) -> str:
    if name not in s.ci:
        return fmt(s.params.get(name))
    lo, hi = s.ci[name]
    return f"{fmt(s.params[name])} [{fmt(lo)}, {fmt(hi)}]"


def section(
    sweeps: Mapping[str, Sequence[Snapshot]],
    *,
    title: str = "Designed sweep against the full sweep",
    params: Sequence[str] | None = None,
    plot_path: str | None = None,
) -> str:
    """The markdown section (see the module docstring); `plot_path` is linked when given.

    Raises:
      ValueError: no sweeps, a sweep without snapshots, or unknown `params`.
    """
    _check(sweeps)
    names = _names(sweeps, params)
    finals = {k: v[-1] for k, v in sweeps.items()}
    full = finals.get(FULL)
    lines = [f"## {title}", ""]
    spent = ", ".join(f"{k} {fmt(s.chip_hours)} chip-hours" for k, s in finals.items())
    if full is not None and full.chip_hours > 0:
        spent += (
            " ("
            + ", ".join(
                f"{k} {s.chip_hours / full.chip_hours:.1%} of full"
                for k, s in finals.items()
                if k != FULL
            )
            + ")"
        )
    lines += [f"Compute at the last refit: {spent}.", ""]
    header = ["parameter", *(f"{k} (95% CI)" for k in finals)]
    others = [k for k in finals if k != FULL]
    if full is not None:
        header += [f"{k} in full CI" for k in others]
    rows = []
    for n in names:
        row = [n, *(_interval(s, n) for s in finals.values())]
        if full is not None:
            for k in others:
                if n in full.ci:
                    lo, hi = full.ci[n]
                    row.append("yes" if lo <= finals[k].params[n] <= hi else "NO")
                else:
                    row.append("—")
        rows.append(row)
    lines += markdown_table(header, rows)
    if plot_path:
        lines += ["", f"![estimates and interval widths against compute]({plot_path})"]
    return "\n".join(lines) + "\n"


def plot(
    sweeps: Mapping[str, Sequence[Snapshot]],
    path: str | Path,
    *,
    params: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Writes the PNG (see the module docstring): one row per parameter, estimate and band on
    the left, relative interval width on the right, chip-hours on a log axis.

    Raises:
      ValueError: no sweeps, a sweep without snapshots, or unknown `params`.
    """
    _check(sweeps)
    names = _names(sweeps, params)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 2.4 * len(names)))
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.05, top=0.95, hspace=0.45, wspace=0.3)
    for row, name in enumerate(names):
        est = fig.add_subplot(len(names), 2, 2 * row + 1)
        wid = fig.add_subplot(len(names), 2, 2 * row + 2, sharex=est)
        for i, (sweep, snaps) in enumerate(sweeps.items()):
            color = _COLORS[i % len(_COLORS)]
            x = [s.chip_hours for s in snaps if name in s.params]
            y = [s.params[name] for s in snaps if name in s.params]
            est.plot(x, y, "o-", color=color, lw=1.2, ms=3, label=sweep)
            band = [(s.chip_hours, *s.ci[name]) for s in snaps if name in s.ci]
            if band:
                bx, lo, hi = zip(*band, strict=True)
                est.fill_between(bx, lo, hi, color=color, alpha=0.2, lw=0)
            w = [(s.chip_hours, s.width(name)) for s in snaps if math.isfinite(s.width(name))]
            if w:
                wid.plot(*zip(*w, strict=True), "o-", color=color, lw=1.2, ms=3, label=sweep)
        est.set_title(name, fontsize=9)
        est.set_ylabel("estimate (95% CI)")
        wid.set_ylabel("CI width / value")
        for ax in (est, wid):
            plots._log(ax, y=False)
        if row == 0:
            est.legend(fontsize=8)
            if title:
                fig.suptitle(title, fontsize=10)
        if row == len(names) - 1:
            est.set_xlabel("chip-hours spent")
            wid.set_xlabel("chip-hours spent")
    return plots._save(fig, path)
