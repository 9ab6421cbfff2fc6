"""`xlscale data build|fixture|show`: build the local corpora, write the UDHR fixture, or print
the sizes recorded in a corpora manifest."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


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


def run(args: argparse.Namespace) -> int:
    """Runs the chosen action; returns the process exit status."""
    from pipelines.corpora import build, fixture, paths

    if args.action == "fixture":
        print(fixture.write_fixture_corpora(args.out))
        return 0
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

    root = Path(data_dir).expanduser() if data_dir else paths.data_root()
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
