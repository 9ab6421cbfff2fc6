"""The train state a run starts from: restored from its newest intact checkpoint (resume), or
fresh from the seed, with the parameters of `INIT_CHECKPOINT` when a CPT run starts from a
source model (and the `init_*` fields of `run.json` that record it).
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np

from convert import init_checkpoints
from trainer import checkpoints as ckpt_lib
from trainer.jobs import Job

log = logging.getLogger(__name__)


def initial_state(
    job: Job,
    store,
    *,
    resume: bool,
    init_checkpoint: str | None,
    seed: int,
    init_checked: bool = False,
):
    """Resumed state (with its saved JSON) when `resume`, else a fresh one (from
    `init_checkpoint` if given) and the `init_*` fields of `run.json`: the train state a run's
    loop starts from, set up once its steps are compiled (`trainer.train`).

    `init_checked`: `init_checkpoint` is the step the run's plan checked against the model
    (`trainer.checkpoints.restore_init_params(checked=True)`)."""
    if resume:
        abstract = job.abstract_state_with_shardings()
        # The newest step that verifies, loads and is finite (newer ones are logged and set aside:
        # corrupt files, or non-finite values written by older code).
        latest, params, opt_state, saved = store.restore_latest_intact(
            abstract_params=abstract.params, abstract_opt_state=abstract.opt_state
        )
        state = job.assemble_state(
            params=params,
            opt_state=opt_state,
            step=int(saved["step"]),
            rng=np.asarray(saved["rng"], np.uint32),
            skipped=int(saved.get("skipped", 0)),
        )
        log.info("resuming from step %d", latest)
        return state, saved, {}
    rng = np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)
    if init_checkpoint is None:
        return job.init_state(rng), {}, {}
    params, directory, step = ckpt_lib.restore_init_params(
        init_checkpoint,
        abstract_params=job.abstract_state_with_shardings().params,
        checked=init_checked,
    )
    init = {
        # The source run's MODEL_DIR (where its run.json is), not its checkpoints/ folder.
        "init_checkpoint": os.fspath(
            directory.parent if directory.name == ckpt_lib.CHECKPOINTS_SUBDIR else directory
        ),
        "init_step": step,
        "init_params_hash": init_checkpoints.params_hash(params),
    }
    log.info("initialised params from %s step %d", directory, step)
    return job.init_state(rng, params=params), {}, init
