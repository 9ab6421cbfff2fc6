"""A run's fingerprint (the settings that define it) and the resume policy that guards it.

A `MODEL_DIR` holds one run. Its `run.json` stores `fingerprint`: the model, every `DataConfig`
field, optimizer and schedule, the step budget and the resolved total steps, seed, microbatches,
z-loss, initial checkpoint, run info, evaluation tasks, the host count, and the SHA-256 of the
vocabulary file's contents (`vocab_sha256`: the same `VOCAB_PATH` holding another SentencePiece
model would give every token another id, so no policy allows that change). Settings that do not
change results (mesh shape, logging and checkpoint periods, the attention kernel, remat, eval
period) are left out. Resuming compares the stored fingerprint with the new configuration before
anything is written, and refuses any difference unless `RESUME_POLICY` (`train.resume_policy`)
names it; an allowed change is recorded in `run.json` as an entry of `amendments`.

A policy is a comma-separated string or a list of names, each a key of `RESUME_POLICIES` or a
fingerprint key (dotted, e.g. `data.corpora_dir`) or section (`evaluation`). Some changes are
refused even when named (`GUARDS`): the model's family or size (the checkpoint holds other
shapes), and the total steps of a schedule whose shape depends on the run's length (cosine: the
learning rate would jump).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rundir import names, records, storage
from trainer import validation
from trainer.schedules import LENGTH_FREE, ScheduleConfig, build_schedule

log = logging.getLogger(__name__)

CONFIG_FILE = names.CONFIG_FILE
_ABSENT = "<absent>"
# ModelSpec overrides that change speed or memory, not results.
NEUTRAL_OVERRIDES = ("attention_kernel", "remat_policy")

# Named policies -> the fingerprint keys (or sections) they allow to change.
RESUME_POLICIES: dict[str, tuple[str, ...]] = {
    # Extend (or shorten) a run whose schedule does not depend on its length (constant, rsqrt).
    "train_steps": ("train_steps", "tokens_per_param", "param_basis", "total_steps"),
    # The corpora, vocabulary or initial checkpoint moved (same contents, new paths).
    "paths": ("data.corpora_dir", "data.vocab_path", "init_checkpoint"),
    # Evaluate other tasks or more tokens from now on (training is unaffected).
    "evaluation": ("evaluation",),
    # Continue on another number of hosts (data order then follows neither host count unless
    # `data.host_sharding` is 'global', which allows this without a policy).
    "process_count": ("process_count",),
}

# Fingerprint keys -> the gin macro that sets them, for messages.
_MACROS: dict[str, str] = {
    "model.size": "model_size",
    "data.batch_size": "batch_size",
    "data.mixture_or_task": "mixture_or_task",
    "data.task_feature_lengths": "feature_lengths",
    "data.vocab_path": "vocab_path",
    "evaluation.tasks": "eval_tasks",
    "train_steps": "train_steps",
    "tokens_per_param": "tokens_per_param",
    "param_basis": "param_basis",
    "num_microbatches": "num_microbatches",
    "vocab_sha256": "vocab_path",
}
# StepConfig fields derived from the data, not set by a run.
_DERIVED_STEP_FIELDS = ("num_components",)
# Keys added to the fingerprint after runs were started: a stored fingerprint without one cannot
# be compared on it (a warning), and is not refused for it.
ADDED_LATER: tuple[str, ...] = ("vocab_sha256", "run.finetune_recipe", "param_basis")
# The N basis runs used before `param_basis` was a setting (their steps came from the exact
# non-embedding count): a stored fingerprint without the key matches it silently.
_PARAM_BASIS_BEFORE = "non_embedding"


def _jsonable(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists, mappings dicts)."""

    def default(obj):
        if isinstance(obj, Mapping):
            return dict(obj)
        if isinstance(obj, set | frozenset):
            return sorted(obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.asdict(obj)
        return repr(obj)

    return json.loads(json.dumps(value, default=default, sort_keys=True))


def _sections(*, data: Any, optimizer: Any, schedule: Any, run: Any) -> dict[str, Any]:
    """The dataclass-valued sections, every field included (fields added later enter too)."""
    return {
        "data": dataclasses.asdict(data),
        "optimizer": dataclasses.asdict(optimizer),
        "schedule": dataclasses.asdict(schedule),
        "run": dataclasses.asdict(run),
    }


def _step_settings(step: Any) -> dict[str, Any]:
    """The train step's settings (`steps.StepConfig`), every field but the derived
    `num_components`: top-level keys, as runs have always recorded `num_microbatches` and
    `z_loss`."""
    return {k: v for k, v in dataclasses.asdict(step).items() if k not in _DERIVED_STEP_FIELDS}


def fingerprint_defaults(job: Any, *, run: Any) -> dict[str, Any]:
    """The sections of a fingerprint at their dataclasses' defaults (`check_resume`'s
    `defaults`: a setting added to the code after a run started is accepted at its default).
    `job` is the run's `trainer.jobs.JobPlan`; only the types of its sections are read."""
    return _jsonable(
        {
            **_sections(
                data=type(job.data)(),
                optimizer=type(job.optimizer)(),
                schedule=type(job.schedule)(),
                run=type(run)(),
            ),
            **_step_settings(type(job.step)()),
            "param_basis": _PARAM_BASIS_BEFORE,
        }
    )


def vocab_sha256(vocab_path: str | os.PathLike | None) -> str | None:
    """SHA-256 of the vocabulary file at `vocab_path` (`VOCAB_PATH`, local or a URL), or None
    when the run has none (its tasks were registered by the caller)."""
    if vocab_path is None:
        return None
    data = storage.as_path(vocab_path, name="VOCAB_PATH").read_bytes()
    return hashlib.sha256(data).hexdigest()


def run_fingerprint(
    job: Any,
    *,
    run: Any,
    seed: int,
    init_checkpoint: str | None,
    process_count: int | None = None,
    vocab_hash: str | None = None,
    prepared: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings that define a run, as a JSON-able dict (stored in `run.json`).

    Args:
      job: the planned job (`trainer.jobs.JobPlan`), read whole: its model spec (family, size,
        overrides minus `NEUTRAL_OVERRIDES`, dropout); its data, optimizer and schedule, every
        field included; its evaluation's tasks, split and token budget (not its period); the
        run's length as asked (`train_steps`, `tokens_per_param`, `param_basis`: the N
        `tokens_per_param` multiplies, `modeling.family.PARAM_BASES`) and the resolved
        `total_steps`; the train step's settings (`steps.StepConfig`: microbatches, z-loss), every
        field but the derived `num_components` recorded at the top level.
      run: the run's `RunInfo`, every field included.
      process_count: hosts (default: `jax.process_count()`): per-host data sharding makes the
        data order depend on it.
      vocab_hash: `vocab_sha256(data.vocab_path)`, the vocabulary's contents.
      prepared: `trainer.data.prepared_input(...)` when the batches are read from prepared
        data: its manifest digests are recorded as `data.prepared_manifests` (beside
        `data.prepared_dir`, which says which path the run reads); None: the seqio path, which
        records no such key (so runs from before prepared data resume unchanged).
    """
    if process_count is None:
        import jax

        process_count = jax.process_count()
    model, evaluation, length = job.spec, job.evaluation, job.length
    overrides = {k: v for k, v in dict(model.overrides or {}).items() if k not in NEUTRAL_OVERRIDES}
    fingerprint = {
        "model": {
            "family": model.family,
            "size": model.size,
            "overrides": overrides,
            "dropout_rate": model.dropout_rate,
        },
        **_sections(data=job.data, optimizer=job.optimizer, schedule=job.schedule, run=run),
        "evaluation": {
            "tasks": list(evaluation.tasks),
            "split": evaluation.split,
            "max_tokens": evaluation.max_tokens,
        },
        **dataclasses.asdict(length),
        "total_steps": int(job.total_steps),
        "seed": seed,
        **_step_settings(job.step),
        "init_checkpoint": init_checkpoint,
        "process_count": int(process_count),
        "vocab_sha256": vocab_hash,
    }
    if prepared is not None:  # which prepared dataset: each component's manifest digest
        fingerprint["data"]["prepared_manifests"] = dict(prepared["manifests"])
    return _jsonable(fingerprint)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and prefix.count(".") < 1:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def diff_fingerprints(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Settings that differ, as `(dotted key, old, new)` sorted by key (a key only one side has
    gets `'<absent>'` on the other; those only the old one has come last).

    Sections (`data`, `model`, ...) are compared field by field; a field's value (a list, a
    dict such as `task_feature_lengths`) is compared whole.
    """
    a, b = _flatten(_jsonable(old)), _flatten(_jsonable(new))
    changes = [(k, a.get(k, _ABSENT), v) for k, v in b.items() if a.get(k, _ABSENT) != v]
    return changes + [(k, v, _ABSENT) for k, v in a.items() if k not in b]


def parse_resume_policy(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """The names in a policy spec (`None`/'' = none; 'a,b' or ['a', 'b'])."""
    if not spec:
        return ()
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    return tuple(n.strip() for n in names if n and n.strip())


def _allowed_keys(names: Sequence[str], keys: Sequence[str]) -> tuple[str, ...]:
    """Fingerprint keys/sections the policy `names` allow; unknown names are errors."""
    sections = {k.split(".", 1)[0] for k in keys}
    allowed = []
    for name in names:
        if name in RESUME_POLICIES:
            allowed += RESUME_POLICIES[name]
        elif name in keys or name in sections:
            allowed.append(name)
        else:
            raise validation.ConfigError(
                f"RESUME_POLICY (train.resume_policy) names {name!r}, which is neither a policy "
                f"nor a fingerprint setting; allowed: policies {sorted(RESUME_POLICIES)} or "
                f"settings such as {sorted(keys)[:12]} ... (see run.json 'fingerprint')"
            )
    return tuple(allowed)


def _covers(allowed: Sequence[str], key: str) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allowed)


def _shape_guard(key, old, new, *, old_fp, new_fp, step) -> str | None:
    del key, old, new, old_fp, new_fp, step
    return "cannot change: the checkpoint holds parameters of another model; use a new MODEL_DIR"


def _length_guard(key, old, new, *, old_fp, new_fp, step) -> str | None:
    """A length-dependent schedule (cosine) cannot change its total steps mid-run."""
    del key
    old_s, new_s = old_fp.get("schedule", {}), new_fp.get("schedule", {})
    if old_s.get("name") in LENGTH_FREE and new_s.get("name") in LENGTH_FREE:
        return None
    why = (
        f"cannot change: the {old_s.get('name')!r} schedule depends on the run's length, so the "
        "learning rate would jump"
    )
    try:
        fields = {f.name for f in dataclasses.fields(ScheduleConfig)}
        at = int(step or 0)  # optimizer step of the next update (metrics step `step + 1`)
        lr_old = float(
            build_schedule(
                ScheduleConfig(**{k: v for k, v in old_s.items() if k in fields}),
                total_steps=int(old),
            )(max(at - 1, 0))
        )
        lr_new = float(
            build_schedule(
                ScheduleConfig(**{k: v for k, v in new_s.items() if k in fields}),
                total_steps=int(new),
            )(at)
        )
        why += f" from {lr_old:.3g} at step {at} to {lr_new:.3g} at step {at + 1}"
    except (TypeError, ValueError):
        pass
    return why + f"; only {sorted(LENGTH_FREE)} schedules can be extended: start a new MODEL_DIR"


def _vocab_guard(key, old, new, *, old_fp, new_fp, step) -> str | None:
    del key, step
    old_path = old_fp.get("data", {}).get("vocab_path")
    new_path = new_fp.get("data", {}).get("vocab_path")
    where = f"{new_path!r}" + (
        f" (the run started with {old_path!r})" if old_path != new_path else ""
    )
    del old, new
    return (
        f"cannot change: VOCAB_PATH {where} holds another vocabulary than the run's, so every "
        "token would get another id; give the run's vocabulary file, or start a new MODEL_DIR"
    )


def _resumed_too_far(key, old, new, *, old_fp, new_fp, step) -> str | None:
    del key, old, old_fp, new_fp
    if step is not None and isinstance(new, int) and new < step:
        return f"cannot change: the run is already at step {step}"
    return None


# Fingerprint key -> checks that refuse a change even when a policy allows it (a reason or None).
GUARDS: dict[str, tuple[Callable[..., str | None], ...]] = {
    "model.family": (_shape_guard,),
    "model.size": (_shape_guard,),
    "total_steps": (_length_guard, _resumed_too_far),
    "vocab_sha256": (_vocab_guard,),
}

# Changes allowed without a policy: key -> predicate on the new fingerprint.
IMPLICIT: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    # Global packing, and reading prepared data by index, give the same global batches whatever
    # the host count.
    "process_count": lambda fp: (
        fp.get("data", {}).get("host_sharding", "per_host") == "global"
        or fp.get("data", {}).get("prepared_dir") is not None
    ),
}


@dataclasses.dataclass(frozen=True)
class Amendment:
    """Allowed changes of a resumed run (recorded in `run.json` under `amendments`)."""

    changes: tuple[tuple[str, Any, Any], ...]
    policy: str

    def to_json(self, *, step: int) -> dict[str, Any]:
        """The `amendments` entry: from which step the new settings apply, and what changed."""
        return {
            "step": int(step),
            "changes": {key: {"old": old, "new": new} for key, old, new in self.changes},
            "policy": self.policy,
        }


def _label(key: str) -> str:
    binding = validation.BINDINGS.get(_MACROS.get(key, ""))
    return f"{key} [{binding}]" if binding else key


def check_resume(
    *,
    stored: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    policy: str | Sequence[str] | None,
    model_dir: str | os.PathLike,
    step: int | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Amendment | None:
    """Compares a resumed run's stored fingerprint with the new one.

    Args:
      stored: the fingerprint in `run.json` (None: an older run without one; resumes with a
        warning).
      new: the fingerprint of the configuration now given.
      policy: `RESUME_POLICY` (see `parse_resume_policy`).
      step: the checkpoint step being resumed (for messages and guards).
      defaults: a fingerprint of default settings: a key missing from `stored` (a setting added
        to the code since the run started) is accepted when its new value is the default.
    Returns:
      None when nothing that matters changed, else the `Amendment` to record.
    Raises:
      trainer.validation.ConfigError: listing each change not allowed (`key: old -> new`) and
        how to allow it.
    """
    names = parse_resume_policy(policy)
    allowed = _allowed_keys(names, list(_flatten(new)))
    if stored is None:
        log.warning(
            "%s: run.json has no fingerprint (a run from an older version); resuming without "
            "checking that the configuration matches",
            model_dir,
        )
        return None
    flat_defaults = _flatten(_jsonable(defaults or {}))
    recorded, refused, implicit = [], [], []
    for key, old, new_value in diff_fingerprints(stored, new):
        if old == _ABSENT and flat_defaults.get(key, _ABSENT) == new_value:
            log.info("%s: setting %s added since the run started, at its default", model_dir, key)
            continue
        if new_value == _ABSENT:
            log.warning("%s: setting %s (%r) no longer exists; ignored", model_dir, key, old)
            continue
        if old == _ABSENT and key in ADDED_LATER:
            log.warning(
                "%s: run.json's fingerprint predates %s; resuming without checking it",
                model_dir,
                key,
            )
            continue
        reasons = [
            r
            for guard in GUARDS.get(key, ())
            if (r := guard(key, old, new_value, old_fp=stored, new_fp=new, step=step))
        ]
        if reasons:
            refused.append((key, old, new_value, reasons[0]))
        elif key in IMPLICIT and IMPLICIT[key](new):
            implicit.append(key)
            recorded.append((key, old, new_value))
        elif _covers(allowed, key):
            recorded.append((key, old, new_value))
        else:
            refused.append((key, old, new_value, None))
    if refused:
        raise validation.ConfigError(_refusal(refused, model_dir=model_dir, step=step))
    if not recorded:
        return None
    policy_text = ",".join(names) + (
        f" (implicit: {', '.join(implicit)}; the global batches do not depend on the host count)"
        if implicit
        else ""
    )
    log.warning(
        "%s: resuming with amended settings (RESUME_POLICY %s): %s",
        model_dir,
        policy_text.strip() or "-",
        "; ".join(f"{k}: {o!r} -> {n!r}" for k, o, n in recorded),
    )
    return Amendment(changes=tuple(recorded), policy=policy_text.strip())


def _refusal(refused, *, model_dir, step) -> str:
    at = f" (checkpoint step {step})" if step is not None else ""
    lines = [
        f"MODEL_DIR {os.fspath(model_dir)} holds a run{at} whose settings differ from this "
        "configuration; resume refused, nothing was written:"
    ]
    for key, old, new, reason in refused:
        lines.append(f"  {_label(key)}: {old!r} -> {new!r}" + (f" ({reason})" if reason else ""))
    fixed = [key for key, _, _, reason in refused if reason is not None]
    allowable = [
        key
        for key, _, _, reason in refused
        if reason is None
        and not any(_covers(RESUME_POLICIES.get(_policy_for(key), ()), f) for f in fixed)
    ]
    if allowable:
        named = sorted({_policy_for(key) for key in allowable})
        lines.append(
            "A MODEL_DIR holds one run: start a new MODEL_DIR for a new configuration, or allow "
            f"{'the other' if fixed else 'these'} changes with --gin.RESUME_POLICY=\"'{','.join(named)}'\" (train.resume_policy;"
            f" named policies: {', '.join(sorted(RESUME_POLICIES))}); they are then recorded in "
            "run.json under 'amendments'."
        )
    return "\n".join(lines)


def _policy_for(key: str) -> str:
    """The named policy that allows `key`, else the key itself."""
    for name, keys in RESUME_POLICIES.items():
        if _covers(keys, key):
            return name
    return key


def check_model_dir(
    model_dir: str | os.PathLike,
    *,
    new: Mapping[str, Any],
    policy: str | Sequence[str] | None,
    step: int | None,
    defaults: Mapping[str, Any] | None = None,
) -> Amendment | None:
    """`check_resume` against the fingerprint in `model_dir`'s `run.json`, when the run resumes
    from its checkpoint `step` (None: a fresh run, nothing to compare). The policy is checked
    either way."""
    _allowed_keys(parse_resume_policy(policy), list(_flatten(new)))
    if step is None:
        return None
    has_run = records.has_run_json(model_dir)
    stored = records.read_run_json(model_dir).get("fingerprint") if has_run else None
    return check_resume(
        stored=stored, new=new, policy=policy, model_dir=model_dir, step=step, defaults=defaults
    )


def record_resume(
    model_dir: str | os.PathLike,
    *,
    old_info: Mapping[str, Any],
    new_info: Mapping[str, Any],
    amendment: Amendment,
    step: int,
) -> dict[str, Any]:
    """`run.json` of an amended run: the fields `fitting` reads take the new values (those of
    the initialisation stay), the new fingerprint, and the amendment appended. Also keeps the
    old `config.gin` as `config.<step>.gin` and removes a `COMPLETED` the run no longer meets.

    Returns:
      The new `run.json` contents (the caller writes it).
    """
    model_dir = storage.as_path(model_dir, name="MODEL_DIR")
    config = model_dir / CONFIG_FILE
    if config.exists():
        storage.write_text_atomic(model_dir / names.amended_config_file(step), config.read_text())
    (model_dir / names.COMPLETED_FILE).unlink(missing_ok=True)
    kept = {k: v for k, v in old_info.items() if k.startswith("init_")}
    return {
        **old_info,
        **new_info,
        **kept,
        "amendments": [*old_info.get("amendments", []), amendment.to_json(step=step)],
    }
