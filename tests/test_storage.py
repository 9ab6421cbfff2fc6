"""`rundir.storage` on local disk and on a real GCS API server (fake-gcs-server on 127.0.0.1):
atomic writes, appends (by compose on GCS, O(chunk)), exclusive creation and compare-and-swap
races, path refusals, an orbax checkpoint in a bucket, errors when the server is down, and the
no-egress guard itself."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import imported_with
from gcs_server import GcsServer
from no_egress import no_egress_guard

from rundir import gcs_client, gcs_objects, storage, storage_backends


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
    """A directory URL on local disk or in a fresh bucket (same tests for both)."""
    if request.param == "local":
        return os.fspath(tmp_path / "run")
    return request.getfixturevalue("gcs_bucket") + "/run"


def _listing(root: str, gcs_server=None) -> list[str]:
    """Every file under `root`, relative, straight from the disk or the server."""
    if not root.startswith("gs://"):
        base = Path(root)
        return sorted(os.fspath(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
    bucket, _, prefix = root[len("gs://") :].partition("/")
    objects = gcs_server.list_objects(bucket)
    return [n[len(prefix) + 1 :] for n in objects if n.startswith(prefix + "/")]


def _server(root, request):
    return request.getfixturevalue("gcs_server") if root.startswith("gs://") else None


def test_atomic_write_reads_back_and_leaves_no_temporaries(root, request):
    path = f"{root}/sub/run.json"
    storage.write_text_atomic(path, '{"a": 1}\n')
    storage.write_text_atomic(path, '{"a": 2}\n')
    assert storage.read_text(path) == '{"a": 2}\n'
    assert storage.read_versioned(path)[0] == '{"a": 2}\n'
    assert abs(storage.mtime(path) - time.time()) < 60
    assert storage.mtime(f"{root}/absent") is None
    assert storage.read_versioned(f"{root}/absent") is None
    with pytest.raises(FileNotFoundError):
        storage.read_text(f"{root}/absent")
    storage.write_bytes(f"{root}/plot.png", b"\x89PNG\r\n--boundary?\x00")
    assert storage.as_path(f"{root}/plot.png").read_bytes() == b"\x89PNG\r\n--boundary?\x00"
    assert _listing(root, _server(root, request)) == ["plot.png", "sub/run.json"]


def test_a_reader_never_sees_a_partial_write(root):
    path = f"{root}/big.txt"
    size, rounds = 300_000, 12
    storage.write_text_atomic(path, "0" * size)
    seen, done = set(), threading.Event()

    def read_all():
        while not done.is_set():
            text = storage.read_text(path)
            assert len(text) == size and text == text[0] * size, "torn read"
            seen.add(text[0])

    with ThreadPoolExecutor(1) as pool:
        reader = pool.submit(read_all)
        for i in range(1, rounds):
            storage.write_text_atomic(path, str(i % 10) * size)
        done.set()
        reader.result()
    assert len(seen) >= 2  # the reader did overlap the writes


def test_appends_keep_their_order_and_create_the_file(root, request):
    path = f"{root}/metrics.jsonl"
    lines = [f'{{"step": {i}}}\n' for i in range(6)]
    for line in lines:
        storage.append_text(path, line)
    assert storage.read_text(path) == "".join(lines)
    assert _listing(root, _server(root, request)) == ["metrics.jsonl"]  # no temporary objects


def test_an_append_on_gcs_uploads_the_chunk_not_the_file(gcs_bucket, monkeypatch):
    path = f"{gcs_bucket}/metrics.jsonl"
    head = "x" * 200_000 + "\n"
    storage.write_text_atomic(path, head)
    fs = gcs_objects.filesystem()
    sent = []
    request = fs._request

    async def spy(method, url, *args, data=None, **kwargs):
        sent.append((method, url, len(data) if data is not None else 0))
        return await request(method, url, *args, data=data, **kwargs)

    monkeypatch.setattr(fs, "_request", spy)
    chunk = '{"step": 1, "loss": 2.5}\n'
    for _ in range(3):
        storage.append_text(path, chunk)
    sent = list(sent)
    assert storage.read_text(path) == head + 3 * chunk
    assert sum(n for _, _, n in sent) < 3 * (len(chunk) + 1000)  # never the 200 kB file
    assert sum("/compose" in url for _, url, _ in sent) == 3


def test_an_append_whose_answer_was_lost_is_not_repeated(gcs_bucket, monkeypatch):
    """A compose that landed but whose answer was lost is retried by the client and refused by
    its own generation precondition (412); the append must not be made twice."""
    path = f"{gcs_bucket}/metrics.jsonl"
    storage.append_text(path, "a\n")
    compose = gcs_objects.compose
    calls = []

    def lost_answer(*args):
        calls.append(args)
        compose(*args)
        if len(calls) == 1:
            raise FileExistsError("412 on the retried compose")

    monkeypatch.setattr(gcs_objects, "compose", lost_answer)
    storage.append_text(path, "b\n")
    assert storage.read_text(path) == "a\nb\n" and len(calls) == 1


def test_exactly_one_of_two_racing_creators_wins(root):
    for trial in range(6):
        path = f"{root}/LEASE.{trial}"
        barrier = threading.Barrier(2)

        def create(who, path=path, barrier=barrier):
            barrier.wait()
            return storage.create_exclusive(path, f"holder {who}\n")

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(create, ["a", "b"]))
        assert sorted(results) == [False, True], results
        winner = "ab"[results.index(True)]
        assert storage.read_text(path) == f"holder {winner}\n"
        assert not storage.create_exclusive(path, "late\n")


def test_compare_and_swap_refuses_a_stale_version(root):
    path = f"{root}/LEASE"
    storage.write_text_atomic(path, "beat 1\n")
    text, first = storage.read_versioned(path)
    assert text == "beat 1\n"
    assert storage.replace_if(path, "beat 2\n", first)  # same length: only the version differs
    assert not storage.replace_if(path, "beat X\n", first)  # stale
    text, second = storage.read_versioned(path)
    assert text == "beat 2\n" and second != first
    assert not storage.replace_if(f"{root}/absent", "x\n", second)
    assert storage.read_versioned(f"{root}/absent") is None


def test_of_two_racing_swaps_exactly_one_wins(root):
    path = f"{root}/LEASE"
    storage.write_text_atomic(path, "old\n")
    for trial in range(4):
        _, version = storage.read_versioned(path)
        barrier = threading.Barrier(2)

        def swap(who, version=version, barrier=barrier, trial=trial):
            barrier.wait()
            return storage.replace_if(path, f"{who} {trial}\n", version)

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(swap, ["a", "b"]))
        assert sorted(results) == [False, True], results
        assert storage.read_text(path) == f"{'ab'[results.index(True)]} {trial}\n"


def test_delete_if_deletes_only_the_version_it_was_given(root):
    path = f"{root}/LEASE"
    storage.write_text_atomic(path, "one\n")
    _, stale = storage.read_versioned(path)
    storage.write_text_atomic(path, "two\n")
    assert not storage.delete_if(path, stale)
    assert storage.read_text(path) == "two\n"
    _, current = storage.read_versioned(path)
    assert storage.delete_if(path, current)
    assert storage.read_versioned(path) is None
    assert not storage.delete_if(path, current)  # already gone


def test_move_tree_moves_every_file(root, request):
    for name in ("a", "d/b"):
        storage.write_text_atomic(f"{root}/7/{name}", name)
    storage.move_tree(f"{root}/7", f"{root}/set_aside/7.nan")
    assert _listing(root, _server(root, request)) == ["set_aside/7.nan/a", "set_aside/7.nan/d/b"]


def test_list_files_lists_only_what_is_under_the_directory(root):
    for name in ("d/a", "d/e/b", "dx/c", "top"):
        storage.write_text_atomic(f"{root}/{name}", name)
    assert [os.fspath(p) for p in storage.list_files(f"{root}/d")] == [
        f"{storage.as_path(root)}/d/a",
        f"{storage.as_path(root)}/d/e/b",
    ]
    assert len(storage.list_files(root)) == 4 and storage.list_files(f"{root}/none") == []


def test_epath_sees_what_another_client_wrote_meanwhile(gcs_bucket):
    """gcsfs caches listings forever by default; `rundir.storage` turns that off, so a reader
    polling a run directory (checkpoint steps, metrics) sees another process's new files."""
    import fsspec

    run = storage.as_path(f"{gcs_bucket}/run")
    storage.write_text_atomic(run / "1", "x")
    assert [p.name for p in run.iterdir()] == ["1"]
    other = fsspec.filesystem("gcs", skip_instance_cache=True, token="anon")
    other.pipe_file(f"{gcs_bucket}/run/2", b"y")
    assert sorted(p.name for p in run.iterdir()) == ["1", "2"] and (run / "2").exists()


@pytest.mark.parametrize(
    "value",
    ["s3://bucket/run", "http://host/run", "file:///srv/run", "gs:/bucket/run", "gs://", "gs:///run",
     "gcs://bucket/run", "/gs/bucket/run", ""],
)  # fmt: skip
def test_unsupported_paths_are_refused_by_name_before_anything_is_written(
    value, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(storage.UnsupportedPathError) as refused:
        storage.write_text_atomic(storage.as_path(value, name="MODEL_DIR") / "run.json", "{}")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"MODEL_DIR={value!r}")
    assert "local paths" in message and "gs://" in message
    assert list(tmp_path.iterdir()) == []


def test_as_path_gives_absolute_local_paths_and_keeps_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert os.fspath(storage.as_path("runs/a")) == os.fspath(tmp_path / "runs" / "a")
    assert os.fspath(storage.as_path(tmp_path / "b")) == os.fspath(tmp_path / "b")
    url = storage.as_path("gs://my-bucket/runs/a", name="MODEL_DIR")
    assert os.fspath(url) == "gs://my-bucket/runs/a" and os.fspath(url / "x") == f"{url}/x"
    assert storage.is_remote(url) and storage.is_remote("gs://b_1/x")
    assert not storage.is_remote("runs/a") and not storage.is_remote("a:b")
    assert storage.as_path(url) == url


def test_gs_paths_use_fsspec_not_tensorflow():
    from etils.epath import backend

    assert os.environ["EPATH_USE_TF"] == "false"
    assert storage.as_path("gs://b/x")._backend is backend.fsspec_backend


def test_importing_rundir_imports_neither_tensorflow_nor_jax():
    assert imported_with("rundir.storage", ("tensorflow", "jax", "gcsfs")) == []


def test_an_orbax_checkpoint_lives_in_the_bucket(gcs_bucket, gcs_server, tmp_path, monkeypatch):
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    monkeypatch.chdir(tmp_path)
    tree = {"w": jnp.arange(12.0).reshape(3, 4), "b": {"n": jnp.arange(5, dtype=jnp.int32)}}
    path = storage.as_path(f"{gcs_bucket}/ckpt/3", name="MODEL_DIR")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, tree)
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(path, tree)
    for got, want in zip(
        [restored["w"], restored["b"]["n"]], [tree["w"], tree["b"]["n"]], strict=True
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    objects = gcs_server.list_objects(gcs_bucket[len("gs://") :])
    assert "ckpt/3/_CHECKPOINT_METADATA" in objects  # epath (gcsfs) wrote the metadata
    assert any(o.startswith("ckpt/3/ocdbt.process_0/") for o in objects)  # tensorstore the arrays
    assert list(tmp_path.iterdir()) == []  # nothing local, no `gs:` directory


def test_orbax_tensorstore_requests_give_up_within_seconds(gcs_bucket, gcs_server, monkeypatch):
    # orbax's TensorStore contexts carry the project's retry bound (`bound_orbax_retries`): a
    # write to a store that went away fails as "storage unreachable" after its retries, not after
    # TensorStore's default of about 5 minutes (the bound is shortened here to keep this fast).
    import copy

    import tensorstore as ts
    from orbax.checkpoint._src.serialization import tensorstore_utils

    for name in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
        template = copy.deepcopy(getattr(tensorstore_utils, name))
        monkeypatch.setattr(tensorstore_utils, name, template)
    bound = {"max_retries": 3, "initial_delay": "0.1s", "max_delay": "0.2s"}
    monkeypatch.setattr(storage_backends, "TENSORSTORE_RETRIES", bound)
    storage.bound_orbax_retries()
    context = tensorstore_utils.get_ts_context(use_ocdbt=True)
    assert context.spec.to_json()["gcs_request_retries"]["max_retries"] == 3
    bucket = gcs_bucket.removeprefix("gs://")
    store = ts.KvStore.open({"driver": "gcs", "bucket": bucket, "path": "ts/"}, context=context)
    store = store.result()
    gcs_server.stop()
    started = time.monotonic()
    try:
        with pytest.raises(storage.StorageError, match=r"^storage unreachable: writing gs://"):
            with storage.service_errors(f"{gcs_bucket}/ts/a", "writing"):
                store.write("a", b"1").result()
    finally:
        gcs_server.start()
    assert time.monotonic() - started < 10


def test_a_stopped_server_is_a_storage_error_naming_the_path(
    gcs_bucket, tmp_path, monkeypatch, fast_retries
):
    server = GcsServer(tmp_path / "second")  # not the session's: that one stays up
    server.start()
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        bucket = server.create_bucket("survives-restarts")
        path = f"{bucket}/run/metrics.jsonl"
        storage.append_text(path, "1\n")
        server.stop()
        attempts = [
            lambda: storage.read_versioned(path),
            lambda: storage.append_text(path, "2\n"),
            lambda: storage.write_text_atomic(path, "x\n"),
            lambda: storage.create_exclusive(path, "x\n"),
        ]
        requests = []
        undecorated = gcs_client._UNDECORATED

        async def counted(*args, **kwargs):
            requests.append(args[1])
            return await undecorated(*args, **kwargs)

        monkeypatch.setattr(gcs_client, "_UNDECORATED", counted)
        for attempt in attempts:
            with pytest.raises(storage.StorageError) as failed:
                attempt()
            message = str(failed.value)
            assert path in message and f"127.0.0.1:{server.port}" in message, message
            assert "\n" not in message and isinstance(failed.value, OSError)
            # No answer is "unreachable", not a refusal to write.
            assert message.startswith("storage unreachable: ") and failed.value.cause == (
                "unreachable"
            )
        # The first request used up its retries; once the store counts as unreachable, each
        # later one is tried once (a run's next request ends it at once).
        assert len(requests) == gcs_client.ATTEMPTS + len(attempts) - 1, requests
        server.restart()  # same port, same data
        storage.append_text(path, "2\n")
        assert storage.read_text(path) == "1\n2\n"
        assert not gcs_client.REACHABILITY.down()
    finally:
        server.stop()


def test_the_guard_refuses_non_loopback_addresses_before_sending(tmp_path):
    import socket

    seen = len(no_egress_guard.BLOCKED)
    # UDP first: its connect sends nothing even unguarded, so this proves the hook is active...
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        with pytest.raises(no_egress_guard.EgressBlockedError):
            udp.connect(("10.255.255.1", 9))
    # ...before the calls that would send a SYN or a DNS query without it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        with pytest.raises(ConnectionRefusedError):
            tcp.connect(("10.255.255.1", 80))
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("storage.googleapis.com", 443)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect(("127.0.0.1", 9))  # loopback stays allowed
    assert len(no_egress_guard.BLOCKED) == seen + 3
    del no_egress_guard.BLOCKED[seen:]

    # A Python subprocess with the fixtures' environment is guarded too, and reports refusals.
    log = tmp_path / "blocked.log"
    env = dict(os.environ, **GcsServer(tmp_path).env(egress_log=log))
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n    s.connect(('10.255.255.1', 9))\nexcept ConnectionRefusedError as e:\n"
        "    print('refused', type(e).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "refused EgressBlockedError", out.stderr
    assert "10.255.255.1" in log.read_text()


def test_only_service_failures_of_a_library_call_become_storage_errors():
    # What orbax raises on the main thread when the store goes away mid-save (gcsfs's transport
    # error, possibly wrapped) is a StorageError naming the path; a bug (ValueError) is not.
    import aiohttp

    def refused():
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except ConnectionRefusedError as e:
            raise RuntimeError("orbax: save failed") from e

    with pytest.raises(storage.StorageError, match=r"saving gs://b/run/checkpoints/20 failed"):
        with storage.service_errors("gs://b/run/checkpoints/20", "saving"):
            refused()
    with pytest.raises(storage.StorageError, match="ClientConnectionError"):
        with storage.service_errors("gs://b/run", "saving"):
            raise aiohttp.ClientConnectionError("Cannot connect to host")
    with pytest.raises(ValueError, match="bad shape"):
        with storage.service_errors("gs://b/run", "saving"):
            raise ValueError("bad shape")
    with pytest.raises(RuntimeError):  # local paths keep their own errors
        with storage.service_errors("runs/local", "saving"):
            refused()
    assert not storage.is_service_failure(KeyError("x"))


def test_storage_failures_are_told_apart_by_cause():
    # What the user does differs: wait for the store, free space, raise a quota, fix the
    # permissions. The errors are those the libraries raise (tensorstore's ValueErrors carry
    # their status in the text; gcsfs's 404 on a forgotten resumable upload is a
    # FileNotFoundError).
    import errno

    from gcsfs.retry import HttpError

    def cause(error, path="gs://b/run/checkpoints/20"):
        try:
            with storage.service_errors(path, "saving"):
                raise error
        except storage.StorageError as e:
            assert str(e).startswith(f"storage {e.cause}: saving {path} failed: "), e
            return e.cause
        except Exception:  # noqa: BLE001 - not a storage failure
            return None

    curl = "ABORTED: All 6 retry attempts failed: CURL error Could not connect to server"
    assert cause(ValueError(f'Error writing "x/.zarray": {curl}')) == "unreachable"
    assert cause(ConnectionRefusedError(111, "Connect call failed")) == "unreachable"
    assert cause(HttpError({"code": 403, "message": "denied"})) == "permission"
    assert cause(HttpError({"code": 429, "message": "slow down"})) == "quota"
    assert cause(HttpError({"code": 503, "message": "busy"})) == "failed"
    assert cause(ValueError("PERMISSION_DENIED: no")) == "permission"
    lost = FileNotFoundError("http://127.0.0.1:1/upload/storage/v1/b/b/o?uploadType=resumable")
    assert cause(lost) == "upload lost"
    # On local disk a full disk or quota is storage; a permission error or a bug is not.
    full = OSError(errno.ENOSPC, "No space left on device")
    assert cause(full, "/runs/x") == "disk full"
    assert cause(OSError(errno.EDQUOT, "Disk quota exceeded"), "/runs/x") == "quota"
    assert cause(ValueError("... [OS error 28: No space left on device]"), "/runs/x") == (
        "disk full"
    )
    assert cause(PermissionError(errno.EACCES, "denied"), "/runs/x") is None
    assert cause(ValueError("bad shape")) is None
    assert cause(ValueError("bad shape"), "/runs/x") is None


def test_a_full_local_disk_is_a_storage_error_of_the_primitives(tmp_path):
    # Appends and atomic writes on a local disk that is full raise the storage class, naming the
    # path and "disk full" (a real ENOSPC: /dev/full refuses every write).
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with pytest.raises(storage.StorageError, match=r"^storage disk full: appending to /dev/full"):
        storage.append_text("/dev/full", "x\n")


def test_local_dir_refuses_gs_naming_the_setting_and_why(tmp_path):
    """What is local by design (apt-built corpora, a demo's output) refuses a gs:// value in one
    line instead of creating a local `gs:/` folder; local values come back absolute."""
    with pytest.raises(
        storage.UnsupportedPathError,
        match=r"--data-dir='gs://b/x': must be a local directory \(apt\)",
    ):
        storage.local_dir("gs://b/x", name="--data-dir", why="apt")
    with pytest.raises(storage.UnsupportedPathError, match="--out='s3://b'"):
        storage.local_dir("s3://b", name="--out", why="demo")
    assert not (tmp_path / "gs:").exists()
    got = storage.local_dir(tmp_path / "d", name="--out", why="demo")
    assert isinstance(got, Path) and got == tmp_path / "d"
