"""The one five-stage skeleton both studies run (`xlscale demo`), each stage cached so that a
re-run reuses what is done:

  1. corpora — the Debian corpora (`pipelines.corpora.build`, cached under `$XLSCALE_DATA`) for a
     full profile, the committed UDHR fixture for a smoke profile (no apt, no network);
  2. a SentencePiece vocabulary on the study's languages (`pipelines.vocab.train_vocab`);
  3. the sweep of the profile's manifest (`launch/manifests/*.toml`), run in dependency order by
     the local launcher, two runs at a time in worker processes on 2 or more cores (each worker
     starts TensorFlow/JAX once and keeps its compiled steps for all its runs);
  4. + 5. the fits and `report.md` (the study's `report` stage).

One failure rule for every study: when a run failed, or was blocked by a failed dependency, the
study stops before fitting and says which runs and where their logs are.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from launch.launchers import LocalLauncher, default_jobs
from launch.manifest import Manifest
from launch.runs import Run
from launch.status import Progress
from launch.sweep import expand, load_manifest
from rundir import storage

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Stages:
    """What one study plugs into the skeleton.

    Attributes:
      study: the study's name (`STUDIES` key), recorded in demo.json.
      tag: the log prefix (`demo`, `demo-mt`).
      manifest: the sweep manifest (a name under launch/manifests).
      corpora: `(out_dir, data_dir) -> corpora directory` (stage 1).
      vocabulary: `(corpora, out_dir) -> SentencePiece model path` (stage 2).
      report: `(runs_dir, out_dir) -> fits.json path`: fits and writes report.md (stages 4-5).
      check_runs: `(runs, vocab_path) -> anything`, raising when the sweep cannot run as
        configured (checked before any training), or None.
      zeroshot: `(runs_dir, corpora, out_dir) -> anything`: scores trained runs on zero-shot
        tasks after training and before the report (`studies.cpt_zeroshot`), or None.
    """

    study: str
    tag: str
    manifest: str
    corpora: Callable[[Path, Path | None], Path]
    vocabulary: Callable[[Path, Path], Path]
    report: Callable[[Path, Path], Path]
    check_runs: Callable[[Sequence[Run], Path], Any] | None = None
    zeroshot: Callable[[Path, Path, Path], Any] | None = None


@dataclasses.dataclass(frozen=True)
class StudyProfile:
    """One way to run a study: which manifest, which corpora, which vocabulary.

    Attributes:
      manifest: the sweep manifest (a name under launch/manifests).
      corpora: key of `CORPORA` ("debian": built from Debian packages, "fixture": the committed
        UDHR fixture).
      vocab_size: SentencePiece pieces (pad, eos, unk and 256 byte pieces included).
      description: one line for `--help` and the log.
      langs: the corpora's languages (the vocabulary's sample).
      pairs: translation pairs whose train and test files the corpora must have.
      vocab_sentences: lines of text the vocabulary is trained on (at most; None: the trainer's
        default).
    """

    manifest: str
    corpora: str
    vocab_size: int
    description: str
    langs: tuple[str, ...] = ("en",)
    pairs: tuple[str, ...] = ()
    vocab_sentences: int | None = None


def profile_stages(
    spec: StudyProfile,
    *,
    study: str,
    tag: str,
    vocab_name: str,
    log: Log,
    report: Callable[[Path, Path], Path],
    check_runs: Callable[[Sequence[Run], Path], Any] | None = None,
    zeroshot: Callable[[Path, Path, Path], Any] | None = None,
) -> Stages:
    """A study's stages under profile `spec`: the corpora and the vocabulary the profile names
    (`CORPORA`, `study_vocabulary` as `<vocab_name>_<langs>_<size>`), and the study's own report,
    run check and zero-shot stage."""
    return Stages(
        study=study,
        tag=tag,
        manifest=spec.manifest,
        corpora=functools.partial(CORPORA[spec.corpora], spec=spec, tag=tag, log=log),
        vocabulary=functools.partial(
            study_vocabulary, spec=spec, name=vocab_name, log=log, tag=tag
        ),
        report=report,
        check_runs=check_runs,
        zeroshot=zeroshot,
    )


def debian_corpora(
    *, data_dir: Path | None, langs: Sequence[str], pairs: Sequence[str] = (), tag: str, log: Log
) -> Path:
    """The Debian corpora of `langs` (and the train and test files of `pairs`) under `data_dir`
    (default `$XLSCALE_DATA`), built only when a file is missing."""
    from pipelines.corpora import build, paths

    why = "the demo builds its corpora on this machine"
    root = (
        storage.local_dir(data_dir, name="--data-dir", why=why) if data_dir else paths.data_root()
    )
    corpora = paths.corpora_dir(root)
    needed = [paths.mono_file(corpora, lang, "train") for lang in langs]
    for pair in pairs:
        needed += [paths.parallel_file(corpora, pair, "train"), paths.test_file(corpora, pair)]
    if (corpora / "manifest.json").exists() and all(p.exists() for p in needed):
        log(f"[{tag}] corpora: reusing {corpora}")
        return corpora
    log(f"[{tag}] corpora: building the Debian corpora for {' '.join(langs)} into {root}")
    return Path(build.build_corpora(data_dir=root, langs=tuple(langs), log=log))


def fixture_corpora(*, out_dir: Path, tag: str, log: Log) -> Path:
    """The committed UDHR fixture written under `<out_dir>/data` (no apt, no network)."""
    from pipelines.corpora import fixture

    log(f"[{tag}] corpora: the committed UDHR fixture (smoke profile)")
    return Path(fixture.write_fixture_corpora(out_dir / "data")).resolve()


def _debian(out: Path, data_dir: Path | None, *, spec: StudyProfile, tag: str, log: Log) -> Path:
    return debian_corpora(data_dir=data_dir, langs=spec.langs, pairs=spec.pairs, tag=tag, log=log)


def _fixture(out: Path, data_dir: Path | None, *, spec: StudyProfile, tag: str, log: Log) -> Path:
    return fixture_corpora(out_dir=out, tag=tag, log=log)


# StudyProfile.corpora -> (out_dir, data_dir, *, spec, tag, log) -> corpora directory.
CORPORA: dict[str, Callable[..., Path]] = {"debian": _debian, "fixture": _fixture}


def study_vocabulary(
    corpora: Path,
    out_dir: Path,
    *,
    spec: StudyProfile,
    name: str,
    log: Log,
    tag: str = "demo",
) -> Path:
    """Trains (or reuses) a study's SentencePiece model `<out_dir>/vocab/<name>_<langs>_<size>`
    of the profile's size on its languages (at most its `vocab_sentences` sentences), logging
    its measured tokens per character per language."""
    from pipelines import vocab

    langs, vocab_size, max_sentences = spec.langs, spec.vocab_size, spec.vocab_sentences
    prefix = out_dir / "vocab" / f"{name}_{'_'.join(langs)}_{vocab_size}"
    model = prefix.with_suffix(".model")
    if model.exists():
        log(f"[{tag}] vocabulary: reusing {model}")
        return model
    log(f"[{tag}] vocabulary: training {vocab_size} pieces on {'+'.join(langs)}")
    extra = {} if max_sentences is None else {"max_sentences": max_sentences}
    model = Path(
        vocab.train_vocab(
            corpora_dir=corpora, langs=langs, out_prefix=prefix, vocab_size=vocab_size, **extra
        )
    )
    info = vocab.read_vocab_info(model)
    for lang, stats in sorted(info.get("measurements", {}).items()):
        log(f"[{tag}]   {lang}: {stats['tokens_per_char']:.3f} tokens per character")
    return model


def _train_in_process(run: Run, log_path: Path) -> int:
    """Runs one job through the trainer's gin entry point in this process."""
    import gin

    from trainer import train

    gin.clear_config()  # each run parses its own files; the previous run locked the config

    return train.main(run.gin_args())


def study_runs(name: str, corpora: Path, vocab_path: Path, out: Path) -> tuple[Manifest, list[Run]]:
    """A study's sweep: manifest `name` with its DATA_DIR and VOCAB_PATH filled in, its runs
    under `<out>/runs` (run ids do not depend on those paths)."""
    manifest = load_manifest(
        name,
        variables={"DATA_DIR": str(corpora), "VOCAB_PATH": str(vocab_path)},
        runs_dir=str(out / "runs"),
    )
    return manifest, expand(manifest)


def training_launcher(jobs: int | None, log: Log) -> LocalLauncher:
    """The studies' launcher: `jobs` runs at once in worker processes (default
    `launchers.default_jobs()`), or one by one in this process when `jobs` is 1."""
    jobs = default_jobs() if jobs is None else jobs
    if jobs > 1:
        log(f"[demo] training up to {jobs} runs at once in worker processes (--jobs 1: one by one)")
    return LocalLauncher(runner=_train_in_process, jobs=jobs, poll_s=15.0)


def run_study(
    stages: Stages,
    *,
    profile: str,
    description: str,
    out_dir: str | Path,
    data_dir: str | Path | None = None,
    log: Log = print,
    jobs: int | None = None,
) -> dict:
    """Runs the five stages of one study and writes `<out_dir>/demo.json`.

    Args:
      stages: what the study plugs in.
      profile: the profile's name (recorded in the summary).
      description: one line for the log.
      out_dir: where the runs, report.md, fits.json and figures go.
      data_dir: data root for the Debian corpora (default `$XLSCALE_DATA`).
      log: progress sink.
      jobs: runs trained at once (see `training_launcher`).

    Returns:
      A summary dict (paths, run counts, wall times), also written as `<out_dir>/demo.json`.

    Raises:
      RuntimeError: a run failed or was blocked by a failed dependency (its train.log says why).
    """
    tag = stages.tag
    out = storage.local_dir(out_dir, name="--out", why="the demo's corpora, runs and report")
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    log(f"[{tag}] profile {profile}: {description}")

    data_root = storage.local_dir(data_dir, name="--data-dir", why="corpora") if data_dir else None
    corpora = stages.corpora(out, data_root)
    times["corpora_s"] = time.monotonic() - t0

    t = time.monotonic()
    vocab_path = stages.vocabulary(corpora, out)
    times["vocab_s"] = time.monotonic() - t

    t = time.monotonic()
    manifest, runs = study_runs(stages.manifest, corpora, vocab_path, out)
    if stages.check_runs is not None:
        stages.check_runs(runs, vocab_path)
    counts = {
        s: sum(r.strategy == s for r in runs) for s in dict.fromkeys(r.strategy for r in runs)
    }
    log(
        f"[{tag}] sweep {manifest.name}: {len(runs)} runs ("
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f") in {out / 'runs'}"
    )
    report = training_launcher(jobs, log).launch(runs, progress=Progress(runs))
    times["train_s"] = time.monotonic() - t
    if not report.ok:
        bad = [*report.failed, *report.blocked]
        raise RuntimeError(
            f"[{tag}] {len(bad)} run(s) failed or were blocked: {', '.join(bad)}; see their "
            f"train.log under {out / 'runs'}"
        )

    if stages.zeroshot is not None:
        t = time.monotonic()
        stages.zeroshot(out / "runs", corpora, out)
        times["zeroshot_s"] = time.monotonic() - t

    t = time.monotonic()
    fits = stages.report(out / "runs", out)
    times["fit_s"] = time.monotonic() - t
    times["total_s"] = time.monotonic() - t0

    summary = {
        "study": stages.study,
        "profile": profile,
        "corpora": str(corpora),
        "vocab": str(vocab_path),
        "runs": len(runs),
        "runs_reused": len(report.skipped),
        "report": str(out / "report.md"),
        "fits": str(fits),
        "times": times,
        "python": sys.version.split()[0],
    }
    (out / "demo.json").write_text(json.dumps(summary, indent=1))
    log(
        f"[{tag}] done in {times['total_s']:.0f} s (corpora {times['corpora_s']:.0f} s, vocab "
        f"{times['vocab_s']:.0f} s, training {times['train_s']:.0f} s, "
        + (f"zero-shot {times['zeroshot_s']:.0f} s, " if "zeroshot_s" in times else "")
        + "fits "
        f"{times['fit_s']:.0f} s): {out / 'report.md'}"
    )
    return summary


def run_profile(
    profiles: dict[str, Any],
    make_stages: Callable[[Any, Log], Stages],
    *,
    profile: str = "full",
    label: str,
    log: Log = print,
    **kwargs: Any,
) -> dict:
    """Runs a study's profile: checks `profile` against `profiles` (each with a `description`),
    builds the study's stages for it and runs them (`run_study`; `kwargs`: `out_dir`,
    `data_dir`, `jobs`).

    Raises:
      ValueError: an unknown profile, naming `label` and the allowed profiles.
    """
    if profile not in profiles:
        raise ValueError(f"unknown {label} profile {profile!r}; choose one of {sorted(profiles)}")
    spec = profiles[profile]
    return run_study(
        make_stages(spec, log), profile=profile, description=spec.description, log=log, **kwargs
    )
