"""The CPT paper's runs as its comparisons read them: the sizes of Table 4 and their token counts.

Both reports on the CPT paper (Zheng et al. 2024) measure against the same grid of runs: the
comparison with a fit of real runs (`fitting.reports.cpt_comparison`) judges a fit's span against
it, and the paper-against-itself check (`fitting.reports.cpt_self_consistency`) evaluates
Table 2 on it. The grid is derived once here from `fitting.reports.paper_values.CPT_SETUP`, so
that the two never read the paper's sizes differently.
"""

from __future__ import annotations

from fitting.reports.paper_values import CPT_SETUP

PAPER_SIZES = tuple(m * 1e6 for m in CPT_SETUP["sizes_m"])
TOKENS_PER_PARAM = CPT_SETUP["tokens_per_param"]
# Sizes at which the consistency section evaluates Table 2: the paper's smallest, its 1.4B (§5.2,
# Figs. 3-4, 6), its largest (the 5.5B example).
CHECK_SIZES = (PAPER_SIZES[0], 1393e6, PAPER_SIZES[-1])
# The smallest and largest size, where their runs end (20×N tokens), and their compute there.
PAPER_N = (PAPER_SIZES[0], PAPER_SIZES[-1])
PAPER_RUN_END_TOKENS = (TOKENS_PER_PARAM * PAPER_N[0], TOKENS_PER_PARAM * PAPER_N[1])
PAPER_RUN_END_COMPUTE = tuple(6.0 * n * TOKENS_PER_PARAM * n for n in PAPER_N)


def size_name(n: float) -> str:
    """A model size as the paper names it (49M, 1.4B, 5.5B)."""
    return f"{n / 1e6:.0f}M" if n < 1e9 else f"{n / 1e9:.2g}B"
