"""PNG figures of zero-shot accuracy, after the CPT paper's Fig. 3 (accuracy per language and
strategy) and Fig. 6 (accuracy against the replay ratio), with binomial confidence intervals and
the chance level drawn, so a reader sees at once whether a difference is larger than the noise.

Rows are plain mappings (`language`, `strategy`, `acc`, `lo`, `hi`, `chance`, and `ratio` for
replay), so the figures do not depend on how the scores were read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fitting.reports.plots import _COLORS, _figure, _log, _save

_LABELS = {"source": "source (en)", "scratch": "scratch", "cpt": "CPT", "cpt_replay": "CPT+replay"}


def accuracy_by_strategy(
    rows: Sequence[Mapping[str, Any]], path: Path, *, title: str, strategies: Sequence[str]
) -> Path:
    """Grouped bars: one group per language, one bar per strategy, 95% intervals as error bars,
    each language's chance level as a dotted line (CPT paper Fig. 3)."""
    fig, (ax,) = _figure(size=(6.5, 4.5))
    langs = list(dict.fromkeys(r["language"] for r in rows))
    width = 0.8 / max(1, len(strategies))
    for j, strategy in enumerate(strategies):
        for i, lang in enumerate(langs):
            match = [r for r in rows if r["language"] == lang and r["strategy"] == strategy]
            if not match:
                continue
            r = match[0]
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(
                x,
                r["acc"],
                width,
                color=_COLORS.get(strategy, "tab:gray"),
                label=_LABELS.get(strategy, strategy) if i == 0 else None,
                yerr=[[r["acc"] - r["lo"]], [r["hi"] - r["acc"]]],
                capsize=3,
            )
    for i, lang in enumerate(langs):
        chance = [r["chance"] for r in rows if r["language"] == lang and r.get("chance")]
        if chance:
            ax.hlines(chance[0], i - 0.45, i + 0.45, colors="black", linestyles=":")
    ax.set_xticks(range(len(langs)), langs)
    ax.set_ylabel("acc_norm (95% Wilson interval; dotted: chance)")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def accuracy_vs_replay(
    rows: Sequence[Mapping[str, Any]], path: Path, *, title: str, languages: Sequence[str]
) -> Path:
    """One line per language: accuracy against the replay ratio with 95% intervals, chance
    dotted (CPT paper Fig. 6); the source model, if given (`ratio` None), as a dashed level."""
    fig, (ax,) = _figure(size=(6.5, 4.5))
    # A study of several target languages plots two lines per target (its own and the source).
    colors = ("tab:green", "tab:red", "tab:blue", "tab:purple", *(f"C{i}" for i in range(4, 10)))
    for i, lang in enumerate(languages):
        color = colors[i % len(colors)]
        points = sorted(
            (r for r in rows if r["language"] == lang and r.get("ratio") is not None),
            key=lambda r: r["ratio"],
        )
        if points:
            xs = [100 * r["ratio"] for r in points]
            ys = [r["acc"] for r in points]
            err = [[r["acc"] - r["lo"] for r in points], [r["hi"] - r["acc"] for r in points]]
            ax.errorbar(xs, ys, yerr=err, color=color, marker="o", capsize=3, label=lang)
        source = [r for r in rows if r["language"] == lang and r.get("ratio") is None]
        if source:
            ax.axhline(source[0]["acc"], color=color, linestyle="--", label=f"{lang}, source model")
        chance = [r["chance"] for r in rows if r["language"] == lang and r.get("chance")]
        if chance:
            ax.axhline(chance[0], color="black", linestyle=":", linewidth=0.8)
    ax.set_xlabel("replay of the source language (% of tokens)")
    ax.set_ylabel("acc_norm (95% Wilson interval; dotted: chance)")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def accuracy_by_size(entry: Mapping[str, Any], path: Path, *, title: str) -> Path:
    """CPT paper Fig. 3 at every size present: each model's mean acc_norm over the target
    language's benchmarks against its non-embedding N, one line per model (source, scratch,
    CPT), the size the bars show marked (`fitting.analyses.zeroshot_figures.fig3` entry's
    `by_size`)."""
    fig, (ax,) = _figure(size=(6.5, 4.5))
    points = entry["by_size"]
    xs = [p["size"] for p in points]
    for strategy in entry["acc_norm"]:
        ys = [p["average"][strategy] for p in points]
        ax.plot(
            xs,
            ys,
            "-o",
            color=_COLORS.get(strategy, "tab:gray"),
            label=_LABELS.get(strategy, strategy),
        )
    ax.axvline(entry["size"], color="black", linestyle=":", linewidth=0.8, label="bars' size")
    _log(ax, y=False)
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("mean acc_norm over the benchmarks each size has")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)
