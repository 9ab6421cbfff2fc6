"""A manifest's runs as design candidates: cost in chip-hours, the points each yields, the runs
it needs first; the study model they inform; where a run's observed values are logged.

`candidates` turns expanded runs (`launch.sweep.expand`) into `fitting.design.study.Candidate`s
for `fitting.design.choose.choose`:

- key: the run's id (the same in a designed manifest, so runs already done are reused);
- cost: chip-hours on `hardware` at `mfu` (what `xlscale sweep plan --hardware` prints: computed
  FLOPs / (chips × peak × MFU) × chips / 3600); without hardware, PFLOP/s-hours of computed FLOPs
  (`Run.cost` / 3.6e18), proportional to any hardware's chip-hours;
- requires: the runs whose checkpoints it starts from (`Run.depends_on`: a CPT run its source run,
  a finetune its pretraining run, or every candidate of a pending `[[select]]`);
- points: CPT study (`BLOCK_OF_STRATEGY`): one `Point(block, (N, D))` per evaluation of the run,
  at the steps the trainer evaluates (`trainer.eval_schedule` under the run's EVAL_* macros: its
  bindings, else its gin files, else `trainer.data.EvalConfig`'s defaults), D = tokens seen by
  then (steps × batch × sequence length), the step-0 evaluation left out (D = 0 is no point of a
  power law, as in `fitting.readers.points`). N is on the fits' basis: the paper's nominal size
  where every scored run has one (`fitting.readers.model_keys.paper_basis`), else the exact
  non-embedding count. Replay runs are candidates without points: the CPT laws' fits leave them
  out, so the design never picks one for its information (pass them as `required` to keep them).
  MT study: a finetune yields one point per metric, `bleu/<series>` and `ce/<series>` at its
  pretraining checkpoint's Dp in the MT paper's units (init step × pretraining batch × 512 input
  tokens, `fitting.readers.points`): its score at the chosen validation step, not one per
  evaluation (evaluations along finetuning do not vary Dp). Pretraining and from-scratch finetunes
  yield none (the baseline is not a point of the Dp laws).

`study_model` gives the study's laws with a prior (the synthetic generator's paper values, or a
pilot fit's fits.json), `targets` the reported quantities beyond the parameters, and `run_metric`
the metrics.jsonl key that holds a block's observed value for a run (for the adaptive controller).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gin import config_parser

from fitting.design import paper_models
from fitting.design.information import Target
from fitting.design.study import Candidate, Point, StudyModel
from fitting.laws import synthetic
from launch import estimate
from launch.runs import Run
from modeling import family as family_lib
from rundir.run_record import Strategy
from trainer import data as trainer_data
from trainer import eval_schedule, gin_checks

# A PFLOP/s-hour: the cost unit without hardware (FLOPs proportional).
FLOPS_PER_UNIT = 1e15 * 3600
MT_INPUT_LENGTH = 512  # the MT paper's Dp counts 512 input tokens per sequence
# CPT study: strategy -> the block (`fitting.design.paper_models.cpt_model`) its evaluations feed.
BLOCK_OF_STRATEGY: Mapping[str, str] = {
    Strategy.SOURCE: "source",
    Strategy.SCRATCH: "scratch",
    Strategy.CPT: "cpt",
}
# MT study: the finetune metrics the design scores -> (block prefix, metrics.jsonl metric).
MT_METRICS: Mapping[str, str] = {"bleu": "bleu", "ce": "loss"}
# EVAL_* macro -> the `trainer.data.EvalConfig` field it sets.
_EVAL_MACROS: Mapping[str, str] = {
    "EVAL_PERIOD": "period",
    "EVAL_AT_START": "at_start",
    "EVAL_SCHEDULE": "schedule",
    "EVAL_LOG_POINTS": "log_points",
    "EVAL_LOG_START": "log_start",
}


@dataclasses.dataclass(frozen=True)
class _MacroRef:
    name: str


class _Values(config_parser.ParserDelegate):
    """Parses gin values: macros as `_MacroRef`s, configurable references as None (unknown)."""

    def configurable_reference(self, scoped_configurable_name, evaluate):  # noqa: D102
        return None

    def macro(self, macro_name):  # noqa: D102
        return _MacroRef(macro_name)


def _find(name: str, search_paths: Sequence[str]) -> Path | None:
    for directory in ("", *search_paths, gin_checks.CONFIGS_DIR):
        path = Path(directory) / name
        if path.is_file():
            return path
    return None


def _file_bindings(
    name: str, search_paths: Sequence[str], out: dict[str, Any], params: set, seen: set
) -> None:
    """Unscoped bindings of a gin file and its includes, in gin's order (later wins): macros
    under their name, a configurable's parameter under `selector.parameter` (also added to
    `params`)."""
    path = _find(name, search_paths)
    if path is None or path in seen:
        return
    seen.add(path)
    source = io.StringIO(path.read_text())
    source.name = str(path)
    for statement in config_parser.ConfigParser(source, _Values()):
        if isinstance(statement, config_parser.IncludeStatement):
            _file_bindings(statement.filename, search_paths, out, params, seen)
        elif isinstance(statement, config_parser.BindingStatement) and not statement.scope:
            key = statement.selector
            if statement.arg_name:
                key = f"{key}.{statement.arg_name}"
                params.add(key)
            out[key] = statement.value


def gin_macros(run: Run) -> dict[str, Any]:
    """The run's top-level gin macros as literal values: its gin files (includes followed, the
    shipped `t5x_configs/` searched last), then its bindings; a macro set to another macro reads
    that one's value, one set to a configurable call is None (unknown until gin runs it)."""
    values, params = _gin_values(run)
    return {k: v for k, v in values.items() if k not in params}


def configurable_params(run: Run, configurable: str) -> dict[str, Any]:
    """The literal values the run's gin binds to `configurable`'s parameters (e.g.
    "ScheduleConfig" matches `schedules.ScheduleConfig.name = ...`), macros resolved as in
    `gin_macros`; a parameter left unbound is absent."""
    values, _ = _gin_values(run)
    out = {}
    for key, value in values.items():
        selector, _, param = key.rpartition(".")  # a macro has no selector
        if selector.rpartition(".")[2] == configurable and value is not None:
            out[param] = value
    return out


def _gin_values(run: Run) -> tuple[dict[str, Any], set[str]]:
    """Every unscoped binding of the run's gin (`_file_bindings`, then the run's own bindings),
    resolved, and the keys that are configurables' parameters rather than macros."""
    values: dict[str, Any] = {}
    params: set[str] = set()
    seen: set[Path] = set()
    for name in run.gin_files:
        _file_bindings(name, run.gin_search_paths, values, params, seen)
    for key, text in run.bindings:
        try:
            values[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            values[key] = _MacroRef(text[1:]) if text.startswith("%") else None

    def resolve(value: Any, depth: int = 0) -> Any:
        while isinstance(value, _MacroRef) and depth < 20:
            value, depth = values.get(value.name), depth + 1
        return None if isinstance(value, _MacroRef) else value

    return {k: resolve(v) for k, v in values.items()}, params


def run_eval_steps(run: Run) -> list[int]:
    """The steps `run` evaluates at, as the trainer will (`trainer.eval_schedule.eval_steps`
    under its EVAL_* macros; evaluation counts as on, the shipped strategies all evaluate)."""
    macros = gin_macros(run)
    fields = {
        field: macros[macro]
        for macro, field in _EVAL_MACROS.items()
        if macros.get(macro) is not None
    }
    config = trainer_data.EvalConfig(tasks=("design",), **fields)
    return eval_schedule.eval_steps(config, total=run.steps)


def n_basis(runs: Sequence[Run]) -> str:
    """The N basis of the fits the runs feed: "nominal" (the paper's sizes) where every scored
    run has one, else "exact" (non-embedding counts), as `fitting.readers.model_keys` decides."""
    scored = [r for r in runs if r.strategy in BLOCK_OF_STRATEGY]
    nominal = [family_lib.get(r.family).nominal_params(r.base_size) for r in scored]
    return "nominal" if scored and all(n is not None for n in nominal) else "exact"


def n_params(run: Run, basis: str) -> float:
    """The run's N on `basis` (`n_basis`).

    Raises:
      ValueError: an exact basis and a model without parameter counts.
    """
    if basis == "nominal":
        return float(family_lib.get(run.family).nominal_params(run.base_size))
    if run.counts is None:
        raise ValueError(f"run {run.run_id}: no parameter counts for model {run.size!r}")
    return float(run.counts.params_non_embedding)


def _tokens_per_step(run: Run) -> float:
    lengths = gin_macros(run).get("TASK_FEATURE_LENGTHS") or {}
    seq_len = lengths.get("targets", run.seq_len) if isinstance(lengths, Mapping) else run.seq_len
    share = 1.0 - float(run.coord("replay_ratio", 0.0) or 0.0)
    return run.batch_size * int(seq_len) * share


def _cpt_points(run: Run, basis: str) -> tuple[Point, ...]:
    block = BLOCK_OF_STRATEGY.get(run.strategy)
    if block is None:
        return ()
    n = n_params(run, basis)
    per_step = _tokens_per_step(run)
    return tuple(Point(block, (n, s * per_step)) for s in run_eval_steps(run) if s > 0)


def series_key(run: Run) -> str:
    """The MT series a finetune belongs to: model size, pretraining mixture, task, finetuning
    steps and Df (`fitting.readers.points.downstream_series` groups by the same)."""
    df = run.coord("finetune_tokens")
    return f"{run.size}/{run.coord('mixture')}/{run.coord('task')}/{run.steps}steps/df{df}"


def paper_dp(run: Run, parent: Run) -> float:
    """The MT paper's Dp of a finetune's checkpoint: init step × pretraining batch × 512."""
    return float(run.coord("init_step")) * parent.batch_size * MT_INPUT_LENGTH


def _pretraining_run(run: Run, by_id: Mapping[str, Run]) -> Run | None:
    ids = run.depends_on
    return by_id.get(ids[0]) if ids else None


def _mt_points(run: Run, by_id: Mapping[str, Run]) -> tuple[Point, ...]:
    parent = _pretraining_run(run, by_id)
    if run.strategy != Strategy.FINETUNE or parent is None or run.coord("init_step") is None:
        return ()
    dp = paper_dp(run, parent)
    key = series_key(run)
    return tuple(Point(f"{metric}/{key}", (dp,)) for metric in _mt_metrics(run))


def _mt_metrics(run: Run) -> tuple[str, ...]:
    """BLEU for translation tasks (`mt_*`), cross-entropy for every finetune."""
    return tuple(m for m in MT_METRICS if m != "bleu" or str(run.coord("task")).startswith("mt_"))


def is_mt(runs: Sequence[Run]) -> bool:
    """Whether the runs are an MT study (pretraining and finetuning) rather than a CPT one."""
    return any(r.strategy in (Strategy.PRETRAIN, Strategy.FINETUNE) for r in runs)


def cost_fn(hardware: str | None, *, mfu: float = 0.5) -> Callable[[Run], float]:
    """Run -> its cost: chip-hours on `hardware` (a `--hardware` name, `launch.estimate`) at
    `mfu`, or without hardware PFLOP/s-hours of its computed FLOPs.

    Raises:
      ValueError: an unknown hardware name or an MFU outside (0, 1] (naming the flag).
    """
    if hardware is None:
        throughput, chips = estimate.Throughput(FLOPS_PER_UNIT / 3600, "PFLOP/s-hours"), 1
    else:
        slice_ = estimate.parse_hardware(hardware)
        throughput, chips = estimate.hardware_throughput(slice_, mfu=mfu), slice_.chips

    def cost(run: Run) -> float:
        seconds = estimate.estimate_seconds(run, throughput)
        if seconds is None:
            raise ValueError(f"run {run.run_id}: no FLOP counts for model {run.size!r}")
        return seconds * chips / 3600

    return cost


def candidates(
    runs: Sequence[Run], *, hardware: str | None = None, mfu: float = 0.5
) -> list[Candidate]:
    """The runs as design candidates (see the module docstring), in the runs' order.

    Args:
      runs: expanded runs of one manifest (`launch.sweep.expand`).
      hardware: a `--hardware` name (`8xH100`, `v5p-8`, ...): costs in its chip-hours; None:
        PFLOP/s-hours.
      mfu: model FLOPs utilisation assumed on `hardware`.
    """
    cost = cost_fn(hardware, mfu=mfu)
    by_id = {r.run_id: r for r in runs}
    mt = is_mt(runs)
    basis = n_basis(runs)
    out = []
    for r in runs:
        points = _mt_points(r, by_id) if mt else _cpt_points(r, basis)
        out.append(Candidate(r.run_id, cost(r), points, tuple(r.depends_on)))
    return out


def _series_prior(prior: Mapping[str, float] | None, block: str, law: str) -> dict[str, float]:
    default = dict(synthetic.BLEU if law == "log_law" else synthetic.CE)
    if prior is None:
        return default
    mine = {p: prior[f"{block}.{p}"] for p in default if f"{block}.{p}" in prior}
    return {**default, **mine}


def study_model(runs: Sequence[Run], prior: Mapping[str, float] | None = None) -> StudyModel:
    """The study the runs inform: the CPT laws (`paper_models.cpt_model`, the source block only
    where the runs train source models) or one BLEU and one cross-entropy law per MT series
    (`paper_models.mt_model`). `prior`: study parameters (`"scratch.alpha"`, ...) replacing the
    synthetic generator's paper values (`fitting.laws.synthetic`), e.g. from `read_prior`."""
    if is_mt(runs):
        laws = {"bleu": "log_law", "ce": "power_law"}
        series: dict[str, dict[str, dict[str, float]]] = {}
        for r in runs:
            if r.strategy == Strategy.FINETUNE:
                k = series_key(r)
                series[k] = {m: _series_prior(prior, f"{m}/{k}", laws[m]) for m in _mt_metrics(r)}
        return paper_models.mt_model(series)
    has_source = any(r.strategy == Strategy.SOURCE for r in runs)
    tables = {"scratch": synthetic.SCRATCH, "cpt": synthetic.CPT, "source": synthetic.SOURCE}
    values = {
        block: {p: (prior or {}).get(f"{block}.{p}", v) for p, v in table.items()}
        for block, table in tables.items()
    }
    if prior:  # the CPT law shares scratch's E, A, alpha
        values["cpt"].update({p: values["scratch"][p] for p in paper_models.CPT_SHARED})
    return paper_models.cpt_model(
        scratch=values["scratch"],
        cpt=values["cpt"],
        source=values["source"] if has_source else None,
    )


def read_prior(path: str | Path) -> dict[str, float]:
    """Study parameters from a pilot fit: a flat JSON object of study parameters
    (`{"scratch.alpha": 0.4, ...}`, any subset), or an MT fits.json of `xlscale fit`, whose
    `bleu` and `ce` entries (model, pretraining mixture, task, finetuning recipe, fitted params)
    become the priors of the matching series.

    Raises:
      ValueError: the file is not JSON or holds no parameters (naming `--prior` and the file).
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--prior {path}: cannot read a JSON fits file: {e}") from e
    out: dict[str, float] = {}
    if isinstance(data, Mapping) and all(isinstance(v, int | float) for v in data.values()):
        out = {k: float(v) for k, v in data.items()}
    elif isinstance(data, Mapping):
        for metric in MT_METRICS:
            for entry in data.get(metric) or ():
                steps, _, df = str(entry.get("finetune_steps", "")).partition(" steps, Df ")
                key = f"{entry.get('model')}/{entry.get('pretraining')}/{entry.get('task')}"
                key += f"/{steps}steps/df{df or None}"
                for p, v in ((entry.get("fit") or {}).get("params") or {}).items():
                    out[f"{metric}/{key}.{p}"] = float(v)
    if not out:
        hint = "; it holds lr_area fits: add --law lr_area" if "lr_area" in data else ""
        if isinstance(data, Mapping) and not hint and not set(data) & set(MT_METRICS):
            odd = {k: v for k, v in data.items() if not isinstance(v, int | float)}
            hint = f"; these values are not numbers: {odd}" if odd else ""
        raise ValueError(
            f"--prior {path}: no parameters found; give an MT fits.json of `xlscale fit` or a "
            'JSON object of study parameters, e.g. {"scratch.alpha": 0.4, "cpt.beta": 0.2}' + hint
        )
    return out


def run_metric(block: str, run: Run) -> str:
    """The metrics.jsonl key holding `run`'s observed value for `block`: source runs'
    `eval/lm_en/loss`, scratch and CPT runs' `eval/lm_<target_lang>/loss`
    (`fitting.readers.points`), a finetune's `eval/<task>/bleu` or `eval/<task>/loss`."""
    metric, _, _ = block.partition("/")
    if metric in MT_METRICS:
        return f"eval/{run.coord('task')}/{MT_METRICS[metric]}"
    if block == "source":
        return "eval/lm_en/loss"
    if block in ("scratch", "cpt"):
        return f"eval/lm_{run.coord('target_lang')}/loss"
    raise ValueError(f"no metric for block {block!r}; blocks: source, scratch, cpt, bleu/…, ce/…")


def targets(model: StudyModel, runs: Sequence[Run], cands: Sequence[Candidate]) -> list[Target]:
    """The reported quantities beyond the parameters: for CPT the compute-optimal N at the
    largest run's compute (C = 6·N·D) for the scratch and CPT laws, and the final loss of the
    largest CPT run (held out); for MT the BLEU (else the cross-entropy) of the dearest finetune
    at the largest Dp. A quantity the prior leaves undefined (a BLEU law below its Dp range) is
    left out: its width would be NaN and would stop the design."""
    scored = [(c, p) for c in cands for p in c.points[-1:]]
    if not scored:
        return []
    blocks = {b.name for b in model.blocks}
    if is_mt(runs):
        # the largest model's (dearest run's) largest Dp
        _, point = max(scored, key=lambda cp: (cp[1].inputs[0], cp[0].cost))
        _, _, key = point.block.partition("/")
        out = [
            paper_models.loss_target(model, f"{m}/{key}", point.inputs, "held_out(largest Dp)")
            for m in MT_METRICS
            if f"{m}/{key}" in blocks
        ]
    else:
        compute = max(6 * p.inputs[0] * p.inputs[1] for _, p in scored)
        laws = [b for b in ("scratch", "cpt") if b in blocks]
        out = [paper_models.allocation_target(model, b, compute) for b in laws]
        last = [(c, p) for c, p in scored if p.block == "cpt"] or scored
        _, point = max(last, key=lambda cp: cp[1].inputs)
        out.append(paper_models.loss_target(model, point.block, point.inputs, "loss(largest run)"))
    defined = [t for t in out if math.isfinite(t.value(model.prior))]
    return defined[:1] if is_mt(runs) else defined
