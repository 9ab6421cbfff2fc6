"""The CPT study (`xlscale demo`, `make demo`): a real, small CPT scaling study end to end.

On the skeleton (`studies.skeleton`): the Debian en/zh corpora (UDHR fixture for the smoke
profile), an en+zh SentencePiece vocabulary, the sweep of `launch/manifests/{demo,smoke}.toml`
(LLaMA2-shaped sizes × {source en, scratch zh, CPT zh} + CPT with en replay), then the fits
(Chinchilla on scratch, two-stage extended law on CPT, allocation, loss–compute frontiers, FLOPs
saved, transferred data, replay curves), zero-shot accuracy of the final checkpoints on local
multiple-choice tasks through lm-evaluation-harness (`studies.cpt_zeroshot`), and `report.md`
with the comparison against the paper (`studies.cpt_report`, `studies.zeroshot_report`).
"""

from __future__ import annotations

import dataclasses
import functools

from studies import cpt_report, cpt_zeroshot
from studies.skeleton import Log, Stages, StudyProfile, profile_stages

TAG = "demo"
LANGS = ("en", "zh")


@dataclasses.dataclass(frozen=True)
class Profile(StudyProfile):
    """One way to run the CPT study (`StudyProfile`), with its fits' and zero-shot settings."""

    langs: tuple[str, ...] = LANGS
    bootstrap: int = 100  # resamples of whole runs for the fits' intervals
    zeroshot_items: int = 100  # items per local zero-shot task (at most; fewer held-out passages)


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
        zeroshot_items=24,
    ),
}


def stages(spec: Profile, log: Log) -> Stages:
    """The CPT study's plug-ins for the skeleton under profile `spec`."""
    return profile_stages(
        spec,
        study="cpt",
        tag=TAG,
        vocab_name="demo",
        log=log,
        report=lambda runs_dir, out: cpt_report.write(
            runs_dir=runs_dir, out_dir=out, bootstrap=spec.bootstrap, log=log
        ),
        zeroshot=functools.partial(
            cpt_zeroshot.evaluate_study_runs, langs=spec.langs, items=spec.zeroshot_items, log=log
        ),
    )
