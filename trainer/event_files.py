"""TensorBoard event files without TensorFlow: scalars written as `tf.summary.scalar` writes them.

clu's `SummaryWriter` (the trainer's writer when TensorFlow is loaded anyway, for seqio input)
imports TensorFlow; a run on prepared data never needs it otherwise (~6 s and ~0.8 GB of a tiny
process), and accelerator images ship JAX without it. `ScalarWriter` writes the same events with
TensorBoard's own pure-Python event-file writer and protos: each scalar a rank-0 float32 tensor
under the `scalars` plugin, so TensorBoard, `fitting.readers.event_files` and anything else that
reads clu's files read these alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class ScalarWriter:
    """clu's `write_scalars` / `flush` / `close`, over `tensorboard`'s `EventFileWriter`.

    Raises:
      ImportError: the `tensorboard` package is not installed.
    """

    def __init__(self, logdir: str | os.PathLike):
        _use_tensorboard_stub()
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        self._writer = EventFileWriter(os.fspath(logdir))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """One event at `step` holding every scalar of `scalars`."""
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

        summary = self._summary_pb2
        metadata = summary.SummaryMetadata(
            plugin_data=summary.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        values = [
            summary.Summary.Value(
                tag=tag,
                metadata=metadata,
                tensor=tensor_pb2.TensorProto(
                    dtype=types_pb2.DT_FLOAT,
                    tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                    float_val=[float(value)],
                ),
            )
            for tag, value in scalars.items()
        ]
        event = self._event_pb2.Event(step=int(step), summary=summary.Summary(value=values))
        self._writer.add_event(event)

    def flush(self) -> None:
        """Writes what is buffered to the events file."""
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the events file."""
        self._writer.close()


# TensorBoard's marker module for its no-TensorFlow build (`//tensorboard/compat:no_tensorflow`).
NO_TENSORFLOW_MARKER = "tensorboard.compat.notf"


def _use_tensorboard_stub() -> None:
    """Makes TensorBoard's writer take its pure-Python TF stub, unless TensorFlow is loaded.

    `EventFileWriter` resolves its file API through `tensorboard.compat.tf` on first use, and
    that imports TensorFlow whenever TensorFlow is installed (~6 s of CPU and ~0.8 GB in a tiny
    trainer process, which on prepared data imports nothing else of it). Where the marker module
    of TensorBoard's no-TensorFlow build exists, it takes its stub instead, whose local file
    system is all this writer needs (a run on object storage writes its event files locally and
    copies them, `trainer.metrics_log`). Where TensorFlow is already loaded (the seqio path),
    TensorBoard uses it, as before.
    """
    import sys
    import types

    if "tensorflow" not in sys.modules:
        sys.modules.setdefault(NO_TENSORFLOW_MARKER, types.ModuleType(NO_TENSORFLOW_MARKER))


def scalar_writer(logdir: str | os.PathLike):
    """The events writer for `logdir`: clu's when TensorFlow is already loaded (the seqio input
    path), else `ScalarWriter`, which imports no TensorFlow.

    Raises:
      ImportError: neither writer's package is installed.
    """
    import sys

    if "tensorflow" in sys.modules:
        from clu.metric_writers.summary_writer import SummaryWriter

        return SummaryWriter(os.fspath(logdir))
    return ScalarWriter(logdir)
