"""Training jobs: the library function `train(...)` and its gin entry point.

    python -m trainer.train --gin_file=experiments/cpt.gin \\
        --gin.MODEL_DIR="'/runs/cpt_zh_49m'" --gin.MODEL_SIZE="'llama2_49m'" \\
        --gin.INIT_CHECKPOINT="'/runs/source_en_49m'" --gin.VOCAB_PATH="'/data/vocab/cpt.model'"

`train` takes keyword arguments and small frozen dataclasses only; gin configures it from the
files in `t5x_configs/` (see `trainer.gin_entry`). A run writes into `model_dir`: `config.gin`,
`run.json`, `metrics.jsonl`, TensorBoard events under `tb/`, orbax checkpoints under
`checkpoints/`, and `COMPLETED` last (docs/interfaces.md, "Training outputs"). Starting a run whose
`model_dir` holds checkpoints resumes it exactly: parameters, optimizer state, step, RNG,
data-stream position and the token counters all come back, once the settings are checked
against the run's fingerprint in `run.json` (`trainer.fingerprint`, `resume_policy`).

A `metrics.jsonl` record is written every `log_every` steps, at every eval step and at the end;
its `train/loss` is the token-weighted mean cross-entropy over the steps since the previous record
(so no step is left out of the curve whatever `log_every` is), `learning_rate` and
`train/grad_norm` are those of its last step.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import sys
from collections.abc import Sequence

import jax
import numpy as np
from etils import epath

from convert import hf_checkpoints, vocab_growth
from rundir import exits, finetune_recipes, names, paper_units, records, storage
from rundir import lease as lease_lib
from rundir.lease import LeaseConfig
from trainer import checkpoints as ckpt_lib
from trainer import data as data_lib
from trainer import divergence, eval_schedule, models, validation
from trainer import eval as eval_lib
from trainer import fingerprint as fingerprint_lib
from trainer import metrics as metrics_lib
from trainer import platform as platform_lib
from trainer.checkpoints import CheckpointConfig
from trainer.data import DataConfig, EvalConfig
from trainer.jobs import Job, build_job
from trainer.optimizers import OptimizerConfig
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

log = logging.getLogger(__name__)

STRATEGIES = ("source", "scratch", "cpt", "cpt_replay", "pretrain", "finetune", "finetune_scratch")
NONFINITE_MODES = ("stop", "skip")
# EX_TEMPFAIL: the run saved a checkpoint and should be started again (`rundir.exits`).
PREEMPTED_EXIT_CODE = exits.PREEMPTED
# At most this many of the records logged since the previous checkpoint are kept in the next one
# (only a file's tail can be lost: a torn last line).
_RECORDS_PER_CHECKPOINT = 8


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What the run is, for `run.json` (read by `fitting`).

    Attributes:
      strategy: one of `STRATEGIES`.
      languages: languages trained on (default: derived from the mixture's components).
      target_lang, source_lang: CPT's target and source languages.
      replay_ratio: fraction of source-language tokens replayed during CPT (0-1).
      finetune_tokens: the finetuning set size Df as given (`FINETUNE_TOKENS`), if one was.
      finetune_unit: what `finetune_tokens` counts (`FINETUNE_UNIT`, a key of
        `rundir.paper_units.DF_UNITS`): `"target"` real target tokens, `"paper"` the MT
        paper's pairs × 512.
      finetune_recipe: the finetuning length by name (`FINETUNE_RECIPE`, a key of
        `rundir.finetune_recipes.RECIPES`), None for runs that are not finetunes.
    """

    strategy: str = "pretrain"
    languages: Sequence[str] = ()
    target_lang: str | None = None
    source_lang: str | None = None
    replay_ratio: float = 0.0
    finetune_tokens: int | None = None
    finetune_unit: str = "target"
    finetune_recipe: str | None = None

    def __post_init__(self):
        if self.finetune_recipe is not None:
            finetune_recipes.recipe(self.finetune_recipe)  # refuses an unknown name, naming it


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How a call to `train` ended: `completed` False means preempted or stopped early."""

    model_dir: str
    step: int
    tokens: int
    completed: bool


# Raised when training diverges (no non-finite state is ever checkpointed); see `divergence`.
NonFiniteError = divergence.NonFiniteError


def resolve_train_steps(
    *, train_steps: int | None, tokens_per_param: float | None, params: int, tokens_per_step: int
) -> int:
    """`train_steps`, or enough steps for `tokens_per_param × params` tokens (rounded up)."""
    validation.check_steps(train_steps=train_steps, tokens_per_param=tokens_per_param)
    if train_steps is not None:
        return int(train_steps)
    return max(1, math.ceil(tokens_per_param * params / tokens_per_step))


def _languages(run: RunInfo, components: Sequence[str]) -> list[str]:
    if run.languages:
        return list(run.languages)
    langs = [c.split("_", 1)[1] for c in components if c.startswith(("lm_", "span_"))]
    langs += [lang for c in components if c.startswith("mt_") for lang in c.split("_")[1:]]
    return list(dict.fromkeys(langs))


def _mt_langs(run: RunInfo, components: Sequence[str]) -> tuple[str | None, str | None]:
    """(source, target) language: as given, or those of a translation task `mt_<src>_<tgt>`."""
    if run.source_lang or run.target_lang or len(components) != 1:
        return run.source_lang, run.target_lang
    parts = components[0].split("_")
    if parts[0] == "mt" and len(parts) == 3:
        return parts[1], parts[2]
    return None, None


def _run_json(job: Job, *, run: RunInfo, data: DataConfig, seed: int, init: dict, gin: str):
    total, non_embedding = job.model.param_counts()
    source_lang, target_lang = _mt_langs(run, job.components)
    return {
        "model": job.model.name,
        "family": job.model.family,
        "params_total": total,
        "params_non_embedding": non_embedding,
        "strategy": run.strategy,
        "languages": _languages(run, job.components),
        "target_lang": target_lang,
        "source_lang": source_lang,
        "replay_ratio": float(run.replay_ratio),
        "mixture_or_task": data.mixture_or_task,
        "components": list(job.components),
        "init_checkpoint": init.get("init_checkpoint"),
        "init_step": init.get("init_step"),
        "init_params_hash": init.get("init_params_hash"),
        **vocab_growth.run_fields(init),  # a grown INIT_CHECKPOINT's vocabulary extension
        **hf_checkpoints.run_fields(init),  # an imported INIT_CHECKPOINT's source (hf:, Meta)
        "seed": seed,
        "seq_len": data.seq_len,
        "task_feature_lengths": dict(data.task_feature_lengths),
        "finetune_tokens": run.finetune_tokens,
        "finetune_recipe": run.finetune_recipe,
        **paper_units.run_fields(
            batch_size=data.batch_size,
            task_feature_lengths=data.task_feature_lengths,
            subset_examples=data.subset_examples,
            finetune_unit=run.finetune_unit,
        ),
        "batch_size": data.batch_size,
        "train_steps": job.total_steps,
        "flops_per_token": job.flops_per_token,
        "flops_per_token_attn": job.flops_per_token_attn,
        "gin_config": gin,
    }


def _write_run_files(
    model_dir: epath.Path,
    *,
    info,
    fingerprint,
    amendment,
    resumed: bool,
    step: int,
    gin_config: str,
) -> None:
    """`config.gin` and `run.json` (with the fingerprint) of a fresh run; on an amended resume
    the old `config.gin` is kept as `config.<step>.gin` and `run.json` records the amendment."""
    info = {**info, "fingerprint": fingerprint}
    has_run_json = records.has_run_json(model_dir)
    if amendment is not None and has_run_json:
        info = fingerprint_lib.record_resume(
            model_dir,
            old_info=records.read_run_json(model_dir),
            new_info=info,
            amendment=amendment,
            step=step,
        )
    storage.write_text_atomic(
        model_dir / names.CONFIG_FILE, gin_config or "# trainer.train called directly\n"
    )
    if not resumed or not has_run_json or amendment is not None:
        records.write_run_json(model_dir, info)


def train(
    *,
    model_dir: str | os.PathLike,
    model: models.ModelSpec,
    data: DataConfig,
    train_steps: int | None = None,
    tokens_per_param: float | None = None,
    optimizer: OptimizerConfig = OptimizerConfig(),
    schedule: ScheduleConfig = ScheduleConfig(),
    checkpoint: CheckpointConfig = CheckpointConfig(),
    mesh: MeshConfig = MeshConfig(),
    evaluation: EvalConfig = EvalConfig(),
    run: RunInfo = RunInfo(),
    init_checkpoint: str | None = None,
    seed: int = 0,
    log_every: int = 100,
    num_microbatches: int = 1,
    z_loss: float = 0.0,
    on_nonfinite: str = "stop",
    max_skipped_fraction: float = 0.05,
    stop_after: int | None = None,
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
      tokens_per_param: ... a token budget of `tokens_per_param × N` (non-embedding N).
      optimizer, schedule: see `trainer.optimizers` and `trainer.schedules`.
      checkpoint: save period and keep policy.
      mesh: mesh axis sizes.
      evaluation: periodic validation losses.
      run: strategy and languages, recorded in `run.json`.
      init_checkpoint: `'<dir>[@step]'` to initialise the parameters from (CPT, finetuning), or
        `'hf:<dir>'`, a Hugging Face LLaMA directory (`convert.hf_cache`); ignored when `model_dir`
        already holds a checkpoint (the run resumes instead).
      seed: parameter initialisation and data order.
      log_every: write a `metrics.jsonl` record every this many steps (and at eval steps).
      num_microbatches: gradient accumulation over this many microbatches per step.
      z_loss: weight of the auxiliary z-loss.
      on_nonfinite: what a non-finite loss, gradient or update does: "stop" raises
        `NonFiniteError` and rolls back to the last checkpoint (all checkpoints are finite);
        "skip" drops such updates (counting neither their tokens nor their loss) and goes on.
      max_skipped_fraction: in "skip" mode, fail with `NonFiniteError` once more than this
        fraction of the steps so far were skipped (one skip is always tolerated); a run that
        applied no update never counts as completed.
      stop_after: stop (saving a checkpoint) after this step, as a preemption would.
      gin_config: the resolved gin config, written to `config.gin` and `run.json`.
      resume_policy: settings that may differ from the run's fingerprint when `model_dir` is
        resumed (`RESUME_POLICY`; see `trainer.fingerprint`); None: nothing may change.
      lease: heartbeat and staleness of the exclusive lease on `model_dir` (`rundir.lease`),
        taken before anything is written there and released when the call ends.
      expect_platform: the platform JAX must run on ('gpu', 'tpu', 'cpu'; `EXPECT_PLATFORM`),
        else `$XLSCALE_EXPECT_PLATFORM`; None or 'any': whatever JAX finds. A mismatch raises
        `trainer.platform.PlatformError` before anything is written or compiled.

    Returns:
      Where the run ended. A SIGTERM or `stop_after` ends it early with a checkpoint.
    """
    platform_lib.check(expect_platform)  # a GPU job never trains on the CPU backend
    validation.check_choice(name="on_nonfinite", value=on_nonfinite, allowed=NONFINITE_MODES)
    validation.check_fraction(name="max_skipped_fraction", value=max_skipped_fraction)
    validation.check_choice(name="strategy", value=run.strategy, allowed=STRATEGIES)
    validation.check_init_for_strategy(strategy=run.strategy, init_checkpoint=init_checkpoint)
    _check_replay(run=run, data=data)
    if not os.fspath(model_dir):
        raise validation.ConfigError(f"{validation.BINDINGS['model_dir']} must be set")
    # Local or object storage; an unsupported scheme is refused here, before anything is written.
    model_dir = storage.as_path(model_dir, name="MODEL_DIR")
    settings = _Settings(
        model=model,
        data=data,
        train_steps=train_steps,
        tokens_per_param=tokens_per_param,
        optimizer=optimizer,
        schedule=schedule,
        checkpoint=checkpoint,
        mesh=mesh,
        evaluation=evaluation,
        run=run,
        init_checkpoint=init_checkpoint,
        seed=seed,
        log_every=log_every,
        num_microbatches=num_microbatches,
        z_loss=z_loss,
        on_nonfinite=on_nonfinite,
        max_skipped_fraction=max_skipped_fraction,
        stop_after=stop_after,
        gin_config=gin_config,
        resume_policy=resume_policy,
    )
    created = not storage.is_remote(model_dir) and not model_dir.exists()
    sigterm = ckpt_lib.SigtermFlag()  # from before the lease is taken until it is released
    held = None
    try:
        held = lease_lib.acquire(model_dir, config=lease)  # one writer; fails if not writable
        return _train_holding_lease(model_dir, settings, sigterm=sigterm)
    except storage.StorageError:
        if held is not None:  # the store is unreachable: each further request would wait too
            held.release(remove_file=False)
            held = None
        raise
    except BaseException:
        if held is not None:
            held.release()
            held = None
            if created:  # a refusal before anything was written leaves no empty MODEL_DIR
                _remove_if_empty(model_dir)
        raise
    finally:
        if held is not None:
            held.release()
        sigterm.close()


def _remove_if_empty(model_dir: epath.Path) -> None:
    try:
        if model_dir.is_dir() and not any(model_dir.iterdir()):
            model_dir.rmdir()
    except OSError:
        pass  # another process wrote there meanwhile: leave it


def _check_replay(*, run: RunInfo, data: DataConfig) -> None:
    """`run.replay_ratio` is recorded in `run.json` only if the mixture applies it."""
    from pipelines import mixtures

    validation.check_replay_ratio(
        replay_ratio=run.replay_ratio,
        applied=data_lib.applied_replay_ratio(
            mixture_or_task=data.mixture_or_task,
            target_lang=run.target_lang,
            source_lang=run.source_lang,
        ),
        mixture_or_task=data.mixture_or_task,
        replay_choices=[p / 100 for p in mixtures.REPLAY_PCTS],
    )


@dataclasses.dataclass(frozen=True)
class _Settings:
    """`train`'s arguments but the run directory and the lease (see `train` for each)."""

    model: models.ModelSpec
    data: DataConfig
    train_steps: int | None
    tokens_per_param: float | None
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    checkpoint: CheckpointConfig
    mesh: MeshConfig
    evaluation: EvalConfig
    run: RunInfo
    init_checkpoint: str | None
    seed: int
    log_every: int
    num_microbatches: int
    z_loss: float
    on_nonfinite: str
    max_skipped_fraction: float
    stop_after: int | None
    gin_config: str
    resume_policy: str | Sequence[str] | None


def _train_holding_lease(
    model_dir: epath.Path, s: _Settings, *, sigterm: ckpt_lib.SigtermFlag | None = None
) -> TrainResult:
    """`train` once it holds the lease on `model_dir`: builds the job once (checking the init
    checkpoint and the fingerprint before compiling), then resumes or starts the run."""
    log.info("%s", platform_lib.describe())
    checkpoints = ckpt_lib.checkpoints_dir(model_dir)
    resuming = checkpoints.is_dir() and any(checkpoints.iterdir())
    checked = {}

    def precheck(abstract_params, total_steps: int):
        if s.init_checkpoint and not resuming:
            ckpt_lib.check_init_checkpoint(s.init_checkpoint, abstract_params=abstract_params)
        vocab_hash = fingerprint_lib.vocab_sha256(s.data.vocab_path)
        if s.data.prepared_dir is not None:  # verified (shards, vocabulary) before compiling
            checked["prepared"] = data_lib.prepared_datasets(s.data, vocab_hash=vocab_hash)
        # Compare with the run being resumed before anything is compiled or written.
        sections = dict(data=s.data, optimizer=s.optimizer, schedule=s.schedule, run=s.run)
        checked["fingerprint"] = fingerprint_lib.run_fingerprint(
            model=s.model,
            **sections,
            evaluation=s.evaluation,
            train_steps=s.train_steps,
            tokens_per_param=s.tokens_per_param,
            total_steps=total_steps,
            seed=s.seed,
            num_microbatches=s.num_microbatches,
            z_loss=s.z_loss,
            init_checkpoint=s.init_checkpoint,
            vocab_hash=vocab_hash,
            prepared=data_lib.prepared_input(s.data, checked["prepared"])
            if "prepared" in checked
            else None,
        )
        checked["amendment"] = fingerprint_lib.check_model_dir(
            model_dir,
            new=checked["fingerprint"],
            policy=s.resume_policy,
            defaults=fingerprint_lib.fingerprint_defaults(**sections),
        )

    job = build_job(
        model=s.model,
        data=s.data,
        evaluation=s.evaluation,
        optimizer=s.optimizer,
        schedule=s.schedule,
        mesh=s.mesh,
        num_microbatches=s.num_microbatches,
        z_loss=s.z_loss,
        steps_fn=lambda params, tokens_per_step: resolve_train_steps(
            train_steps=s.train_steps,
            tokens_per_param=s.tokens_per_param,
            params=params,
            tokens_per_step=tokens_per_step,
        ),
        precheck=precheck,
    )
    is_chief = jax.process_index() == 0
    if is_chief:
        model_dir.mkdir(parents=True, exist_ok=True)
    store = ckpt_lib.CheckpointStore(checkpoints, s.checkpoint)
    writer = metrics_lib.MetricsWriter(model_dir, is_chief=is_chief)
    watcher = ckpt_lib.PreemptionWatcher(store, flag=sigterm)
    failed: BaseException | None = None
    try:
        state, saved, init = _initial_state(
            job, store, init_checkpoint=s.init_checkpoint, seed=s.seed
        )
        start = int(saved.get("step", 0))
        if is_chief:
            _write_run_files(
                model_dir,
                info=_run_json(
                    job, run=s.run, data=s.data, seed=s.seed, init=init, gin=s.gin_config
                ),
                fingerprint=checked["fingerprint"],
                amendment=checked["amendment"] if saved else None,
                resumed=bool(saved),
                step=start,
                gin_config=s.gin_config,
            )
        writer.truncate_after(start)
        writer.restore_lost(saved.get("records", []), step=start)
        return _loop(
            job,
            state,
            model_dir=model_dir,
            data=s.data,
            evaluation=s.evaluation,
            checkpoint=s.checkpoint,
            saved=saved,
            start=start,
            seed=s.seed,
            log_every=s.log_every,
            on_nonfinite=s.on_nonfinite,
            max_skipped_fraction=s.max_skipped_fraction,
            stop_after=s.stop_after,
            prepared=checked.get("prepared"),
            store=store,
            writer=writer,
            watcher=watcher,
        )
    except BaseException as e:
        failed = e
        raise
    finally:
        _close(watcher, writer, store, failed=failed)


def _close(watcher, writer, store, *, failed: BaseException | None) -> None:
    """Stops the preemption watcher, the metrics writer and the checkpoint store.

    After a failure, a close that fails too is logged rather than raised (the first error is the
    one to report); after a storage failure the store's background save is not waited for: it
    may retry against the unreachable store for many minutes (TensorStore's retry policy), and
    the step it writes was never committed, so resume does not see it; nor are TensorBoard's
    staged events copied (each request would wait out the storage client's retries again).
    """
    unreachable = isinstance(failed, storage.StorageError)
    closers = [watcher.close, functools.partial(writer.close, sync=not unreachable)]
    if not unreachable:
        closers.append(store.close)
    for close in closers:
        try:
            close()
        except Exception as e:
            if failed is None:
                raise
            log.warning("while stopping after %s: %s", type(failed).__name__, e)


def _initial_state(job: Job, store, *, init_checkpoint: str | None, seed: int):
    """Resumed state (with its saved JSON), or a fresh one (from `init_checkpoint` if given)."""
    if store.latest_step() is not None:
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
        init_checkpoint, abstract_params=job.abstract_state_with_shardings().params
    )
    init = {
        # The source run's MODEL_DIR (where its run.json is), not its checkpoints/ folder.
        "init_checkpoint": os.fspath(
            directory.parent if directory.name == ckpt_lib.CHECKPOINTS_SUBDIR else directory
        ),
        "init_step": step,
        "init_params_hash": ckpt_lib.params_hash(params),
    }
    log.info("initialised params from %s step %d", directory, step)
    return job.init_state(rng, params=params), {}, init


def _loop(
    job: Job,
    state,
    *,
    model_dir,
    data,
    evaluation,
    checkpoint,
    saved,
    start,
    seed,
    log_every,
    on_nonfinite,
    max_skipped_fraction,
    stop_after,
    prepared,
    store,
    writer,
    watcher,
) -> TrainResult:
    """Runs steps `start+1 .. total`, logging, evaluating and saving along the way."""
    counters = metrics_lib.Counters(
        job.components,
        saved,
        tokens_paper_per_step=paper_units.tokens_paper_per_step(
            batch_size=data.batch_size, task_feature_lengths=data.task_feature_lengths
        ),
    )
    total = job.total_steps
    progress = metrics_lib.StepRate(
        total_steps=total,
        tokens_per_step=data.batch_size * data.seq_len,
        flops_per_token=job.flops_per_token_attn,
        num_devices=jax.device_count(),
        peak_flops=metrics_lib.peak_flops_per_device(jax.devices()[0].device_kind),
    )
    stream = data_lib.train_batches(
        data,
        seed=seed,
        start_step=int(saved.get("data_position", start)),
        shard_index=jax.process_index(),
        num_shards=jax.process_count(),
        host_rows=job.partitioner.host_rows(data.batch_size),
        prepared=prepared,
    )

    def evaluate(step):
        return eval_lib.evaluate_params(
            job,
            state.params,
            evaluation,
            seq_len=data.seq_len,
            step=step,
            final=step == total,
            model_dir=model_dir,
        )

    # Records logged since the last checkpoint: the next one keeps them (`train_state["records"]`)
    # so that a resume can log again what it covers but `metrics.jsonl` lost.
    unsaved = []

    def log_record(record):
        writer.write(record)
        unsaved.append(dict(record))
        del unsaved[:-_RECORDS_PER_CHECKPOINT]

    def save(step):
        train_state = {
            "step": step,
            "data_position": step,
            "rng": [int(x) for x in np.asarray(jax.device_get(state.rng)).ravel()],
            "skipped": int(jax.device_get(state.skipped)),
            **counters.to_json(),
            "records": list(unsaved),
        }
        store.save(step, params=state.params, opt_state=state.opt_state, train_state=train_state)
        unsaved.clear()

    if watcher.signalled():  # SIGTERM while starting up: nothing trained, nothing to save
        log.warning("stopping before step %d (SIGTERM during start-up); rerun to resume", start + 1)
        return TrainResult(
            model_dir=os.fspath(model_dir), step=start, tokens=counters.tokens, completed=False
        )
    # The steps this run evaluates at (`trainer.eval_schedule`: periodic or log-spaced; 0 first
    # with EVAL_AT_START, run only on a fresh start since a resumed run logged it already).
    eval_at = frozenset(eval_schedule.eval_steps(evaluation, total=total))
    if start == 0 and 0 in eval_at:
        log_record({**counters.record(0, **job.flops_kwargs()), **evaluate(0)})
    step, pending, preempted = start, [], False
    progress.start(step)
    while step < total:
        batch = job.partitioner.shard_batch(next(stream))
        state, step_metrics = job.train_step(state, batch)
        pending.append((step + 1, step_metrics))
        step += 1
        if step == start + 1:  # leave compilation out of the throughput
            jax.block_until_ready(step_metrics)
            progress.start(step)
        last = step == total
        do_eval = step in eval_at
        periodic_save = step % checkpoint.period == 0
        # Every checkpoint kept for good (KEEP_EVERY) has a record: fitting dates it by `tokens`.
        kept = periodic_save and bool(checkpoint.keep_every) and step % checkpoint.keep_every == 0
        do_log = last or do_eval or kept or step % log_every == 0
        preempted = not last and (step == stop_after or watcher.should_stop(step))
        do_save = last or preempted or periodic_save
        if not (do_log or do_save):
            continue
        counters.absorb(jax.device_get(pending))
        pending = []
        if counters.nonfinite:
            divergence.on_nonfinite(
                counters,
                step=step,
                mode=on_nonfinite,
                max_skipped_fraction=max_skipped_fraction,
                model_dir=model_dir,
                store=store,
                writer=writer,
            )
        if do_log:
            timing = progress.timing(step)
            record = counters.record(step, **job.flops_kwargs())
            progress.log_line(
                step,
                loss=record.get("train/loss", float("nan")),
                learning_rate=record["learning_rate"],
                timing=timing,
            )
            if do_eval:
                record.update(evaluate(step))
            log_record({**record, **timing})
        if do_save:
            save(step)
        if do_eval or do_save:
            progress.start(step)
        if preempted:
            log.warning("stopping at step %d (checkpoint saved); rerun to resume", step)
            break
    store.wait()
    completed = step >= total
    if completed:
        divergence.check_applied(step=step, skipped=counters.skipped)
    if completed and jax.process_index() == 0:
        records.write_completed(model_dir, step=step, tokens=counters.tokens)
    return TrainResult(
        model_dir=os.fspath(model_dir), step=step, tokens=counters.tokens, completed=completed
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainer.train --gin_file=F [--gin_file=...] [--gin.KEY=VALUE ...]`."""
    from trainer import gin_entry
    from trainer import train as lib  # the importable module, which the gin files name

    config = gin_entry.parse(sys.argv[1:] if argv is None else argv, job="train")
    result = gin_entry.call(lib.train, config)
    return 0 if result.completed else PREEMPTED_EXIT_CODE


if __name__ == "__main__":
    from rundir import exits

    code = exits.run_main(main, prog="python -m trainer.train")
    if code not in (0, PREEMPTED_EXIT_CODE):
        # A failed run may leave background threads (an orbax save retrying against storage
        # that went away) that would hold the process for many minutes; nothing they write
        # matters any more, and the error has been reported.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
