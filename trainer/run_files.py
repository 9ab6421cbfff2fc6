"""A run's own files: `run.json` (a `rundir.run_record.RunRecord`) and `config.gin`.

`run_record` says what the run is -- model and counts, strategy and languages, data, where its
parameters came from, the paper units -- from the compiled job and the run's settings;
`write_run_files` writes it with the fingerprint on a fresh start, and on an amended resume
keeps the old `config.gin` beside the new one and appends the amendment (`trainer.fingerprint`).

When (`RunFiles`): a fresh start writes them once its plan, compilation, initial state and input
stream succeeded, before its first step; a resume writes them at its first checkpoint, so an
amendment is recorded only once the run has trained under it (a resume refused, or diverged
before that checkpoint, leaves `run.json` and `config.gin` as they were).
This is the interface between training and fitting (docs/interfaces.md, "Training outputs").
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any

from etils import epath

from convert import grown_init, hf_checkpoints
from rundir import names, paper_units, records, storage
from rundir.run_record import RunRecord
from trainer import checkpoints as ckpt_lib
from trainer import fingerprint as fingerprint_lib
from trainer.data import DataConfig

log = logging.getLogger(__name__)


def languages(run: Any, components: Sequence[str]) -> list[str]:
    """The run's languages: as given (`RunInfo.languages`), else those of its mixture's
    components (`lm_<lang>`, `span_<lang>`, `mt_<src>_<tgt>`), in order, each once."""
    if run.languages:
        return list(run.languages)
    langs = [c.split("_", 1)[1] for c in components if c.startswith(("lm_", "span_"))]
    langs += [lang for c in components if c.startswith("mt_") for lang in c.split("_")[1:]]
    return list(dict.fromkeys(langs))


def mt_langs(run: Any, components: Sequence[str]) -> tuple[str | None, str | None]:
    """(source, target) language: as given, or those of a translation task `mt_<src>_<tgt>`."""
    if run.source_lang or run.target_lang or len(components) != 1:
        return run.source_lang, run.target_lang
    parts = components[0].split("_")
    if parts[0] == "mt" and len(parts) == 3:
        return parts[1], parts[2]
    return None, None


def run_record(
    job: Any, *, run: Any, data: DataConfig, seed: int, init: dict, gin: str
) -> RunRecord:
    """The run's record from its compiled job (`trainer.jobs.Job`), its `RunInfo`, its data,
    and `init`, the `init_*` fields of a run initialised from a checkpoint."""
    total, non_embedding = job.model.param_counts()
    source_lang, target_lang = mt_langs(run, job.components)
    return RunRecord(
        model=job.model.name,
        family=job.model.family,
        params_total=total,
        params_non_embedding=non_embedding,
        strategy=run.strategy,
        languages=tuple(languages(run, job.components)),
        target_lang=target_lang,
        source_lang=source_lang,
        replay_ratio=float(run.replay_ratio),
        mixture_or_task=data.mixture_or_task,
        components=tuple(job.components),
        init_checkpoint=init.get("init_checkpoint"),
        init_step=init.get("init_step"),
        init_params_hash=init.get("init_params_hash"),
        **grown_init.run_fields(init),  # a grown INIT_CHECKPOINT's vocabulary extension
        **hf_checkpoints.run_fields(init),  # an imported INIT_CHECKPOINT's source (hf:, Meta)
        seed=seed,
        seq_len=data.seq_len,
        task_feature_lengths=dict(data.task_feature_lengths),
        finetune_tokens=run.finetune_tokens,
        finetune_recipe=run.finetune_recipe,
        **paper_units.run_fields(
            batch_size=data.batch_size,
            task_feature_lengths=data.task_feature_lengths,
            subset_examples=data.subset_examples,
            finetune_unit=run.finetune_unit,
        ),
        batch_size=data.batch_size,
        train_steps=job.total_steps,
        flops_per_token=job.flops_per_token,
        flops_per_token_attn=job.flops_per_token_attn,
        gin_config=gin,
    )


def write_run_files(
    model_dir: epath.Path,
    *,
    record: RunRecord,
    fingerprint: dict[str, Any],
    amendment: fingerprint_lib.Amendment | None,
    resumed: bool,
    step: int,
    gin_config: str,
) -> None:
    """`config.gin` and `run.json` (with the fingerprint, and its `param_basis` and `vocab_sha256`
    as fields of their own) of a fresh run; on an amended resume
    the old `config.gin` is kept as `config.<step>.gin` and `run.json` records the amendment."""
    info = dataclasses.replace(
        record,
        param_basis=fingerprint.get("param_basis"),
        vocab_sha256=fingerprint.get("vocab_sha256"),
        fingerprint=fingerprint,
    ).to_json()
    has_run_json = records.has_run_json(model_dir)
    if amendment is not None and has_run_json:
        info = fingerprint_lib.record_resume(
            model_dir,
            old_info=records.read_run_json(model_dir),
            new_info=info,
            amendment=amendment,
            step=step,
        )
    storage.write_text_atomic(
        model_dir / names.CONFIG_FILE, gin_config or "# trainer.train called directly\n"
    )
    if not resumed or not has_run_json or amendment is not None:
        records.write_run_json(model_dir, info)


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """What `write_run_files` writes for one start of a run, held until it is due (see the
    module docstring: a fresh start before its first step, a resume at its first checkpoint).

    Attributes:
      record: the run's record (`run_record`).
      fingerprint: the settings that define the run.
      amendment: the changes this resume makes (None: none, or a fresh start).
      resumed: whether this start resumes a checkpoint of the run.
      step: the step this start begins at (an amendment applies from there).
      gin_config: the resolved gin config.
    """

    record: RunRecord
    fingerprint: dict[str, Any]
    amendment: fingerprint_lib.Amendment | None
    resumed: bool
    step: int
    gin_config: str

    def write(self, model_dir: epath.Path) -> None:
        """`write_run_files` into `model_dir`."""
        write_run_files(
            model_dir,
            record=self.record,
            fingerprint=self.fingerprint,
            amendment=self.amendment,
            resumed=self.resumed,
            step=self.step,
            gin_config=self.gin_config,
        )


# What a start writes into MODEL_DIR before its first metrics record (besides the lease).
_START_ENTRIES = (names.RUN_FILE, names.CONFIG_FILE, names.TB_SUBDIR, names.CHECKPOINTS_SUBDIR)


def entries(model_dir: epath.Path) -> frozenset[str] | None:
    """The names in a local `model_dir` now (None on object storage: nothing is removed there)."""
    if storage.is_remote(model_dir):
        return None
    try:
        return frozenset(p.name for p in model_dir.iterdir()) if model_dir.is_dir() else frozenset()
    except OSError:
        return None


def remove_refused_start(model_dir: epath.Path, *, existed: frozenset[str], created: bool) -> None:
    """A fresh start that failed before it trained anything (refused after its plan, e.g. by
    its input stream, an initial checkpoint that does not restore, a full disk, or a divergence
    before its first record) leaves `model_dir` as it found it: the run files, `tb/` and an
    uncommitted `checkpoints/` that this start created are removed, and `model_dir` itself when
    this start created it. Nothing is removed once the start wrote a metrics record or
    committed a checkpoint, nor anything that was there before it."""
    try:
        if not model_dir.is_dir() or names.METRICS_FILE in existed:
            return
        if (model_dir / names.METRICS_FILE).exists() or ckpt_lib.committed_step(
            model_dir
        ) is not None:
            return  # it trained: what it wrote is the run's
        for name in _START_ENTRIES:
            path = model_dir / name
            if name in existed or not path.exists():
                continue
            if path.is_dir():
                shutil.rmtree(os.fspath(path))
            else:
                path.unlink()
        if created:
            remove_if_empty(model_dir)
    except OSError as e:
        log.warning("%s: could not remove what the failed start wrote: %s", model_dir, e)


def remove_if_empty(model_dir: epath.Path) -> None:
    """Removes `model_dir` if it is an empty directory (a refusal leaves no empty MODEL_DIR)."""
    try:
        if model_dir.is_dir() and not any(model_dir.iterdir()):
            model_dir.rmdir()
    except OSError:
        pass  # another process wrote there meanwhile: leave it
