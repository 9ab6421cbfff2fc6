"""`xlscale sweep design`: a manifest's runs chosen for a compute budget, and the manifest that
runs them.

`design_sweep` builds the candidates and the study model of the laws asked for (`STUDIES`: the
papers' laws, `launch.design`, or the schedule-aware law, `launch.design_schedule`), checks the
budget against the cheapest useful design, and runs the greedy optimal design
(`fitting.design.choose.choose`). `manifest_text` writes the designed manifest: a header comment
saying how it was made, what it costs and what it predicts, then the original manifest's text
unchanged (comments kept), then a `[design]` table naming the chosen runs (`launch.manifest`), so
every run keeps the id it has in the full grid and `sweep run` reuses runs already done.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from fitting.design import choose
from fitting.design.information import Target
from fitting.design.study import Candidate, StudyModel, with_noise
from launch import design, design_schedule
from launch.runs import Run
from rundir.run_record import Strategy


@dataclasses.dataclass(frozen=True)
class SweepDesign:
    """A design of one manifest and what it was made for.

    Attributes:
      result: the chosen runs and predicted widths (`fitting.design.choose.Design`).
      runs: the manifest's runs (the candidates' order).
      candidates: the runs as design candidates.
      model: the study model the design scored.
      budget, hardware, mfu, criterion, prior: the design's settings (prior: a file or "paper").
      run_sigma: τ, a run's offset shared by its evaluations (0: evaluations independent).
      law: the laws the design scores (a key of `STUDIES`).
    """

    result: choose.Design
    runs: tuple[Run, ...]
    candidates: tuple[Candidate, ...]
    model: StudyModel
    budget: float
    hardware: str | None
    mfu: float
    criterion: str
    prior: str
    run_sigma: float = 0.0
    law: str = "paper"

    @property
    def chosen(self) -> list[Run]:
        """The chosen runs in the manifest's order."""
        keys = set(self.result.keys)
        return [r for r in self.runs if r.run_id in keys]


def minimum_budget(candidates: Sequence[Candidate]) -> tuple[float, str]:
    """The cost of the cheapest useful design (one run that yields points, with the runs it
    needs) and that run's id."""
    by_key = {c.key: c for c in candidates}
    best = (math.inf, "")
    for c in candidates:
        if c.points:
            cost = sum(by_key[k].cost for k in choose.closure(c.key, by_key, set()))
            best = min(best, (cost, c.key))
    return best


def with_baselines(runs: Sequence[Run], cands: Sequence[Candidate]) -> list[Candidate]:
    """The candidates with each finetune requiring the from-scratch finetune
    (`finetune_scratch`) of its model, task, Df and recipe: no point of the Dp laws, but the
    baseline its MT series is reported against (`fitting.readers.points.downstream_series`),
    so a design pays for it once with the first finetune of the series it chooses."""

    def series(r: Run) -> tuple:
        return (r.size, r.coord("task"), r.coord("finetune_tokens"), r.steps)

    baseline = {series(r): r.run_id for r in runs if r.strategy == Strategy.FINETUNE_SCRATCH}
    by_id = {r.run_id: r for r in runs}
    out = []
    for c in cands:
        run = by_id[c.key]
        extra = baseline.get(series(run)) if run.strategy == Strategy.FINETUNE else None
        out.append(dataclasses.replace(c, requires=(*c.requires, extra)) if extra else c)
    return out


@dataclasses.dataclass(frozen=True)
class Study:
    """What a design scores: the candidates, the study model, the reported quantities beyond
    the parameters, where the prior came from, and for the schedule-aware law each block's
    λ and reference scales (`launch.design_schedule.BlockScales`; what its refits must use)."""

    candidates: list[Candidate]
    model: StudyModel
    targets: list[Target]
    prior: str
    scales: Mapping[str, design_schedule.BlockScales] = dataclasses.field(default_factory=dict)


def paper_study(
    runs: Sequence[Run], prior_path: str | None, *, hardware: str | None, mfu: float
) -> Study:
    """The papers' laws (`launch.design`): L(N, D) laws for CPT, the Dp laws for MT; the prior
    the synthetic generator's paper values, or a pilot fit (`launch.design.read_prior`)."""
    cands = design.candidates(runs, hardware=hardware, mfu=mfu)
    prior = design.read_prior(prior_path) if prior_path else None
    try:
        model = design.study_model(runs, prior)
    except ValueError as e:
        if not prior_path:
            raise  # the papers' own values: nothing of the user's to name
        raise ValueError(f"--prior {prior_path}: {e}") from e
    label = prior_path or "paper (fitting.laws.synthetic)"
    return Study(cands, model, design.targets(model, runs, cands), label)


def schedule_study(
    runs: Sequence[Run], prior_path: str | None, *, hardware: str | None, mfu: float
) -> Study:
    """The schedule-aware law (`launch.design_schedule`), from a pilot fit of it.

    Raises:
      ValueError: an MT manifest, or no `--prior` (the law has no paper values).
    """
    law = design_schedule.LAW
    if design.is_mt(runs):
        raise ValueError(f"--law {law}: a law of CPT studies' losses; this manifest is an MT study")
    if not prior_path:
        raise ValueError(
            f"--law {law} needs --prior: the fits.json of `xlscale fit PILOT_RUNS_DIR --law {law}` "
            "(the law has no paper values to start from)"
        )
    prior = design_schedule.read_prior(prior_path, runs)
    cands = design_schedule.candidates(runs, prior, hardware=hardware, mfu=mfu)
    try:
        model = design_schedule.study_model(prior)
    except ValueError as e:
        raise ValueError(f"--prior {prior_path}: {e}") from e
    targets = design_schedule.targets(model, cands)
    return Study(cands, model, targets, prior.source, prior.scales)


# `--law` -> the study a design scores.
STUDIES = {"paper": paper_study, design_schedule.LAW: schedule_study}


def study_of(
    law: str, runs: Sequence[Run], prior_path: str | None, *, hardware: str | None, mfu: float
) -> Study:
    """The study `--law` names (`STUDIES`), built on `runs`: what `sweep design` scores and the
    adaptive sweep refits, so both refuse an unknown law in the same words.

    Raises:
      ValueError: an unknown law (naming the allowed ones), or the study's own refusals.
    """
    if law not in STUDIES:
        raise ValueError(f"--law {law!r}: allowed: {', '.join(STUDIES)}")
    return STUDIES[law](runs, prior_path, hardware=hardware, mfu=mfu)


def design_sweep(
    runs: Sequence[Run],
    *,
    budget: float,
    hardware: str | None,
    mfu: float = 0.5,
    criterion: str = "d_optimal",
    prior_path: str | None = None,
    keep: Sequence[str] = (),
    run_sigma: float = 0.0,
    law: str = "paper",
) -> SweepDesign:
    """The design of `runs` for `budget` chip-hours on `hardware` (see the module docstring),
    with the from-scratch baselines of its MT series (`with_baselines`). `run_sigma`: τ of
    every law, a run's offset shared by its evaluations (`fitting.design.information`: the fits'
    sandwich covariance), so a run's tenth checkpoint does not count as a tenth run. `law`: the
    laws scored (`STUDIES`).

    Raises:
      ValueError: an unknown law, hardware or criterion, a prior file without parameters, no run
        that yields points, or a budget below the cheapest useful design (naming the flag, the
        value and the minimum).
    """
    if criterion not in choose.CRITERIA:
        raise ValueError(f"--criterion {criterion!r}: allowed: {', '.join(choose.CRITERIA)}")
    if not (math.isfinite(run_sigma) and run_sigma >= 0):
        raise ValueError(f"--run-sigma {run_sigma!r}: allowed: 0 or a positive log-metric spread")
    study = study_of(law, runs, prior_path, hardware=hardware, mfu=mfu)
    cands = with_baselines(runs, study.candidates)
    minimum, cheapest = minimum_budget(cands)
    if not cheapest:
        raise ValueError("no run of the manifest yields points of the study's laws")
    unit = "chip-hours" if hardware else "PFLOP/s-hours"
    if budget < minimum:
        raise ValueError(
            f"--budget {budget:g}: below the cheapest useful design, {minimum:.4g} {unit} "
            f"({cheapest} with the runs it needs{f' on {hardware}' if hardware else ''})"
        )
    model = study.model
    if run_sigma:
        model = with_noise(model, {b.name: (b.sigma, run_sigma) for b in model.blocks})
    result = choose.choose(
        model, cands, budget, targets=study.targets, criterion=criterion, required=tuple(keep)
    )
    return SweepDesign(
        result, tuple(runs), tuple(cands), model, budget, hardware, mfu, criterion,
        study.prior, run_sigma, law,
    )  # fmt: skip


def run_rows(d: SweepDesign) -> list[list[str]]:
    """One row per chosen run: id, strategy, size, tokens, points, chip-hours."""
    by_key = {c.key: c for c in d.candidates}
    return [
        [
            r.run_id,
            str(r.strategy),
            r.size,
            f"{r.tokens:.3g}",
            str(len(by_key[r.run_id].points)),
            f"{by_key[r.run_id].cost:,.2f}",
        ]
        for r in d.chosen
    ]


RUN_HEADER = ["run", "strategy", "size", "tokens", "points", "chip-hours"]
WIDTH_HEADER = ["quantity", "value", "design ±95%", "full manifest ±95%"]


def _prior_value(d: SweepDesign, name: str) -> float | None:
    return d.model.prior.get(name)


def width_rows(d: SweepDesign) -> list[list[str]]:
    """One row per reported quantity: its prior value and the predicted 95% half-widths of the
    design and of the full manifest (relative, in %, for scales and derived quantities;
    absolute for exponents, `fitting.design.information.parameter_targets`)."""
    relative = dict(zip(d.model.names, d.model.log_scaled, strict=True))
    rows = []
    for name, width in d.result.widths.items():
        rel = relative.get(name, True)
        value = _prior_value(d, name)

        def fmt(w: float, rel: bool = rel) -> str:
            return f"{100 * w:.3g}%" if rel else f"{w:.3g}"

        rows.append(
            [
                name,
                "-" if value is None else f"{value:.4g}",
                fmt(width),
                fmt(d.result.full_widths[name]),
            ]
        )
    return rows


def summary(d: SweepDesign) -> str:
    """One line: chosen runs and cost against the full manifest's."""
    unit = "chip-hours" if d.hardware else "PFLOP/s-hours"
    r = d.result
    where = f" on {d.hardware} at {d.mfu:.0%} MFU" if d.hardware else ""
    return (
        f"{len(r.keys)} of {len(d.runs)} runs, {r.cost:,.1f} of {r.full_cost:,.1f} {unit}"
        f"{where} ({r.fraction:.1%}; budget {d.budget:g}); criterion {d.criterion}, "
        f"prior {d.prior}"
        + (f"; run offset tau {d.run_sigma:g}" if d.run_sigma else "")
        + (f"; law {d.law}" if d.law != "paper" else "")
    )


# The lines that open the original text and the [design] table in a designed manifest.
_BELOW = "# Below:"
_TABLE_MARK = "# The designed subset (`xlscale sweep design`): runs kept, settings, predictions."


def original_text(text: str, *, where: str) -> str:
    """The manifest a designed manifest was made from: its text less the header comment and the
    `[design]` table that `manifest_text` added (so a designed manifest can be designed again,
    e.g. for another budget).

    Raises:
      ValueError: a [design] table that `xlscale sweep design` did not write (naming the file).
    """
    head, below, rest = text.partition("\n" + _BELOW)
    body, mark, _ = rest.partition("\n" + _TABLE_MARK)
    if not below or not mark or not head.startswith("# Designed subset"):
        raise ValueError(
            f"{where}: its [design] table was not written by `xlscale sweep design`; design from "
            "the manifest without it"
        )
    original = body.split("\n", 1)[1]  # past the "# Below:" line
    return original.removeprefix("\n")  # and the blank line after the header


def _toml_value(value) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "nan")
    if isinstance(value, Mapping):
        return (
            "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
        )
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def header_comment(d: SweepDesign, *, source: str, command: str) -> str:
    """The designed manifest's header: how it was made, its cost, its predicted intervals."""
    table = [WIDTH_HEADER, *width_rows(d)]
    widths = [max(len(row[i]) for row in table) for i in range(len(WIDTH_HEADER))]
    lines = [
        f"# Designed subset of {source} (`xlscale sweep design`, launch/sweep_design.py), made "
        f"{datetime.now(UTC):%Y-%m-%d}:",
        f"#   {command}",
        f"# {summary(d)}.",
        "# Predicted 95% half-widths (Fisher information at the prior, delta method; % relative):",
        *(
            "#   " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in table
        ),
        f"{_BELOW} {source} unchanged, then the [design] table (`expand` keeps its runs and the"
        " runs they need; ids as in the full grid).",
        "",
    ]
    return "\n".join(lines) + "\n"


def design_table(d: SweepDesign) -> str:
    """The `[design]` table (`launch.manifest`): the chosen runs and the design's settings."""
    r = d.result
    fields = {
        "budget": float(d.budget),
        **({"hardware": d.hardware} if d.hardware else {}),
        "mfu": float(d.mfu),
        "criterion": d.criterion,
        **({"law": d.law} if d.law != "paper" else {}),
        "prior": d.prior,
        "cost": round(r.cost, 3),
        "full_cost": round(r.full_cost, 3),
    }
    lines = [
        "",
        _TABLE_MARK,
    ]
    lines += ["[design]", "runs = ["]
    lines += [f"  {json.dumps(k)}," for k in r.keys]
    lines += ["]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    for name, values in (("widths", r.widths), ("full_widths", r.full_widths)):
        lines += ["", f"[design.{name}]"]
        lines += [f"{json.dumps(k)} = {float(f'{v:.4g}')!r}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def manifest_text(d: SweepDesign, source_text: str, *, source: str, command: str) -> str:
    """The designed manifest: header comment, the original text, the `[design]` table."""
    body = source_text if source_text.endswith("\n") else source_text + "\n"
    return header_comment(d, source=source, command=command) + body + design_table(d)
