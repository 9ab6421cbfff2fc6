"""The process's gcsfs client with a bounded retry policy: every gs:// request of the project and
of orbax's metadata goes through `BoundedGCSFileSystem` (`rundir.storage_backends` registers it
for the `gs` and `gcs` protocols).

gcsfs retries each request 6 times with exponential back-off, and does so again for every
following request: a save that makes ten requests against a store that went away waits minutes
before anyone hears of it. A store that accepts connections but never answers (a hung server)
is worse: each attempt waits out the read timeout, and an upload whose body fills the socket
buffers waits forever (aiohttp's read timeout starts only once the body is sent). Here:

- a request that gets no answer (refused, reset, timed out) keeps retrying only while its next
  attempt would end within `NO_ANSWER_BUDGET_S` of its first one (an attempt is expected to take
  as long as the last one did): about 31 s against a hung store, about 35 s against a refused
  port;
- each attempt that sends a body is cut off after the connect and read timeouts plus the time
  the body takes at `MIN_UPLOAD_BYTES_PER_S`, so a stalled upload fails like a stalled answer;
- once a request has given up without an answer, the store counts as unreachable: later requests
  are tried once, without back-off, until one gets an answer. So the run's next request after
  the first failure ends it within one read timeout.
"""

from __future__ import annotations

import asyncio
import io
import random
import threading
import time
from asyncio import wait_for as _wait_for  # bound here: tests stub this module's `asyncio.sleep`

import aiohttp
from gcsfs import retry as gcsfs_retry
from gcsfs.core import GCSFileSystem

from rundir.storage_backends import REQUEST_TIMEOUTS_S

# Attempts of one request while the store answers (gcsfs's own count), and their back-off.
ATTEMPTS = 6
_MAX_BACKOFF_S = 32.0
# One request that gets no answer stops retrying before it has waited this long in all: what is
# left of a minute then ends the run (its report, the wait for its threads).
NO_ANSWER_BUDGET_S = 40.0
# An upload slower than this counts as stalled (the attempt is cut off; see `_attempt_bound_s`).
MIN_UPLOAD_BYTES_PER_S = 1024 * 1024
# The requests themselves, without gcsfs's retry decorator (which this class replaces).
_UNDECORATED = GCSFileSystem._request.__wrapped__
_UNDECORATED_GET_FILE = GCSFileSystem._get_file_request.__wrapped__
_UNDECORATED_GET_FILE_CONCURRENT = GCSFileSystem._get_file_concurrent.__wrapped__
# Failures that mean no answer came: the connection was refused, reset or timed out.
_NO_ANSWER = (aiohttp.ClientConnectionError, asyncio.TimeoutError, ConnectionError, TimeoutError)


class _Reachability:
    """Since when the store has given no answer (None: it answers), for every thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._down_since: float | None = None

    def down(self) -> bool:
        """Whether the last request that gave up did so without an answer."""
        return self._down_since is not None

    def mark(self, *, answered: bool) -> None:
        """Records that a request got an answer (the store is back) or gave up without one."""
        with self._lock:
            if answered:
                self._down_since = None
            elif self._down_since is None:
                self._down_since = time.monotonic()


REACHABILITY = _Reachability()


def _retriable(error: BaseException) -> bool:
    """gcsfs's rule: transport errors and 408/429/5xx answers, never a 404."""
    if getattr(error, "code", None) == 404 or getattr(error, "status", None) == 404:
        return False
    return isinstance(error, _NO_ANSWER) or gcsfs_retry.is_retriable(error)


def _body_bytes(data) -> int | None:
    """The size of a request body gcsfs sends (bytes, a file object), or None when unknown."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).nbytes
    if isinstance(data, io.BytesIO):
        return data.getbuffer().nbytes
    return None


def _attempt_bound_s(data) -> float | None:
    """How long one attempt that sends `data` may take before it counts as stalled: opening the
    connection, sending the body at `MIN_UPLOAD_BYTES_PER_S`, and the read timeout for the
    answer. None for a request without a body, which the read timeout bounds on its own (it
    starts once the request is sent, so it does not cover a body that never leaves)."""
    size = _body_bytes(data)
    if not size:
        return None
    return (
        REQUEST_TIMEOUTS_S["connect"] + REQUEST_TIMEOUTS_S["read"] + size / MIN_UPLOAD_BYTES_PER_S
    )


def _backoff_s(attempt: int) -> float:
    return min(random.random() + 2 ** (attempt - 1), _MAX_BACKOFF_S)


async def _bounded(request, *args, **kwargs):
    """`request(*args, **kwargs)` under the policy of the module docstring."""
    attempts = 1 if REACHABILITY.down() else ATTEMPTS
    bound = _attempt_bound_s(kwargs.get("data"))
    first = time.monotonic()
    for attempt in range(attempts):
        started = time.monotonic()
        try:
            call = request(*args, **kwargs)
            answer = await (call if bound is None else _wait_for(call, bound))
        except Exception as e:
            no_answer = isinstance(e, _NO_ANSWER)
            if not no_answer:
                REACHABILITY.mark(answered=True)  # an answer, if an error
            if attempt < attempts - 1 and _retriable(e):
                backoff = _backoff_s(attempt + 1)
                # Against no answer, retry only while the next attempt (as long as this one)
                # would still end within the budget.
                now = time.monotonic()
                spent = (now - first) + backoff + (now - started)
                if not no_answer or spent <= NO_ANSWER_BUDGET_S:
                    await asyncio.sleep(backoff)
                    continue
            if no_answer:
                REACHABILITY.mark(answered=False)
            raise
        REACHABILITY.mark(answered=True)
        return answer


class BoundedGCSFileSystem(GCSFileSystem):
    """gcsfs's JSON-API filesystem whose requests are bounded in time and stop retrying once the
    store is unreachable (see the module docstring); everything else is gcsfs's."""

    async def _request(self, method, path, *args, data=None, **kwargs):
        """gcsfs's request (all JSON-API calls and uploads) under the bounded policy."""
        return await _bounded(_UNDECORATED, self, method, path, *args, data=data, **kwargs)

    async def _get_file_request(self, rpath, lpath, *args, **kwargs):
        """gcsfs's download to a local file under the bounded policy (it has no body)."""
        return await _bounded(_UNDECORATED_GET_FILE, self, rpath, lpath, *args, **kwargs)

    async def _get_file_concurrent(self, rpath, lpath, *args, **kwargs):
        """gcsfs's download in parts, which retried its `_get_file_request`s six times over: under
        the bounded policy too, so that its retries share one budget with theirs."""
        return await _bounded(_UNDECORATED_GET_FILE_CONCURRENT, self, rpath, lpath, *args, **kwargs)
