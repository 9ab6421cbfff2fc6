"""Training streams read again in one process (the runs of a sweep in one worker process):
replayed from the batches read before, then continued by a pipeline of their own, batch for batch
the stream built afresh (`trainer.seqio_data._PREFIXES`)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tiny_runs import tiny_kwargs

from trainer import data, seqio_data


def _read(config, n, *, start=0):
    stream = data.train_batches(config, seed=0, start_step=start, shard_index=0, num_shards=1)
    return list(itertools.islice(stream, n))


def _assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.slow
def test_a_stream_read_again_replays_its_batches_and_continues_past_them(tiny_data, seqio_registry):
    config = tiny_kwargs(tiny_data)["data"]
    data.register(config)
    seqio_data.clear_prefixes()
    first = _read(config, 2)
    again = _read(config, 4)  # 2 replayed, then a pipeline started after them
    seqio_data.clear_prefixes()
    fresh = _read(config, 4)
    _assert_same(first, fresh[:2])
    _assert_same(again, fresh)
    # A resumed stream (another start step) is its own: the same batches as the whole stream's.
    _assert_same(_read(config, 2, start=2), fresh[2:])
    # A replayed batch is handed over as a fresh one is (read-only where the pipeline's arrays
    # are), and is its own: no two runs share its memory, nor with the memo.
    replayed = _read(config, 1)[0]
    for key, value in replayed.items():
        assert value.flags.writeable == fresh[0][key].flags.writeable, key
        assert not np.shares_memory(value, again[0][key]), key
    seqio_data.clear_prefixes()
