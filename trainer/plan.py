"""A training run's plan: everything decided and checked before anything is compiled or written.

`build_run_plan` takes the run's `trainer.run_request.RunRequest` whole and is straight-line
code, each step using only what the steps above produced:

1. the model and its partitioner, the data registered and every configuration checked
   (`jobs.plan_job`, given the request's `JobRequest` part);
2. parameter counts and the run's steps (same call), and the train step's memory;
3. one resume decision, from the checkpoint store: the newest committed step (`resume_step`);
4. the initial checkpoint checked against the model from metadata, and against the run's
   vocabulary where its run.json records one (a fresh run only);
5. the prepared input opened and verified (when the batches are read by index): manifests,
   sidecars and every shard's sha256 (`data.prepared_datasets`);
6. the run's fingerprint, and the amendment a resume is allowed to make (`trainer.fingerprint`).

A refusal at any step leaves `MODEL_DIR` as it was: nothing here writes. `jobs.compile_plan`
follows, then the trainer restores or initialises the state and runs the loop.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from etils import epath

from convert import grown_init
from rundir import names, records, storage
from trainer import checkpoints as ckpt_lib
from trainer import data as data_lib
from trainer import fingerprint as fingerprint_lib
from trainer import jobs, stop_requests, validation
from trainer.checkpoints import CheckpointConfig
from trainer.loop import LoopConfig
from trainer.partitioning import MeshConfig
from trainer.run_request import RunInfo, RunRequest


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One training run, planned.

    Attributes:
      model_dir: the run directory.
      job: model, partitioner, counts and steps (`jobs.JobPlan`).
      checkpoint, loop, mesh: how the run saves, loops and is laid out.
      run: strategy and languages (`trainer.run_request.RunInfo`).
      init_checkpoint: `'<dir>[@step]'` or `'hf:<dir>'` to start from (None: random init);
        unused when resuming.
      init_source: `init_checkpoint` as the checkpoints directory and step that were checked
        (`'<checkpoints dir>@<step>'`), what a fresh start restores: the step checked is the step
        loaded, and its choice (a fallback past newer unrecorded steps) is logged once (None:
        no initial checkpoint, or a resume).
      seed, gin_config: as given to `train`.
      resume_step: the newest committed checkpoint step in `model_dir` (None: a fresh start).
      vocab_hash: SHA-256 of the vocabulary file (None without one).
      prepared: the opened, verified prepared datasets by component (None: seqio).
      fingerprint: the settings that define the run (`run.json`'s `fingerprint`).
      amendment: the allowed changes a resume makes to the stored fingerprint (None: none).
    """

    model_dir: epath.Path
    job: jobs.JobPlan
    checkpoint: CheckpointConfig
    loop: LoopConfig
    mesh: MeshConfig
    run: RunInfo
    init_checkpoint: str | None
    init_source: str | None
    seed: int
    gin_config: str
    resume_step: int | None
    vocab_hash: str | None
    prepared: dict[str, Any] | None
    fingerprint: dict[str, Any]
    amendment: fingerprint_lib.Amendment | None

    @property
    def resuming(self) -> bool:
        """Whether the run continues from a checkpoint of its own."""
        return self.resume_step is not None


def build_run_plan(*, request: RunRequest) -> RunPlan:
    """Plans the run `request` asks for (see the module docstring for the order); its
    `model_dir` is the run directory as `storage.as_path` gives it.

    Raises:
      trainer.validation.ConfigError, FileNotFoundError, ValueError,
      rundir.checksums.CheckpointCorruptError, fingerprint refusals: before anything is
      compiled or written; `trainer.stop_requests.StopRequested` for a run told to stop.
    """
    model_dir = storage.as_path(request.model_dir, name="MODEL_DIR")
    data, run, init_checkpoint = request.data, request.run, request.init_checkpoint
    stop_requests.refuse_if_requested(model_dir)  # skipped by `sweep run --adaptive`: no work
    job = jobs.plan_job(request.job)
    resume_step = ckpt_lib.committed_step(model_dir)
    vocab_hash = fingerprint_lib.vocab_sha256(data.vocab_path)
    init_source = None
    if init_checkpoint and resume_step is None:
        init_dir, init_step = ckpt_lib.check_init_checkpoint(
            init_checkpoint, abstract_params=job.abstract_params
        )
        init_source = f"{os.fspath(init_dir)}@{init_step}"
        source_hash = init_vocab_sha256(init_checkpoint)
        if source_hash is not None and vocab_hash is not None:
            validation.check_init_vocab(
                init_checkpoint=init_checkpoint,
                source_hash=source_hash,
                vocab_path=str(data.vocab_path),
                vocab_hash=vocab_hash,
            )
    prepared = None
    if data.prepared_dir is not None:  # verified (shards, vocabulary) before compiling
        prepared = data_lib.prepared_datasets(data, vocab_hash=vocab_hash)
    fingerprint = fingerprint_lib.run_fingerprint(
        job,
        run=run,
        seed=request.seed,
        init_checkpoint=init_checkpoint,
        vocab_hash=vocab_hash,
        prepared=data_lib.prepared_input(data, prepared) if prepared is not None else None,
    )
    amendment = fingerprint_lib.check_model_dir(
        model_dir,
        new=fingerprint,
        policy=request.resume_policy,
        step=resume_step,
        defaults=fingerprint_lib.fingerprint_defaults(job, run=run),
    )
    return RunPlan(
        model_dir=model_dir,
        job=job,
        checkpoint=request.checkpoint,
        loop=request.loop,
        mesh=request.mesh,
        run=run,
        init_checkpoint=init_checkpoint,
        init_source=init_source,
        seed=request.seed,
        gin_config=request.gin_config,
        resume_step=resume_step,
        vocab_hash=vocab_hash,
        prepared=prepared,
        fingerprint=fingerprint,
        amendment=amendment,
    )


def init_vocab_sha256(init_checkpoint: str) -> str | None:
    """The SHA-256 of the vocabulary `INIT_CHECKPOINT` ('<dir>[@step]') was trained on, as its
    run's run.json records it: `vocab_sha256`, else its fingerprint's; for a grown checkpoint
    (`convert.grown_init`) the vocabulary it was grown to. None where nothing says (no run.json:
    an older run or a bare checkpoints directory; an `hf:` import; a record without the hash).
    """
    if init_checkpoint.startswith("hf:"):
        return None
    path = init_checkpoint.rpartition("@")[0] if "@" in init_checkpoint else init_checkpoint
    run_dir = storage.as_path(path, name="INIT_CHECKPOINT")
    if not records.has_run_json(run_dir) and run_dir.name == names.CHECKPOINTS_SUBDIR:
        run_dir = run_dir.parent  # '<MODEL_DIR>/checkpoints[@step]'
    if not records.has_run_json(run_dir):
        return None
    info = records.read_run_json(run_dir)
    grown = info.get(grown_init.RUN_FIELD) if info.get("kind") == grown_init.GROWN_KIND else None
    return (
        info.get("vocab_sha256")
        or (info.get("fingerprint") or {}).get("vocab_sha256")
        or (grown or {}).get("vocab_sha256")
    )


def describe(plan: RunPlan) -> str:
    """One line for the start-up log: size, counts, steps, and fresh start or resume."""
    job = plan.job
    start = f"resuming from step {plan.resume_step}" if plan.resuming else "fresh start"
    return (
        f"{os.fspath(plan.model_dir)}: {job.spec.size} ({job.params_non_embedding:,} "
        f"non-embedding parameters), {job.total_steps} steps of {job.data.batch_size} × "
        f"{job.data.seq_len} tokens; {start}"
    )
