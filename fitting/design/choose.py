"""Choosing runs for a budget: greedy optimal design on the study's Fisher information.

`choose` adds runs one at a time, each time the one whose information gain per chip-hour is
largest, paying for the runs it needs first, until nothing more fits the budget. The gain is the
criterion's improvement (`CRITERIA`): "d_optimal" is log det of the information (the volume of the
joint confidence region of the parameters), "targets" the sum of the squared predicted 95%
half-widths of the reported quantities (parameters, compute-optimal allocation, the loss of the
largest run; A-optimality on what the study reports), "matched" the sum of each target's variance
ratio to the full study's, to the 4th power (every reported quantity as close to what the full
sweep would pin down as the budget allows: the worst-matched one dominates). Greedy selection of a monotone
submodular criterion such as log det is within a constant factor of the best subset, and it is
deterministic: the same study and budget give the same design.

`random_design` draws subsets of equal cost, the baseline a design must beat.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fitting.design import information
from fitting.design.information import Target
from fitting.design.study import Candidate, StudyModel


@dataclasses.dataclass(frozen=True)
class Design:
    """A chosen subset of a study's runs.

    Attributes:
      keys: chosen runs, in the order chosen (each after the runs it needs).
      cost: their chip-hours.
      full_cost: chip-hours of every candidate.
      criterion: what was optimised.
      widths: predicted 95% half-widths of the targets (relative for positive quantities).
      full_widths: the same for every candidate run.
      log_det: log det of the design's information (regularised).
    """

    keys: tuple[str, ...]
    cost: float
    full_cost: float
    criterion: str
    widths: dict[str, float]
    full_widths: dict[str, float]
    log_det: float

    @property
    def fraction(self) -> float:
        """The design's share of the full study's compute."""
        return self.cost / self.full_cost if self.full_cost else float("nan")

    def to_dict(self) -> dict:
        """JSON-ready (unrounded)."""
        return {**dataclasses.asdict(self), "keys": list(self.keys), "fraction": self.fraction}


def _targets_score(model: StudyModel, targets: Sequence[Target]) -> Callable[[np.ndarray], float]:
    gradients = information.target_gradients(model, targets)

    def score(F: np.ndarray) -> float:
        widths = information.widths_from(F, gradients)
        return -float(sum(w * w for w in widths.values()))

    return score


def _log_det_score(model: StudyModel) -> Callable[[np.ndarray], float]:
    groups = information.parameter_groups(model)
    return lambda F: information.log_det(F, groups)


def _matched_score(
    model: StudyModel, targets: Sequence[Target], full: np.ndarray | None = None
) -> Callable[[np.ndarray], float]:
    """−Σ (varianceₜ(F) / varianceₜ(full))²: each target's variance as a multiple of the full
    study's, squared so that the worst-matched target dominates. A design's estimate lies in the
    full sweep's 95% interval with probability P(|Z|·√(r − 1) < 1.96) for variance ratio r (the
    full sweep contains the design), so what matters is every ratio, not the widths' sum."""
    if full is None:
        raise ValueError("criterion 'matched' needs the full study's information")
    gradients = information.target_gradients(model, targets)
    reference = information.widths_from(full, gradients)

    def score(F: np.ndarray) -> float:
        widths = information.widths_from(F, gradients)
        return -float(sum((widths[k] / reference[k]) ** 4 for k in widths if reference[k] > 0))

    return score


# criterion → factory(model, targets, full information) → score(F), larger is better.
CRITERIA: Mapping[str, Callable[..., Callable[[np.ndarray], float]]] = {
    "d_optimal": lambda model, targets, full=None: _log_det_score(model),
    "targets": lambda model, targets, full=None: _targets_score(model, targets),
    "matched": _matched_score,
}


def closure(key: str, by_key: Mapping[str, Candidate], have: set[str]) -> list[str]:
    """`key` and every run it needs that is not in `have`, dependencies first."""
    out: list[str] = []

    def visit(k: str) -> None:
        if k in have or k in out:
            return
        if k not in by_key:
            raise KeyError(f"run {key!r} needs {k!r}, which is not a candidate")
        for r in by_key[k].requires:
            visit(r)
        out.append(k)

    visit(key)
    return out


def _check(candidates: Sequence[Candidate], budget: float) -> dict[str, Candidate]:
    by_key = {c.key: c for c in candidates}
    if len(by_key) != len(candidates):
        raise ValueError("candidate keys must be distinct")
    if not budget > 0:
        raise ValueError(f"--budget {budget}: must be a positive number of chip-hours")
    return by_key


def choose(
    model: StudyModel,
    candidates: Sequence[Candidate],
    budget: float,
    *,
    targets: Sequence[Target] = (),
    criterion: str = "targets",
    required: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Design:
    """The greedy design for `budget` chip-hours (see the module docstring).

    Args:
      model: the study's laws and prior.
      candidates: every run the manifest has.
      budget: chip-hours the design may spend.
      targets: reported quantities beyond the parameters (allocation, held-out loss).
      criterion: a key of `CRITERIA`.
      required: runs the design must contain (e.g. a pilot already trained).
      exclude: runs the design must not contain (e.g. the largest, held out to test the law's
        prediction); a run that needs an excluded run is excluded too.

    Raises:
      ValueError: an unknown criterion, a non-positive budget, required runs over budget, or a
        run both required and excluded (or one that is not a candidate).
    """
    if criterion not in CRITERIA:
        raise ValueError(f"criterion {criterion!r}; choose from {', '.join(CRITERIA)}")
    by_key = _check(candidates, budget)
    banned = _excluded(exclude, by_key)
    clash = sorted(set(required) & banned)
    if clash:
        raise ValueError(f"runs {clash} are both required and excluded (or need excluded runs)")
    all_targets = [*information.parameter_targets(model), *targets]
    info = information.candidate_information(model, candidates)
    n = len(model.names)
    score = CRITERIA[criterion](model, all_targets, sum(info.values(), np.zeros((n, n))))
    chosen: list[str] = []
    for key in required:
        chosen += closure(key, by_key, set(chosen))
    spent = sum(by_key[k].cost for k in chosen)
    if spent > budget:
        raise ValueError(f"the required runs cost {spent:.4g} chip-hours, over --budget {budget}")
    runs = [
        _greedy(candidates, by_key, banned, info, score, chosen, budget, p) for p in COST_POWERS
    ]
    chosen = max(runs, key=lambda keys: score(sum((info[k] for k in keys), np.zeros((n, n)))))
    return _design(model, candidates, chosen, criterion, all_targets, info)


# Greedy by gain / cost^p for each p, the best result kept: p = 1 (gain per chip-hour) alone can
# fill a budget with cheap runs, p = 0 (gain alone) with one expensive run; the better of the two
# is within a constant factor of the best budgeted subset for a submodular criterion (Leskovec et
# al. 2007, "cost-effective outbreak detection"), and p = 0.5 often beats both.
COST_POWERS = (1.0, 0.5, 0.0)


def _greedy(candidates, by_key, banned, info, score, start, budget, power) -> list[str]:
    """Adds runs (each with what it needs) by criterion gain / cost^power until none fits."""
    n = next(iter(info.values())).shape[-1]
    chosen = list(start)
    spent = sum(by_key[k].cost for k in chosen)
    F = sum((info[k] for k in chosen), np.zeros((n, n)))
    current = score(F)
    while True:
        best, best_rate, best_add = None, 0.0, []
        have = set(chosen)
        for c in candidates:
            if c.key in have or c.key in banned:
                continue
            add = closure(c.key, by_key, have)
            cost = sum(by_key[k].cost for k in add)
            if spent + cost > budget or cost <= 0:
                continue
            gain = score(F + sum(info[k] for k in add)) - current
            rate = gain / cost**power
            if gain > 1e-12 and (best is None or rate > best_rate):
                best, best_rate, best_add = c.key, rate, add
        if best is None:
            return chosen
        chosen += best_add
        spent += sum(by_key[k].cost for k in best_add)
        F = F + sum(info[k] for k in best_add)
        current = score(F)


def _excluded(exclude: Sequence[str], by_key: Mapping[str, Candidate]) -> set[str]:
    """The excluded runs and every run that needs one of them."""
    unknown = sorted(set(exclude) - set(by_key))
    if unknown:
        raise ValueError(f"exclude: {unknown} are not candidates")
    return {k for k in by_key if set(closure(k, by_key, set())) & set(exclude)}


def _design(model, candidates, chosen, criterion, targets, info) -> Design:
    n = len(model.names)
    by_key = {c.key: c for c in candidates}
    F = sum((info[k] for k in chosen), np.zeros((n, n)))
    F_full = sum(info.values(), np.zeros((n, n)))
    return Design(
        keys=tuple(chosen),
        cost=float(sum(by_key[k].cost for k in chosen)),
        full_cost=float(sum(c.cost for c in candidates)),
        criterion=criterion,
        widths=information.half_widths(model, F, targets),
        full_widths=information.half_widths(model, F_full, targets),
        log_det=information.log_det(F, information.parameter_groups(model)),
    )


def random_design(
    model: StudyModel,
    candidates: Sequence[Candidate],
    budget: float,
    *,
    seed: int,
    targets: Sequence[Target] = (),
    exclude: Sequence[str] = (),
) -> Design:
    """A random subset within `budget`: runs in a random order, each kept (with what it needs)
    while it fits — the baseline a design must beat. `exclude` as for `choose`."""
    by_key = _check(candidates, budget)
    banned = _excluded(exclude, by_key)
    rng = np.random.default_rng(seed)
    chosen: list[str] = []
    spent = 0.0
    for i in rng.permutation(len(candidates)):
        if candidates[i].key in banned:
            continue
        add = closure(candidates[i].key, by_key, set(chosen))
        cost = sum(by_key[k].cost for k in add)
        if spent + cost <= budget:
            chosen += add
            spent += cost
    all_targets = [*information.parameter_targets(model), *targets]
    info = information.candidate_information(model, candidates)
    return _design(model, candidates, chosen, "random", all_targets, info)
