"""pytest plugin (registered in tests/conftest.py): a real GCS API server on 127.0.0.1 and the
no-egress guard.

- The guard (`tests/no_egress/no_egress_guard.py`) is installed in the pytest process when this
  plugin loads: a connect, send or name lookup aimed at anything but loopback fails at once.
- `gcs_server` (session): one fake-gcs-server (`tests/gcs_server.py`), filesystem-backed on a fixed
  port, so `gcs_server.restart()` or `stop()` ... `start()` keeps its buckets; skipped, saying why,
  only where the server binary cannot start; `gcs_server.freeze()` ... `thaw()` makes it accept
  connections without answering them.
- `fast_retries` (function): the storage clients' retries without their back-off sleeps.
- `gcs_bucket` (function): a fresh bucket, yielded as `gs://<bucket>`, with the server's
  environment set in `os.environ` for this process and for subprocesses (their PYTHONPATH gains
  the guard's sitecustomize); a test whose process or subprocesses attempted egress fails.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from gcs_server import GcsServer, ServerUnavailable
from no_egress import no_egress_guard

no_egress_guard.install()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """The session's fake-gcs-server (started; stopped by pid at the end of the session)."""
    server = GcsServer(tmp_path_factory.mktemp("gcs_server"))
    try:
        server.start()
    except ServerUnavailable as e:
        pytest.skip(f"no GCS API server: fake-gcs-server cannot start here ({e})")
    yield server
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch, tmp_path_factory):
    """`gs://<fresh bucket>` on `gcs_server`, with every client of the stack pointed at it."""
    import fsspec.config

    import rundir.storage  # noqa: F401  (selects epath's and fsspec's gs:// backend first)

    if not gcs_server.running:  # a test before this one may have stopped it
        gcs_server.start()
    gcs_server.thaw()  # or frozen it (`GcsServer.freeze`)
    egress_log = tmp_path_factory.mktemp("egress") / "blocked.log"
    for key, value in gcs_server.env(egress_log=egress_log).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    # fsspec read FSSPEC_GCS_TOKEN when it was imported; this process needs it set directly.
    monkeypatch.setitem(fsspec.config.conf, "gcs", {**fsspec.config.conf.get("gcs", {})})
    monkeypatch.setitem(fsspec.config.conf["gcs"], "token", "anon")
    from rundir import gcs_client

    gcs_client.REACHABILITY.mark(answered=True)  # a test before this one may have stopped it
    seen = len(no_egress_guard.BLOCKED)
    yield gcs_server.create_bucket(f"xl-{uuid.uuid4().hex[:16]}")
    blocked = no_egress_guard.BLOCKED[seen:]
    if egress_log.exists():
        blocked += egress_log.read_text().splitlines()
    if blocked:
        pytest.fail("network egress attempted (refused by the guard): " + "; ".join(blocked))


@pytest.fixture
def fast_retries(monkeypatch):
    """gcsfs's retry loop without its back-off sleeps (about 30 s in all), so a dead server
    fails the test in a second; the loop itself (six attempts) still runs."""
    import gcsfs.retry

    from rundir import gcs_client

    class NoSleep:
        @staticmethod
        async def sleep(_seconds):
            await asyncio.sleep(0)

    monkeypatch.setattr(gcsfs.retry, "asyncio", NoSleep)
    monkeypatch.setattr(gcs_client, "asyncio", NoSleep)  # the project's client (same policy)
