"""`xlscale data build|fixture|show`: build the local corpora, write the UDHR fixture, or print
the sizes recorded in a corpora manifest."""

from __future__ import annotations

import argparse
import json
import sys
import time


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
        build.build_corpora(data_dir=args.data_dir, langs=args.langs, update=args.update, log=log)
    except build.BuildError as err:
        print(f"xlscale data build: {err}", file=sys.stderr)
        return 1
    return 0
