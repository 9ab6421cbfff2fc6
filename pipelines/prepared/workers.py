"""The worker processes of a preparation and its progress lines.

Shards are prepared by spawned processes (TensorFlow does not survive a fork), each registering
the task itself; a worker reports each shard's running counts through a queue, and the parent
logs a line per finished shard and a rate line every `LOG_EVERY_S`. The first failure stops the
pool at once, so a bad input file is one line within seconds, not after every other shard.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue as queue_lib
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

from rundir import durations

LOG_EVERY_S = 30.0  # seconds between progress lines

_WORKER: dict[str, Any] = {}


def _init(registration, reports) -> None:
    """Runs once in each spawned worker: registers the tasks, keeps the progress queue."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    registration.register()
    _WORKER["reports"] = reports


def report(index: int, documents: int, tokens: int) -> None:
    """In a worker: shard `index` has `documents` documents and `tokens` tokens so far."""
    _WORKER["reports"].put((index, documents, tokens))


class Progress:
    """Documents and tokens per shard, a line per finished shard, and a periodic rate line."""

    def __init__(self, *, shards: int, expected_docs: float | None, log: Callable[[str], None]):
        self.shards, self.expected, self.log = shards, expected_docs, log
        self.docs: dict[int, int] = {}
        self.tokens: dict[int, int] = {}
        self.done = 0
        self.start = self.last = time.monotonic()

    def update(self, index: int, docs: int, tokens: int) -> None:
        """Records shard `index`'s cumulative counts; logs when `LOG_EVERY_S` has passed."""
        self.docs[index], self.tokens[index] = docs, tokens
        if time.monotonic() - self.last >= LOG_EVERY_S:
            self.log(self.line())

    def finished(self, index: int, docs: int, tokens: int) -> None:
        """Logs shard `index` as finished."""
        self.docs[index], self.tokens[index] = docs, tokens
        self.done += 1
        self.log(
            f"shard {index} done ({self.done}/{self.shards} of this run): {docs:,} documents, "
            f"{tokens:,} tokens; {self.line()}"
        )

    def line(self) -> str:
        """`N documents, D docs/s, T tokens/s, ETA ...` over this run so far."""
        self.last = time.monotonic()
        elapsed = max(self.last - self.start, 1e-9)
        docs, tokens = sum(self.docs.values()), sum(self.tokens.values())
        rate = docs / elapsed
        if self.done == self.shards:
            eta = 0.0
        elif self.expected and rate > 0:
            eta = max(0.0, self.expected - docs) / rate
        else:
            eta = math.nan
        return (
            f"{docs:,} documents | {rate:,.0f} docs/s | {tokens / elapsed:,.0f} tokens/s | "
            f"ETA {durations.format_duration(eta)}"
        )


def run(
    shard: Callable[[Any, int], tuple[int, int, int]],
    plan: Any,
    todo: list[int],
    *,
    workers: int,
    registration: Any,
    progress: Progress,
) -> None:
    """Runs `shard(plan, k)` for each `k` of `todo` on `workers` spawned processes, relaying
    their progress to `progress`; `shard` returns (k, documents, tokens) and reports through
    `report`, and `registration.register()` runs once in each process first.

    The first failure stops the pool at once (`_stop`): shards not started are cancelled and
    those running are ended (the caller removes what they left half-written), so a bad input
    file is reported in seconds, not after every other shard has been prepared."""
    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    pool = futures.ProcessPoolExecutor(
        min(workers, len(todo)),
        mp_context=context,
        initializer=_init,
        initargs=(registration, reports),
    )
    try:
        pending = {pool.submit(shard, plan, k) for k in todo}
        while pending:
            done, pending = futures.wait(pending, timeout=1.0, return_when=futures.FIRST_EXCEPTION)
            _drain(reports, progress)
            for future in done:
                index, docs, tokens = future.result()
                progress.finished(index, docs, tokens)
    except BaseException:
        _stop(pool)
        raise
    else:
        pool.shutdown()
    finally:
        reports.close()


def _stop(pool: futures.ProcessPoolExecutor) -> None:
    """Cancels the shards not started and ends the worker processes still preparing one.

    Before Python 3.14 (`terminate_workers`) the executor has no public way to end running
    work, so its own process table is read."""
    terminate = getattr(pool, "terminate_workers", None)
    if callable(terminate):
        terminate()
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join()


def _drain(reports, progress: Progress) -> None:
    while True:
        try:
            index, docs, tokens = reports.get_nowait()
        except queue_lib.Empty:
            return
        progress.update(index, docs, tokens)
