"""The MT paper's translation alignment score (Isik et al. 2024, Definition 1, eq. 2).

A(D, T(src, dst)) = P_src·P_dst + 0.7·P_src + 0.8·P_dst, with P the fractions of the pretraining
mixture in the task's source and destination languages: 50% en + 50% fr for en→fr scores 1.0,
100% en scores 0.7, 100% fr 0.8, a mixture with neither language 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_MIX = re.compile(r"^mix((?:_[a-z]{2}_\d+(?:\.\d+)?)+)$")
_CPT = re.compile(r"^cpt_([a-z]{2})_replay_([a-z]{2})_(\d+(?:\.\d+)?)$")
_LANG = re.compile(r"^(?:(?:lm|span)_)?([a-z]{2})$")


def mixture_fractions(mixture: Mapping[str, float] | str) -> dict[str, float]:
    """Language → fraction of the pretraining mixture, normalised to sum to 1.

    Accepts a mapping (fractions or percentages), a mixture name of xlscale's registry
    (`mix_en_50_fr_50`, `cpt_zh_replay_en_5`), a task name (`lm_en`, `span_de`) or a language code.

    Raises:
      ValueError: an unparseable name, negative shares, or an empty mixture.
    """
    if isinstance(mixture, str):
        name = mixture.strip()
        if m := _MIX.match(name):
            parts = m.group(1).strip("_").split("_")
            shares = {parts[i]: float(parts[i + 1]) for i in range(0, len(parts), 2)}
        elif m := _CPT.match(name):
            pct = float(m.group(3))
            shares = {m.group(1): 100.0 - pct, m.group(2): pct}
        elif m := _LANG.match(name):
            shares = {m.group(1): 1.0}
        else:
            raise ValueError(f"alignment: cannot read a mixture from {mixture!r}")
    else:
        shares = {str(k): float(v) for k, v in mixture.items()}
    if any(v < 0 for v in shares.values()):
        raise ValueError(f"alignment: negative share in {shares}")
    total = sum(shares.values())
    if not total > 0:
        raise ValueError(f"alignment: empty mixture {shares}")
    return {k: v / total for k, v in shares.items()}


def score(mixture: Mapping[str, float] | str, source: str, target: str) -> float:
    """Translation alignment score of a pretraining mixture for the task source → target (eq. 2).

    Args:
      mixture: language shares (see `mixture_fractions`).
      source, target: the translation task's languages (ISO 639-1).
    """
    p = mixture_fractions(mixture)
    ps, pd = p.get(source, 0.0), p.get(target, 0.0)
    return ps * pd + 0.7 * ps + 0.8 * pd
