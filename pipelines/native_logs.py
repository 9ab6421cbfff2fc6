"""Native (C++) log lines of TensorFlow and its ops, kept off the terminal.

TensorFlow 2.21 writes its start-up lines from C++ straight to file descriptor 2: absl's
`WARNING: All log messages before absl::InitializeLog() is called are written to STDERR`, the
oneDNN notice, `cudart_stub` and, on a machine without a GPU driver, `failed call to cuInit`;
`TF_CPP_MIN_LOG_LEVEL` does not silence the first three (tensorflow#100442). tf_text's statically
linked SentencePiece prints `normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty` whenever
its op loads an identity-normalised model such as ours, and exposes no log level. Python's
logging never sees these lines, so the only place to catch them is the file descriptor itself:
`stderr_to` points fd 2 at a log file (or the sink) while a native call that writes them runs,
`quiet_tensorflow_import` wraps the first `import tensorflow` of a process, wherever it happens,
in it. TensorStore (orbax's checkpoint arrays) logs `Using GOOGLE_AUTH_TOKEN_FOR_TESTING` (or which
credentials it found) from C++ when it first asks for GCS credentials, from whatever thread makes
its first request: `quiet_tensorstore_credentials` makes that first request in a block.

The sink is the third-party log, `$XLSCALE_THIRD_PARTY_LOG` (a file the lines are appended to;
`/dev/stderr` shows them as before), else `os.devnull`. Python exceptions are not affected: they are raised, not written, and
reach the caller as before.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator

THIRD_PARTY_LOG_ENV = "XLSCALE_THIRD_PARTY_LOG"
STDERR_FD = 2

_lock = threading.RLock()
_depth = 0  # nested `stderr_to` blocks: only the outermost one moves fd 2
_terminal: int | None = None  # fd 2's own target while a block has moved it (a dup)


def third_party_log() -> str | None:
    """The file third-party lines are kept in, `$XLSCALE_THIRD_PARTY_LOG`; None: nowhere."""
    return os.environ.get(THIRD_PARTY_LOG_ENV) or None


def sink() -> str:
    """Where redirected native lines go: the third-party log, else the null device."""
    return third_party_log() or os.devnull


@contextlib.contextmanager
def stderr_to(path: str | os.PathLike | None = None) -> Iterator[None]:
    """Points file descriptor 2 at `path` (appended to; default `sink()`) while the block runs,
    then back at what it was.

    Native libraries write to fd 2 directly, so this is what moves their lines; Python's
    `sys.stderr` (also fd 2) is flushed on the way in and out so that no buffered line of ours
    lands in the wrong place. Nested blocks leave fd 2 where the outermost one put it: a run whose
    whole process log is redirected keeps every native line in that log. fd 2 is one per process,
    so a line another thread writes meanwhile goes the same way; keep the blocks short, around
    the native call.
    """
    global _depth, _terminal
    with _lock:
        saved = None
        if _depth == 0:
            target = os.open(os.fspath(path or sink()), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            sys.stderr.flush()
            saved = os.dup(STDERR_FD)
            _terminal = saved
            os.dup2(target, STDERR_FD)
            os.close(target)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if saved is not None:
                sys.stderr.flush()
                os.dup2(saved, STDERR_FD)
                _terminal = None
                os.close(saved)


def terminal_fd() -> int:
    """The file descriptor of the process's own stderr (the terminal, or whatever fd 2 was
    before a `stderr_to` block moved it): where a line that must be seen goes, e.g. the one a
    signal handler writes while TensorFlow imports with fd 2 pointed at the sink."""
    saved = _terminal
    return STDERR_FD if saved is None else saved


def _hide_gpus_from_tensorflow(tf) -> None:
    """TensorFlow only feeds the input pipelines here; JAX owns the accelerators. Hiding them from
    TensorFlow (as T5X does) keeps it from reserving GPU memory, and probes its devices now,
    inside the redirect, instead of printing `failed call to cuInit` at the first op."""
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # devices already initialised by someone else: nothing left to hide
        pass


class _QuietTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `tensorflow` once, and loads it with fd 2 redirected (see `quiet_tensorflow_import`).
    A finder and loader in one, wrapping the real loader."""

    NAME = "tensorflow"

    def __init__(self):
        self._real = None

    def find_spec(self, fullname, path=None, target=None):
        # Asked again until TensorFlow is loaded: a library that only probes whether it is
        # installed (`importlib.util.find_spec`) does not load it.
        if fullname != self.NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        self._real, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: the real finders answer from here on
        with stderr_to():
            self._real.exec_module(module)
            _hide_gpus_from_tensorflow(module)
        module.__loader__ = module.__spec__.loader = self._real  # as if imported plainly


def quiet_tensorflow_import() -> None:
    """Makes the process's first `import tensorflow`, wherever it happens, run with fd 2 pointed
    at the sink (`stderr_to`), and hides the GPUs from TensorFlow there: its start-up lines never
    reach the terminal, and a command that never needs TensorFlow never pays for importing it.
    Does nothing once TensorFlow is imported or the hook is installed."""
    if "tensorflow" in sys.modules:
        return
    if not any(isinstance(finder, _QuietTensorFlow) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlow())


# How long the first TensorStore request may take before `quiet_tensorstore_credentials` moves on
# (it has asked for the credentials by then; a store that does not answer keeps it waiting).
_CREDENTIALS_WAIT_S = 5.0
_credentials_asked = False


def quiet_tensorstore_credentials(url: str) -> None:
    """Makes TensorStore's first GCS request of the process, a read of `url` (a `gs://` URL; an
    absent object is fine), with fd 2 pointed at the sink, so that the line its credentials
    lookup logs never reaches the terminal: orbax's first save or restore would log it from a
    background thread, at a time no block could cover. Waits for the answer at most
    `_CREDENTIALS_WAIT_S`; its failure is ignored (the run's own requests report the store's).
    Once per process; a no-op for other URLs."""
    global _credentials_asked
    if _credentials_asked or not url.startswith("gs://"):
        return
    _credentials_asked = True
    import tensorstore as ts

    bucket, _, key = url[len("gs://") :].partition("/")
    spec = {
        "driver": "gcs",
        "bucket": bucket,
        "context": {"gcs_request_retries": {"max_retries": 0}},
    }
    with stderr_to():
        try:
            ts.KvStore.open(spec).result().read(key.rstrip("/")).result(timeout=_CREDENTIALS_WAIT_S)
        except Exception:  # noqa: BLE001 - no answer, a refusal: the run's own requests say so
            pass
