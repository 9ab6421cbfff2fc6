"""The checks a job's plan (`trainer.jobs.plan_job`) runs before anything is compiled: batch and
feature shapes against the model and the mesh, and the training, evaluation and decoding tasks
against the registered ones (each check is `trainer.validation`'s)."""

from __future__ import annotations

import jax

from trainer import data as data_lib
from trainer import model_spec, validation
from trainer.data import DataConfig


def check_shapes(
    *, spec: model_spec.ModelSpec, model, data: DataConfig, partitioner, microbatches: int
) -> None:
    """The checks of batch and feature shapes against the model and the mesh (see
    `trainer.validation`); they need no registered task."""
    validation.check_batch_size(
        batch_size=data.batch_size,
        data_parallel_size=partitioner.data_parallel_size,
        num_microbatches=microbatches,
        process_count=jax.process_count(),
    )
    validation.check_feature_lengths(
        feature_lengths=data.task_feature_lengths,
        max_len=model.max_len,
        required=model.feature_keys,
        model=spec.size,
    )
    validation.check_model_features(
        feature_lengths=data.task_feature_lengths,
        feature_keys=model.feature_keys,
        family=spec.family,
    )


def check_tasks(*, model, data: DataConfig, evaluation) -> None:
    """The checks of the training, evaluation and decoding tasks against the registered ones
    and of their vocabulary against the model's (see `trainer.validation`). A run on prepared
    data (`data.seqio_free`) registers no seqio task: its training tasks are checked when their
    prepared splits are opened (`data.prepared_datasets`), its eval tasks' prepared validation
    splits here, and only decoding tasks are registered through seqio."""
    if data_lib.seqio_free(data):
        _check_prepared_tasks(model=model, data=data, evaluation=evaluation)
        return
    names = data_lib.registered_names()
    validation.check_task(name=data.mixture_or_task, allowed=names)
    for task in evaluation.tasks:
        validation.check_task(name=task, allowed=names, binding="eval_tasks")
    decoding = getattr(evaluation, "decoding", None)
    validation.check_decoding(
        tasks=decoding.tasks if decoding is not None else (),
        allowed=names,
        feature_keys=model.feature_keys,
    )
    validation.check_vocab(
        vocab_size=data_lib.vocab_size(data.mixture_or_task),
        model_vocab_size=model.vocab_size,
        vocab_path=data.vocab_path,
    )


def _check_prepared_tasks(*, model, data: DataConfig, evaluation) -> None:
    """`check_tasks` of a run on prepared data: the eval tasks' prepared splits exist and
    verify, decoding tasks (read through seqio) are registered, and the vocabulary of
    `VOCAB_PATH` fits the model."""
    data_lib.check_prepared_eval(data, evaluation)
    decoding = getattr(evaluation, "decoding", None)
    if decoding is not None and decoding.tasks:
        data_lib.register_seqio(data)  # decoding reads its held-out split through seqio
        validation.check_decoding(
            tasks=decoding.tasks,
            allowed=data_lib.registered_names(),
            feature_keys=model.feature_keys,
        )
    validation.check_vocab(
        vocab_size=data_lib.vocab_size(data.mixture_or_task, data),
        model_vocab_size=model.vocab_size,
        vocab_path=data.vocab_path,
    )
