"""The translation study (`xlscale demo --study mt`, `make demo-mt`): the MT paper at CPU size.

The five stages of `studies.skeleton`, each cached so that a re-run reuses what is done:
  1. corpora — the Debian corpora with English and French text and the en-fr pair (built with
     `pipelines.corpora.build` if missing) for the full profile, the committed UDHR fixture for the
     smoke profile (no apt, no network);
  2. an en+fr SentencePiece vocabulary (`pipelines.vocab.train_vocab`); the trainer appends the
     100 sentinel ids of span corruption when it loads it (`load_vocab(extra_ids=100)`), so the
     model's vocabulary is the pieces plus 100 (checked against the manifest here);
  3. the sweep of the profile's manifest (`launch/manifests/{mt_demo,mt_smoke}.toml`): a T5
     pretrained by span corruption on `mix_en_50_fr_50` (alignment 1.0) and `mix_en_100` (0.7),
     keeping checkpoints along the way; each kept checkpoint finetuned on `mt_en_fr` at two
     finetuning sizes Df for the same number of steps (as the paper's 300 steps at every Df, so
     that Df, not the training length, is what differs), plus the same finetuning from random
     initialisation (the paper's black lines); run in dependency order, two at a time in worker processes on a machine with 2 or
     more cores, with progress lines and an ETA;
  4. the fits (`fitting.reports.fit_all.fit_runs`: BLEU log-law, CE power law, valuation) and `report.md`
     with the comparison against the paper (`studies.mt_report`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from launch.runs import Run
from studies import mt_report
from studies.skeleton import Log, Stages, StudyProfile, profile_stages

TAG = "demo-mt"
EXTRA_IDS = 100  # T5's span-corruption sentinels, appended to the vocabulary at load time


@dataclasses.dataclass(frozen=True)
class MtProfile(StudyProfile):
    """One way to run the translation study (`StudyProfile`: its pretraining languages, its
    translation pair; the model's vocabulary is `vocab_size` plus `EXTRA_IDS`).

    Attributes:
      data_note: what the corpora are, for the report's caveats ("": the Debian note).
    """

    langs: tuple[str, ...] = ("en", "fr")
    pairs: tuple[str, ...] = ("en-fr",)
    vocab_sentences: int | None = 100_000
    data_note: str = ""


PROFILES: dict[str, MtProfile] = {
    "full": MtProfile(
        manifest="mt_demo",
        corpora="debian",
        vocab_size=1948,
        description=(
            "T5 on Debian en/fr: 2 mixtures x 6 checkpoints x 2 Df + baselines; ~13 min on 2 cores"
        ),
        vocab_sentences=60_000,
    ),
    "smoke": MtProfile(
        manifest="mt_smoke",
        corpora="fixture",
        vocab_size=412,
        description="the same study at toy size on the committed UDHR fixture; ~3 min",
        vocab_sentences=20_000,
        data_note=(
            "The committed UDHR fixture: a few dozen aligned paragraphs of one document, so "
            "pretraining, finetuning and the held-out set are tiny and the scores mostly noise; "
            "this profile checks that the pipeline runs, not the paper's findings."
        ),
    ),
}


def check_vocab_fits(runs: Sequence[Run], vocab_path: Path) -> int:
    """The model vocabulary every run needs (pieces + sentinels); raises if a run's is smaller.

    A model vocabulary smaller than the SentencePiece pieces plus the 100 sentinels would index
    past its embedding table when span corruption emits `<extra_id_0>`.
    """
    import sentencepiece as spm

    pieces = spm.SentencePieceProcessor(model_file=str(vocab_path)).get_piece_size()
    needed = pieces + EXTRA_IDS
    for run in runs:
        size = dict(run.overrides).get("vocab_size")
        if size is not None and int(size) < needed:
            raise ValueError(
                f"[demo-mt] run {run.run_id}: model vocab_size {size} < {pieces} SentencePiece "
                f"pieces + {EXTRA_IDS} sentinel ids = {needed}; raise MODEL_OVERRIDES.vocab_size "
                "in the manifest or train a smaller vocabulary"
            )
    return needed


def stages(spec: MtProfile, log: Log) -> Stages:
    """The translation study's plug-ins for the skeleton under profile `spec`."""
    note = {"data_note": spec.data_note} if spec.data_note else {}
    return profile_stages(
        spec,
        study="mt",
        tag=TAG,
        vocab_name="mt",
        log=log,
        report=lambda runs_dir, out: mt_report.write(
            runs_dir=runs_dir, out_dir=out, log=log, **note
        ),
        check_runs=check_vocab_fits,
    )
