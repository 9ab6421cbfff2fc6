"""Training jobs: the library function `train(...)` and its gin entry point.

    python -m trainer.train --gin_file=experiments/cpt.gin \\
        --gin.MODEL_DIR="'/runs/cpt_zh_49m'" --gin.MODEL_SIZE="'llama2_49m'" \\
        --gin.INIT_CHECKPOINT="'/runs/source_en_49m'" --gin.VOCAB_PATH="'/data/vocab/cpt.model'"

`train` takes keyword arguments and small frozen dataclasses only; gin configures it from the
files in `t5x_configs/` (see `trainer.gin_entry`). It reads top to bottom: checks that need
nothing built; the lease on `model_dir`; the run's plan (`trainer.plan`: model, counts and steps,
the resume decision, init checks, fingerprint, inputs; nothing written); the compiled steps
(`trainer.jobs`); the restored or fresh state, the input stream and the run files; then the step
loop (`trainer.loop`) with two hook objects (`trainer.run_hooks`), a metrics record (with
evaluation) and a checkpoint. A
resume writes its run files (an amendment, `config.<step>.gin`) at its first checkpoint, not
before (`trainer.run_files.RunFiles`); a fresh start that fails before it trained leaves
`model_dir` as it found it.

A run writes into `model_dir`: `config.gin`, `run.json`, `metrics.jsonl`, TensorBoard events
under `tb/`, orbax checkpoints under `checkpoints/`, and `COMPLETED` last (docs/interfaces.md,
"Training outputs"). Starting a run whose `model_dir` holds checkpoints resumes it exactly:
parameters, optimizer state, step, RNG, data-stream position and the token counters all come
back, once the settings are checked against the run's fingerprint in `run.json`
(`trainer.fingerprint`, `resume_policy`).

A `metrics.jsonl` record is written every `loop.log_every` steps, at every eval step, at kept
checkpoints and at the end; its `train/loss` is the token-weighted mean cross-entropy over the
steps since the previous record (so no step is left out of the curve whatever `log_every` is),
`learning_rate` and `train/grad_norm` are those of its last step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

import jax

from pipelines import native_logs
from rundir import exits, paper_units, records, storage
from rundir import lease as lease_lib
from rundir.lease import LeaseConfig
from rundir.run_record import Strategy
from trainer import checkpoints as ckpt_lib
from trainer import data as data_lib
from trainer import (
    divergence,
    eval_schedule,
    gin_entry,
    jobs,
    model_spec,
    preemption,
    run_files,
    run_hooks,
    shutdown,
    start_state,
    validation,
)
from trainer import eval as eval_lib
from trainer import loop as loop_lib
from trainer import metrics_log as metrics_lib
from trainer import plan as plan_lib
from trainer import platform as platform_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import DataConfig, EvalConfig
from trainer.jobs import Job
from trainer.loop import LoopConfig
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig
from trainer.run_request import RunInfo, RunRequest, TrainResult
from trainer.schedules import ScheduleConfig
from trainer.steps import StepConfig

log = logging.getLogger(__name__)

STRATEGIES = tuple(s.value for s in Strategy)  # `RunInfo.strategy`
# EX_TEMPFAIL: the run saved a checkpoint and should be started again (`rundir.exits`).
PREEMPTED_EXIT_CODE = exits.PREEMPTED
# At most this many of the records logged since the previous checkpoint are kept in the next one
# (only a file's tail can be lost: a torn last line).
_RECORDS_PER_CHECKPOINT = 8


# Raised when training diverges (no non-finite state is ever checkpointed); see `divergence`.
NonFiniteError = divergence.NonFiniteError


def train(
    *,
    model_dir: str | os.PathLike,
    model: model_spec.ModelSpec,
    data: DataConfig,
    train_steps: int | None = None,
    tokens_per_param: float | None = None,
    param_basis: str = "non_embedding",
    optimizer: OptimizerConfig = OptimizerConfig(),
    schedule: ScheduleConfig = ScheduleConfig(),
    checkpoint: CheckpointConfig = CheckpointConfig(),
    mesh: MeshConfig = MeshConfig(),
    evaluation: EvalConfig = EvalConfig(),
    step: StepConfig = StepConfig(),
    loop: LoopConfig = LoopConfig(),
    run: RunInfo = RunInfo(),
    init_checkpoint: str | None = None,
    seed: int = 0,
    gin_config: str = "",
    resume_policy: str | Sequence[str] | None = None,
    lease: LeaseConfig = LeaseConfig(),
    expect_platform: str | None = None,
) -> TrainResult:
    """Trains (or resumes) one run and writes its outputs into `model_dir`.

    Args:
      model_dir: the run directory (`MODEL_DIR`).
      model: family, size and config overrides.
      data: training mixture/task, lengths, global batch size, vocabulary and corpora.
      train_steps: optimizer steps (`TRAIN_STEPS`); when None they are derived from ...
      tokens_per_param: ... a token budget of `tokens_per_param × N`, N on ...
      param_basis: ... this basis (`PARAM_BASIS`, `modeling.family.PARAM_BASES`): the exact
        'non_embedding' or 'total' count, or the paper's 'nominal' size
        (`jobs.resolve_train_steps`).

    All of them travel on as one `trainer.run_request.RunRequest`, which the plan takes whole.
      optimizer, schedule: see `trainer.optimizers` and `trainer.schedules`.
      checkpoint: save period and keep policy.
      mesh: mesh axis sizes.
      evaluation: periodic validation losses.
      step: the train step's settings: microbatches and z-loss (`trainer.steps.StepConfig`).
      loop: logging period, non-finite handling and `stop_after` (`trainer.loop.LoopConfig`).
      run: strategy and languages, recorded in `run.json`.
      init_checkpoint: `'<dir>[@step]'` to initialise the parameters from (CPT, finetuning), or
        `'hf:<dir>'`, a Hugging Face LLaMA directory (`convert.hf_cache`); ignored when `model_dir`
        already holds a checkpoint (the run resumes instead).
      seed: parameter initialisation and data order.
      gin_config: the resolved gin config, written to `config.gin` and `run.json`.
      resume_policy: settings that may differ from the run's fingerprint when `model_dir` is
        resumed (`RESUME_POLICY`; see `trainer.fingerprint`); None: nothing may change.
      lease: heartbeat and staleness of the exclusive lease on `model_dir` (`rundir.lease`),
        taken before anything is written there and released when the call ends.
      expect_platform: the platform JAX must run on ('gpu', 'tpu', 'cpu'; `EXPECT_PLATFORM`),
        else `$XLSCALE_EXPECT_PLATFORM`; None or 'any': whatever JAX finds. A mismatch raises
        `trainer.platform.PlatformError` before anything is written or compiled.

    Returns:
      Where the run ended. A SIGTERM or `loop.stop_after` ends it early with a checkpoint.
    """
    request = RunRequest(
        model_dir=model_dir,
        model=model,
        data=data,
        train_steps=train_steps,
        tokens_per_param=tokens_per_param,
        param_basis=param_basis,
        optimizer=optimizer,
        schedule=schedule,
        checkpoint=checkpoint,
        mesh=mesh,
        evaluation=evaluation,
        step=step,
        loop=loop,
        run=run,
        init_checkpoint=init_checkpoint,
        seed=seed,
        gin_config=gin_config,
        resume_policy=resume_policy,
        lease=lease,
        expect_platform=expect_platform,
    )
    platform_lib.check(request.expect_platform)  # a GPU job never trains on the CPU backend
    validation.check_choice(name="strategy", value=request.run.strategy, allowed=STRATEGIES)
    validation.check_init_for_strategy(
        strategy=request.run.strategy, init_checkpoint=request.init_checkpoint
    )
    _check_replay(run=request.run, data=request.data)
    if not os.fspath(request.model_dir):
        raise validation.ConfigError(f"{validation.BINDINGS['model_dir']} must be set")
    # Local or object storage; an unsupported scheme is refused here, before anything is written.
    model_dir = storage.as_path(request.model_dir, name="MODEL_DIR")
    request = dataclasses.replace(request, model_dir=model_dir)
    created = not storage.is_remote(model_dir) and not model_dir.exists()
    existed = run_files.entries(model_dir)  # what a fresh start that trains nothing leaves behind
    sigterm = preemption.SigtermFlag()  # from before the lease is taken until it is released
    held, plan = None, None
    try:
        # One writer; fails if `model_dir` is not writable.
        held = lease_lib.acquire(model_dir, config=request.lease)
        plan = plan_lib.build_run_plan(request=request)
        return _run(plan, sigterm=sigterm)
    except BaseException as e:
        # A remote store that failed is left alone: each further request would wait too (its
        # lease goes stale and is taken over). A full local disk still lets files be removed.
        remote_failure = isinstance(e, storage.StorageError) and storage.is_remote(model_dir)
        if held is not None:
            held.release(remove_file=not remote_failure)
            held = None
            if not remote_failure and existed is not None and (plan is None or not plan.resuming):
                run_files.remove_refused_start(model_dir, existed=existed, created=created)
        elif created:  # the lease could not be written (a full disk): no empty MODEL_DIR left
            run_files.remove_if_empty(model_dir)
        raise
    finally:
        if held is not None:
            held.release()
        sigterm.close()


def _check_replay(*, run: RunInfo, data: DataConfig) -> None:
    """`run.replay_ratio` is recorded in `run.json` only if the mixture applies it."""
    from pipelines import mixtures  # seqio: imported by a run, not by `import trainer.train`

    validation.check_replay_ratio(
        replay_ratio=run.replay_ratio,
        applied=mixtures.replay_fraction(
            mixture_or_task=data.mixture_or_task,
            target_lang=run.target_lang,
            source_lang=run.source_lang,
        ),
        mixture_or_task=data.mixture_or_task,
        replay_choices=[p / 100 for p in mixtures.REPLAY_PCTS],
    )


def _run(plan: plan_lib.RunPlan, *, sigterm: preemption.SigtermFlag | None = None) -> TrainResult:
    """A planned run, once its lease is held: compiles, restores or initialises the state,
    writes the run files and runs the loop."""
    log.info("%s", platform_lib.describe())
    log.info("%s", plan_lib.describe(plan))
    job = jobs.compile_plan(plan.job)
    # SIGTERM only here (stop requests are polled by the watcher, built with the store below).
    if sigterm is not None and sigterm.event.is_set():  # before a restore that may take minutes
        first = "restoring" if plan.resuming else "initialising"
        return _stopped_at_start_up(plan, before=f"{first} the state", step=plan.resume_step or 0)
    model_dir = plan.model_dir
    is_chief = jax.process_index() == 0
    failed: BaseException | None = None
    store = writer = watcher = training = None
    try:
        # Opening the store (listing its steps, reading their records) is storage work too: an
        # outage here is reported as one, like a failed save.
        if is_chief:
            model_dir.mkdir(parents=True, exist_ok=True)
        store = ckpt_lib.CheckpointStore(ckpt_lib.checkpoints_dir(model_dir), plan.checkpoint)
        writer = metrics_lib.MetricsWriter(model_dir, is_chief=is_chief)
        watcher = preemption.PreemptionWatcher(store, flag=sigterm, model_dir=model_dir)
        state, saved, init = start_state.initial_state(
            job,
            store,
            resume=plan.resuming,
            init_checkpoint=plan.init_source,
            init_checked=True,  # the step the plan checked against the model
            seed=plan.seed,
        )
        start = int(saved.get("step", 0))
        if watcher.signalled():  # before opening the input pipeline (seconds for large mixtures)
            return _stopped_at_start_up(
                plan, before="opening the data", step=start, tokens=int(saved.get("tokens", 0))
            )
        files = run_files.RunFiles(
            record=run_files.run_record(
                job,
                run=plan.run,
                data=plan.job.data,
                seed=plan.seed,
                init=init,
                gin=plan.gin_config,
            ),
            fingerprint=plan.fingerprint,
            amendment=plan.amendment if saved else None,
            resumed=bool(saved),
            step=start,
            gin_config=plan.gin_config,
        )
        # Opens the input stream (its settings are checked there) before any run file is written.
        training = _Training(
            plan,
            job,
            state,
            saved=saved,
            start=start,
            store=store,
            writer=writer,
        )
        hooks = [
            run_hooks.MetricsHook(training),  # first: a checkpoint carries the records up to it
            # A resume's run files (an amendment above all) wait for its first checkpoint: only
            # a run that trained under them records them (`run_files.RunFiles`).
            run_hooks.CheckpointHook(training, pending_files=files if is_chief and saved else None),
        ]
        if is_chief and not saved:
            files.write(model_dir)
        writer.truncate_after(start)
        writer.restore_lost(saved.get("records", []), step=start)
        return training.run(watcher, hooks)
    except Exception as e:
        # A full disk is a storage failure whatever wrote (TensorBoard's events through
        # TensorFlow, orbax's threads): told as one, with where a rerun resumes.
        failed = storage.as_storage_error(e, model_dir, "writing", causes=storage.LOCAL_CAUSES)
        failed = failed or e
        if not isinstance(failed, storage.StorageError):
            raise
        # The store knows the last step committed (on local disk it lets a save in flight end
        # first); before it opened, that is the step the plan found.
        local = not storage.is_remote(model_dir)
        last = plan.resume_step if store is None else store.last_committed(wait=local)
        last = None if last is None else (last, ckpt_lib.checkpoints_dir(model_dir) / str(last))
        raise storage.told(failed, last=last) from e
    except BaseException as e:
        failed = e
        raise
    finally:
        shutdown.close(watcher, writer, store, failed=failed)


def _stopped_at_start_up(
    plan: plan_lib.RunPlan, *, before: str, step: int, tokens: int = 0
) -> TrainResult:
    """A run told to stop (SIGTERM, a stop request) while it starts: nothing trained since its
    last checkpoint, so nothing to save. It stops at the next point of its start-up rather than
    after all of it, so a short notice (a preemptible VM's, a scheduler's SIGTERM before its time
    limit) is not spent restoring and compiling; a rerun resumes. `step`, `tokens`: where the run
    stands (0 tokens when the state was not read yet)."""
    log.warning("stopping before %s (SIGTERM during start-up or a stop request)", before)
    return TrainResult(
        model_dir=os.fspath(plan.model_dir), step=step, tokens=tokens, completed=False
    )


class _Training:
    """A run's shared state around the step loop (`trainer.loop.StepLoop`): the train state, the
    counters and throughput, the input stream, the store and metrics writer, the eval schedule
    and the records not yet in a checkpoint. The work done at chosen steps lives in hook objects
    (`trainer.run_hooks`: a metrics record with evaluation, a checkpoint) that `_run` registers;
    they read and update this state."""

    def __init__(
        self,
        plan: plan_lib.RunPlan,
        job: Job,
        state,
        *,
        saved,
        start,
        store,
        writer,
    ):
        self.plan, self.job, self.state = plan, job, state
        self.start, self.store, self.writer = start, store, writer
        data = plan.job.data
        self.counters = metrics_lib.Counters(
            job.components,
            saved,
            tokens_paper_per_step=paper_units.tokens_paper_per_step(
                batch_size=data.batch_size, task_feature_lengths=data.task_feature_lengths
            ),
        )
        self.progress = metrics_lib.StepRate(
            total_steps=job.total_steps,
            tokens_per_step=data.batch_size * data.seq_len,
            flops_per_token=job.flops_per_token_attn,
            num_devices=jax.device_count(),
            peak_flops=metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind),
        )
        self.stream = data_lib.train_batches(
            data,
            seed=plan.seed,
            start_step=int(saved.get("data_position", start)),
            shard_index=jax.process_index(),
            num_shards=jax.process_count(),
            host_rows=job.partitioner.host_rows(data.batch_size),
            prepared=plan.prepared,
        )
        # The steps this run evaluates at (`trainer.eval_schedule`: periodic or log-spaced; 0
        # first with EVAL_AT_START, run only on a fresh start since a resumed run logged it).
        self.eval_at = frozenset(
            eval_schedule.eval_steps(plan.job.evaluation, total=job.total_steps)
        )
        self.best_key = plan.checkpoint.best_metric(plan.job.evaluation.tasks)
        self.evaluated: tuple[int, float | None] = (-1, None)  # (step, best_key's value)
        # Records logged since the last checkpoint: the next one keeps them
        # (`train_state["records"]`) so that a resume can log again what it covers but
        # `metrics.jsonl` lost.
        self.unsaved: list[dict] = []

    def run_step(self):
        """One train step on the next batch; its metrics stay on the device."""
        batch = self.job.partitioner.shard_batch(next(self.stream))
        self.state, metrics = self.job.train_step(self.state, batch)
        return metrics

    def first_step(self, step: int, metrics) -> None:
        """Leaves compilation out of the throughput."""
        jax.block_until_ready(metrics)
        self.progress.start(step)

    def sync(self, pending) -> None:
        """Fetches the pending steps' metrics; a non-finite update stops (rolling back) or is
        counted as skipped (`trainer.divergence`) before any hook acts."""
        self.counters.absorb(jax.device_get(pending))
        if self.counters.nonfinite:
            divergence.on_nonfinite(
                self.counters,
                step=pending[-1][0],
                mode=self.plan.loop.on_nonfinite,
                max_skipped_fraction=self.plan.loop.max_skipped_fraction,
                model_dir=self.plan.model_dir,
                store=self.store,
                writer=self.writer,
            )

    def evaluate(self, step: int) -> dict:
        """Validation losses (and decoding scores) of the current parameters."""
        return eval_lib.evaluate_params(
            self.job,
            self.state.params,
            self.plan.job.evaluation,
            seq_len=self.plan.job.data.seq_len,
            step=step,
            final=step == self.job.total_steps,
            model_dir=self.plan.model_dir,
        )

    def log_record(self, record: dict) -> None:
        """Writes a `metrics.jsonl` record, kept for the next checkpoint too. TensorFlow's own
        lines of a failed events write (a full disk) go to the third-party log: the failure is
        raised, and reported once."""
        with native_logs.stderr_to():
            self.writer.write(record)
        self.unsaved.append(dict(record))
        del self.unsaved[:-_RECORDS_PER_CHECKPOINT]

    def result(self, step: int, *, completed: bool) -> TrainResult:
        """How the run ended."""
        return TrainResult(
            model_dir=os.fspath(self.plan.model_dir),
            step=step,
            tokens=self.counters.tokens,
            completed=completed,
        )

    def run(
        self, watcher: preemption.PreemptionWatcher, hooks: Sequence[loop_lib.StepHook]
    ) -> TrainResult:
        """Steps `start+1 .. total` with `hooks` registered in their order, then `COMPLETED`."""
        start, total = self.start, self.job.total_steps
        if watcher.signalled():  # SIGTERM or a stop request at start-up: nothing to save
            return _stopped_at_start_up(
                self.plan, before=f"step {start + 1}", step=start, tokens=self.counters.tokens
            )
        if start == 0 and 0 in self.eval_at:
            self.log_record(
                {**self.counters.record(0, **self.job.flops_kwargs()), **self.evaluate(0)}
            )
        stop_after = self.plan.loop.stop_after
        steps = loop_lib.StepLoop(
            start=start,
            total=total,
            run_step=self.run_step,
            sync=self.sync,
            should_stop=lambda step: step == stop_after or watcher.should_stop(step),
            on_first_step=self.first_step,
            min_step_seconds=self.plan.loop.min_step_seconds,
        )
        for hook in hooks:
            steps.add(hook)
        self.progress.start(start)
        step = steps.run()
        self.store.wait()  # the last save written, before saying it is
        if step < total:
            log.warning("stopping at step %d (checkpoint saved); rerun to resume", step)
        completed = step >= total
        if completed:
            divergence.check_applied(step=step, skipped=self.counters.skipped)
        if completed and jax.process_index() == 0:
            records.write_completed(self.plan.model_dir, step=step, tokens=self.counters.tokens)
        return self.result(step, completed=completed)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainer.train --gin_file=F [--gin_file=...] [--gin.KEY=VALUE ...]`."""
    return gin_entry.run("train", argv)


if __name__ == "__main__":
    gin_entry.main("train")
