"""The process's gcsfs client with a bounded retry policy: every gs:// request of the project and
of orbax's metadata goes through `BoundedGCSFileSystem` (`rundir.storage` registers it for the
`gs` and `gcs` protocols).

gcsfs retries each request 6 times with exponential back-off (about 20 s when the service does
not answer), and does so again for every following request: a save that makes ten requests
against a store that went away waits minutes before anyone hears of it (issue 36). Here, once a
request has used up its retries without reaching the service, the store counts as unreachable:
later requests are tried once, without back-off, until one gets an answer. So the first failure
takes about 20 s, and the run's next request ends it at once.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import aiohttp
from gcsfs import retry as gcsfs_retry
from gcsfs.core import GCSFileSystem

# Attempts of one request while the store answers (gcsfs's own count), and their back-off.
ATTEMPTS = 6
_MAX_BACKOFF_S = 32.0
# The request itself, without gcsfs's retry decorator (which this class replaces).
_UNDECORATED = GCSFileSystem._request.__wrapped__
# Failures that mean no answer came: the connection was refused, reset or timed out.
_NO_ANSWER = (aiohttp.ClientConnectionError, asyncio.TimeoutError, ConnectionError, TimeoutError)


class _Reachability:
    """Since when the store has given no answer (None: it answers), for every thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._down_since: float | None = None

    def down(self) -> bool:
        return self._down_since is not None

    def mark(self, *, answered: bool) -> None:
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
    return gcsfs_retry.is_retriable(error)


class BoundedGCSFileSystem(GCSFileSystem):
    """gcsfs's JSON-API filesystem whose requests stop retrying once the store is unreachable
    (see the module docstring); everything else is gcsfs's."""

    async def _request(self, method, path, *args, **kwargs):
        attempts = 1 if REACHABILITY.down() else ATTEMPTS
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(min(random.random() + 2 ** (attempt - 1), _MAX_BACKOFF_S))
            try:
                answer = await _UNDECORATED(self, method, path, *args, **kwargs)
            except Exception as e:
                if not isinstance(e, _NO_ANSWER):
                    REACHABILITY.mark(answered=True)  # an answer, if an error
                elif attempt == attempts - 1:
                    REACHABILITY.mark(answered=False)
                if attempt < attempts - 1 and _retriable(e):
                    continue
                raise
            REACHABILITY.mark(answered=True)
            return answer
