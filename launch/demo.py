"""The main job: a real, small CPT scaling study end to end (`make demo` → `xlscale demo`).

Steps, each cached so that a re-run reuses what is done:
  1. corpora — the Debian corpora (`pipelines.corpora.build`, cached under `$XLSCALE_DATA`) for
     the full profile, the committed UDHR fixture for the smoke profile (no apt, no network);
  2. an en+zh SentencePiece vocabulary (`pipelines.vocab.train_vocab`);
  3. the sweep of the profile's manifest (`launch/manifests/{demo,smoke}.toml`): LLaMA2-shaped
     sizes × {source en, scratch zh, CPT zh} + CPT with en replay, run in dependency order by the
     local launcher in worker processes, two runs at a time on 2 or more cores (each worker
     starts TensorFlow/JAX once and keeps its compiled steps for all its runs);
  4. the fits (`fitting.outputs.fit_runs`): Chinchilla on scratch, two-stage extended law on CPT,
     allocation, loss–compute frontiers, FLOPs saved, transferred data, replay curves;
  5. `report.md`: the fitting report plus the comparison with the paper's findings.

`run_demo(study=...)` dispatches through `STUDIES`: "cpt" is this module's study, "mt" the
translation study of `launch.demo_mt` (the MT paper at CPU size).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from launch.launchers import LocalLauncher, default_jobs
from launch.status import Progress
from launch.sweep import Manifest, Run, expand, load_manifest

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Profile:
    """One way to run the demo: which manifest, which corpora, which vocabulary."""

    manifest: str
    corpora: str  # key of CORPORA
    vocab_size: int
    description: str
    bootstrap: int = 100  # resamples of whole runs for the fits' intervals


PROFILES: dict[str, Profile] = {
    "full": Profile(
        manifest="demo",
        corpora="debian",
        vocab_size=2048,
        description="4 sizes (14x non-embedding params) on Debian en/zh text; ~8 min on 2 cores",
    ),
    "smoke": Profile(
        manifest="smoke",
        corpora="fixture",
        vocab_size=512,
        description="the same pipeline at toy size on the committed UDHR fixture; ~3 min",
        bootstrap=20,
    ),
}

LANGS = ("en", "zh")


def _debian_corpora(out_dir: Path, data_dir: Path | None, log: Log) -> Path:
    from pipelines.corpora import build, paths

    root = Path(data_dir) if data_dir else paths.data_root()
    corpora = paths.corpora_dir(root)
    if (corpora / "manifest.json").exists() and all(
        (corpora / "mono" / lang / "train.txt").exists() for lang in LANGS
    ):
        log(f"[demo] corpora: reusing {corpora}")
        return corpora
    log(f"[demo] corpora: building the Debian corpora for {' '.join(LANGS)} into {root}")
    return Path(build.build_corpora(data_dir=root, langs=LANGS, log=log))


def _fixture_corpora(out_dir: Path, data_dir: Path | None, log: Log) -> Path:
    from pipelines.corpora import fixture

    log("[demo] corpora: the committed UDHR fixture (smoke profile)")
    return Path(fixture.write_fixture_corpora(out_dir / "data")).resolve()


CORPORA: dict[str, Callable[[Path, Path | None, Log], Path]] = {
    "debian": _debian_corpora,
    "fixture": _fixture_corpora,
}


def study_vocabulary(
    corpora: Path,
    out_dir: Path,
    *,
    langs: Sequence[str],
    vocab_size: int,
    name: str,
    log: Log,
    tag: str = "demo",
    max_sentences: int | None = None,
) -> Path:
    """Trains (or reuses) a study's SentencePiece model `<out_dir>/vocab/<name>_<langs>_<size>`
    on `langs`, logging its measured tokens per character per language."""
    from pipelines import vocab

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
    """A demo's sweep: manifest `name` with its DATA_DIR and VOCAB_PATH filled in, its runs under
    `<out>/runs` (run ids do not depend on those paths)."""
    manifest = load_manifest(
        name,
        variables={"DATA_DIR": str(corpora), "VOCAB_PATH": str(vocab_path)},
        runs_dir=str(out / "runs"),
    )
    return manifest, expand(manifest)


def training_launcher(jobs: int | None, log: Log) -> LocalLauncher:
    """The demos' launcher: `jobs` runs at once in worker processes (default
    `launchers.default_jobs()`), or one by one in this process when `jobs` is 1."""
    jobs = default_jobs() if jobs is None else jobs
    if jobs > 1:
        log(f"[demo] training up to {jobs} runs at once in worker processes (--jobs 1: one by one)")
    return LocalLauncher(runner=_train_in_process, jobs=jobs, poll_s=15.0)


def run_cpt_demo(
    *,
    profile: str = "full",
    out_dir: str | Path = "demo_out",
    data_dir: str | Path | None = None,
    log: Log = print,
    jobs: int | None = None,
) -> dict:
    """Runs the whole study of `profile` and writes `<out_dir>/report.md`, `fits.json`, plots;
    `jobs` runs train at once (see `training_launcher`).

    Returns a summary dict (paths, run counts, wall times) that is also written as
    `<out_dir>/demo.json`.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown demo profile {profile!r}; choose one of {sorted(PROFILES)}")
    spec = PROFILES[profile]
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    log(f"[demo] profile {profile}: {spec.description}")

    corpora = CORPORA[spec.corpora](out, Path(data_dir) if data_dir else None, log)
    times["corpora_s"] = time.monotonic() - t0

    t = time.monotonic()
    vocab_path = study_vocabulary(
        corpora, out, langs=LANGS, vocab_size=spec.vocab_size, name="demo", log=log
    )
    times["vocab_s"] = time.monotonic() - t

    t = time.monotonic()
    manifest, runs = study_runs(spec.manifest, corpora, vocab_path, out)
    log(f"[demo] sweep {manifest.name}: {len(runs)} runs in {out / 'runs'}")
    report = training_launcher(jobs, log).launch(runs, progress=Progress(runs))
    times["train_s"] = time.monotonic() - t
    if report.failed:
        raise RuntimeError(
            f"[demo] {len(report.failed)} run(s) failed: {', '.join(report.failed)}; "
            f"see their train.log under {out / 'runs'}"
        )

    t = time.monotonic()
    from launch import demo_report

    fits = demo_report.write(runs_dir=out / "runs", out_dir=out, bootstrap=spec.bootstrap, log=log)
    times["fit_s"] = time.monotonic() - t
    times["total_s"] = time.monotonic() - t0

    summary = {
        "profile": profile,
        "corpora": str(corpora),
        "vocab": str(vocab_path),
        "runs": len(runs),
        "report": str(out / "report.md"),
        "fits": str(fits),
        "times": times,
        "python": sys.version.split()[0],
    }
    (out / "demo.json").write_text(json.dumps(summary, indent=1))
    log(
        f"[demo] done in {times['total_s']:.0f} s (corpora {times['corpora_s']:.0f} s, "
        f"training {times['train_s']:.0f} s, fits {times['fit_s']:.0f} s): {out / 'report.md'}"
    )
    return summary


def _run_mt_demo(**kwargs) -> dict:
    from launch import demo_mt  # imported on demand: it needs nothing of the CPT study

    return demo_mt.run_mt_demo(**kwargs)


# Study name -> the function that runs it (keyword arguments: profile, out_dir, data_dir, log).
STUDIES: dict[str, Callable[..., dict]] = {"cpt": run_cpt_demo, "mt": _run_mt_demo}
# Study name -> (full profile's, smoke profile's) default output directory.
DEFAULT_OUT: dict[str, dict[str, str]] = {
    "cpt": {"full": "demo_out", "smoke": "demo_out/smoke"},
    "mt": {"full": "demo_out/mt", "smoke": "demo_out/mt/smoke"},
}


def run_demo(*, study: str = "cpt", out_dir: str | Path | None = None, **kwargs) -> dict:
    """Runs one of the demo studies (`STUDIES`): "cpt" (the CPT paper) or "mt" (the MT paper).

    Args:
      study: which study.
      out_dir: output directory (default `DEFAULT_OUT[study][profile]`).
      **kwargs: `profile` ("full" | "smoke"), `data_dir`, `log`, `jobs`, passed to the study.

    Returns:
      The study's summary dict (also written as `<out_dir>/demo.json`).
    """
    if study not in STUDIES:
        raise ValueError(f"unknown demo study {study!r}; choose one of {sorted(STUDIES)}")
    profile = kwargs.get("profile", "full")
    if out_dir is None:
        out_dir = DEFAULT_OUT[study].get(profile, f"demo_out/{study}/{profile}")
    return STUDIES[study](out_dir=out_dir, **kwargs)
