"""Which client serves gs:// in this process, and how long each of its requests may take.

Importing `rundir.storage` imports this module, which pins the backends before anything touches
gs://:

- gcsfs (as `rundir.gcs_client.BoundedGCSFileSystem`) for the project's own objects and for every
  `etils.epath.Path` (orbax's metadata included), never TensorFlow's GCS client, so one client
  with one configuration (endpoint, credentials, retries) serves the whole process;
- TensorStore (orbax's arrays) keeps its own libcurl transport: its stall detection and connect
  timeout are set through its environment variables here, before its first request, and its
  retries in the contexts orbax builds (`bound_orbax_retries`, called by the job entry points).

A store that stops answering, refuses connections or accepts them without ever answering, so
fails each request within `gcs_client.NO_ANSWER_BUDGET_S` (gcsfs) or about
`TENSORSTORE_CURL_ENV`'s stall time per TensorStore attempt, and the run ends within a minute.
"""

from __future__ import annotations

import os
import sys

import fsspec

# Bounds of one gcsfs request (seconds): to open its connection, and between two reads of its
# answer once the request is sent (a long download is not cut short while data flows). The GCS
# JSON API answers in well under a second; 15 s of silence is a store that stopped answering.
# (`rundir.gcs_client` bounds the time a request body takes to leave, and the retries.)
REQUEST_TIMEOUTS_S = {"connect": 10.0, "read": 15.0}
# TensorStore's libcurl transport (read from the environment when it makes its first request):
# a transfer that moves under 256 bytes/s for 5 s is cut off (its default waits a minute), and a
# connection must open within 10 s (default 30 s). libcurl measures the speed over its last 5 s,
# so against a store that accepts connections but never answers an attempt fails in about 10 s
# (measured: 9-10 s).
TENSORSTORE_CURL_ENV = {
    "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "256",
    "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": "5",
    "TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS": "10",
}
# TensorStore's retries of a failed GCS request (orbax's arrays), `max_retries` retries after the
# first attempt: its default (32 retries, up to 32 s apart) waits about 5 minutes on a store that
# went away, or 30 minutes on one that never answers; this gives up after three attempts, 1-2 s
# and 2-3 s apart: about 35 s against a store that never answers (`TENSORSTORE_CURL_ENV`), 5 s
# against a refused connection, and a transient 429/503 answer is tried again twice.
TENSORSTORE_RETRIES = {"max_retries": 2, "initial_delay": "1s", "max_delay": "2s"}


def select_backends() -> None:
    """Routes gs:// through fsspec's plain gcsfs filesystem, for epath (orbax) and for us, and
    bounds every request of gcsfs and of TensorStore's transport in time.

    - `EPATH_USE_TF=false`: etils otherwise uses TensorFlow's GCS client whenever TF is installed,
      which ignores `STORAGE_EMULATOR_HOST` and our retries; etils caches that choice on first
      use (`gpath._is_tf_installed`), so the cache is cleared too if someone used gs:// earlier.
    - gcsfs's JSON-API `GCSFileSystem` (as `rundir.gcs_client.BoundedGCSFileSystem`, which
      bounds each request's retries in time and stops retrying once the store is unreachable),
      not its `ExtendedGcsFileSystem` default: the extended one asks the Storage Control gRPC API
      for every bucket's layout (a 60 s retry loop where that API is not served, e.g. an
      emulator) and our preconditions and compose are JSON-API calls.
    - No listing cache: gcsfs caches directory listings forever by default, so a reader would not
      see objects another process wrote (checkpoints, metrics); local disk has no such staleness.
    - `TENSORSTORE_CURL_ENV`, unless the environment sets them already (for child processes too).
    """
    os.environ["EPATH_USE_TF"] = "false"
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # for child processes
    for name, value in TENSORSTORE_CURL_ENV.items():
        os.environ.setdefault(name, value)
    from etils.epath import gpath

    cached = getattr(gpath, "_is_tf_installed", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
    for protocol in ("gs", "gcs"):
        if protocol in fsspec.registry:  # already imported (maybe the extended class)
            from rundir.gcs_client import BoundedGCSFileSystem

            fsspec.register_implementation(protocol, BoundedGCSFileSystem, clobber=True)
        else:  # imported on first use
            fsspec.register_implementation(
                protocol, "rundir.gcs_client.BoundedGCSFileSystem", clobber=True
            )
    conf = fsspec.config.conf.setdefault("gcs", {})
    conf.setdefault("use_listings_cache", False)
    # Every attempt is bounded: a connection that does not open, or an answer that stops
    # arriving, fails it (`rundir.gcs_client` decides whether another attempt follows).
    conf.setdefault("requests_timeout", _request_timeout())


def _request_timeout():
    import aiohttp  # gcsfs's transport, imported with it anyway

    return aiohttp.ClientTimeout(
        total=None, sock_connect=REQUEST_TIMEOUTS_S["connect"], sock_read=REQUEST_TIMEOUTS_S["read"]
    )


def bound_orbax_retries() -> None:
    """Applies `TENSORSTORE_RETRIES` to every TensorStore context orbax builds from now on (its
    base and OCDBT contexts are module-level templates that `get_ts_context` copies), so that a
    store that went away fails a save within a minute. Called by the job entry points; orbax is
    imported here, not by `import rundir.storage`."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    for name in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
        template = getattr(tensorstore_utils, name, None)
        if isinstance(template, dict):
            template["gcs_request_retries"] = dict(TENSORSTORE_RETRIES)


def store_unreachable() -> bool:
    """Whether the object store stopped answering: the last gs:// request that gave up did so
    without an answer, and none has been answered since (`rundir.gcs_client`); False before any
    gs:// request. A caller that may skip a request (a lease's removal after a failure) asks it
    rather than waiting out the store once more."""
    client = sys.modules.get("rundir.gcs_client")  # not imported: no gs:// request was made
    return client is not None and client.REACHABILITY.down()
