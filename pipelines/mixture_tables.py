"""The mixtures of xlscale as plain tables: names, components and token fractions, no seqio.

`RATIOS` maps a mixture name to `{task name: fraction of tokens}`:

- the MT paper's pretraining mixtures of span-corruption tasks, `mix_<lang>_<pct>[_<lang>_<pct>]`:
  100% en/de/fr/ro, 50/50 en-de, en-fr, en-ro, and 30/70, 70/30 en-fr;
- the CPT paper's replay mixtures of LM tasks, `cpt_<target>_replay_en_<pct>` for targets zh, fr,
  ru and English replay pct in {0, 1, 5, 10, 20, 30, 50, 80}. Replay is nothing but a mixture;
  pct 0 keeps `lm_en` as a component with fraction 0, so every replay run reports the same
  components (and `tokens_by_task["lm_en"] == 0`).

`pipelines.mixtures` registers these tables as seqio mixtures; a run on prepared data reads its
components and fractions from here (`components`, `fractions`) and never imports seqio.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipelines.names import lm_task_name, span_task_name

# The MT paper (Isik et al. 2024), Figures 2-4: pretraining language shares in percent.
MT_MIXES: tuple[dict[str, int], ...] = (
    {"en": 100},
    {"de": 100},
    {"fr": 100},
    {"ro": 100},
    {"en": 50, "de": 50},
    {"en": 50, "fr": 50},
    {"en": 50, "ro": 50},
    {"en": 30, "fr": 70},
    {"en": 70, "fr": 30},
)
# The CPT paper (Zheng et al. 2024), section 5.2: English replay during continual pretraining.
CPT_TARGETS: tuple[str, ...] = ("zh", "fr", "ru")
CPT_SOURCE = "en"
REPLAY_PCTS: tuple[int, ...] = (0, 1, 5, 10, 20, 30, 50, 80)


def mix_name(shares: Mapping[str, int]) -> str:
    """Returns `mix_<lang>_<pct>_...` for `{lang: pct}` in the given order."""
    return "mix_" + "_".join(f"{lang}_{pct}" for lang, pct in shares.items())


def cpt_name(target: str, source: str, pct: int) -> str:
    """Returns `cpt_<target>_replay_<source>_<pct>`."""
    return f"cpt_{target}_replay_{source}_{pct}"


def default_ratios() -> dict[str, dict[str, float]]:
    """Builds the mapping mixture name -> {task: token fraction} of both papers."""
    ratios: dict[str, dict[str, float]] = {}
    for shares in MT_MIXES:
        ratios[mix_name(shares)] = {span_task_name(lang): p / 100 for lang, p in shares.items()}
    for target in CPT_TARGETS:
        for pct in REPLAY_PCTS:
            ratios[cpt_name(target, CPT_SOURCE, pct)] = {
                lm_task_name(target): (100 - pct) / 100,
                lm_task_name(CPT_SOURCE): pct / 100,
            }
    return ratios


RATIOS: dict[str, dict[str, float]] = default_ratios()


def validate(name: str, fractions: Mapping[str, float]) -> None:
    """Refuses a mixture whose fractions are empty, negative or do not sum to 1 (ValueError)."""
    if not fractions or any(f < 0 for f in fractions.values()):
        raise ValueError(f"mixture {name!r}: fractions must be non-negative, got {fractions}")
    if abs(sum(fractions.values()) - 1.0) > 1e-6:
        raise ValueError(f"mixture {name!r}: fractions must sum to 1, got {fractions}")


def components(mixture_or_task: str) -> list[str]:
    """The components of a mixture of `RATIOS` in seqio's order (sorted by name), which is the
    order of `decoder_task_ids`; any other name is a task and gives `[name]`."""
    if mixture_or_task in RATIOS:
        return sorted(RATIOS[mixture_or_task])
    return [mixture_or_task]


def fractions(mixture_or_task: str) -> dict[str, float]:
    """`{component: fraction of tokens}` of a mixture of `RATIOS` (normalised, in `components`
    order); any other name is a task and gives `{name: 1.0}`."""
    if mixture_or_task not in RATIOS:
        return {mixture_or_task: 1.0}
    table = RATIOS[mixture_or_task]
    total = sum(table.values())
    if total <= 0:
        raise ValueError(f"mixture {mixture_or_task!r} has no positive rate")
    return {name: float(table[name]) / total for name in components(mixture_or_task)}


def replay_fraction(
    *, mixture_or_task: str, target_lang: str | None, source_lang: str | None
) -> float:
    """The share of source-language tokens `mixture_or_task` replays into a run on `target_lang`:
    the `lm_<source>` fraction of a mixture of `RATIOS` that also holds `lm_<target>`, else 0 (a
    task, or a mixture without both languages). This, not the `REPLAY_RATIO` asked for, is what
    the data applies and `run.json` may record."""
    if not (target_lang and source_lang) or target_lang == source_lang:
        return 0.0
    table = RATIOS.get(mixture_or_task, {})
    if lm_task_name(target_lang) not in table:
        return 0.0
    return float(table.get(lm_task_name(source_lang), 0.0))
