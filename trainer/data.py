"""The trainer's view of the data: registering seqio tasks, and per-host train and eval batches.

Everything about corpora, vocabularies and mixtures lives in `pipelines`; this module only wires
it to a run: it registers the tasks and mixtures a run names (from `VOCAB_PATH` and `DATA_DIR`),
opens the training stream at the checkpointed position and keeps this host's rows of it (by
default every host builds the global stream, so the batches do not depend on the host count;
`DataConfig.host_sharding`), or reads them by index from prepared data after checking it, and
produces fixed-shape eval batches. The batches hold the model features `pipelines.features`
declares; the name helpers gin files compute with are `trainer.recipes`.

seqio, TensorFlow and the `pipelines` modules that import them are imported inside the functions
that need them: the trainer's jobs import this module in processes that never read seqio data
(`tests/test_import_hygiene.py`). A run on prepared data (`PREPARED_DATA` with `VOCAB_PATH`)
imports neither: its vocabulary is read with SentencePiece (`pipelines.vocab.vocab_info`), its
mixture from `pipelines.mixture_tables`, and its train and eval batches from prepared splits
(`pipelines.prepared`); only decoding tasks (`trainer.downstream`) still register seqio tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pipelines import features, mixture_tables
from pipelines import vocab as vocab_lib
from pipelines.corpora import paths
from pipelines.prepared import batches, shards
from pipelines.prepared import manifest as manifest_lib
from rundir import storage
from trainer import eval_schedule, validation


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Training data of a run.

    Attributes:
      mixture_or_task: a seqio task or mixture name (`MIXTURE_OR_TASK_NAME`).
      task_feature_lengths: `{"targets": L}` for decoder-only models, `{"inputs": Li,
        "targets": Lt}` for encoder-decoders (`TASK_FEATURE_LENGTHS`).
      batch_size: global batch in sequences (`BATCH_SIZE`); each host reads its share.
      vocab_path: SentencePiece model to register the tasks with (`VOCAB_PATH`); None: the tasks
        are registered already (by the caller).
      corpora_dir: the `corpora/` directory (`DATA_DIR`); None: `$XLSCALE_DATA/corpora`.
      source: a key of `pipelines.tasks.SOURCES`: `local` corpora, `tfds` (mC4/WMT), or the
        papers' corpora as Hugging Face files, `hf` (mC4 + WMT) and `hf_cpt` (RedPajama, SkyPile +
        WuDao, mC4; `pipelines.corpora.hf_sources`).
      langs: languages to register (None: all present).
      pairs: language pairs to register translation tasks for (None: all present).
      extra_ids: sentinel ids appended to the vocabulary (span corruption needs 100).
      pack: pack several documents per row.
      shuffle: shuffle the training stream (seeded).
      subset_tokens: train on a fixed sample of about this many target tokens of the task,
        repeated (a finetuning set of Df target tokens, `FINETUNE_TOKENS` with `FINETUNE_UNIT =
        'target'`); None: the whole split (or `subset_examples`).
      subset_examples: train on a fixed sample of exactly this many examples of the task,
        repeated (the MT paper's finetuning set of Df / 512 pairs, `FINETUNE_TOKENS` with
        `FINETUNE_UNIT = 'paper'`); None: the whole split (or `subset_tokens`).
      host_sharding: how hosts split the input (`HOST_SHARDING`, a key of `HOST_SHARDINGS`):
        `"global"` builds the one global stream on every host and each host keeps its rows of
        every batch, so the global batches are those of one host whatever the host count;
        `"per_host"` packs a separate seqio shard on each host (the input pipeline costs 1/n
        per host, for input-bound scale), whose batches differ from one host's.
      prepared_dir: a directory of prepared tasks (`PREPARED_DATA`; `xlscale data prepare`
        writes `<dir>/<task>/`, and `<dir>/<task>@validation/` for `--split validation`):
        training batches are read by index from them (`pipelines.prepared.batches`), so resume
        at any step costs what step 0 costs and each host reads only its rows, whatever
        `host_sharding` says, and eval batches from the prepared validation splits
        (`pipelines.prepared.eval_batches`, the batches of the seqio path); None: the seqio
        pipeline.
    """

    mixture_or_task: str = ""
    task_feature_lengths: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"targets": 2048}
    )
    batch_size: int = 512
    vocab_path: str | None = None
    corpora_dir: str | None = None
    source: str = "local"
    langs: Sequence[str] | None = None
    pairs: Sequence[str] | None = ()
    extra_ids: int = 0
    pack: bool = True
    shuffle: bool = True
    subset_tokens: int | None = None
    subset_examples: int | None = None
    host_sharding: str = "global"
    prepared_dir: str | None = None

    def __post_init__(self):
        if self.subset_tokens is not None and self.subset_examples is not None:
            raise validation.ConfigError(
                "data.DataConfig: set subset_tokens or subset_examples, not both (a finetuning "
                "set is sized in target tokens or in pairs; FINETUNE_UNIT picks one)"
            )
        validation.check_choice(
            name="HOST_SHARDING (data.DataConfig.host_sharding)",
            value=self.host_sharding,
            allowed=tuple(HOST_SHARDINGS),
        )
        # Prepared input always packs documents into rows and shuffles them per epoch: a run asking
        # otherwise would record settings its batches do not follow.
        unpassable = [f"{k}=False" for k in ("pack", "shuffle") if not getattr(self, k)]
        if self.prepared_dir is not None and unpassable:
            raise validation.ConfigError(
                f"data.DataConfig {', '.join(unpassable)} with PREPARED_DATA = "
                f"{self.prepared_dir!r}: prepared input reads packed rows of epoch-shuffled "
                "documents by index; allowed: pack=True, shuffle=True, or PREPARED_DATA = None "
                "(the seqio pipeline)"
            )

    @property
    def seq_len(self) -> int:
        """Length of a decoder row (the `targets` feature length)."""
        return int(self.task_feature_lengths["targets"])

    @property
    def has_inputs(self) -> bool:
        """Whether the run reads inputs/targets tasks (an encoder-decoder)."""
        return "inputs" in self.task_feature_lengths


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Periodic evaluation: token-weighted cross-entropy on each task's validation split.

    Attributes:
      tasks: task names (`EVAL_TASKS`); CPT runs list the target and the source language.
      period: evaluate every `period` steps and at the last step (`EVAL_PERIOD`); 0 = only at
        the end.
      max_tokens: evaluate on (up to) this many target tokens per task; the CPT paper holds out
        1M tokens per language.
      batch_size: eval batch in sequences (None: the training batch size).
      split: the split to evaluate on.
      at_start: also evaluate the initial parameters (step 0, before the first update;
        `EVAL_AT_START`): the CPT transfer starting point, the source model on the target.
      schedule: `EVAL_SCHEDULE`, a name of `trainer.eval_schedule.SCHEDULES`: 'periodic' (every
        `period` steps) or 'log' (those plus `log_points` steps log-spaced from `log_start` of
        the run to its end: dense early, where the papers' early effects are).
      log_points: `EVAL_LOG_POINTS`, the log-spaced steps of the 'log' schedule.
      log_start: `EVAL_LOG_START`, the first log-spaced step as a fraction of the run's steps.
      decoding: downstream scores by decoding (a `trainer.downstream.DecodeConfig`: BLEU,
        chrF++, ROUGE-L, COMET on a held-out split; encoder-decoders), or None.
    """

    tasks: Sequence[str] = ()
    period: int = 1000
    max_tokens: int = 1_000_000
    batch_size: int | None = None
    split: str = "validation"
    at_start: bool = False
    decoding: Any = None
    schedule: str = "periodic"
    log_points: int = 20
    log_start: float = 0.001

    def __post_init__(self):
        if self.schedule not in eval_schedule.SCHEDULES:
            raise ValueError(
                f"EVAL_SCHEDULE = {self.schedule!r} (data.EvalConfig.schedule); allowed: "
                f"{', '.join(map(repr, eval_schedule.SCHEDULES))}"
            )
        if self.log_points < 1 or not 0 < self.log_start <= 1:
            raise ValueError(
                f"EVAL_LOG_POINTS = {self.log_points}, EVAL_LOG_START = {self.log_start}: allowed "
                "a positive count and a fraction of the run in (0, 1]"
            )

    @property
    def enabled(self) -> bool:
        """Whether anything is evaluated at all (cross-entropy or decoding)."""
        return bool(self.tasks) or bool(self.decoding is not None and self.decoding.tasks)


def seqio_free(config: DataConfig) -> bool:
    """Whether the run reads its data without seqio: prepared data (`PREPARED_DATA`) and a
    vocabulary file (`VOCAB_PATH`) to read ids from (without one, the caller registered seqio
    tasks and the run reads their vocabulary)."""
    return config.prepared_dir is not None and config.vocab_path is not None


def register(config: DataConfig) -> Any:
    """Registers the tasks and mixtures of `config.vocab_path`; returns the vocabulary (or None
    when `vocab_path` is None and the caller registered the tasks). A run on prepared data
    (`seqio_free`) registers nothing: it returns the vocabulary's `pipelines.vocab.VocabInfo`
    (read with SentencePiece), after the same checks of `VOCAB_PATH`.

    Raises:
      trainer.validation.ConfigError: `vocab_path` does not exist or holds no usable vocabulary
        (naming `VOCAB_PATH` and the file), or the corpora directory has no training data for
        `mixture_or_task` (naming `DATA_DIR` and the directory).
    """
    if config.vocab_path is None:
        return None
    if seqio_free(config):
        return prepared_vocabulary(config)
    return register_seqio(config)


def _check_vocab_file(config: DataConfig) -> None:
    """ConfigError naming `VOCAB_PATH` when the file does not exist."""
    # Through the project's storage layer (local paths and gs:// alike): TensorFlow's own GCS
    # client would bypass it (and, pointed at an emulator, reach for www.googleapis.com).
    if not storage.as_path(config.vocab_path, name="VOCAB_PATH").exists():
        raise validation.ConfigError(
            f"{validation.BINDINGS['vocab_path']} = {config.vocab_path!r}: no such file; "
            "allowed: a SentencePiece .model file (pipelines.vocab builds one)"
        )


def prepared_vocabulary(config: DataConfig) -> vocab_lib.VocabInfo:
    """The run's vocabulary as a run on prepared data needs it (ids, size with `extra_ids`,
    sha256), read from `VOCAB_PATH` with SentencePiece alone (no seqio, no TensorFlow).

    Raises:
      trainer.validation.ConfigError: as `register` (naming `VOCAB_PATH` and the file).
    """
    _check_vocab_file(config)
    try:
        return vocab_lib.vocab_info(config.vocab_path, extra_ids=config.extra_ids)
    except vocab_lib.VocabularyFileError as e:
        raise validation.ConfigError(
            f"{validation.BINDINGS['vocab_path']} = {config.vocab_path!r}: {e}; "
            "allowed: a SentencePiece .model file (pipelines.vocab builds one)"
        ) from e


def register_seqio(config: DataConfig) -> Any:
    """`register` through seqio: registers the tasks and mixtures of `config.vocab_path` (the
    seqio path, and decoding tasks of any run); returns the seqio vocabulary."""
    from pipelines import mixtures, tasks

    _check_vocab_file(config)
    try:
        vocabulary = vocab_lib.load_vocab(config.vocab_path, extra_ids=config.extra_ids)
    except vocab_lib.VocabularyFileError as e:
        raise validation.ConfigError(
            f"{validation.BINDINGS['vocab_path']} = {config.vocab_path!r}: {e}; "
            "allowed: a SentencePiece .model file (pipelines.vocab builds one)"
        ) from e
    try:
        registered = tasks.register_tasks(
            vocabulary=vocabulary,
            corpora_dir=config.corpora_dir,
            langs=config.langs,
            pairs=config.pairs,
            source=config.source,
        )
    except FileNotFoundError as e:
        raise validation.ConfigError(
            f"{validation.BINDINGS['corpora_dir']} = {config.corpora_dir!r}: {e}; allowed: a "
            "corpora/ directory with that language's text (xlscale data build | fixture)"
        ) from e
    mixtures.register_mixtures()
    if config.source == "local":
        _check_corpora(config, registered=registered)
    return vocabulary


def _check_corpora(config: DataConfig, *, registered: Sequence[str]) -> None:
    """The training mixture's tasks must have found their text under the corpora directory; a
    missing or empty `DATA_DIR` otherwise surfaces as an unregistered task with nothing allowed."""
    name = config.mixture_or_task
    wanted = list(mixture_tables.RATIOS.get(name, {name: 1.0}))
    missing = [t for t in wanted if t.split("_", 1)[0] in _CORPUS_TASKS and t not in registered]
    if not missing:
        return
    root = paths.corpora_dir() if config.corpora_dir is None else config.corpora_dir
    where = "" if os.path.isdir(root) else " (no such directory)"
    default = " (DATA_DIR unset: $XLSCALE_DATA/corpora)" if config.corpora_dir is None else ""
    raise validation.ConfigError(
        f"{validation.BINDINGS['mixture_or_task']} = {name!r} needs {', '.join(missing)}, which "
        f"found no training text under {validation.BINDINGS['corpora_dir']} = "
        f"{os.fspath(root)!r}{where}{default}; allowed: a corpora/ directory holding them "
        f"(xlscale data build | fixture); found there: {', '.join(sorted(registered)) or 'nothing'}"
    )


# Task kinds whose text comes from the corpora directory (`pipelines.tasks`).
_CORPUS_TASKS = ("lm", "span", "mt")


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


def _global_stream(config, *, seed, start_step, shard_index, num_shards, host_rows):
    """Every host builds the one-host stream and keeps its rows of each global batch."""
    rows = host_rows or even_rows(
        batch_size=config.batch_size, shard_index=shard_index, num_shards=num_shards
    )
    for batch in _packed_stream(config, seed=seed, start_step=start_step, shard=(0, 1)):
        yield take_rows(batch, rows)


def _per_host_stream(config, *, seed, start_step, shard_index, num_shards, host_rows):
    """Each host packs its own seqio shard into batches of `batch_size / num_shards` rows."""
    del host_rows
    yield from _packed_stream(
        config, seed=seed, start_step=start_step, shard=(shard_index, num_shards)
    )


# How hosts split the training input (`DataConfig.host_sharding`).
HOST_SHARDINGS = {"global": _global_stream, "per_host": _per_host_stream}


def _packed_stream(config, *, seed, start_step, shard):
    from pipelines import streams

    shard_index, num_shards = shard
    make = streams.encdec_batches if config.has_inputs else streams.decoder_batches
    stream = make(
        mixture_or_task=config.mixture_or_task,
        split="train",
        sequence_length=dict(config.task_feature_lengths) if config.has_inputs else config.seq_len,
        batch_size=config.batch_size // num_shards,
        seed=seed,
        shard_index=shard_index,
        num_shards=num_shards,
        start_step=start_step,
        shuffle=config.shuffle,
        repeat=True,
        pack=config.pack,
        subset_tokens=config.subset_tokens,
        subset_examples=config.subset_examples,
    )
    for batch in stream:
        yield features.model_arrays(batch)


def _prepare_command(config: DataConfig, task: str, split: str = "train") -> str:
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
    for name in components(config.mixture_or_task, config):
        directory = os.fspath(root / name)
        try:
            dataset = shards.PreparedDataset.open(directory, vocab_hash=vocab_hash)
        except shards.PreparedDataError as e:
            raise validation.ConfigError(
                f"{where}: {e}; prepare it with: {_prepare_command(config, name)}"
            ) from e
        found = (dataset.manifest.task, dataset.manifest.split)
        if found != (name, "train"):
            dataset.close()
            raise validation.ConfigError(
                f"{where}: {directory} holds task {found[0]!r} split {found[1]!r}; training "
                f"reads task {name!r} split 'train'; prepare it with: "
                f"{_prepare_command(config, name)}"
            )
        try:  # sidecars and shard checksums: what a reader would find only mid-training
            dataset.verify()
        except shards.PreparedDataError as e:
            dataset.close()
            raise validation.ConfigError(
                f"{where}: {e}; prepare it again with: {_prepare_command(config, name)}"
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


def _prepared_stream(config, *, seed, start_step, host_rows, datasets, vocabulary):
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


def train_batches(
    config: DataConfig,
    *,
    seed: int,
    start_step: int,
    shard_index: int,
    num_shards: int,
    host_rows: Sequence[tuple[int, int]] | None = None,
    prepared: Mapping[str, Any] | None = None,
    vocabulary: Any = None,
) -> Iterator[dict[str, np.ndarray]]:
    """This host's rows of each global batch, starting after `start_step` batches (encoder-
    decoder batches when the feature lengths have `inputs`), split as `config.host_sharding`
    says, or read by index from `prepared` datasets.

    Args:
      shard_index, num_shards: this host (`jax.process_index()`) of how many.
      host_rows: the `[start, stop)` row ranges of the global batch that this host's devices
        hold (`Partitioner.host_rows`), for `"global"` sharding and prepared input; None:
        `even_rows`.
      prepared: `prepared_datasets(config, ...)` when `config.prepared_dir` is set.
      vocabulary: the run's vocabulary (`register`), for prepared input (start, EOS and
        sentinel ids).
    """
    if config.prepared_dir is not None:
        rows = host_rows or even_rows(
            batch_size=config.batch_size, shard_index=shard_index, num_shards=num_shards
        )
        return _prepared_stream(
            config,
            seed=seed,
            start_step=start_step,
            host_rows=rows,
            datasets=prepared
            if prepared is not None
            else prepared_datasets(config, vocab_hash=None),
            vocabulary=vocabulary,
        )
    return HOST_SHARDINGS[config.host_sharding](
        config,
        seed=seed,
        start_step=start_step,
        shard_index=shard_index,
        num_shards=num_shards,
        host_rows=host_rows,
    )


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
    command = _prepare_command(config, task, split)
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


def _prepared_eval_batches(config, *, task, split, seq_len, batch_size, max_tokens):
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


def _seqio_eval_batches(*, task, split, seq_len, batch_size, max_tokens):
    from pipelines import streams

    return streams.eval_batches(
        task=task,
        split=split,
        sequence_length=seq_len,
        batch_size=batch_size,
        max_tokens=max_tokens,
    )


def eval_batches(
    *,
    task: str,
    split: str,
    seq_len: int | Mapping[str, int],
    batch_size: int,
    max_tokens: int,
    shard_index: int,
    num_shards: int,
    host_rows: Sequence[tuple[int, int]] | None = None,
    config: DataConfig | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Fixed-shape eval batches of `task` (this host's rows); the last one is padded with rows of
    zero weight, so every batch compiles to the same program. `seq_len` is the targets length,
    or the feature lengths `{"inputs": Li, "targets": Lt}` of an inputs/targets task.

    Every host reads the same global batches (whatever the host count) and keeps its rows
    (`host_rows`, as in `train_batches`), so the token-weighted loss summed over the global batch
    does not depend on the host count. A run on prepared data (`config`, `seqio_free`) reads
    the prepared split (`prepared_eval_dataset`), whose batches are those of the seqio path."""
    lengths = dict(seq_len) if isinstance(seq_len, Mapping) else seq_len
    read = (
        functools.partial(_prepared_eval_batches, config)
        if config is not None and seqio_free(config)
        else _seqio_eval_batches
    )
    for batch in read(
        task=task, split=split, seq_len=lengths, batch_size=batch_size, max_tokens=max_tokens
    ):
        batch = features.model_arrays(batch)
        rows = next(iter(batch.values())).shape[0]
        if rows < batch_size:
            batch = {
                k: np.concatenate([v, np.zeros((batch_size - rows,) + v.shape[1:], v.dtype)])
                for k, v in batch.items()
            }
        yield take_rows(
            batch,
            host_rows
            or even_rows(batch_size=batch_size, shard_index=shard_index, num_shards=num_shards),
        )
