"""Checkpoints: orbax `CheckpointManager` saves, resume, params-only initialisation, preemption.

Layout: `MODEL_DIR/checkpoints/<step>/{params, opt_state, train_state}`; `train_state` is JSON
(step, RNG key data, data-stream position, cumulative token counters), the two others are array
trees. Orbax writes each step into a temporary directory and renames it only once complete, so
a killed save never leaves a latest step that cannot load.

`INIT_CHECKPOINT = '<dir>[@step]'` (CPT, finetuning) restores parameters only, after checking
every parameter's presence and shape against the model. `INIT_CHECKPOINT = 'hf:<dir>'` names a
Hugging Face model directory, converted once into a cached orbax directory
(`convert.hf_cache`) and then checked and restored like any other.

Integrity: every step is committed with its integrity record (`rundir.checksums`), written on
orbax's async-commit thread just before the atomic rename (`convert.init_checkpoints.
RecordOnCommit`), and a step counts as complete only with it. Every restore verifies the record.
A committed step without one (written by older code that hashed after the commit and was killed
in between, or whose record write failed) is set aside, never restored blind: resume falls back
to the newest step with a record -- or starts fresh, as after a kill before the first checkpoint
-- and, training being deterministic, reaches the same state. (Recomputing the record on resume
would verify nothing: it would hash whatever the files hold now.) `INIT_CHECKPOINT` and the
readers of `trainer.restore` refuse such a step, saying how to record files one trusts.

Deletion: the keep policy's deletion of an old step first marks it (`trainer.step_deletion`), so
a kill in the middle leaves `<step>.deleting`, which the next writer removes; it is never taken
for a step without its record. Steps set aside are listed each time a writer opens the store.

Failures: a writer knows which step it committed last and which save is in flight, so a failed
save names its own step (not the step of the save that noticed it) and a failure report names
the last step actually committed (`CheckpointStore.last_committed`). Orbax's own error records
of a failing save stay off the terminal (`trainer.orbax_logs`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers

from convert import init_checkpoints
from convert.hf_cache import local_init_spec
from convert.init_checkpoints import param_name
from rundir import checksums, names, storage
from rundir.checksums import CheckpointCorruptError
from trainer import orbax_logs, step_deletion, steps, validation

log = logging.getLogger(__name__)


ITEMS = ("params", "opt_state", "train_state")
CHECKPOINTS_SUBDIR = names.CHECKPOINTS_SUBDIR
# Checkpoints that must not be resumed (corrupt files; non-finite values written by older code)
# are moved here, beside `checkpoints/`, as `<step>.<reason>`: kept for inspection, invisible to
# resume, and a later save of the same step is not skipped as already on disk.
SET_ASIDE_SUBDIR = names.SET_ASIDE_SUBDIR


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When to save and what to keep.

    Attributes:
      period: save every `period` steps (and always at the last step and on preemption).
      keep_last: keep the newest `keep_last` checkpoints ...
      keep_every: ... plus every checkpoint whose step is a multiple of `keep_every` (None = no).
      async_save: write in a background thread while training continues.
      keep_best: ... plus the checkpoint with the best value of this metric of the run's first
        evaluation task (e.g. 'loss': `eval/<task>/loss`), among the checkpoints saved at an
        evaluation step, so that the step a selection picks is still there to finetune from or
        decode (None = no).
      keep_best_mode: 'min' (losses) or 'max' (BLEU, accuracy): which value is best.
    """

    period: int = 1000
    keep_last: int = 3
    keep_every: int | None = None
    async_save: bool = True
    keep_best: str | None = None
    keep_best_mode: str = "min"

    def __post_init__(self):
        validation.check_positive_int(name="checkpoint_period", value=self.period)
        validation.check_choice(
            name="keep_best_mode", value=self.keep_best_mode, allowed=tuple(BEST_MODES)
        )

    def best_metric(self, eval_tasks) -> str | None:
        """The metrics key `keep_best` names for a run evaluating `eval_tasks` (its first task's
        metric, e.g. `eval/mt_en_fr/loss`), or None without `keep_best` or evaluation."""
        return f"eval/{eval_tasks[0]}/{self.keep_best}" if self.keep_best and eval_tasks else None


# keep_best_mode -> orbax `BestN.reverse` (it keeps the last of the sorted values).
BEST_MODES = {"min": True, "max": False}
# The metrics orbax stores with a checkpoint saved at an evaluation step (`keep_best`).
_BEST_METRIC = "best"


def _handlers() -> dict[str, ocp.CheckpointHandler]:
    return {
        "params": ocp.StandardCheckpointHandler(),
        "opt_state": ocp.StandardCheckpointHandler(),
        "train_state": ocp.JsonCheckpointHandler(),
    }


def checkpoints_dir(model_dir: str | os.PathLike) -> epath.Path:
    """Where a run keeps its checkpoints (local or on object storage)."""
    return storage.as_path(model_dir, name="MODEL_DIR") / CHECKPOINTS_SUBDIR


def committed_step(model_dir: str | os.PathLike) -> int | None:
    """The newest complete checkpoint step of the run in `model_dir` -- committed by orbax (a
    step whose save did not finish is not one) and carrying its integrity record -- or None for
    a fresh run. The one rule by which a run decides that it resumes (the steps without a record
    are set aside when the run opens its store); opens nothing for writing and creates
    nothing."""
    directory = checkpoints_dir(model_dir)
    if not storage.is_dir(directory):  # an outage raises: never taken for a fresh start
        return None
    store = CheckpointStore(directory, CheckpointConfig(), read_only=True)
    try:
        return store.latest_step()
    finally:
        store.close()


class CheckpointStore:
    """A run's checkpoints: periodic saves with a keep policy, and full restores for resume.

    Opening the store, listing its steps, reading their records and verifying them raise
    `rundir.storage.StorageError` when the storage service fails (as saves do), so that an outage
    while a resume opens its checkpoints is reported as one (exit 74, `rundir.exits`), never as
    a corrupt step.

    Args:
      directory: the checkpoints directory (`checkpoints_dir(model_dir)`).
      config: save period and keep policy.
      read_only: open an existing directory without creating or deleting anything.
    """

    def __init__(
        self, directory: str | os.PathLike, config: CheckpointConfig, *, read_only: bool = False
    ):
        self.config = config
        policies = [checkpoint_managers.LatestN(max(1, config.keep_last))]
        if config.keep_every:
            policies.append(checkpoint_managers.EveryNSteps(config.keep_every))
        best = {}
        if config.keep_best:
            policies.append(
                checkpoint_managers.BestN(
                    get_metric_fn=_best_value,
                    reverse=BEST_MODES[config.keep_best_mode],
                    n=1,
                    keep_checkpoints_without_metrics=False,
                )
            )
            # orbax writes and reads a step's metrics only when it tracks a best checkpoint
            best = {"best_fn": _best_value, "best_mode": config.keep_best_mode}
        # A reader keeps and saves nothing: say so, rather than have orbax warn that it reset
        # those options (once per restore: zero-shot and eval restores are many).
        saving = (
            {"preservation_policy": checkpoint_managers.AnyPreservationPolicy(policies), **best}
            if not read_only
            else {"save_interval_steps": 0}
        )
        self.directory = storage.as_path(directory)
        # A writer records each step inside its commit, on orbax's async-commit thread (a
        # synchronous store waits for each save instead of saving without the hook).
        self._record = None if read_only else init_checkpoints.RecordOnCommit(self.directory)
        options = ocp.CheckpointManagerOptions(
            **saving,
            enable_async_checkpointing=not read_only,
            async_options=self._record.async_options() if self._record else None,
            create=not read_only,
            read_only=read_only,
        )
        with (
            storage.service_errors(self.directory, "opening checkpoints in"),
            init_checkpoints.quiet_read_only_notice(),
        ):
            self._manager = ocp.CheckpointManager(
                self.directory, options=options, item_handlers=_handlers()
            )
        # The newest step known committed with its record, and the step of a save in flight.
        self._committed: int | None = None
        self._pending: int | None = None
        if not read_only:
            self._open_for_writing()

    def _open_for_writing(self) -> None:
        """A writer's start: the keep policy's deletions marked (`trainer.step_deletion`), what
        a kill left of earlier ones removed, steps without a record set aside, the steps set
        aside so far listed, and orbax's error records kept off the terminal."""
        orbax_logs.install()
        # Orbax (pinned at 0.12.8) takes no deleter as an option: its manager's own is replaced,
        # and an orbax without that attribute is refused here rather than deleting unmarked.
        if not hasattr(self._manager, "_checkpoint_deleter"):
            raise RuntimeError(f"orbax {ocp.__version__}: CheckpointManager has no deleter to set")
        self._manager._checkpoint_deleter = step_deletion.MarkedDeleter(self.directory)
        with storage.service_errors(self.directory, "opening checkpoints in"):
            if step_deletion.finish_interrupted(self.directory) or jax.process_count() > 1:
                self._manager.reload()
            self._set_aside_unrecorded()
            self._list_set_aside()
            self._committed = self.latest_step()

    def step_dir(self, step: int) -> epath.Path:
        """A committed step's directory."""
        return self.directory / str(step)

    def recorded(self, step: int) -> bool:
        """Whether committed `step` carries its integrity record (is complete)."""
        return checksums.has_manifest(self.step_dir(step))

    def _set_aside_unrecorded(self) -> None:
        """Sets aside every committed step without its integrity record (see the module
        docstring), so that neither resume nor the keep policy counts it and a later save of the
        same step is not skipped. Process 0 decides; every host moves the same steps."""
        steps = self.all_steps()
        unrecorded = np.array([0 if self.recorded(s) else 1 for s in steps], np.int32)
        if jax.process_count() > 1 and steps:
            from jax.experimental import multihost_utils

            unrecorded = np.asarray(multihost_utils.broadcast_one_to_all(unrecorded))
        for step, missing in zip(steps, unrecorded, strict=True):
            if missing:
                log.warning(
                    "checkpoint step %d in %s has no integrity record (written by older code, "
                    "killed before hashing it, or by another tool): never restored unverified",
                    step,
                    self.directory,
                )
                self.set_aside(step, reason="unverified")

    def _list_set_aside(self) -> None:
        """Logs the steps set aside beside the checkpoints so far (they are kept for inspection
        and never removed by the run: the user removes them once not needed)."""
        aside = self.directory.parent / SET_ASIDE_SUBDIR
        if jax.process_index() != 0 or not storage.is_dir(aside):
            return
        if names_aside := sorted(entry.name for entry in aside.iterdir()):
            log.info(
                "checkpoints set aside in %s (never resumed; remove them once not needed): %s",
                aside,
                ", ".join(names_aside),
            )

    def latest_step(self) -> int | None:
        """Step of the newest complete checkpoint (committed, with its integrity record), or
        None."""
        return next((s for s in reversed(self.all_steps()) if self.recorded(s)), None)

    def all_steps(self) -> list[int]:
        """Steps of all committed checkpoints, ascending (in a writer's store, all complete:
        those without a record were set aside when it opened)."""
        with storage.service_errors(self.directory, "listing checkpoints in"):
            return sorted(self._manager.all_steps())

    def save(
        self,
        step: int,
        *,
        params: Any,
        opt_state: Any,
        train_state: Mapping[str, Any],
        best: float | None = None,
    ) -> None:
        """Saves one step (asynchronously when configured); a step already on disk is skipped.

        `best`: the step's value of the `keep_best` metric, when it was evaluated (non-finite
        values do not compete).

        Raises:
          rundir.storage.StorageError: the storage failed, in this save or in the save still in
            flight (the error names that save's step).
        """
        # The record hook learns its step only once the previous save has committed.
        self._finish_pending()
        with storage.service_errors(self.directory / str(step), "saving checkpoint"):
            if step in self._manager.all_steps():
                return
            self._record.expect(step)
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(params),
                    opt_state=ocp.args.StandardSave(opt_state),
                    train_state=ocp.args.JsonSave(dict(train_state)),
                ),
                metrics=_best_metrics(self.config, best),
                force=True,
            )
            self._pending = step
        if not self.config.async_save:
            self._finish_pending()

    def _finish_pending(self) -> None:
        """Waits for the save in flight; once it committed, it is the last committed step. A
        failure names that save's step, and the save is no longer in flight."""
        pending, self._pending = self._pending, None
        where, action = (
            (self.directory, "committing checkpoints in")
            if pending is None
            else (self.directory / str(pending), "saving checkpoint")
        )
        with storage.service_errors(where, action):
            self._manager.wait_until_finished()
        if pending is not None:
            self._committed = pending

    def last_committed(self, *, wait: bool) -> int | None:
        """The newest step this store knows committed with its record (a writer's), for a
        failure report: where a rerun resumes. A save still in flight counts once it committed:
        with `wait` its end is waited for (local disk: seconds, whether it commits or fails),
        without it the save counts only if it already ended (a store that went away may keep a
        save waiting for minutes). Never raises: the failure being reported comes first."""
        if self._pending is not None and (wait or not self._manager.is_saving_in_progress()):
            try:
                self._finish_pending()
            except Exception as e:  # noqa: BLE001 - it failed too: not committed
                log.debug("the save in flight failed too: %s", e)
        return self._committed

    def verify(self, step: int) -> int:
        """Verifies a step's integrity record.

        Returns:
          How many files were verified (at least one).
        Raises:
          rundir.checksums.CheckpointUnrecordedError: the step has no record.
          CheckpointCorruptError: naming the file and the step (a file the record does not list
            is one too).
          rundir.storage.StorageError: the storage service failed while reading.
        """
        return checksums.verify_manifest(
            self.step_dir(step),
            step=step,
            source=f"checkpoint {self.directory}",
            skip=init_checkpoints.COMMIT_FILES,
        )

    def _verify_agreed(self, step: int) -> None:
        """`verify` on process 0 only (it reads every file), its verdict shared by all hosts."""
        if jax.process_count() == 1:
            self.verify(step)
            return
        from jax.experimental import multihost_utils

        failed, error = 0, None
        if jax.process_index() == 0:
            try:
                self.verify(step)
            except CheckpointCorruptError as e:
                failed, error = 1, e
        if int(multihost_utils.broadcast_one_to_all(np.int32(failed))):
            raise error or CheckpointCorruptError(
                f"checkpoint {self.directory}: step {step} failed its checksums on process 0"
            )

    def restore_latest_intact(
        self, *, abstract_params: Any, abstract_opt_state: Any
    ) -> tuple[int, Any, Any, dict[str, Any]] | None:
        """Restores the newest step that verifies and loads, for resume; None without steps.

        Every step restored is verified against its integrity record first. A newer step that
        fails its checksums or fails to load while an older one loads is corrupt; a step holding
        non-finite values (written by older code) is unusable too. Each is logged and moved to
        `SET_ASIDE_SUBDIR` (`set_aside`) so the run re-saves it and the keep policy never counts
        it. When no step is usable, nothing is moved (the cause is more likely the configuration
        than the files). Steps without a record were set aside when a writer's store opened; a
        read-only store skips them (never restoring one unverified).

        Returns:
          (step, params, opt_state, train_state), or None when there is no checkpoint.
        Raises:
          CheckpointCorruptError: when no step verifies and loads, listing each step's problem.
          rundir.storage.StorageError: the storage service failed while listing or verifying
            (no step is taken for corrupt then, nor set aside).
        """
        failed: list[tuple[int, Exception]] = []
        for step in reversed(self.all_steps()):
            if not self.recorded(step):
                log.warning(
                    "checkpoint step %d in %s has no integrity record: skipped",
                    step,
                    self.directory,
                )
                continue
            try:
                self._verify_agreed(step)
                restored = self.restore(
                    step, abstract_params=abstract_params, abstract_opt_state=abstract_opt_state
                )
            except storage.StorageError:
                raise  # the store failed, not the step: a rerun resumes once it is back
            except Exception as e:  # noqa: BLE001 - TensorStore raises many kinds on bad files
                log.warning(
                    "checkpoint step %d in %s is unusable (%s); falling back to the previous step",
                    step,
                    self.directory,
                    e,
                )
                failed.append((step, "corrupt", e))
                continue
            if not steps.params_finite(restored[:2]):  # written by code without the update guard
                log.warning(
                    "checkpoint step %d in %s holds non-finite values; falling back to the "
                    "previous step",
                    step,
                    self.directory,
                )
                failed.append((step, "nonfinite", "non-finite parameters or optimizer state"))
                continue
            for failed_step, reason, _ in failed:
                self.set_aside(failed_step, reason=reason)
            log.info("restored checkpoint step %d (verified)", step)
            return (step, *restored)
        if failed:
            problems = "\n".join(f"  step {s}: {e}" for s, _, e in failed)
            raise CheckpointCorruptError(
                f"no checkpoint in {self.directory} could be restored (corrupt files, or a model "
                f"or optimizer other than the one that saved them):\n{problems}"
            )
        return None

    def restore(
        self, step: int, *, abstract_params: Any, abstract_opt_state: Any
    ) -> tuple[Any, Any, dict[str, Any]]:
        """Restores params, optimizer state (sharded as the abstract trees say) and train state."""
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params),
                opt_state=ocp.args.StandardRestore(abstract_opt_state),
                train_state=ocp.args.JsonRestore(),
            ),
        )
        return restored["params"], restored["opt_state"], dict(restored["train_state"])

    def restore_params(self, step: int, *, abstract_params: Any) -> Any:
        """Restores the params item only."""
        restored = self._manager.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params))
        )
        return restored["params"]

    def params_metadata(self, step: int) -> Any:
        """The saved params tree with shape/dtype metadata leaves (nothing is read into memory)."""
        metadata = self._manager.item_metadata(step)["params"]
        return getattr(metadata, "tree", metadata)

    def set_aside(self, step: int, *, reason: str) -> int | None:
        """Moves checkpoint `step` out of the run (to `SET_ASIDE_SUBDIR/<step>.<reason>` beside
        the checkpoints directory), so that resume no longer sees it and a later save of the same
        step is not skipped as already on disk.

        Returns:
          The newest remaining step, or None.
        """
        self._finish_pending()
        if jax.process_index() == 0:
            target = self.directory.parent / SET_ASIDE_SUBDIR / f"{step}.{reason}"
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                target.rmtree()
            storage.move_tree(self.directory / str(step), target)
            log.warning("checkpoint step %d set aside (%s) to %s", step, reason, target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"xlscale_set_aside_{step}")
        self._manager.reload()
        self._committed = self.latest_step()
        return self._committed

    def wait(self) -> None:
        """Blocks until background saves are committed (each with its integrity record).

        Raises:
          rundir.storage.StorageError: the storage failed in the save in flight (named).
        """
        self._finish_pending()

    def reached_preemption(self, step: int) -> bool:
        """Whether JAX's multi-host preemption service asks every host to stop at `step`."""
        return self._manager.reached_preemption(step)

    def close(self) -> None:
        """Waits for pending saves (each committed with its integrity record), and releases the
        manager."""
        self._finish_pending()
        self._manager.close()


def _best_value(metrics: Mapping[str, float]) -> float:
    return metrics[_BEST_METRIC]


def _best_metrics(config: CheckpointConfig, value: float | None) -> dict[str, float] | None:
    """What orbax stores with a checkpoint for `keep_best`: the value, when it competes."""
    if not config.keep_best or value is None or not np.isfinite(value):
        return None
    return {_BEST_METRIC: float(value)}


def check_params_compatible(
    saved: Any, target: Any, *, source: str, what: str = "INIT_CHECKPOINT"
) -> None:
    """Checks that `saved` (checkpoint metadata) holds every parameter of `target` with its shape.

    Raises:
      convert.init_checkpoints.CheckpointMismatchError (a ValueError): listing each missing
        parameter, and each mismatched one with both shapes.
    """
    saved_shapes = {
        param_name(path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(saved)
    }
    problems = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(target):
        name = param_name(path)
        if name not in saved_shapes:
            problems.append(
                f"  {name}: missing from the checkpoint (model wants {tuple(leaf.shape)})"
            )
        elif saved_shapes[name] != tuple(leaf.shape):
            problems.append(
                f"  {name}: checkpoint has shape {saved_shapes[name]}, "
                f"model wants {tuple(leaf.shape)}"
            )
    if problems:
        raise init_checkpoints.CheckpointMismatchError(
            f"{what} {source} does not fit the model ({len(problems)} parameters):\n"
            + "\n".join(problems)
        )


def check_init_checkpoint(
    spec: str, *, abstract_params: Any, what: str = "INIT_CHECKPOINT"
) -> tuple[epath.Path, int]:
    """Finds `INIT_CHECKPOINT` `spec` ('<dir>[@step]') and checks its parameters against the
    model from metadata alone (no arrays are read), so a bad one fails before compiling.

    Returns:
      (checkpoints directory, step).
    Raises:
      FileNotFoundError: when the directory holds no (such) checkpoint.
      ValueError: when parameters are missing or have other shapes (each one named).
      rundir.checksums.CheckpointUnrecordedError: when the step has no integrity record.
      CheckpointCorruptError: when a file of the step fails its checksums (named, with the step).
    """
    spec = local_init_spec(spec)
    directory, step = init_checkpoints.resolve_step(spec, what=what)
    store = CheckpointStore(directory, CheckpointConfig(), read_only=True)
    try:
        check_params_compatible(
            store.params_metadata(step), abstract_params, source=repr(spec), what=what
        )
    finally:
        store.close()
    return directory, step


def restore_init_params(
    spec: str, *, abstract_params: Any, what: str = "INIT_CHECKPOINT", checked: bool = False
) -> tuple[Any, epath.Path, int]:
    """Loads the parameters of `INIT_CHECKPOINT` `spec` ('<dir>[@step]') for a fresh run, after
    `check_init_checkpoint` (which verifies the step's integrity record).

    Args:
      checked: the caller has just run `check_init_checkpoint` on this same spec (the run's
        plan does, before compiling): the step's integrity record is verified again, so the
        files read are the ones checked, but the parameters' shapes are not compared again
        (reading orbax's metadata opens every array: about half a second for a small run).

    Returns:
      (params sharded as `abstract_params` says, checkpoints directory, step).
    """
    if checked:
        directory, step = init_checkpoints.resolve_step(local_init_spec(spec), what=what)
    else:
        directory, step = check_init_checkpoint(
            local_init_spec(spec), abstract_params=abstract_params, what=what
        )
    store = CheckpointStore(directory, CheckpointConfig(), read_only=True)
    try:
        params = store.restore_params(step, abstract_params=abstract_params)
    finally:
        store.close()
    log.info("restored the parameters of %s step %d (verified)", directory, step)
    return params, directory, step
