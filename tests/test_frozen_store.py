"""A GCS store that accepts connections but never answers (the test server stopped with SIGSTOP,
`GcsServer.freeze`: the kernel still completes TCP handshakes, nothing reads a request) ends a run
within a bound, as a storage failure: exit 74, the project's report of at most 5 lines, no
traceback. Every request is bounded in time, not only in retries (`rundir.gcs_client`,
`rundir.storage_backends`).

- The storage client alone: a request that gets no answer gives up within its budget and marks
  the store unreachable, and an upload whose body never leaves is cut off.
- The real `python -m trainer.train` with the store frozen before it starts, and the moment its
  second checkpoint save starts (the first one has committed by then): it ends within
  `BOUND_S`, and the lease it leaves behind (the store could not delete it) is taken over by the
  next start with one line naming the job that is gone.
- TensorStore's credentials line (`Using GOOGLE_AUTH_TOKEN_FOR_TESTING`, from C++ on fd 2) does
  not reach the terminal.

The server is thawed in every test's teardown, before anything else talks to it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import pytest
from conftest import fast_compile_flags
from tiny_runs import tiny_source_argv

from pipelines import native_logs
from rundir import exits, lease, storage

REPO = Path(__file__).resolve().parent.parent
PROG = "python -m trainer.train"
STORAGE = exits.CLASSES["storage"].code
# A run against a frozen store ends within this many seconds (measured here: 37 s from the freeze
# mid-save, 43-53 s from a start against a frozen store, start-up included). Generous, so a slow
# machine cannot flake it; requests bounded only in retries took 250-370 s.
BOUND_S = 150
# TensorStore's credentials line, which names the variable the test server sets.
AUTH_LINE = "GOOGLE_AUTH_TOKEN_FOR_TESTING"


@pytest.fixture
def thawed(gcs_server):
    """The test server (`gcs_server`), thawed (answering again) at the end of the test, whatever the
    test did to it."""
    yield gcs_server
    gcs_server.thaw()


# --------------------------------------------------------------------------- the storage client


@pytest.fixture
def fast_bounds(monkeypatch):
    """The storage client's time bounds shortened (1 s to connect, 1 s of silence, a 5 s budget
    per request), in a client made with them, so that a frozen store fails it in seconds."""
    import aiohttp
    import fsspec.config

    from rundir import gcs_client

    monkeypatch.setitem(storage.REQUEST_TIMEOUTS_S, "connect", 1.0)
    monkeypatch.setitem(storage.REQUEST_TIMEOUTS_S, "read", 1.0)
    monkeypatch.setattr(gcs_client, "NO_ANSWER_BUDGET_S", 5.0)
    # Another timeout is another client: fsspec caches its clients by their settings.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=1.0, sock_read=1.0)
    monkeypatch.setitem(fsspec.config.conf["gcs"], "requests_timeout", timeout)
    yield gcs_client
    gcs_client.REACHABILITY.mark(answered=True)


@pytest.mark.slow
def test_a_request_without_an_answer_gives_up_within_its_budget(
    gcs_bucket, thawed, fast_bounds, monkeypatch
):
    path = f"{gcs_bucket}/run/run.json"
    storage.write_text_atomic(path, "{}\n")
    attempts = []
    undecorated = fast_bounds._UNDECORATED

    async def counted(*args, **kwargs):
        attempts.append(time.monotonic())
        return await undecorated(*args, **kwargs)

    monkeypatch.setattr(fast_bounds, "_UNDECORATED", counted)
    thawed.freeze()
    started = time.monotonic()
    with pytest.raises(storage.StorageError) as failed:
        storage.read_text(path)
    took = time.monotonic() - started
    assert failed.value.cause == "unreachable" and path in str(failed.value), failed.value
    assert "no detail" not in str(failed.value)  # the timeout says what timed out
    # Retried while another attempt fitted in the budget, then given up: not six attempts of a
    # read timeout each.
    assert 2 <= len(attempts) < fast_bounds.ATTEMPTS and took < 5.0 + 2.0, (attempts, took)
    assert storage.store_unreachable()
    # The store counts as unreachable: the next request is tried once.
    attempts.clear()
    with pytest.raises(storage.StorageError):
        storage.read_text(path)
    assert len(attempts) == 1
    thawed.thaw()
    assert storage.read_text(path) == "{}\n"
    assert not storage.store_unreachable()


@pytest.mark.slow
def test_an_upload_whose_body_never_leaves_is_cut_off(gcs_bucket, thawed, fast_bounds, monkeypatch):
    # 20 MB fill the socket buffers of a frozen server: aiohttp's read timeout, which starts once
    # the body is sent, never starts, and without a bound on the attempt the upload waits forever.
    monkeypatch.setattr(fast_bounds, "MIN_UPLOAD_BYTES_PER_S", 100 * 2**20)
    path = f"{gcs_bucket}/run/big.bin"
    storage.write_bytes(f"{gcs_bucket}/run/small.bin", b"1")
    thawed.freeze()
    # In a thread, so that an upload that hangs fails the test (the thaw lets it end).
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        upload = pool.submit(storage.write_bytes, path, b"\0" * 20_000_000)
        try:
            error = upload.exception(timeout=60)
        except TimeoutError:
            thawed.thaw()
            pytest.fail("the upload to a frozen store was still waiting after 60 s")
    assert isinstance(error, storage.StorageError) and error.cause == "unreachable", error
    assert time.monotonic() - started < 5.0 + 5.0


# --------------------------------------------------------------------------- a training run


def _argv(model_dir: str, tiny_data, prepared) -> list[str]:
    """A tiny source run of 30 steps, saved every 10, a record every 5, no evaluation, on prepared
    data (no TensorFlow imported)."""
    return tiny_source_argv(
        model_dir,
        tiny_data,
        prepared=prepared,
        TRAIN_STEPS=30,
        CHECKPOINT_PERIOD=10,
        LOG_EVERY=5,
        EVAL_TASKS="[]",
    )


def _env() -> dict[str, str]:
    """The test's environment (the server's, set by `gcs_bucket`) for a CPU trainer."""
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS=fast_compile_flags()
    )
    env["PYTHONPATH"] = os.pathsep.join([os.fspath(REPO), env.get("PYTHONPATH", "")])
    env.pop(exits.DEBUG_ENV, None)
    cache = jax.config.jax_compilation_cache_dir
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    return env


def _start(argv: list[str], tmp_path: Path) -> subprocess.Popen:
    """`python -m trainer.train ARGV`, its stderr (the terminal) in tmp_path/stderr."""
    # -X faulthandler: a process that overstays its wait dumps its threads' stacks (`_wait`).
    command = [sys.executable, "-X", "faulthandler", "-m", "trainer.train", *argv]
    with open(tmp_path / "stderr", "w") as err:
        return subprocess.Popen(
            command, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=err
        )


def _wait(process: subprocess.Popen, tmp_path: Path, *, since: float) -> tuple[int, float, str]:
    """(exit code, seconds since `since`, stderr) of the run; one still running `BOUND_S` after
    `since` dumps its threads' stacks and fails the test."""
    try:
        code = process.wait(timeout=max(1.0, since + BOUND_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait(timeout=60)
        stacks = (tmp_path / "stderr").read_text()[-12000:]
        pytest.fail(f"still running {BOUND_S} s after the store froze; its stacks:\n{stacks}")
    return code, time.monotonic() - since, (tmp_path / "stderr").read_text()


def _storage_report(text: str) -> list[str]:
    """The project's report of a storage failure: from its `python -m trainer.train: storage`
    line to the end of stderr."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(f"{PROG}: storage ")), None)
    assert first is not None, text[-3000:]
    return lines[first:]


def _step_dirs(gcs_server, model_dir: str) -> list[str]:
    """The names under the run's `checkpoints/` in the bucket, read from the server's own files
    (polling costs no request). On GCS orbax writes a step in place: a new step directory is a
    save in flight, and orbax starts one only once the previous one committed."""
    path = Path(gcs_server.root) / "data" / model_dir.removeprefix("gs://") / "checkpoints"
    return sorted(p.name for p in path.iterdir() if p.name.isdigit()) if path.is_dir() else []


def _next_start_takes_over(model_dir: str, pid: int, caplog, *, left: bool | None) -> None:
    """Once the store answers again: a new start takes the lease, and where the failed job left
    one behind (`left`; None: either way) it says so in one line naming that job (its pid no
    longer runs here)."""
    with caplog.at_level(logging.WARNING, logger="rundir.lease"):
        held = lease.acquire(model_dir)
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "rundir.lease"]
        assert left is None or (held.took_over is not None) == left, (left, held.took_over)
        if held.took_over is None:
            assert lines == [], lines
            return
        assert held.took_over.get("pid") == pid, held.took_over
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert lines[0].startswith("taking over the stale lease"), lines
        assert f"pid {pid}" in lines[0] and "no longer runs" in lines[0], lines
    finally:
        held.release()


@pytest.mark.slow
def test_a_run_started_against_a_frozen_store_ends_as_a_storage_failure(
    gcs_bucket, thawed, tiny_data, tiny_prepared, tmp_path, caplog
):
    model_dir = f"{gcs_bucket}/runs/frozen_at_start"
    thawed.freeze()
    started = time.monotonic()
    process = _start(_argv(model_dir, tiny_data, tiny_prepared), tmp_path)
    code, took, text = _wait(process, tmp_path, since=started)
    thawed.thaw()
    print(f"exit {code} {took:.1f} s after the start; stderr:\n{text}")
    assert code == STORAGE, text[-3000:]
    report = _storage_report(text)
    assert report[0].startswith(f"{PROG}: storage unreachable: "), report
    assert len(report) <= 5 and "Traceback" not in text, text[-3000:]
    assert report[-1].startswith("  to resume once it is fixed: "), report
    assert AUTH_LINE not in text
    # Its lease's creation may still land once the store answers (the server had accepted it).
    _next_start_takes_over(model_dir, process.pid, caplog, left=None)


@pytest.mark.slow
def test_a_store_frozen_mid_save_ends_the_run_as_a_storage_failure(
    gcs_server, gcs_bucket, thawed, tiny_data, tiny_prepared, tmp_path, caplog
):
    model_dir = f"{gcs_bucket}/runs/frozen_mid_save"
    process = _start(_argv(model_dir, tiny_data, tiny_prepared), tmp_path)
    deadline = time.monotonic() + 300
    while len(_step_dirs(gcs_server, model_dir)) < 2:  # the second save has started
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no second save: {(tmp_path / 'stderr').read_text()[-3000:]}")
        time.sleep(0.005)
    thawed.freeze()
    code, took, text = _wait(process, tmp_path, since=time.monotonic())
    thawed.thaw()
    print(f"exit {code} {took:.1f} s after the freeze; stderr:\n{text}")
    assert code == STORAGE, text[-3000:]
    report = _storage_report(text)
    assert report[0].startswith(f"{PROG}: storage unreachable: "), report
    assert report[1] == f"  {storage.CAUSES['unreachable']}", report
    assert report[2].startswith("  last complete checkpoint: step 10 "), report
    assert len(report) <= 5 and "Traceback" not in text, text[-3000:]
    # The lease's heartbeat says at most once that it could not refresh the lease.
    assert text.count("could not refresh the lease") <= 1, text[-3000:]
    # The first save went through TensorStore before the freeze: its credentials line stayed off.
    assert AUTH_LINE not in text
    # The store stopped answering: the lease stayed behind, and the next start says so.
    _next_start_takes_over(model_dir, process.pid, caplog, left=True)


# --------------------------------------------------------------------------- TensorStore's line


def test_tensorstore_credentials_line_stays_off_the_terminal(gcs_bucket, tmp_path):
    # A process that writes through TensorStore after the trainer's first contact
    # (`native_logs.quiet_tensorstore_credentials`): its stderr holds nothing of TensorStore's;
    # the same writes without the first contact print the line (the check has teeth).
    script = """if True:
        import sys
        import tensorstore as ts
        from pipelines import native_logs
        url, quiet = sys.argv[1], sys.argv[2] == "quiet"
        if quiet:
            native_logs.quiet_tensorstore_credentials(url)
        bucket, _, path = url[len("gs://"):].partition("/")
        store = ts.KvStore.open({"driver": "gcs", "bucket": bucket, "path": path + "/"}).result()
        store.write("a", b"1").result()
        assert store.read("a").result().value == b"1"
        print("written", file=sys.stderr)
    """
    env = _env()
    env.pop(native_logs.THIRD_PARTY_LOG_ENV, None)
    url = f"{gcs_bucket}/ts"
    for mode, shown in (("quiet", False), ("plain", True)):
        done = subprocess.run(
            [sys.executable, "-c", script, url, mode],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert (AUTH_LINE in done.stderr) == shown, (mode, done.stderr)
        if not shown:
            assert done.stderr == "written\n", done.stderr
