"""The prepared-data path of a run: training and eval batches read by index from prepared tasks.

A run with `PREPARED_DATA` (`DataConfig.prepared_dir`) reads its training batches by index from
the prepared tasks `xlscale data prepare` writes (`pipelines.prepared`): each component of the
mixture is opened and verified (every sidecar and shard sha256, the vocabulary) while the run
plans, so damaged data is refused before anything is written; the fingerprint records what was
read (`prepared_input`); each host reads only its rows; eval batches come from the prepared
validation splits, the batches of the seqio path. Every refusal names `PREPARED_DATA` and the
command that prepares the data.

This module never imports seqio nor TensorFlow at import time: a run on prepared data with a
`VOCAB_PATH` (`trainer.task_lookup.seqio_free`) reads its vocabulary with SentencePiece and its
mixture from `pipelines.mixture_tables` (`tests/test_prepared_without_tensorflow.py`); only a
run whose caller registered seqio tasks asks their registry, inside the function.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipelines import features, mixture_tables
from pipelines import vocab as vocab_lib
from pipelines.prepared import batches, shards
from pipelines.prepared import manifest as manifest_lib
from rundir import storage
from trainer import task_lookup, validation
from trainer.task_lookup import prepared_vocabulary, seqio_free

if TYPE_CHECKING:
    from trainer.data import DataConfig, EvalConfig


def prepare_command(config: DataConfig, task: str, split: str = "train") -> str:
    """The `xlscale data prepare` command line that prepares `task`'s `split` for this run
    (a validation split in one shard: its documents keep the split's order)."""
    vocab = config.vocab_path or "<VOCAB_PATH>"
    split_flags = "" if split == "train" else f" --split {split} --shards 1"
    return (
        f"xlscale data prepare --task {task}{split_flags} --vocab {vocab} --data-dir <DATA_DIR> "
        f"--source {config.source} --out {config.prepared_dir}"
    )


def prepared_datasets(config: DataConfig, *, vocab_hash: str | None) -> dict[str, Any]:
    """The prepared dataset of every component of the training mixture (`prepared_dir/<task>`),
    opened and verified against the run's vocabulary before training starts: each must be that
    task's `train` split (a prepared validation split is not training data). A sample
    (`--max-documents`) is accepted and recorded in the fingerprint (`prepared_input`). Every
    sidecar and every shard's sha256 is checked here (`PreparedDataset.verify`: all bytes are
    read once, on threads), so that damaged data is refused while the run plans, before anything
    is written, not at the batch that reads it.

    Raises:
      trainer.validation.ConfigError: a component has no prepared task, another task or split,
        or a shard is missing, truncated, changed (sha256) or from another vocabulary, or a
        sidecar is missing, unreadable or another shard's (naming `PREPARED_DATA`, the file and
        what differs, and the command that prepares it).
    """
    out = {}
    root = storage.as_path(config.prepared_dir, name="PREPARED_DATA")
    where = f"PREPARED_DATA (data.DataConfig.prepared_dir) = {config.prepared_dir!r}"
    for name in task_lookup.components(config.mixture_or_task, config):
        directory = os.fspath(root / name)
        try:
            dataset = shards.PreparedDataset.open(directory, vocab_hash=vocab_hash)
        except shards.PreparedDataError as e:
            raise validation.ConfigError(
                f"{where}: {e}; prepare it with: {prepare_command(config, name)}"
            ) from e
        found = (dataset.manifest.task, dataset.manifest.split)
        if found != (name, "train"):
            dataset.close()
            raise validation.ConfigError(
                f"{where}: {directory} holds task {found[0]!r} split {found[1]!r}; training "
                f"reads task {name!r} split 'train'; prepare it with: "
                f"{prepare_command(config, name)}"
            )
        try:  # sidecars and shard checksums: what a reader would find only mid-training
            dataset.verify()
        except shards.PreparedDataError as e:
            dataset.close()
            raise validation.ConfigError(
                f"{where}: {e}; prepare it again with: {prepare_command(config, name)}"
            ) from e
        out[name] = dataset
    return out


def prepared_input(config: DataConfig, datasets: Mapping[str, Any]) -> dict[str, Any]:
    """What the run's fingerprint records of a prepared input: the directory and each
    component's content digest (`Manifest.content_digest`: every shard's sha256, the sample size), so
    that a resume reading other prepared data is refused like any other change of the data."""
    return {
        "dir": config.prepared_dir,
        "manifests": {name: ds.manifest.content_digest() for name, ds in datasets.items()},
    }


def prepared_stream(config, *, seed, start_step, host_rows, datasets, vocabulary):
    """This host's rows of each global batch, read by index from the prepared datasets; the
    settings are checked here, when the stream is made, not at its first batch.

    Raises:
      trainer.validation.ConfigError: the prepared data cannot make this run's batches (names
        PREPARED_DATA and why: lengths, Df subset, fractions, sentinels, ...).
    """
    if vocabulary is None and seqio_free(config):  # VOCAB_PATH, read without seqio
        vocabulary = prepared_vocabulary(config)
    if vocabulary is None:  # the caller registered the tasks: their targets vocabulary
        import seqio

        provider = seqio.get_mixture_or_task(config.mixture_or_task)
        vocabulary = provider.output_features["targets"].vocabulary
    if seqio_free(config):
        fractions = mixture_tables.fractions(config.mixture_or_task)
    else:
        from pipelines import mixtures

        fractions = mixtures.token_fractions(config.mixture_or_task)
    components = [
        batches.Component(name=name, dataset=ds, fraction=fractions.get(name, 1.0))
        for name, ds in datasets.items()
    ]
    try:
        stream = batches.batches(
            components=components,
            sequence_length=dict(config.task_feature_lengths)
            if config.has_inputs
            else config.seq_len,
            global_batch_size=config.batch_size,
            seed=seed,
            start_step=start_step,
            host_rows=tuple(host_rows),
            start_id=vocab_lib.start_id(vocabulary),
            eos_id=vocabulary.eos_id,
            vocab_size=vocabulary.vocab_size,
            extra_ids=int(getattr(vocabulary, "extra_ids", 0) or 0),
            subset_examples=config.subset_examples,
            subset_tokens=config.subset_tokens,
        )
    except ValueError as e:
        raise validation.ConfigError(
            f"PREPARED_DATA (data.DataConfig.prepared_dir) = {config.prepared_dir!r}: {e}"
        ) from e
    return map(features.model_arrays, stream)


def prepared_eval_dataset(config: DataConfig, task: str, split: str, *, vocab_hash: str | None):
    """The prepared `split` of eval task `task` (`PREPARED_DATA/<task>@<split>`), opened and
    verified (sidecars, every shard's sha256, the vocabulary) as training splits are: one shard
    (its documents in the split's order, as the seqio path reads them) of a kind the numpy eval
    reader makes (`pipelines.prepared.eval_batches.EVAL_KINDS`).

    Raises:
      trainer.validation.ConfigError: the split is not prepared, damaged, of another task,
        split or vocabulary, in several shards, or of a kind with no prepared eval (naming
        `PREPARED_DATA`, the directory and the command that prepares it).
    """
    from pipelines.prepared import eval_batches as eval_lib

    root = storage.as_path(config.prepared_dir, name="PREPARED_DATA")
    directory = os.fspath(root / manifest_lib.task_dir_name(task, split))
    where = f"PREPARED_DATA (data.DataConfig.prepared_dir) = {config.prepared_dir!r}"
    command = prepare_command(config, task, split)
    if not os.path.isdir(directory):
        raise validation.ConfigError(
            f"{where}: eval task {task!r} has no prepared {split} split: no directory "
            f"{directory}; a run on prepared data evaluates on prepared splits; prepare it "
            f"with: {command}"
        )
    try:
        dataset = shards.PreparedDataset.open(directory, vocab_hash=vocab_hash)
    except shards.PreparedDataError as e:
        raise validation.ConfigError(f"{where}: {e}; prepare it with: {command}") from e
    manifest = dataset.manifest
    problem = None
    if (manifest.task, manifest.split) != (task, split):
        problem = (
            f"{directory} holds task {manifest.task!r} split {manifest.split!r}; evaluation "
            f"reads task {task!r} split {split!r}"
        )
    elif len(manifest.shards) != 1:
        problem = (
            f"{directory} holds {len(manifest.shards)} shards; an eval split is read in the "
            "split's order, which one shard keeps"
        )
    elif manifest.postprocess not in eval_lib.EVAL_KINDS:
        problem = (
            f"{directory} is of kind {manifest.postprocess!r}, which has no prepared eval (its "
            f"masks are drawn by TensorFlow); allowed: tasks of kind "
            f"{', '.join(map(repr, eval_lib.EVAL_KINDS))}, or PREPARED_DATA = None"
        )
    if problem is not None:
        dataset.close()
        raise validation.ConfigError(f"{where}: {problem}; prepare it with: {command}")
    try:
        dataset.verify()
    except shards.PreparedDataError as e:
        dataset.close()
        raise validation.ConfigError(f"{where}: {e}; prepare it again with: {command}") from e
    return dataset


def check_prepared_eval(config: DataConfig, evaluation: EvalConfig) -> None:
    """Every eval task of a run on prepared data has its split prepared and intact
    (`prepared_eval_dataset`), checked while the run plans, not at its first evaluation.

    Raises:
      trainer.validation.ConfigError: as `prepared_eval_dataset`.
    """
    if not evaluation.tasks:
        return
    vocab_hash = prepared_vocabulary(config).sha256
    for task in evaluation.tasks:
        prepared_eval_dataset(config, task, evaluation.split, vocab_hash=vocab_hash).close()


def prepared_eval_batches(config, *, task, split, seq_len, batch_size, max_tokens):
    """`pipelines.prepared.eval_batches` of `task`'s prepared `split`, with the run's ids."""
    from pipelines.prepared import eval_batches as eval_lib

    vocabulary = prepared_vocabulary(config)
    with prepared_eval_dataset(config, task, split, vocab_hash=vocabulary.sha256) as dataset:
        return eval_lib.eval_batches(
            dataset,
            sequence_length=seq_len,
            batch_size=batch_size,
            max_tokens=max_tokens,
            eos_id=vocabulary.eos_id,
            start_id=vocabulary.start_id,
        )
