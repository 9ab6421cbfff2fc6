"""Which rows of a global batch a host holds, and how a host takes them.

Every input path of the trainer (the seqio stream of `"global"` sharding, prepared data read by
index, eval batches) builds or reads the global batch and keeps one host's rows of it, so the
batches do not depend on the host count; the row ranges and the slicing live here, apart from
any data source, so each path (`trainer.seqio_data`, `trainer.prepared_data`, `trainer.data`)
shares them without importing the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def even_rows(*, batch_size: int, shard_index: int, num_shards: int) -> tuple[tuple[int, int], ...]:
    """Rows `[i*B/n, (i+1)*B/n)` of a global batch of `B` for host `i` of `n`: a host's rows when
    its devices hold one contiguous block of the batch, in process order."""
    per_host = batch_size // num_shards
    return ((shard_index * per_host, (shard_index + 1) * per_host),)


def take_rows(
    batch: Mapping[str, np.ndarray], rows: Sequence[tuple[int, int]]
) -> dict[str, np.ndarray]:
    """The rows `[start, stop)` of each range in `rows` of every array, concatenated in order
    (how `jax.make_array_from_process_local_data` reads a host's share)."""
    if len(rows) == 1:
        (start, stop), *_ = rows
        return {key: value[start:stop] for key, value in batch.items()}
    return {
        key: np.concatenate([value[start:stop] for start, stop in rows])
        for key, value in batch.items()
    }
