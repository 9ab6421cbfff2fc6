"""What a run's tasks are: its vocabulary, its vocabulary size and its mixture's components.

A run either registers seqio tasks (the seqio path, and decoding tasks of any run) or reads
prepared data without seqio (`seqio_free`: `PREPARED_DATA` with `VOCAB_PATH`). The questions both
paths and the job checks ask of the run's data -- is `VOCAB_PATH` there and usable, how large is
the vocabulary, which tasks make up the mixture -- are answered here, from the seqio registry or,
on prepared data, from the vocabulary file (SentencePiece alone, `pipelines.vocab.vocab_info`)
and `pipelines.mixture_tables`. seqio is imported only inside the functions that ask its
registry, so a run on prepared data never imports it (`tests/test_prepared_without_tensorflow.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines import mixture_tables
from pipelines import vocab as vocab_lib
from rundir import storage
from trainer import validation

if TYPE_CHECKING:
    from trainer.data import DataConfig


def seqio_free(config: DataConfig) -> bool:
    """Whether the run reads its data without seqio: prepared data (`PREPARED_DATA`) and a
    vocabulary file (`VOCAB_PATH`) to read ids from (without one, the caller registered seqio
    tasks and the run reads their vocabulary)."""
    return config.prepared_dir is not None and config.vocab_path is not None


def check_vocab_file(config: DataConfig) -> None:
    """ConfigError naming `VOCAB_PATH` when the file does not exist."""
    # Through the project's storage layer (local paths and gs:// alike): TensorFlow's own GCS
    # client would bypass it (and, pointed at an emulator, reach for www.googleapis.com).
    if not storage.as_path(config.vocab_path, name="VOCAB_PATH").exists():
        raise validation.ConfigError(
            f"{validation.BINDINGS['vocab_path']} = {config.vocab_path!r}: no such file; "
            "allowed: a SentencePiece .model file (pipelines.vocab builds one)"
        )


def vocab_file_error(config: DataConfig, error: Exception) -> validation.ConfigError:
    """The ConfigError for a `VOCAB_PATH` file that holds no usable vocabulary (`error`: what
    `pipelines.vocab` found), naming the binding and the file."""
    return validation.ConfigError(
        f"{validation.BINDINGS['vocab_path']} = {config.vocab_path!r}: {error}; "
        "allowed: a SentencePiece .model file (pipelines.vocab builds one)"
    )


def prepared_vocabulary(config: DataConfig) -> vocab_lib.VocabInfo:
    """The run's vocabulary as a run on prepared data needs it (ids, size with `extra_ids`,
    sha256), read from `VOCAB_PATH` with SentencePiece alone (no seqio, no TensorFlow).

    Raises:
      trainer.validation.ConfigError: as `trainer.data.register` (naming `VOCAB_PATH` and the
        file).
    """
    check_vocab_file(config)
    try:
        return vocab_lib.vocab_info(config.vocab_path, extra_ids=config.extra_ids)
    except vocab_lib.VocabularyFileError as e:
        raise vocab_file_error(config, e) from e


def registered_names() -> list[str]:
    """All registered seqio task and mixture names."""
    import seqio

    return sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))


def vocab_size(name: str, config: DataConfig | None = None) -> int:
    """Vocabulary size (extra ids included) of a task's or mixture's `targets` feature: of the
    registered seqio task, or of `VOCAB_PATH` for a run on prepared data (`seqio_free`)."""
    if config is not None and seqio_free(config):
        return prepared_vocabulary(config).vocab_size
    import seqio

    provider = seqio.get_mixture_or_task(name)
    return int(provider.output_features["targets"].vocabulary.vocab_size)


def components(name: str, config: DataConfig | None = None) -> list[str]:
    """Mixture components (a task gives `[task]`), in the order of `decoder_task_ids`: from the
    seqio registry, or from `pipelines.mixture_tables` for a run on prepared data."""
    if config is not None and seqio_free(config):
        return mixture_tables.components(name)
    from pipelines import mixtures

    return list(mixtures.component_names(name))
