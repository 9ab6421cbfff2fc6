"""Storage failures end a run within a minute, in a few lines: the GCS API server
stopped in the middle of an asynchronous save and before a run starts, and a size-limited tmpfs
(mounted by the test; CI runs as root) filled while a save is in flight and before a run starts.

The mid-run failures run the real `python -m trainer.train` command and check its exit code (74,
the storage class), the time it took after the failure, the lines of the project's own on stderr
(at most 5: what failed and why, what to do, the last complete checkpoint, the command that
resumes), that no background traceback is printed, and that the resume, once the store is back,
equals an uninterrupted run. The failures at start run `xlscale train` in this process (nothing
is compiled before them) and check that nothing was written, remotely or locally.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import bucket_runs
import pytest
from bucket_runs import bucket_step_dirs, subprocess_env, wait_or_dump_stacks

from rundir import exits, names, records

REPO = Path(__file__).resolve().parent.parent
STEPS = 30
PROG = "python -m trainer.train"
# The failure ends the run within this many seconds (the target).
DEADLINE_S = 60
STORAGE = exits.CLASSES["storage"].code


def _argv(model_dir: str, tiny_data, prepared=None) -> list[str]:
    """A tiny source run of 30 steps, saved every 10, a record every 5, no evaluation; read from
    `prepared` when given (the trainer subprocesses: no TensorFlow imported), else through
    seqio."""
    data = {} if prepared is None else {"PREPARED_DATA": f"'{prepared}'"}
    return bucket_runs.run_argv(
        model_dir,
        tiny_data,
        experiment="cpt_source_en",
        TRAIN_STEPS=STEPS,
        CHECKPOINT_PERIOD=10,
        LOG_EVERY=5,
        EVAL_TASKS="[]",
        **data,
    )


def _start(argv, log: Path, cwd: Path) -> subprocess.Popen:
    command = [sys.executable, "-X", "faulthandler", "-m", "trainer.train", *argv]
    with open(log, "w") as out:
        return subprocess.Popen(
            command, cwd=cwd, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT
        )


def _train(argv, log: Path, cwd: Path) -> None:
    code = wait_or_dump_stacks(_start(argv, log, cwd), log, timeout=300)
    assert code == 0, log.read_text()[-3000:]


def _own_lines(text: str) -> list[str]:
    """The lines of the project's own refusal: its first line starts with the command."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(f"{PROG}: ")), None)
    assert first is not None, text[-3000:]
    return lines[first:]


def _params_hash(model_dir: str) -> str:
    from convert import init_checkpoints

    return init_checkpoints.params_hash(
        init_checkpoints.read_params(*init_checkpoints.resolve_step(model_dir))
    )


def _same_as_reference(model_dir: str, reference: str) -> None:
    got, want = records.read_metrics(model_dir), records.read_metrics(reference)
    assert [records.without_timing(r) for r in got] == [records.without_timing(r) for r in want]
    assert records.read_completed(model_dir) == records.read_completed(reference)
    assert _params_hash(model_dir) == _params_hash(reference)


@pytest.mark.slow
def test_a_failed_command_ends_without_waiting_for_stuck_threads():
    # A thread that never ends (orbax's signalling threads wait forever on a store that went
    # away) and one that fails after the report: the process ends with the code, within the
    # join deadline, and its report stays the last thing on stderr.
    script = """if True:
        import sys, threading, time
        from rundir import exits
        threading.Thread(target=threading.Event().wait, name="stuck").start()
        def late():
            time.sleep(0.5)
            raise RuntimeError("a background traceback")
        threading.Thread(target=late).start()
        print("the report", file=sys.stderr)
        sys.exit(exits.leave(74))
    """
    env = dict(os.environ, PYTHONPATH=os.fspath(REPO))
    env.pop(exits.DEBUG_ENV, None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == STORAGE, done.stderr
    assert time.monotonic() - started < exits.JOIN_DEADLINE_S + 20
    assert done.stderr == "the report\n"


@pytest.mark.slow
def test_the_xlscale_command_does_not_wait_for_stuck_threads(tmp_path):
    # The console script's `main()` (no argv: the process's own command line) ends a failed
    # command through `exits.leave` too: a refused `xlscale train` with a thread stuck for good
    # exits with its code, where a plain return would wait for that thread forever.
    script = """if True:
        import sys, threading
        from xlscale_cli import main
        threading.Thread(target=threading.Event().wait, name="stuck").start()
        sys.argv = ["xlscale", "train", "--gin_file=no_such_file.gin"]
        sys.exit(main.main())
    """
    env = dict(os.environ, PYTHONPATH=os.fspath(REPO), JAX_PLATFORMS="cpu")
    env.pop(exits.DEBUG_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == exits.CLASSES["configuration"].code, done.stderr
    assert done.stderr.splitlines()[-1].startswith("xlscale train: gin file 'no_such_file.gin'")


@pytest.fixture(scope="module")
def reference(tiny_data, tiny_prepared, tmp_path_factory):
    """`reference() -> MODEL_DIR`: an uninterrupted run of the same settings on local disk,
    trained in the background from the fixture's start; `reference()` waits for it. It trains
    while a test's own run starts and while the test waits for that run's storage failure to end
    it (the store's retries: ~40 s of idle waiting), instead of before them."""
    root = tmp_path_factory.mktemp("reference")
    model_dir, log = os.fspath(root / "run"), root / "train.log"
    process = _start(_argv(model_dir, tiny_data, tiny_prepared), log, root)

    def finished() -> str:
        code = wait_or_dump_stacks(process, log, timeout=300)
        assert code == 0, log.read_text()[-3000:]
        return model_dir

    yield finished
    if process.poll() is None:  # a test failed before it needed the reference
        process.kill()
        process.wait(timeout=60)


def _wait_for(predicate, process, log: Path, *, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if predicate():
            return
        time.sleep(0.005)
    pytest.fail(f"the run ended or stalled before the failure: {log.read_text()[-3000:]}")


def _ends_as_storage_failure(process, log: Path, *, failed_at: float, cause: str) -> list[str]:
    code = wait_or_dump_stacks(process, log, timeout=DEADLINE_S + 120)
    took = time.monotonic() - failed_at
    text = log.read_text()
    assert code == STORAGE, text[-3000:]
    assert took <= DEADLINE_S, f"{took:.0f} s after the failure: {text[-3000:]}"
    print(f"exit {code} {took:.1f} s after the failure; {len(text.splitlines())} lines")
    own = _own_lines(text)
    assert len(own) <= 5, own
    assert "Traceback" not in text, text[-3000:]  # background threads' ones are not printed
    assert cause in own[0], own
    return own


def _resumes_with(own: list[str], argv: list[str]) -> None:
    """The report's last line is the command that resumes the run: this one, as a shell reads it."""
    head, _, command = own[-1].partition(": ")
    assert head == "  to resume once it is fixed", own
    assert shlex.split(command) == PROG.split() + argv, own


@pytest.mark.slow
def test_the_store_going_away_mid_save_ends_the_run_in_a_minute(
    gcs_server, gcs_bucket, tiny_data, tiny_prepared, reference, tmp_path
):
    model_dir = f"{gcs_bucket}/runs/outage"
    argv = _argv(model_dir, tiny_data, tiny_prepared)
    log = tmp_path / "outage.log"
    process = _start(argv, log, tmp_path)
    # The server stops the moment the second save starts (the first one has committed by then).
    _wait_for(lambda: len(bucket_step_dirs(gcs_server, model_dir)) >= 2, process, log)
    gcs_server.stop()
    failed_at = time.monotonic()
    committed = bucket_step_dirs(gcs_server, model_dir)[0]
    try:
        own = _ends_as_storage_failure(process, log, failed_at=failed_at, cause="unreachable")
    finally:
        gcs_server.start()
    print(log.read_text()[-6000:])
    assert f"step {committed}" in own[2], own
    _resumes_with(own, argv)
    # Nothing recorded past the last complete checkpoint's step other than what a resume redoes:
    # no COMPLETED, and the resume equals an uninterrupted run.
    assert not records.read_completed(model_dir)
    _train(argv, tmp_path / "resumed.log", tmp_path)
    assert "resuming from step" in (tmp_path / "resumed.log").read_text()
    _same_as_reference(model_dir, reference())


def test_a_store_stopped_between_an_objects_bytes_and_its_metadata_comes_back_listable(
    gcs_server, gcs_bucket
):
    # The emulator writes an object's bytes, then its metadata: stopped between the two, it kept
    # a file that made every later listing of the bucket a 404. The upload was never
    # acknowledged, so the store that comes back has the objects before it and not that one.
    bucket = gcs_bucket.removeprefix("gs://")
    gcs_server.create_object(bucket, "run/kept.json", b"{}")
    gcs_server.stop()
    cut = gcs_server.root / "data" / bucket / "run" / "cut.json"
    cut.write_bytes(b"{")  # bytes written, no metadata
    gcs_server.start()
    assert gcs_server.list_objects(bucket) == ["run/kept.json"]
    assert not cut.exists()


def test_a_store_unreachable_at_start_is_storage_not_permissions(
    gcs_server, gcs_bucket, tiny_data, tmp_path, monkeypatch, capsys, fast_retries
):
    # `xlscale train` in this process (the refusal comes before anything is compiled), with the
    # storage clients' retries but not their back-off sleeps: the store not answering is the
    # storage class, "unreachable", not "not writable ... fix its permissions" (73).
    import gin

    from xlscale_cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(exits.DEBUG_ENV, raising=False)
    argv = _argv(f"{gcs_bucket}/runs/at_start", tiny_data)
    gcs_server.stop()
    gin.clear_config()
    try:
        code = main.main(["train", *argv])
    finally:
        gin.clear_config()
        gcs_server.start()
    err = capsys.readouterr().err
    own = [line for line in err.splitlines() if line.startswith(("xlscale train: ", "  "))]
    assert code == STORAGE, err
    assert own[0].startswith("xlscale train: storage unreachable: "), err
    assert len(own) <= 5 and "Traceback" not in err, err
    assert "not writable" not in err and "permissions" not in err, err
    head, _, command = own[-1].partition(": ")
    assert head == "  to resume once it is fixed", own
    assert shlex.split(command) == ["xlscale", "train", *argv], own
    assert gcs_server.list_objects(gcs_bucket.removeprefix("gs://")) == []  # nothing written
    assert list(tmp_path.iterdir()) == []  # nor anything local


@pytest.fixture
def small_disk(tmpfs):
    """A 32 MiB tmpfs mounted for the test (CI runs as root), unmounted afterwards."""
    return tmpfs(32)


def _fill(directory: Path) -> Path:
    """Takes every free block of `directory`'s filesystem with one file."""
    ballast = directory / f"ballast-{uuid.uuid4().hex[:6]}"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        stat = os.statvfs(directory)
        with contextlib.suppress(OSError):
            os.posix_fallocate(fd, 0, max(stat.f_bavail * stat.f_frsize, 1))
        with contextlib.suppress(OSError):
            while True:  # what fallocate left (rounding)
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return ballast


@pytest.mark.slow
def test_a_full_disk_during_an_async_save_ends_the_run_in_a_few_lines(
    small_disk, tiny_data, tiny_prepared, reference, tmp_path
):
    model_dir = small_disk / "run"
    checkpoints = model_dir / names.CHECKPOINTS_SUBDIR
    argv = _argv(os.fspath(model_dir), tiny_data, tiny_prepared)
    log = tmp_path / "full.log"
    process = _start(argv, log, tmp_path)

    def second_save_started() -> bool:  # orbax writes step 20 under a temporary name first
        return checkpoints.is_dir() and any(p.name.startswith("20") for p in checkpoints.iterdir())

    _wait_for(second_save_started, process, log)
    ballast = _fill(small_disk)
    failed_at = time.monotonic()
    own = _ends_as_storage_failure(process, log, failed_at=failed_at, cause="disk full")
    assert "step 10" in own[2], own
    _resumes_with(own, argv)
    assert not records.read_completed(os.fspath(model_dir))
    ballast.unlink()
    _train(argv, tmp_path / "resumed.log", tmp_path)
    assert "resuming from step 10" in (tmp_path / "resumed.log").read_text()
    _same_as_reference(os.fspath(model_dir), reference())


def test_a_full_disk_at_start_leaves_no_run_directory(small_disk, tiny_data, capsys):
    # No byte free: the lease cannot be written. A storage failure (74, "disk full"), not "not
    # writable" (73), and no empty MODEL_DIR left behind.
    import gin

    from xlscale_cli import main

    ballast = _fill(small_disk)
    gin.clear_config()
    try:
        code = main.main(["train", *_argv(os.fspath(small_disk / "run"), tiny_data)])
    finally:
        gin.clear_config()
        ballast.unlink()
    err = capsys.readouterr().err.splitlines()
    assert code == STORAGE, err
    assert err[0].startswith("xlscale train: storage disk full: ") and len(err) <= 5, err
    assert "not writable" not in err[0]
    assert err[-1].startswith("  to resume once it is fixed: xlscale train --gin_file="), err
    assert list(small_disk.iterdir()) == []
