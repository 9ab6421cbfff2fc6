"""Lease files written by hand: a holder record (`lease_holder`) and the lease file of a model
directory (`write_lease`), as another training job would leave them."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

from rundir import lease as lease_lib


def lease_holder(pid, *, host=None, heartbeat=None, started=None):
    now = time.time()
    return {
        "host": host or socket.gethostname(),
        "pid": pid,
        "pid_start": lease_lib._pid_start(pid)[0],
        "started": started or now - 3600,
        "heartbeat": heartbeat or now,
        "token": f"t{pid}",
    }


def write_lease(model_dir: Path, holder: dict) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    path = lease_lib.lease_path(model_dir)
    path.write_text(json.dumps(holder))
    return path
