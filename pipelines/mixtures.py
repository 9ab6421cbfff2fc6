"""The seqio mixture registry of xlscale, built from one ratios mapping.

`RATIOS` (`pipelines.mixture_tables`, which holds the tables without seqio) maps a mixture name
to `{task name: fraction of tokens}`: the MT paper's pretraining mixtures of span-corruption
tasks, `mix_<lang>_<pct>[_<lang>_<pct>]`, and the CPT paper's replay mixtures of LM tasks,
`cpt_<target>_replay_en_<pct>`.

Fractions are of *tokens* (the papers' "x% of a batch"), while seqio samples *examples*. The
seqio `Mixture` stores the token fractions as its rates; `pipelines.streams` turns them into
example rates by dividing each by the component's measured mean target tokens per example (at
the stream's sequence length), and draws components by a deterministic smooth weighted
round-robin rather than by random sampling, so the realised token shares follow the requested
ones closely (see `pipelines.streams`; tests check ±2% over ~10k examples).

Nothing is registered at import time: call `register_mixtures()` after
`pipelines.tasks.register_tasks(...)`. seqio is imported by the functions that use its registry,
so the tables and `replay_fraction` are read without it.
"""

from __future__ import annotations

from collections.abc import Mapping

# The tables live in a module without seqio; they are this module's names too.
from pipelines.mixture_tables import (  # noqa: F401 -- re-exported
    CPT_SOURCE,
    CPT_TARGETS,
    MT_MIXES,
    RATIOS,
    REPLAY_PCTS,
    cpt_name,
    default_ratios,
    mix_name,
    replay_fraction,
    validate,
)


def register_mixtures(*, ratios: Mapping[str, Mapping[str, float]] | None = None) -> list[str]:
    """Registers one seqio `Mixture` per entry of `ratios` (default `RATIOS`).

    With the default mapping, mixtures whose tasks are not registered (languages not built) are
    skipped; with an explicit mapping, a missing task is an error. Re-registering replaces.

    Args:
      ratios: mixture name -> {task name: fraction of tokens}; fractions sum to 1.

    Returns:
      The registered mixture names.
    """
    import seqio

    explicit = ratios is not None
    ratios = RATIOS if ratios is None else ratios
    registered = set(seqio.TaskRegistry.names())
    names = []
    for name, fractions in ratios.items():
        validate(name, fractions)
        missing = [t for t in fractions if t not in registered]
        if missing:
            if explicit:
                raise ValueError(f"mixture {name!r}: tasks {missing} are not registered")
            continue
        if name in seqio.MixtureRegistry.names():
            seqio.MixtureRegistry.remove(name)
        seqio.MixtureRegistry.add(name, [(task, float(f)) for task, f in fractions.items()])
        names.append(name)
    return names


def component_names(mixture_or_task: str) -> list[str]:
    """Returns the components of a mixture in seqio's order (sorted by name); a task gives
    `[task]`. Indices into this list are the `decoder_task_ids` of `pipelines.streams`."""
    import seqio

    if mixture_or_task in seqio.TaskRegistry.names():
        return [mixture_or_task]
    return [t.name for t in seqio.MixtureRegistry.get(mixture_or_task).tasks]


def token_fractions(mixture_or_task: str) -> dict[str, float]:
    """Returns `{component: fraction of tokens}` (normalised; a task gives `{task: 1.0}`)."""
    import seqio

    if mixture_or_task in seqio.TaskRegistry.names():
        return {mixture_or_task: 1.0}
    mixture = seqio.MixtureRegistry.get(mixture_or_task)
    rates = {t.name: float(mixture.get_rate(t)) for t in mixture.tasks}
    total = sum(rates.values())
    if total <= 0:
        raise ValueError(f"mixture {mixture_or_task!r} has no positive rate")
    return {name: rate / total for name, rate in rates.items()}
