"""`xlscale data build|fixture|show|prepare`: build the local corpora, write the UDHR fixture,
print the sizes recorded in a corpora manifest, or prepare a task's split once into ArrayRecord
shards read by index at training time (`pipelines.prepared.prepare`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DEFAULT_SHARDS = 8  # `data prepare --shards` when not given (--finalize: the directory's count)
# A split other than train (the validation split evaluation reads) is one shard by default: the
# prepared eval reader reads its documents in the split's order, which one shard keeps.
DEFAULT_EVAL_SHARDS = 1


def default_shards(split: str) -> int:
    """`--shards` when not given: `DEFAULT_SHARDS` for the train split, `DEFAULT_EVAL_SHARDS`
    for any other."""
    return DEFAULT_SHARDS if split == "train" else DEFAULT_EVAL_SHARDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `build`, `fixture` and `show` actions and their flags."""
    from pipelines.corpora import paths

    actions = parser.add_subparsers(dest="action", required=True)
    build = actions.add_parser("build", help="build corpora from Debian packages (needs network)")
    build.add_argument(
        "--langs",
        nargs="+",
        default=list(paths.LANGS),
        choices=paths.LANGS,
        help="languages to build (pairs are en-<xx>); default: all six",
    )
    build.add_argument(
        "--data-dir", default=None, help="data root (default: $XLSCALE_DATA or ~/.cache/xlscale)"
    )
    build.add_argument(
        "--update",
        action="store_true",
        help="refresh the private APT indices first (may change versions)",
    )
    build.add_argument(
        "--zeroshot-items",
        type=int,
        default=200,
        help="items per local zero-shot task written under DATA/zeroshot_tasks (default 200)",
    )
    fixture = actions.add_parser("fixture", help="write the committed UDHR fixture corpora")
    fixture.add_argument("--out", required=True, help="root directory; writes OUT/corpora/...")
    show = actions.add_parser("show", help="print the sizes recorded in a corpora manifest")
    show.add_argument("--data-dir", default=None, help="data root (default as for build)")
    add_prepare_arguments(
        actions.add_parser("prepare", help="tokenize a task's split once into ArrayRecord shards")
    )


def add_prepare_arguments(prepare: argparse.ArgumentParser) -> None:
    """The flags of `xlscale data prepare`."""
    prepare.add_argument("--task", required=True, help="seqio task: lm_<lang>, span_<lang>, mt_..")
    prepare.add_argument("--vocab", required=True, help="SentencePiece model (VOCAB_PATH)")
    prepare.add_argument(
        "--data-dir",
        default=None,
        help="the corpora/ directory (DATA_DIR; default: $XLSCALE_DATA/corpora)",
    )
    prepare.add_argument(
        "--out",
        required=True,
        help="parent of prepared tasks (writes OUT/<task>/ for train, OUT/<task>@<split>/ for "
        "another split; local, or a gcsfuse mount)",
    )
    prepare.add_argument("--split", default="train", help="split to prepare (default train)")
    prepare.add_argument(
        "--shards",
        type=int,
        default=None,
        help=f"shards of the split (default {DEFAULT_SHARDS} for train, {DEFAULT_EVAL_SHARDS} for "
        "another split, which evaluation reads in order; with --finalize: those in --out)",
    )
    prepare.add_argument(
        "--workers", type=int, default=2, help="processes preparing shards (default 2)"
    )
    prepare.add_argument(
        "--shard-index",
        type=int,
        nargs="+",
        default=None,
        help="prepare only these shards (several machines, one directory); default: all",
    )
    prepare.add_argument(
        "--extra-ids", type=int, default=0, help="sentinel ids (span tasks need 100; default 0)"
    )
    prepare.add_argument(
        "--source", default="local", help="task source: local (default), tfds, or a named one"
    )
    prepare.add_argument(
        "--max-documents",
        type=int,
        default=None,
        help="at most this many documents per shard (a sample or smoke run)",
    )
    prepare.add_argument(
        "--finalize",
        action="store_true",
        help="prepare nothing; write the manifest if every shard is done",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the chosen action; returns the process exit status."""
    from pipelines.corpora import build, fixture, paths

    if args.action == "fixture":
        print(fixture.write_fixture_corpora(args.out))
        return 0
    if args.action == "prepare":
        return run_prepare(args)
    if args.action == "show":
        manifest = paths.manifest_file(paths.corpora_dir(args.data_dir))
        if not manifest.exists():
            print(f"xlscale data show: no manifest at {manifest}", file=sys.stderr)
            return 1
        print(build.summary_table(json.loads(manifest.read_text(encoding="utf-8"))))
        return 0
    start = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {line}", flush=True)

    try:
        corpora = build.build_corpora(
            data_dir=args.data_dir, langs=args.langs, update=args.update, log=log
        )
    except build.BuildError as err:
        print(f"xlscale data build: {err}", file=sys.stderr)
        return 1
    return write_zeroshot_tasks(
        corpora, data_dir=args.data_dir, langs=args.langs, items=args.zeroshot_items, log=log
    )


def write_zeroshot_tasks(corpora: Path, *, data_dir: str | None, langs, items: int, log) -> int:
    """Writes the local zero-shot tasks of the built languages (`evals.local_tasks`) under
    `<data root>/zeroshot_tasks`, where `xlscale zeroshot` looks for them; returns the exit status."""
    from evals import job, local_tasks
    from pipelines.corpora import paths
    from rundir import storage

    why = "lm-evaluation-harness reads local task files"
    root = (
        storage.local_dir(data_dir, name="--data-dir", why=why) if data_dir else paths.data_root()
    )
    try:
        tasks = local_tasks.write_local_tasks(
            corpora, root / job.LOCAL_TASKS_SUBDIR, langs=list(langs), items=items
        )
    except ValueError as err:
        print(
            f"xlscale data build: corpora built at {corpora}; zero-shot tasks: {err}",
            file=sys.stderr,
        )
        return 1
    for task, why in tasks.skipped.items():
        log(f"zero-shot task {task} not written: {why}")
    log(f"zero-shot tasks ({', '.join(sorted(tasks.tasks)) or 'none'}): {tasks.dir}")
    return 0


def _prepare_refusal(args: argparse.Namespace) -> str | None:
    """The first bad flag of `xlscale data prepare`, as one line naming it, or None."""
    from pipelines import tasks
    from rundir import storage

    shards = default_shards(args.split) if args.shards is None else args.shards
    counts = {"--shards": (shards, 1), "--workers": (args.workers, 1)}
    counts["--extra-ids"] = (args.extra_ids, 0)
    if args.max_documents is not None:
        counts["--max-documents"] = (args.max_documents, 1)
    for flag, (value, least) in counts.items():
        if value < least:
            return f"{flag} {value}: allowed: an integer >= {least}"
    for index in args.shard_index or ():
        if not 0 <= index < shards:
            return f"--shard-index {index}: allowed: 0 to {shards - 1} (--shards {shards})"
    if args.source not in tasks.SOURCES:
        return f"--source {args.source!r}: allowed: {', '.join(sorted(tasks.SOURCES))}"
    if not storage.as_path(args.vocab, name="--vocab").exists():
        return f"--vocab {args.vocab!r}: no such file; allowed: a SentencePiece .model file"
    if args.source == "local" and args.data_dir is not None and not Path(args.data_dir).is_dir():
        return f"--data-dir {args.data_dir!r}: no such directory; allowed: a corpora/ directory"
    return None


def run_prepare(args: argparse.Namespace) -> int:
    """`xlscale data prepare`: registers the tasks from `--vocab` and `--data-dir` and prepares
    `--task` (`pipelines.prepared.prepare.prepare`), or only writes its manifest (`--finalize`).
    A bad flag, a directory of another preparation or an input file that cannot be read is one
    line on stderr, exit 2 (`rundir.exits`' configuration class)."""
    # TensorFlow's C++ log would repeat an input error's Python traceback above our line (the
    # spawned workers inherit this); set before anything imports TensorFlow.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pipelines import vocab
    from pipelines.prepared import prepare
    from pipelines.prepared.manifest import PreparedDataError
    from rundir import exits

    prog = "xlscale data prepare"
    refused = exits.CLASSES["configuration"].code
    refusal = _prepare_refusal(args)
    if refusal is None:
        try:
            vocab.load_vocab(args.vocab, extra_ids=args.extra_ids)
        except vocab.VocabularyFileError as e:
            refusal = f"--vocab {args.vocab!r}: {e}"
    if refusal is not None:
        print(f"{prog}: {refusal}", file=sys.stderr)
        return refused
    start = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {line}", flush=True)

    registration = prepare.Registration(
        vocab_path=args.vocab,
        corpora_dir=args.data_dir,
        source=args.source,
        extra_ids=args.extra_ids,
    )
    common = dict(task_name=args.task, split=args.split, out_dir=args.out, log=log)
    try:
        if args.finalize:
            prepare.finalize(**common, num_shards=args.shards, registration=registration)
        else:
            prepare.prepare(
                **common,
                num_shards=default_shards(args.split) if args.shards is None else args.shards,
                workers=args.workers,
                shard_indices=args.shard_index,
                max_documents=args.max_documents,
                registration=registration,
            )
    except (PreparedDataError, ValueError, FileNotFoundError) as e:
        print(f"{prog}: {exits.message(e).splitlines()[0]}", file=sys.stderr)
        return refused
    return 0
