"""The papers' studies as design models: their laws, shared parameters and priors.

CPT (Zheng et al. 2024): the source (English) and from-scratch (target language) runs follow
Chinchilla laws; the CPT runs follow the CPT law, which takes E, A and α from the from-scratch
fit (its eq. 7). MT (Isik et al. 2024): per series (model, mixture, task, Df), BLEU follows the
log-law and downstream cross-entropy the power law in Dp. Priors are the values the synthetic
generator draws from (`fitting.laws.synthetic`: the papers' tables), or a pilot fit's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fitting.analyses import allocation
from fitting.design.information import Target
from fitting.design.study import Block, StudyModel
from fitting.laws import formulas, synthetic

CHINCHILLA_PARAMS = ("E", "A", "B", "alpha", "beta")
CPT_OWN = ("B", "beta", "gamma")
CPT_SHARED = ("E", "A", "alpha")  # from the from-scratch fit (CPT paper eq. 7)


def _own(block: str, params) -> dict[str, str]:
    return {p: f"{block}.{p}" for p in params}


def cpt_model(
    *,
    scratch: Mapping[str, float] = synthetic.SCRATCH,
    cpt: Mapping[str, float] = synthetic.CPT,
    source: Mapping[str, float] | None = synthetic.SOURCE,
    sigma: float = 0.005,
) -> StudyModel:
    """The CPT study: scratch and (optionally) source Chinchilla laws, and the CPT law sharing
    scratch's E, A, α. `sigma`: noise of one evaluation's log loss."""
    blocks = [
        Block("scratch", "chinchilla", _own("scratch", CHINCHILLA_PARAMS), sigma),
        Block(
            "cpt",
            "cpt",
            {**_own("scratch", CPT_SHARED), **_own("cpt", CPT_OWN)},
            sigma,
        ),
    ]
    prior = {**_prefixed("scratch", scratch, CHINCHILLA_PARAMS), **_prefixed("cpt", cpt, CPT_OWN)}
    if source is not None:
        blocks.append(Block("source", "chinchilla", _own("source", CHINCHILLA_PARAMS), sigma))
        prior.update(_prefixed("source", source, CHINCHILLA_PARAMS))
    return StudyModel(tuple(blocks), prior)


def _prefixed(block: str, values: Mapping[str, float], params) -> dict[str, float]:
    return {f"{block}.{p}": float(values[p]) for p in params}


def law_params(model: StudyModel, block: str, params: Mapping[str, float]) -> dict[str, float]:
    """The block's law parameters (E, A, ...) from study parameters."""
    return {lp: params[sp] for lp, sp in model.block(block).params.items()}


def allocation_target(model: StudyModel, block: str, compute: float) -> Target:
    """N_opt at `compute` FLOPs for a Chinchilla or CPT block (CPT paper eqs. 2, 5)."""
    law = model.block(block).law

    def n_opt(params: Mapping[str, float]) -> float:
        alloc = allocation.compute_optimal(law_params(model, block, params), law=law)
        return float(alloc.n_opt(compute))

    return Target(f"{block}.N_opt({compute:.3g})", n_opt)


def loss_target(model: StudyModel, block: str, inputs: tuple[float, ...], name: str) -> Target:
    """The block's law at one point (e.g. the final loss of the largest run, held out)."""
    point = np.asarray([inputs], np.float64)

    def value(params: Mapping[str, float]) -> float:
        return float(model.predict(block, params, point)[0])

    return Target(f"{block}.{name}", value)


def mt_model(series: Mapping[str, Mapping[str, Mapping[str, float]]], *, sigma: float = 0.01):
    """The MT study: per series key, a BLEU log-law block `bleu/<key>` and a cross-entropy
    power-law block `ce/<key>`, each with its own parameters. `series`: key → {"bleu": params,
    "ce": params} (priors: the MT paper's Table 3 row and eq. 3's form, `synthetic.BLEU`/`CE`)."""
    blocks, prior = [], {}
    for key, laws in series.items():
        for metric, law in (("bleu", "log_law"), ("ce", "power_law")):
            if metric not in laws:
                continue
            name = f"{metric}/{key}"
            params = formulas.LAWS[law].params
            blocks.append(Block(name, law, _own(name, params), sigma))
            prior.update(_prefixed(name, laws[metric], params))
    return StudyModel(tuple(blocks), prior)
