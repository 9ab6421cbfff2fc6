"""What a run-directory operation costs on local disk and on a GCS API server, measured in one run.

Times `rundir.storage`'s primitives as the trainer uses them — appending one `metrics.jsonl`
record (GCS: upload a part, compose, delete), writing `run.json` atomically, the lease's
create-if-absent and compare-and-swap heartbeat, reading a file back — `--ops` times each, on a
local temporary directory and on a bucket of fake-gcs-server started on 127.0.0.1 (the server
the tests use), and prints the median and 90th-percentile milliseconds and the ratio. Against
real GCS the absolute numbers differ (network round trips of 20-100 ms); the request counts per
operation are the same.

    .venv/bin/python benchmarks/storage_ops.py [--ops 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.fspath(REPO / "tests"))  # the tests' server helper


def _time(fn, ops: int) -> list[float]:
    out = []
    for i in range(ops):
        start = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - start) * 1e3)
    return out


def measure(root: str, ops: int) -> dict[str, list[float]]:
    """Milliseconds per call of each operation under the run directory `root`."""
    from rundir import storage

    run = storage.as_path(root) / "run"
    record = json.dumps({"step": 0, "tokens": 123456, "train/loss": 2.5}) + "\n"
    lease = run / "LEASE"
    storage.create_exclusive(lease, "holder\n")
    state = {"version": storage.read_versioned(lease)[1]}

    def heartbeat(i):
        storage.replace_if(lease, f"beat {i}\n", state["version"])
        state["version"] = storage.read_versioned(lease)[1]

    return {
        "append a metrics record": _time(
            lambda i: storage.append_text(run / "metrics.jsonl", record), ops
        ),
        "write run.json atomically": _time(
            lambda i: storage.write_text_atomic(run / "run.json", record * 40), ops
        ),
        "create-if-absent (lease)": _time(
            lambda i: storage.create_exclusive(run / f"LEASE.{i}", "holder\n"), ops
        ),
        "lease heartbeat (read + CAS)": _time(heartbeat, ops),
        "read a file": _time(lambda i: storage.read_text(run / "run.json"), ops),
    }


def main() -> int:
    """Starts the server, measures both stores, prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=50, help="calls of each operation")
    args = parser.parse_args()
    from gcs_server import GcsServer

    scratch = Path(tempfile.mkdtemp(prefix="xlscale-storage-bench-"))
    server = GcsServer(scratch / "server")
    server.start()
    try:
        os.environ.update(server.env())
        bucket = server.create_bucket("bench")
        local = measure(os.fspath(scratch / "local"), args.ops)
        remote = measure(bucket, args.ops)
    finally:
        server.stop()
    print(f"rundir.storage, {args.ops} calls each: median (p90) ms; local disk vs fake-gcs-server")
    print(f"{'operation':<30} {'local':>16} {'gs:// (127.0.0.1)':>20} {'ratio':>8}")
    for name in local:
        lo, gs = local[name], remote[name]
        p90 = lambda v: statistics.quantiles(v, n=10)[-1]  # noqa: E731
        print(
            f"{name:<30} {statistics.median(lo):8.2f} ({p90(lo):5.2f}) "
            f"{statistics.median(gs):11.2f} ({p90(gs):6.2f}) "
            f"{statistics.median(gs) / statistics.median(lo):8.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
