"""The preparation job: a registered seqio task's split tokenized once into ArrayRecord shards.

A task's preprocessors are split by `seqio.CacheDatasetPlaceholder`: what comes before it
(parsing, tokenization) is deterministic, and is what is prepared here, one record per document,
int32 ids exactly as `task.preprocess_precache` gives them (no EOS: the reader's post-cache part,
LM chunks, span corruption or pairs, adds it). Shard k is seqio's shard k of the split, in order
(`shard_dataset`), so a preparation is a function of the task, the split, the shard count and
the source's files (`pipelines.prepared.plan` holds its fingerprint).

Restartable and shardable across machines: each shard is written under a temporary name and
renamed when complete, then its sidecar (lengths, size, sha256, settings) is written atomically;
a rerun skips every shard whose sidecar and file agree and redoes the others, so a killed run
completes without duplicates; a directory prepared with other settings or from other data, or
into another shard count, is refused in one line. `shard_indices` lets several machines
prepare disjoint shards into one directory (mounted with gcsfuse at scale); whoever finds every
shard done writes `manifest.json` (`finalize` does it explicitly). Shards are prepared by
`workers` spawned processes, each registering the task itself (`Registration`;
`pipelines.prepared.workers`); an input that cannot be read is one line naming the shard and
the file, and stops the others.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from array_record.python import array_record_module

from pipelines.prepared import manifest as manifest_lib
from pipelines.prepared import plan as plan_lib
from pipelines.prepared import shards as shards_lib
from pipelines.prepared import workers as workers_lib
from pipelines.prepared.manifest import Manifest, PreparedDataError, ShardEntry

REPORT_EVERY_DOCS = 2_000  # a worker reports its progress at least this often (documents)

# The postcache preprocessors of a task (names, in order) -> what the reader applies after the
# prepared tokens. A dict registry: a new task kind is one line here.
POSTPROCESS: dict[tuple[str, ...], str] = {
    ("lm_chunks",): "lm_chunks",
    ("span_corruption", "append_eos_after_trim"): "span_corruption",
    ("append_eos_after_trim",): "pairs",
}


@dataclasses.dataclass(frozen=True)
class Registration:
    """What a process needs to register the task it prepares (spawned workers start empty).

    Attributes:
      vocab_path: the SentencePiece model (`VOCAB_PATH`).
      corpora_dir: the `corpora/` directory (`DATA_DIR`; None: `$XLSCALE_DATA/corpora`).
      source: a key of `pipelines.tasks.SOURCES` (`local`, `tfds`, or a named source).
      extra_ids: sentinel ids appended to the vocabulary (span tasks need 100).
    """

    vocab_path: str
    corpora_dir: str | None = None
    source: str = "local"
    extra_ids: int = 0

    def register(self) -> list[str]:
        """Registers every task of the corpora (as `trainer.data.register` does); returns the
        names. Raises ValueError/FileNotFoundError on a bad vocabulary or source."""
        from pipelines import tasks, vocab

        vocabulary = vocab.load_vocab(self.vocab_path, extra_ids=self.extra_ids)
        return tasks.register_tasks(
            vocabulary=vocabulary, corpora_dir=self.corpora_dir, source=self.source
        )


def preprocessor_name(fn: Any) -> str:
    """A preprocessor's name for the manifest: `__name__`, a partial's function's, else repr."""
    while hasattr(fn, "func"):  # functools.partial (possibly nested)
        fn = fn.func
    return getattr(fn, "__name__", None) or repr(fn)


def split_preprocessors(task) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of `task`'s preprocessors before and after its `CacheDatasetPlaceholder`.

    Raises:
      ValueError: the task has no placeholder (nothing deterministic to prepare).
    """
    import seqio

    fns = list(task.preprocessors)
    cut = [i for i, fn in enumerate(fns) if isinstance(fn, seqio.CacheDatasetPlaceholder)]
    if not cut:
        raise ValueError(
            f"task {task.name!r} has no seqio.CacheDatasetPlaceholder to prepare up to"
        )
    pre, post = fns[: cut[0]], fns[cut[0] + 1 :]
    return tuple(map(preprocessor_name, pre)), tuple(map(preprocessor_name, post))


def postprocess_kind(task) -> str:
    """What the reader applies after the prepared tokens of `task` (`POSTPROCESS`).

    Raises:
      ValueError: postcache preprocessors of no known kind (naming them and the known ones).
    """
    _, post = split_preprocessors(task)
    if post not in POSTPROCESS:
        known = "; ".join(" + ".join(k) for k in POSTPROCESS)
        raise ValueError(
            f"task {task.name!r}: postcache preprocessors {' + '.join(post) or '(none)'} are of "
            f"no prepared kind; allowed: {known}"
        )
    return POSTPROCESS[post]


def _source_files(source, split: str) -> list[str] | None:
    """The files of a file-based seqio source's split (None for other sources)."""
    import seqio

    if isinstance(source, seqio.FileDataSource) and split in source.splits:
        return list(source.list_shards(split))
    return None


def shard_dataset(task, *, split: str, index: int, num_shards: int):
    """Shard `index` of `num_shards` of the task's raw split, unshuffled: seqio's
    `ShardInfo` shard (whole files) when the source has at least as many files as shards,
    otherwise every `num_shards`-th record from `index` (`Dataset.shard`, as `pipelines.streams`
    shards local text files, which are one file per split)."""
    import seqio

    source = task.source
    if num_shards == 1:
        return source.get_dataset(split=split, shuffle=False)
    files = _source_files(source, split)
    if files is not None and len(files) < num_shards:
        return source.get_dataset(split=split, shuffle=False).shard(num_shards, index)
    return source.get_dataset(
        split=split, shuffle=False, shard_info=seqio.ShardInfo(index=index, num_shards=num_shards)
    )


def precache_dataset(task, *, split: str, index: int, num_shards: int):
    """The documents of shard `index`: `shard_dataset` through `task.preprocess_precache`
    (seed 0; these preprocessors are deterministic)."""
    ds = shard_dataset(task, split=split, index=index, num_shards=num_shards)
    return task.preprocess_precache(ds, seed=0)


def _storage_size(path: str) -> int:
    from rundir import storage

    if storage.is_remote(path):
        return int(storage.as_path(path).stat().length)
    return os.path.getsize(path)


def _input_files(source, split: str) -> list[str] | None:
    """The files `split` is read from: a file-based seqio source's, or a named source's (one
    with `describe()`, e.g. HF `datasets` files) `list_shards`; None for others (TFDS)."""
    files = _source_files(source, split)
    if files is None and callable(getattr(source, "describe", None)) and split in source.splits:
        files = list(source.list_shards(split))
    return files


def describe_source(task, split: str) -> dict[str, Any]:
    """The manifest's `source`, and part of the preparation's fingerprint: `repr(task.source)`,
    and the split's files with their sizes for a file-based or named source (a named source adds
    keys through its `describe()` method), so a rerun on other data is refused."""
    source = task.source
    out: dict[str, Any] = {"repr": repr(source)}
    files = _input_files(source, split)
    if files is not None:
        out["files"] = [{"path": f, "bytes": _storage_size(f)} for f in files]
    describe = getattr(source, "describe", None)
    if callable(describe):
        out.update(describe())
    return out


def _task(task_name: str, registration: Registration | None = None):
    """The registered seqio task (ValueError listing the registered ones otherwise, and where
    `registration` looked for them)."""
    import seqio

    names = sorted(seqio.TaskRegistry.names())
    if task_name not in names:
        where = ""
        if registration is not None:
            where = f" (registered from --data-dir {registration.corpora_dir or '$XLSCALE_DATA/corpora'}"
            where += f", --source {registration.source})"
        raise ValueError(
            f"--task {task_name!r}: no such registered task{where}; allowed: "
            + (", ".join(names) or "none")
        )
    return seqio.TaskRegistry.get(task_name)


def _check_split(task, split: str) -> None:
    """ValueError naming `--split` and the task's splits when it has no such split."""
    if split not in task.source.splits:
        raise ValueError(
            f"--split {split!r}: task {task.name} has no such split; allowed: "
            + ", ".join(task.source.splits)
        )


def _vocabulary(task):
    return task.output_features["targets"].vocabulary


def _precache_features(task, split: str) -> tuple[str, ...]:
    """The token features the pre-cache part gives (`targets`, or `inputs` and `targets`)."""
    ds = precache_dataset(task, split=split, index=0, num_shards=1)
    return tuple(k for k in ("inputs", "targets") if k in ds.element_spec)


def _plan(
    task, *, split: str, directory: str, num_shards: int, max_documents: int | None
) -> plan_lib.Plan:
    """This run's plan of `task`'s `split`: the settings and source it prepares from."""
    features = _precache_features(task, split)
    fingerprint = plan_lib.fingerprint(
        task=task.name,
        split=split,
        num_shards=num_shards,
        vocab_sha256=manifest_lib.file_sha256(_vocabulary(task).sentencepiece_model_file),
        precache=split_preprocessors(task)[0],
        features=features,
        max_documents=max_documents,
        source=describe_source(task, split),
    )
    return plan_lib.Plan(
        task=task.name,
        split=split,
        directory=directory,
        num_shards=num_shards,
        features=features,
        max_documents=max_documents,
        fingerprint=fingerprint,
    )


# An error reading the input (tf.data wraps one raised in Python as an OpError), for
# `_shard_failure`. PreparedDataError (a ValueError) is ours and passes through.
_INPUT_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, EOFError)


def _first_line(error: BaseException) -> str:
    """The error's first line, without tf.data's `{{function_node ...}}` prefix, led by its
    type (`LayoutError: ...`) when the line does not name one already."""
    text = getattr(error, "message", None) or str(error)
    line = re.sub(r"^\{\{[^}]*\}\}\s*", "", (text.strip().splitlines() or [""])[0]).strip()
    if not re.match(r"^[A-Z][\w.]*: ", line):  # `LayoutError: ...`, `BadGzipFile: ...`
        line = f"{type(error).__name__}: {line}" if line else type(error).__name__
    return line


def _shard_failure(task, plan: plan_lib.Plan, index: int, error: BaseException):
    """One line naming shard `index`, its input file where known, and the error's first line."""
    first = _first_line(error)
    files = _input_files(task.source, plan.split) or []
    if len(files) >= plan.num_shards:  # sharded by file (`shard_dataset`)
        files = files[index :: plan.num_shards]
    where = ""
    if not any(f in first for f in files):
        if len(files) == 1:
            where = f" reading {files[0]}"
        elif files:
            where = f" reading one of its {len(files)} input files ({files[0]}, ...)"
    final = plan.path(index, manifest_lib.shard_file)
    return PreparedDataError(f"{final}: shard {index} of {plan.num_shards} failed{where}: {first}")


def _remove_temporaries(plan: plan_lib.Plan, indices: Sequence[int]) -> None:
    """Removes the half-written files of shards `indices` (a killed or stopped worker's)."""
    for index in indices:
        final = plan.path(index, manifest_lib.shard_file)
        for stale in glob.glob(glob.escape(final) + ".tmp-*"):
            os.remove(stale)


def _prepare_shard(
    task, plan: plan_lib.Plan, index: int, report: Callable[[int, int, int], None]
) -> shards_lib.Sidecar:
    """Writes shard `index` (temporary name, renamed when complete) and then its sidecar.

    `report(index, documents, tokens)` is called every `REPORT_EVERY_DOCS` documents and at
    the end (cumulative counts of this shard).

    Raises:
      PreparedDataError: reading or tokenizing the input failed (`_shard_failure`); the
        temporary file is removed (a killed run's is removed by the rerun, which redoes it).
    """
    import tensorflow as tf

    final = plan.path(index, manifest_lib.shard_file)
    _remove_temporaries(plan, [index])  # left by a killed run
    tmp = f"{final}.tmp-{os.getpid()}"
    lengths: dict[str, list[int]] = {f: [] for f in plan.features}
    tokens = 0
    writer = array_record_module.ArrayRecordWriter(tmp, shards_lib.WRITER_OPTIONS)
    try:
        ds = precache_dataset(task, split=plan.split, index=index, num_shards=plan.num_shards)
        if plan.max_documents is not None:
            ds = ds.take(plan.max_documents)
        for example in ds.as_numpy_iterator():
            arrays = [example[f] for f in plan.features]
            writer.write(shards_lib.encode_record(arrays))
            for f, a in zip(plan.features, arrays, strict=True):
                lengths[f].append(len(a))
                tokens += len(a)
            if len(lengths[plan.features[0]]) % REPORT_EVERY_DOCS == 0:
                report(index, len(lengths[plan.features[0]]), tokens)
    except BaseException as e:
        writer.close()
        os.remove(tmp)
        if isinstance(e, (tf.errors.OpError, *_INPUT_ERRORS)) and not isinstance(
            e, PreparedDataError
        ):
            raise _shard_failure(task, plan, index, e) from e
        raise
    writer.close()
    size = os.path.getsize(tmp)
    sha = manifest_lib.file_sha256(tmp)
    os.replace(tmp, final)
    sidecar = shards_lib.Sidecar(
        lengths={f: np.asarray(v, np.int32) for f, v in lengths.items()},
        bytes=size,
        sha256=sha,
        fingerprint=plan.fingerprint,
    )
    shards_lib.write_sidecar(plan.path(index, manifest_lib.sidecar_file), sidecar)
    report(index, sidecar.documents, tokens)
    return sidecar


# --------------------------------------------------------------------------- worker processes


def _worker_shard(plan: plan_lib.Plan, index: int) -> tuple[int, int, int]:
    """Prepares one shard in a spawned worker (`workers.run`); returns (index, documents,
    tokens)."""
    sidecar = _prepare_shard(_task(plan.task), plan, index, workers_lib.report)
    return index, sidecar.documents, int(sum(int(v.sum()) for v in sidecar.lengths.values()))


# --------------------------------------------------------------------------- the job


def prepare(
    *,
    task_name: str,
    split: str,
    out_dir: str | os.PathLike,
    num_shards: int,
    workers: int,
    shard_indices: Sequence[int] | None = None,
    max_documents: int | None = None,
    registration: Registration | None = None,
    log: Callable[[str], None] = print,
) -> Manifest | None:
    """Prepares `task_name`'s `split` into `<out_dir>/<task_name>/` (the train split) or
    `<out_dir>/<task_name>@<split>/` (any other; `manifest.task_dir_name`), see the module
    docstring.

    Args:
      task_name: a registered seqio task (`lm_<lang>`, `span_<lang>`, `mt_<src>_<tgt>`).
      split: the split to prepare.
      out_dir: the parent directory of prepared tasks (a local path; a gcsfuse mount at scale).
      num_shards: shards of the split (seqio shards: shard k is `ShardInfo(k, num_shards)`).
      workers: processes preparing shards at once; above 1 needs `registration` (each spawned
        process registers the task itself).
      shard_indices: the shards this call prepares (None: all); another machine may prepare
        the rest into the same directory. `()` only finalizes (`finalize` of the `num_shards`
        preparation, with the document limit recorded in its sidecars).
      max_documents: at most this many documents per shard (a sample or smoke run); None: all.
      registration: registers the tasks in this process and in every worker; None: the task is
        registered in this process already (then `workers` must be 1).
      log: where progress lines go.

    Returns:
      The manifest once every shard exists (written last, atomically), else None (some shards
      are left to another call).

    Raises:
      ValueError: an unknown task or split, or bad counts (naming the flag and allowed values).
      PreparedDataError: the directory holds shards prepared with other settings or from
        another source, or files of another shard count; or an input file cannot be read (one
        line naming the shard and the file; with several workers the others are stopped).
    """
    if registration is not None:
        registration.register()
    task = _task(task_name, registration)
    _check_split(task, split)
    if num_shards < 1:
        raise ValueError(f"--shards {num_shards}: allowed: a positive count")
    if workers < 1:
        raise ValueError(f"--workers {workers}: allowed: a positive count")
    if workers > 1 and registration is None:
        raise ValueError("workers > 1 needs a Registration (spawned workers register the task)")
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"--max-documents {max_documents}: allowed: a positive count")
    indices = list(range(num_shards)) if shard_indices is None else list(shard_indices)
    bad = [k for k in indices if not 0 <= k < num_shards]
    if bad:
        raise ValueError(f"--shard-index {bad[0]}: allowed: 0 to {num_shards - 1} (--shards)")
    if not indices:  # finalize only: the document limit is the one the shards were prepared with
        return finalize(
            task_name=task_name, split=split, out_dir=out_dir, num_shards=num_shards, log=log
        )
    postprocess_kind(task)  # refuses a task of no prepared kind before any work
    directory = os.path.join(
        shards_lib.local_dir(out_dir), manifest_lib.task_dir_name(task_name, split)
    )
    plan_lib.shard_count(directory, num_shards)  # refuses shards of another count, before any work
    plan = _plan(
        task, split=split, directory=directory, num_shards=num_shards, max_documents=max_documents
    )
    os.makedirs(directory, exist_ok=True)
    todo = [k for k in dict.fromkeys(indices) if plan_lib.finished(plan, k, log) is None]
    skipped = len(set(indices)) - len(todo)
    if skipped:
        log(f"{directory}: {skipped} of the {len(set(indices))} shards asked for are done already")
    if todo:
        total = task.source.num_input_examples(split)
        expected = None if total is None else total * len(todo) / num_shards
        if expected is not None and max_documents is not None:
            expected = min(expected, max_documents * len(todo))
        progress = workers_lib.Progress(shards=len(todo), expected_docs=expected, log=log)
        log(f"preparing {task_name}:{split}, shards {todo} of {num_shards}, {workers} worker(s)")
        if workers == 1:
            for k in todo:
                sidecar = _prepare_shard(task, plan, k, progress.update)
                progress.finished(k, sidecar.documents, progress.tokens.get(k, 0))
        else:
            try:
                workers_lib.run(
                    _worker_shard,
                    plan,
                    todo,
                    workers=workers,
                    registration=registration,
                    progress=progress,
                )
            except BaseException:
                _remove_temporaries(plan, todo)  # of the shards its workers were stopped in
                raise
    return finalize(task_name=task_name, split=split, out_dir=out_dir, plan=plan, log=log)


def finalize(
    *,
    task_name: str,
    split: str,
    out_dir: str | os.PathLike,
    num_shards: int | None = None,
    plan: plan_lib.Plan | None = None,
    registration: Registration | None = None,
    log: Callable[[str], None] = print,
) -> Manifest | None:
    """Writes `manifest.json` when every shard of the preparation in `<out_dir>/<task_name>`
    (`manifest.task_dir_name` of the split) is done; returns it, or None with a line saying what is left.

    Without `plan`, the preparation is the `num_shards`-shard one (None: the one shard count the
    directory holds) with the document limit its sidecars record, from this run's source and
    vocabulary: shards prepared from other data are refused as `prepare` refuses them. An
    existing manifest that already says the same (but for its time) is kept as it is.

    Args:
      registration: registers the tasks first (None: `task_name` is registered already).

    Raises:
      ValueError: an unknown task or split.
      PreparedDataError: files of another shard count (or of several) in the directory, sidecars
        that disagree, or a shard prepared with settings other than this run's.
    """
    from rundir import storage

    if registration is not None:
        registration.register()
    task = _task(task_name, registration)
    _check_split(task, split)
    if plan is None:
        directory = os.path.join(
            shards_lib.local_dir(out_dir), manifest_lib.task_dir_name(task_name, split)
        )
        num_shards = plan_lib.shard_count(directory, num_shards)
        recorded = None if num_shards is None else plan_lib.recorded_settings(directory, num_shards)
        if recorded is None:
            log(f"{directory}: no finished shard to finalize")
            return None
        if recorded["split"] != split:
            raise ValueError(f"--split {split!r}: {directory} holds split {recorded['split']!r}")
        plan = _plan(
            task,
            split=split,
            directory=directory,
            num_shards=num_shards,
            max_documents=recorded["max_documents"],
        )
    sidecars = {k: plan_lib.finished(plan, k, log) for k in range(plan.num_shards)}
    missing = [k for k, s in sidecars.items() if s is None]
    if missing:
        log(
            f"{plan.directory}: {plan.num_shards - len(missing)} of {plan.num_shards} shards done; "
            f"left: {missing} (the manifest is written by the call that finishes the last)"
        )
        return None
    pre, post = split_preprocessors(task)
    vocabulary = _vocabulary(task)
    entries = tuple(
        ShardEntry(
            file=manifest_lib.shard_file(k, plan.num_shards),
            documents=s.documents,
            tokens={f: int(s.lengths[f].sum()) for f in plan.features},
            bytes=s.bytes,
            sha256=s.sha256,
        )
        for k, s in sidecars.items()
    )
    manifest = Manifest(
        task=task_name,
        split=split,
        source=plan.settings["source"],
        vocab_path=os.fspath(vocabulary.sentencepiece_model_file),
        vocab_hash=plan.settings["vocab_sha256"],
        vocab_size=int(vocabulary.vocab_size),
        eos_id=int(vocabulary.eos_id),
        preprocessors={"precache": pre, "postcache": post},
        postprocess=postprocess_kind(task),
        features=plan.features,
        shards=entries,
        documents=sum(e.documents for e in entries),
        tokens={f: sum(e.tokens[f] for e in entries) for f in plan.features},
        max_documents=plan.max_documents,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        xlscale_version=_version(),
    )
    path = os.path.join(plan.directory, manifest_lib.MANIFEST_FILE)
    if os.path.exists(path):
        try:
            old = Manifest.from_json(storage.read_text(path))
        except ValueError:
            old = None
        if old is not None and old.without_time() == manifest.without_time():
            log(f"{path}: up to date ({old.documents:,} documents, written {old.created})")
            return old
    storage.write_text_atomic(path, manifest.to_json())
    log(
        f"{path}: {manifest.documents:,} documents, "
        + ", ".join(f"{v:,} {f} tokens" for f, v in manifest.tokens.items())
        + f" in {plan.num_shards} shards"
    )
    return manifest


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("xlscale")
    except metadata.PackageNotFoundError:
        return "unknown"
