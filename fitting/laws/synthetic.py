"""Synthetic data from known laws: fit points and whole run directories in the trainer's format.

Tests, the benchmark and a smoke demo need runs whose true law is known, without training:
`chinchilla_points` draws (N, D, L) as the benchmark specifies, and `write_study` writes source,
scratch, CPT, replay, pretraining and finetuning run directories (run.json + metrics.jsonl, as in
docs/interfaces.md) whose eval losses follow the CPT paper's laws (its Table 2 values by default)
times lognormal noise, and whose BLEU follows the MT paper's log-law (Table 3's first row) and
downstream cross-entropy its power law's form on a nats scale (`CE`, not Table 4's coefficients,
whose printed values are 2e-5 to 2e-4 nats: `fitting.reports.mt_paper_comparison`).

With `models` (size names of the CPT paper's Table 4, e.g. `llama2_49m`), the runs are the
paper's models: losses follow the laws at the paper's nominal N (the basis we read its Table 2 as
fitted on, `fitting.reports.paper_values.CPT_TABLE2`) while run.json records the exact
non-embedding counts, as the trainer does, so a fit on the nominal basis must recover Table 2 and
one on the exact basis need not.

The laws: `SCRATCH` and `CPT` are the CPT paper's Table 2 [q:cpt.table2_scratch]
[q:cpt.table2_cpt]; `SOURCE`, the English source models' own law, is ours (made up, near the
scratch law): the paper fits no law to its source runs. `BLEU` is the MT paper's Table 3 first row;
`CE` is ours (eq. 3's form on a nats scale).

The full paper-scale study (every run of the papers' manifests, as `xlscale sweep` expands them)
is `studies.paper_study`, which needs `launch` and so lives a layer up; it uses `forgetting`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting.laws import formulas
from rundir import records as rundir_records
from rundir import storage

SCRATCH = {"E": 1.55, "A": 420.0, "B": 719.5, "alpha": 0.40, "beta": 0.30}  # CPT paper Table 2
CPT = {"E": 1.55, "A": 420.0, "alpha": 0.40, "B": 433.3, "beta": 0.20, "gamma": 0.08}  # Table 2
# Ours, not the paper's: a made-up law for the English source runs (the paper fits none to them).
SOURCE = {"E": 1.45, "A": 400.0, "B": 650.0, "alpha": 0.38, "beta": 0.29}
BLEU = {"log_A": -180.75, "alpha": 9.0, "beta": 0.75}  # MT paper Table 3, first row
CE = {"E": 0.9, "A": 60.0, "alpha": 0.2}  # eq. 3's form, 1.2-1.7 nats over Dp 2.6e9-1.3e11


def chinchilla_points(
    n: int = 200,
    *,
    seed: int = 0,
    sigma: float = 0.005,
    truth: Mapping[str, float] = SCRATCH,
    n_range: tuple[float, float] = (7e7, 1.6e10),
    d_range: tuple[float, float] = (5e9, 5e11),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, D, L): N and D log-uniform in their ranges, L the Chinchilla law times e^(σ·ε)."""
    rng = np.random.default_rng(seed)
    N = np.exp(rng.uniform(*np.log(n_range), n))
    D = np.exp(rng.uniform(*np.log(d_range), n))
    L = formulas.chinchilla(N, D, **truth) * np.exp(sigma * rng.standard_normal(n))
    return N, D, L


def _write_run(root, run_id: str, meta: dict[str, Any], records: list[dict]):
    return rundir_records.write_run(storage.as_path(root) / run_id, info=meta, records=records)


def paper_model(name: str) -> tuple[float, float, float]:
    """(nominal N, exact non-embedding N, exact total) of a size of the LLaMA2 table; the
    nominal N is the CPT paper's Table 4 size.

    Raises:
      ValueError: a size with no nominal count (not a Table 4 row).
    """
    from modeling import family

    llama = family.get("llama2")
    nominal = llama.nominal_params(name)
    if nominal is None:
        raise ValueError(f"{name!r} is not a size of the CPT paper's Table 4 (no nominal count)")
    total, non_embedding = llama.param_counts(llama.get_config(name))
    return float(nominal), float(non_embedding), float(total)


def _meta(model: str, n: float, strategy: str, **extra: Any) -> dict[str, Any]:
    meta = {
        "model": model,
        "family": "llama2",
        "params_total": n * 1.25,
        "params_non_embedding": n,
        "strategy": strategy,
        "seed": 0,
        "seq_len": 2048,
        "flops_per_token": 6 * n,
        "flops_per_token_attn": 6.5 * n,
        "gin_config": "",
        "replay_ratio": 0.0,
        "init_checkpoint": None,
        "init_step": None,
    }
    meta.update(extra)
    return meta


def _records(
    n: float,
    total_tokens: float,
    evals: int,
    components: Mapping[str, float],
    eval_losses: Mapping[str, Any],
    batch_tokens: float,
) -> list[dict]:
    """Eval records at log-spaced points of training; eval_losses maps task → f(tokens_by_task)."""
    fractions = np.geomspace(0.05, 1.0, evals)
    out = []
    for frac in fractions:
        tokens = float(total_tokens * frac)
        step = max(1, int(round(tokens / batch_tokens)))
        by_task = {c: tokens * share for c, share in components.items()}
        rec = {
            "step": step,
            "tokens": tokens,
            "tokens_by_task": by_task,
            "flops": 6 * n * tokens,
            "flops_attn": 6.5 * n * tokens,
            "learning_rate": 2e-4,
            "tokens_per_s": 1e5,
        }
        for task, fn in eval_losses.items():
            rec[f"eval/{task}/loss"] = float(fn(by_task, tokens))
            rec[f"eval/{task}/tokens"] = 1e5
        rec["train/loss"] = rec[f"eval/{next(iter(eval_losses))}/loss"]
        out.append(rec)
    return out


def write_study(
    root: str | Path,
    *,
    sizes: Sequence[float] = (3e7, 6e7, 1.2e8, 2.5e8, 5e8, 1e9),
    tokens_per_param: float = 20.0,
    evals: int = 8,
    sigma: float = 0.005,
    seed: int = 0,
    source: str = "en",
    target: str = "zh",
    replay_ratios: Sequence[float] = (0.01, 0.05, 0.2, 0.5),
    scratch: Mapping[str, float] = SCRATCH,
    cpt: Mapping[str, float] = CPT,
    source_law: Mapping[str, float] = SOURCE,
    mt: bool = True,
    models: Sequence[str] | None = None,
) -> Path:
    """Writes a CPT study (and an MT pretrain/finetune study) as run directories under `root`.

    Runs: `source_<size>` (source language from scratch), `scratch_<size>` and `cpt_<size>`
    (target language, from scratch and from the source checkpoint), `replay_<pct>` (CPT of the
    middle size with source replay), and with `mt` a 50/50 en–fr pretraining run whose checkpoints
    are finetuned on mt_en_fr (BLEU and cross-entropy follow the MT paper's laws), plus a
    finetune-from-scratch baseline.

    With `models` (Table 4 size names; `sizes` is then ignored) the runs are named after the
    models (`scratch_llama2_49m`), losses follow the laws at the nominal N, tokens are 20 ×
    the nominal N (the paper's and the manifests' budget), and run.json records the family,
    the model and its exact counts (`paper_model`).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def noisy(v: float) -> float:
        return float(v * np.exp(sigma * rng.standard_normal()))

    lm_s, lm_t = f"lm_{source}", f"lm_{target}"

    def cpt_losses(n: float) -> dict[str, Any]:
        # Target loss from the CPT law; source loss forgotten and (with replay) relearned.
        return {
            lm_t: lambda bt, t: noisy(formulas.cpt(n, bt[lm_t], **cpt)),
            lm_s: lambda bt, t: noisy(
                forgetting(n, bt.get(lm_s, 0.0), t, source_law, tokens_per_param * n)
            ),
        }

    from_scratch = (("source", source, source_law, source), ("scratch", target, scratch, None))
    if models is None:
        # name, N of the law, exact N recorded; _meta's default total (1.25 N)
        table = [(f"{i:02d}_{n:.3g}", n, n, {}) for i, n in enumerate(sizes)]
    else:
        table = []
        for name in models:
            nominal, exact, total_params = paper_model(name)
            counts = {"params_non_embedding": exact, "params_total": total_params}
            table.append((name, nominal, exact, counts))
    for name, n, n_exact, counts in table:
        total, batch = tokens_per_param * n, 2048 * 256
        for strategy, lang, law, src in from_scratch:
            task = f"lm_{lang}"
            _write_run(
                root,
                f"{strategy}_{name}",
                _meta(
                    name,
                    n_exact,
                    strategy,
                    languages=[lang],
                    target_lang=lang,
                    source_lang=src,
                    mixture_or_task=task,
                    components=[task],
                    **counts,
                ),
                _records(
                    n_exact,
                    total,
                    evals,
                    {task: 1.0},
                    {
                        task: lambda bt, t, n=n, task=task, law=law: noisy(
                            formulas.chinchilla(n, bt[task], **law)
                        )
                    },
                    batch,
                ),
            )
        _write_run(
            root,
            f"cpt_{name}",
            _meta(
                name,
                n_exact,
                "cpt",
                languages=[target],
                target_lang=target,
                source_lang=source,
                mixture_or_task=lm_t,
                components=[lm_t],
                init_checkpoint=str(root / f"source_{name}"),
                init_step=int(total / batch),
                **counts,
            ),
            _records(n_exact, total, evals, {lm_t: 1.0}, cpt_losses(n), batch),
        )
    name, n, n_exact, counts = table[len(table) // 2]
    model = name if models is not None else f"replay_{n:.3g}"
    total, batch = tokens_per_param * n, 2048 * 256
    for r in replay_ratios:
        mix = f"cpt_{target}_replay_{source}_{r * 100:g}"
        _write_run(
            root,
            f"replay_{r * 100:g}",
            _meta(
                model,
                n_exact,
                "cpt_replay",
                languages=[target, source],
                target_lang=target,
                source_lang=source,
                replay_ratio=r,
                mixture_or_task=mix,
                components=[lm_t, lm_s],
                **counts,
            ),
            _records(n_exact, total, evals, {lm_t: 1 - r, lm_s: r}, cpt_losses(n), batch),
        )
    if mt:
        _write_mt(root, rng, sigma)
    return root


def forgetting(
    n: float, source_tokens: float, tokens: float, law: Mapping[str, float], total: float
) -> float:
    """Source-language loss during CPT: a bump that replayed source tokens pull back down.

    Args:
      n: the model's N (of the law).
      source_tokens: source-language tokens replayed so far (0 without replay).
      tokens: all tokens of the CPT run so far.
      law: the source language's Chinchilla law (its loss at 20·n tokens is the start).
      total: the run's total tokens.
    """
    start = formulas.chinchilla(n, 20 * n, **law)
    frac = tokens / total
    bump = 0.6 * frac / (0.15 + frac)
    relief = formulas.chinchilla(n, max(source_tokens, 1.0), **law) - start
    return float(start + bump / (1 + 30 * source_tokens / total) + 0.05 * np.tanh(relief))


def _write_mt(root: Path, rng: np.random.Generator, sigma: float) -> None:
    """A 50/50 en–fr pretraining run, finetunes of its checkpoints on mt_en_fr, and a baseline."""
    n, batch = 7.4e8, 512 * 256
    steps = np.geomspace(2e4, 1e6, 8).astype(int)
    pre_id = "pretrain_mix_en_50_fr_50"
    recs = []
    for s in steps:
        tokens = float(s * batch)
        recs.append(
            {
                "step": int(s),
                "tokens": tokens,
                "tokens_by_task": {"span_en": tokens / 2, "span_fr": tokens / 2},
                "flops": 6 * n * tokens,
                "eval/span_en/loss": 2.0,
                "eval/span_fr/loss": 2.1,
            }
        )
    _write_run(
        root,
        pre_id,
        _meta(
            "t5_770m",
            n,
            "pretrain",
            family="t5",
            languages=["en", "fr"],
            mixture_or_task="mix_en_50_fr_50",
            components=["span_en", "span_fr"],
        ),
        recs,
    )

    def finetune(run_id: str, strategy: str, ce: float, bleu: float, **extra: Any) -> None:
        """One 300-step finetune on mt_en_fr with its final cross-entropy and BLEU."""
        rec = {
            "step": 300,
            "tokens": 300 * 128 * 512.0,
            "flops": 1.0,
            "eval/mt_en_fr/loss": ce,
            "eval/mt_en_fr/bleu": bleu,
        }
        meta = _meta(
            "t5_770m",
            n,
            strategy,
            family="t5",
            languages=["en", "fr"],
            mixture_or_task="mt_en_fr",
            components=["mt_en_fr"],
            **extra,
            train_steps=300,
        )
        _write_run(root, run_id, meta, [rec])

    for s in steps:
        dp = float(s * batch)
        bleu = float(formulas.log_law(dp, **BLEU) * np.exp(sigma * rng.standard_normal()))
        ce = float(formulas.power_law(dp, **CE) * np.exp(sigma * 0.2 * rng.standard_normal()))
        start = {"init_checkpoint": f"{root / pre_id}@{int(s)}", "init_step": int(s)}
        finetune(f"finetune_en_fr_{s}", "finetune", ce, bleu, **start)
    finetune(
        "finetune_scratch_en_fr",
        "finetune_scratch",
        float(formulas.power_law(1e9, **CE) * 1.3),
        float(formulas.log_law(1e10, **BLEU) * 0.7),
    )
