"""Test-only fault injection into a trainer subprocess, at a chosen point rather than a raced one.

    python tests/inject_faults.py FAULT ENTRY [ARGS...]

installs FAULT in this process, then runs ENTRY with ARGS as the real command would:
`trainer.train` as `python -m trainer.train ARGS`, `xlscale` as `xlscale ARGS` (ARGS start with
the subcommand). Nothing of the project knows about it: each fault replaces one function of a
library or of the storage layer before the command starts.

Faults (`FAULTS`):
  record_full@STEP   the write of step STEP's integrity record, inside orbax's commit of that
                     step (its background thread), fails with ENOSPC: a disk filling during a
                     commit.
  metrics_full@STEP  appending the metrics record of step STEP fails with ENOSPC, once a
                     checkpoint has committed (waited for on disk): a failure after a commit.
  kill_deleting      the first deletion of a checkpoint directory (orbax's `PathDeleter`, the
                     keep policy) removes the step's integrity record and half its other files,
                     then the process is killed with SIGKILL.
  kill_after_commit@STEP
                     when the metrics record of step STEP is appended, the process waits until a
                     checkpoint of a step between 2 and STEP has committed (its integrity record is
                     in storage, local or gs://), then kills itself with SIGKILL: a run killed
                     mid-way, after a checkpoint, whatever this machine's speed.
  held_for_the_sweep@STEP:FREE
                     a trainer of an adaptive sweep (`xlscale sweep run --adaptive`) whose runs
                     lie side by side in one runs_dir. The runs named in FREE (run ids, comma
                     separated) train as they are; any other run waits, before its first metrics
                     record, until the FREE runs have completed, and after its record of step
                     STEP until the sweep has logged a decision about it from an identified law
                     (and, where it drops the run, until the stop request is in place); neither
                     wait outlasts the sweep. The trainer looks for stop requests at every step.
                     So the FREE runs complete before the law can be identified, and a dropped
                     run is still training when it is told to stop and stops at its next step,
                     whatever this machine's speed.
  xm_units@FAULT     `xlscale sweep run --launcher xmanager --xm-packaging checkout` (the `xlscale`
                     entry) runs each training work unit as `python tests/inject_faults.py FAULT
                     trainer.train ARGS` instead of `python -m trainer.train ARGS`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import signal
import sys
import time

INJECT = pathlib.Path(__file__).resolve()
REPO = INJECT.parent.parent
CHECKSUMS_FILE = "xlscale_checksums.json"  # `rundir.names.CHECKSUMS_FILE`
# How long `metrics_full` waits for a checkpoint to commit before failing anyway.
_COMMIT_WAIT_S = 120
# The sweep's process id, in the environment of the work units of `xm_units`.
SWEEP_PID_ENV = "INJECT_FAULTS_SWEEP_PID"


def _disk_full(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))


def record_full(step: str) -> None:
    """The integrity record of `step` cannot be written (ENOSPC), inside its commit."""
    from rundir import local_files

    real = local_files.staged

    @contextlib.contextmanager
    def staged(target, data):
        path = pathlib.Path(target)
        # Inside a commit the record is written into `<step>.orbax-checkpoint-tmp...`.
        if path.name == CHECKSUMS_FILE and path.parent.name.startswith(f"{step}."):
            raise _disk_full(target)
        with real(target, data) as tmp:
            yield tmp

    local_files.staged = staged


def metrics_full(step: str) -> None:
    """The metrics record of `step` cannot be appended (ENOSPC), once a checkpoint committed."""
    from rundir import records

    real = records.append_metrics

    def append_metrics(model_dir, record):
        if int(record["step"]) == int(step):
            checkpoints = pathlib.Path(os.fspath(model_dir)) / "checkpoints"
            deadline = time.monotonic() + _COMMIT_WAIT_S
            while time.monotonic() < deadline and not any(checkpoints.glob(f"*/{CHECKSUMS_FILE}")):
                time.sleep(0.05)
            raise _disk_full(records.metrics_file(model_dir))
        return real(model_dir, record)

    records.append_metrics = append_metrics


def kill_deleting(_: str = "") -> None:
    """The first checkpoint deletion stops half-way, killed."""
    from orbax.checkpoint.path import deleter

    real = deleter.PathDeleter.delete

    def delete(self, path, *, destination=None, overwrite=False):
        if destination is None:
            root = pathlib.Path(os.fspath(path))
            (root / CHECKSUMS_FILE).unlink(missing_ok=True)
            files = sorted(p for p in root.rglob("*") if p.is_file())
            for file in files[: len(files) // 2]:
                file.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, path, destination=destination, overwrite=overwrite)

    deleter.PathDeleter.delete = delete


def kill_after_commit(step: str) -> None:
    """Killed with SIGKILL at step `step`'s metrics record, once a later-than-2 step committed."""
    from rundir import names, records, storage

    real = records.append_metrics

    def committed(model_dir) -> bool:
        checkpoints = storage.as_path(model_dir) / names.CHECKPOINTS_SUBDIR
        steps = [p for p in checkpoints.iterdir()] if checkpoints.exists() else []
        return any(
            p.name.isdigit() and 2 < int(p.name) < int(step) and (p / CHECKSUMS_FILE).exists()
            for p in steps
        )

    def append_metrics(model_dir, record):
        if int(record["step"]) == int(step):
            deadline = time.monotonic() + _COMMIT_WAIT_S
            while time.monotonic() < deadline and not committed(model_dir):
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(model_dir, record)

    records.append_metrics = append_metrics


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(what: str, ready, sweep: int) -> None:
    """Waits until `ready()`, or until the sweep (process `sweep`) is gone: then it says so on
    stderr and goes on, so a sweep killed mid-way leaves no trainer waiting for it."""
    while not ready():
        if not _alive(sweep):
            print(f"inject_faults: the sweep is gone; not waiting for {what}", file=sys.stderr)
            return
        time.sleep(0.1)


def held_for_the_sweep(arg: str) -> None:
    """Holds a run of an adaptive sweep until the FREE runs completed, then at step STEP until
    the sweep has decided about it (see the module docstring)."""
    import json

    from rundir import names, records, stop_request
    from trainer import stop_requests

    step, _, free = arg.partition(":")
    free_ids = [run_id for run_id in free.split(",") if run_id]
    stop_requests.POLL_S = 0.0  # a request is seen at the step after it is written
    real = records.append_metrics
    appended = []  # the steps of this trainer's records so far
    sweep = int(os.environ.get(SWEEP_PID_ENV) or os.getppid())

    def decided(model_dir: pathlib.Path) -> bool:
        log = model_dir.parent / names.ADAPTIVE_SUBDIR / names.ADAPTIVE_DECISIONS_FILE
        lines = log.read_text().splitlines() if log.exists() else []
        for line in lines:
            try:
                decision = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                continue
            if decision["run_id"] == model_dir.name and decision["identifiable"]:
                return decision["decision"] == "RUN" or stop_request.requested(model_dir)
        return False

    def append_metrics(model_dir, record):
        here = pathlib.Path(os.fspath(model_dir))
        held = here.name not in free_ids
        if held and not appended:
            others = [here.parent / run_id / names.COMPLETED_FILE for run_id in free_ids]
            _wait_for("the free runs", lambda: all(p.exists() for p in others), sweep)
        appended.append(record["step"])
        real(model_dir, record)
        if held and int(record["step"]) == int(step):
            _wait_for("the sweep's decision", lambda: decided(here), sweep)

    records.append_metrics = append_metrics


def xm_units(fault: str) -> None:
    """The xmanager launcher's checkout work units train under `fault` (this script)."""
    from launch import xm_launch

    real = xm_launch.XManagerLauncher._packageable
    os.environ[SWEEP_PID_ENV] = str(os.getpid())  # the units' environment is the sweep's

    def packageable(self, xm, executor_cls, module: str):
        if self.packaging != "checkout" or module not in ENTRIES:
            return real(self, xm, executor_cls, module)
        return xm.binary(
            path="/bin/sh",
            args=["-c", xm_launch.LOGGED, self.python, os.fspath(INJECT), fault, module],
            executor_spec=executor_cls.Spec(),
        )

    xm_launch.XManagerLauncher._packageable = packageable


FAULTS = {
    "record_full": record_full,
    "metrics_full": metrics_full,
    "kill_deleting": kill_deleting,
    "kill_after_commit": kill_after_commit,
    "held_for_the_sweep": held_for_the_sweep,
    "xm_units": xm_units,
}


def _trainer() -> None:
    from trainer import gin_entry

    gin_entry.main("train")


def _xlscale() -> None:
    from xlscale_cli import main

    sys.exit(main.main())


ENTRIES = {"trainer.train": _trainer, "xlscale": _xlscale}


def main() -> None:
    """Installs the fault named by the first argument, then runs the entry named by the second."""
    fault, entry, *args = sys.argv[1:]
    sys.path.insert(0, os.fspath(REPO))
    name, _, arg = fault.partition("@")
    FAULTS[name](arg)
    sys.argv = [entry, *args]
    ENTRIES[entry]()


if __name__ == "__main__":
    main()
