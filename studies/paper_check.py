"""`make paper-check`: the synthetic paper-scale study, fitted, against the papers' own numbers.

`run_paper_check(out)` writes the study (`studies.paper_study`: every run of the `cpt_paper`,
`cpt_replay`, `cpt_languages` and `mt_paper` manifests, metrics from the papers' laws with
noise), fits it with `fitting.reports.fit_all.fit_runs` (what `xlscale fit` runs; the CPT runs on the
paper's nominal N basis), and compares, row by row (`Row`):

- CPT paper: Table 2 (E, A, B, α, β of the from-scratch Chinchilla law; B', β', γ of the CPT law)
  and eqs. 8-9 (N_opt = n·C^a, D_opt = d·C^b for scratch and CPT), fitted on the nominal basis;
  the fr/ru runs of `cpt_languages` (one size each) must be refused, never fitted.
- MT paper: per model (T5-3B and T5-770M apart) and series (mixture, task, Df), the fitted law
  against the law the runs follow, as a curve (the largest relative gap over the series' Dp) and,
  where the paper prints the coefficients and four points can identify them, coefficient by
  coefficient; every model has its own series and its own baseline; Dp is in the paper's unit.
  The cross-entropy series follow a stand-in on a nats scale (`paper_truth.CE_SCALE`): no Dp unit
  makes Tables 4/6 and 3/5 both plausible at any value their printed digits allow
  (`fitting.reports.mt_paper_comparison`), so no CE coefficient is set against the paper; the
  consistency rows say why.

Tolerances (`TOLERANCES`, relative) are set for the study's noise (`paper_truth.Truth`: σ 0.001
on CPT losses, 5e-5 on MT scores and cross-entropies). A log-law's or CE law's coefficient is
compared only when the condition number κ of its fit (the Jacobian of log f in the relative
coefficients on the four fitted points) is at most `MAX_KAPPA_SIGMA`/σ: above it, 4 points with
that noise cannot pin the coefficients (the paper's own Table 3 prints such rows, e.g. α = 9.9e6),
and only the curve is compared.

    python -m studies.paper_check [--out paper_check_out] [--seed 0]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fitting import paper_quotes, printed_box
from fitting.laws import formulas as laws
from fitting.reports import cpt_comparison, mt_paper_comparison, paper_values
from fitting.reports import fit_all as pipeline
from rundir.run_record import Strategy
from studies import paper_study, paper_truth

# Relative tolerances of the CPT rows, for σ = 0.001 lognormal noise on every evaluation: about
# twice the largest error over five noise seeds. A/N^α and the allocation prefactors (eqs. 8-9's
# n, d: powers ≈ 1.4-1.9 of αA/(βB), carried over the fitted range) are the least determined.
TOLERANCES = {
    "E": 0.01,
    "A": 0.15,
    "B": 0.03,
    "alpha": 0.025,
    "beta": 0.01,
    "B'": 0.02,
    "beta'": 0.01,
    "gamma": 0.02,
    "a": 0.015,
    "b": 0.015,
    "n_coef": 0.25,
    "d_coef": 0.25,
    "mt_coef": 0.10,  # an identifiable MT coefficient
    "mt_curve": 0.01,  # the largest relative gap of a fitted MT law over its series' Dp
    "dp_unit": 0.01,
}
# Chinchilla starts: the Hoffmann grid's ranges, coarser (192 starts instead of 4,500), which the
# synthetic study's optimum sits well inside; `--full-grid` uses the default grid. (The CPT paper
# searches its starts with Optuna and refines them by L-BFGS [q:cpt.s3_3_optuna]; the grid and the
# optimiser are ours, fitting.laws.robust_fit.)
FAST_GRID = {
    "a": [0.0, 5.0, 10.0, 15.0],
    "b": [0.0, 5.0, 10.0, 15.0],
    "e": [-1.0, 0.0, 1.0],
    "alpha": [0.25, 0.75],
    "beta": [0.25, 0.75],
}
MAX_KAPPA_SIGMA = 0.5  # compare MT coefficients only where κ·σ ≤ this
CPT_LANG = "zh"
REFUSED_LANGS = ("fr", "ru")  # cpt_languages: one size each


# The verdict groups: whether the fitter recovers the laws the synthetic runs follow (a failure is
# ours, and fails the check), and whether the paper agrees with itself (a finding about the paper:
# its claims against its own tables over every value their printed digits allow, one of
# `fitting.printed_box.VERDICTS`, printed apart and never failing the check). A recovered Table 2
# cannot agree with a claim Table 2 contradicts at every value its digits allow; where the digits
# do not determine a claim, neither does a recovered Table 2.
RECOVERY = "the fitter recovers the law"
CONSISTENCY = "the paper is self-consistent"


@dataclasses.dataclass(frozen=True)
class Row:
    """One comparison: a law's parameter, the paper's (or the runs' true) value, the fitted one.

    `tolerance` is relative (None: an exact match of `paper` and `fitted`, e.g. a basis name).
    """

    law: str
    parameter: str
    paper: Any
    fitted: Any
    tolerance: float | None
    note: str = ""
    group: str = ""  # RECOVERY (the default) or CONSISTENCY

    @property
    def rel_error(self) -> float | None:
        """|fitted − paper| / |paper| (the gap itself when the paper value is 0)."""
        values = (self.paper, self.fitted)
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
            return None
        if self.paper == 0:
            return abs(self.fitted)
        return abs(self.fitted - self.paper) / abs(self.paper)

    @property
    def ok(self) -> bool:
        """Within tolerance (or equal, for exact rows)."""
        if self.tolerance is None:
            return self.paper == self.fitted
        err = self.rel_error
        return err is not None and math.isfinite(err) and err <= self.tolerance


# --- CPT ------------------------------------------------------------------------------------------


def cpt_rows(fits: Mapping[str, Any]) -> list[Row]:
    """Table 2 and eqs. 8-9 against a `fit_runs` result of the CPT runs (nominal basis)."""
    t2 = paper_values.CPT_TABLE2
    rows = [Row("all CPT fits", "N basis", t2["n_basis"], fits.get("n_basis"), None)]
    chin = fits.get("chinchilla", {}).get(CPT_LANG)
    cpt = fits.get("cpt", {}).get(CPT_LANG)
    where = f"({CPT_LANG}, nominal N)"
    if chin is None or cpt is None:
        why = fits.get("skipped", {})
        return rows + [Row(f"Table 2 {where}", "fit", "fitted", "missing", None, str(why))]
    p = chin["fit"]["params"]
    for name in ("E", "A", "B", "alpha", "beta"):
        rows.append(
            Row(f"Table 2 scratch {where}", name, t2["scratch"][name], p[name], TOLERANCES[name])
        )
    q = cpt["fit"]["params"]
    for name, key in (("B", "B'"), ("beta", "beta'"), ("gamma", "gamma")):
        rows.append(Row(f"Table 2 CPT {where}", key, t2["cpt"][name], q[name], TOLERANCES[key]))
    for law, entry in (("scratch", chin), ("cpt", cpt)):
        n_coef, a, d_coef, b = t2["eq8_9"][law]
        alloc = entry["allocation"]
        for name, value in (("n_coef", n_coef), ("a", a)):
            rows.append(Row(f"eq. 8 N_opt {law}", name, value, alloc[name], TOLERANCES[name]))
        for name, value in (("d_coef", d_coef), ("b", b)):
            rows.append(Row(f"eq. 9 D_opt {law}", name, value, alloc[name], TOLERANCES[name]))
    rows.append(
        Row(
            f"fits {where}",
            "converged",
            True,
            bool(chin["fit"]["converged"] and cpt["fit"]["converged"]),
            None,
        )
    )
    for lang in REFUSED_LANGS:
        refused = f"chinchilla/{lang}" in fits.get("skipped", {}) and lang not in fits.get(
            "chinchilla", {}
        )
        rows.append(
            Row(
                f"cpt_languages {lang} (1 size)",
                "Chinchilla law",
                "refused",
                "refused" if refused else "FITTED",
                None,
            )
        )
    return rows


def cpt_consistency_rows() -> list[Row]:
    """The CPT paper's claims against its own tables (`fitting.reports.cpt_comparison.consistency`),
    in the CONSISTENCY group: `fitted` is the claim's verdict over every value the printed digits
    allow (`ok` only when consistent), the note its words and the range."""
    return [
        Row(
            f["claim"],
            "claim vs its tables",
            printed_box.CONSISTENT,
            f["verdict"],
            None,
            f"paper: {f['paper']} ({'; '.join(paper_quotes.cite(k) for k in f['quotes'])}); "
            f"Table 2 gives: {f['table2']}; the range runs over {f['decided_by']}",
            CONSISTENCY,
        )
        for f in cpt_comparison.consistency()
    ]


# --- MT -------------------------------------------------------------------------------------------


def mt_consistency_rows() -> list[Row]:
    """The MT paper's CE tables against its BLEU tables (`fitting.reports.mt_paper_comparison`), in
    the CONSISTENCY group: whether one Dp unit makes both plausible, then each unit tried."""
    return [Row(*r, CONSISTENCY) for r in mt_paper_comparison.paper_check_rows()]


def _relative_jacobian(law: paper_truth.MTLaw, dp: np.ndarray) -> np.ndarray:
    """∂ log f / ∂ log|θ| at `dp`, by central differences (one column per coefficient)."""
    cols = []
    for name, value in law.params.items():
        h = 1e-6
        up = dict(law.params, **{name: value * (1 + h)})
        down = dict(law.params, **{name: value * (1 - h)})
        with np.errstate(invalid="ignore", divide="ignore"):
            diff = np.log(laws.predict(law.law, up, dp)) - np.log(laws.predict(law.law, down, dp))
        cols.append(diff / (2 * h))
    return np.stack(cols, axis=1)


def kappa(law: paper_truth.MTLaw, dp: Sequence[float]) -> float:
    """Condition number of the law's fit on the points `dp`, in relative coefficients."""
    jac = _relative_jacobian(law, np.asarray(dp, float))
    if not np.all(np.isfinite(jac)):
        return math.inf
    s = np.linalg.svd(jac, compute_uv=False)
    return float(s[0] / s[-1]) if s[-1] > 0 else math.inf


def _to_paper_dp(law: str, params: Mapping[str, float], ratio: float) -> dict[str, float]:
    """A law fitted on Dp' = ratio·Dp, rewritten in Dp (the paper's unit)."""
    p = dict(params)
    if law == "log_law":
        p["log_A"] = p["log_A"] + p["alpha"] * math.log(ratio)
    else:
        p["A"] = p["A"] * ratio ** -p["alpha"]
    return p


def mt_rows(fits: Mapping[str, Any], runs: Sequence[Any], *, sigma: float) -> list[Row]:
    """The MT paper's laws (and the stand-ins where it prints none) against a `fit_runs` result
    of the mt_paper runs (`runs`: the sweep's `Run`s, for each finetune's paper Dp)."""
    by_id = {r.run_id: r for r in runs}
    paper_dp = {
        run_id: paper_study.paper_dp(r, parent)
        for run_id, parent in paper_study.pretraining_runs(runs).items()
        for r in (by_id[run_id],)
    }
    expected: dict[str, set] = {}
    for r in runs:
        if r.strategy == Strategy.FINETUNE:
            key = (r.coord("mixture"), r.coord("task"), int(r.coord("finetune_tokens")))
            expected.setdefault(r.base_size, set()).add(key)
    rows: list[Row] = []
    ratios, found = [], {}
    unconverged, failed = [], []
    curve_rows, coef_rows = [], []
    for step, metric in (("bleu", "bleu"), ("ce", "loss")):
        for entry in fits.get(step, []):
            if entry["metric"] != metric:
                continue
            model, mixture, task = entry["model"], entry["pretraining"], entry["task"]
            df = int(by_id[entry["runs"][0]].coord("finetune_tokens"))  # as the manifest gives it
            found.setdefault((model, metric), set()).add((mixture, task, df))
            truth = paper_truth.mt_truth(model, mixture, task, df, metric)
            fit = entry["fit"]
            dp_true = np.sort([paper_dp[r] for r in entry["runs"]])
            ratio = float(np.median(np.asarray(fit["Dp"]) / dp_true))
            ratios.append(ratio)
            params = _to_paper_dp(truth.law, fit["params"], ratio)
            with np.errstate(invalid="ignore"):
                gap = np.max(np.abs(laws.predict(truth.law, params, dp_true) / truth(dp_true) - 1))
            label = f"{model} {mixture} {task} Df {df:.3g} {metric}"
            curve_rows.append(
                Row(label, "curve (max gap)", 0.0, float(gap), TOLERANCES["mt_curve"], truth.source)
            )
            k = kappa(truth, dp_true[: fit["n_fit"]])
            if not fit["converged"]:
                # Only a law 4 points cannot pin may end on a flat valley floor unconverged.
                (unconverged if k * sigma > MAX_KAPPA_SIGMA else failed).append(label)
            if not truth.from_paper:
                continue
            if k * sigma > MAX_KAPPA_SIGMA:
                coef_rows.append(
                    Row(
                        label,
                        "coefficients",
                        "-",
                        "-",
                        None,
                        f"{truth.source}; κ = {k:.2g}: curve only",
                    )
                )
                continue
            for name, value in truth.params.items():
                coef_rows.append(
                    Row(
                        label,
                        name,
                        value,
                        params[name],
                        TOLERANCES["mt_coef"],
                        f"{truth.source}; κ = {k:.2g}",
                    )
                )
    for size, keys in sorted(expected.items()):
        for metric in ("bleu", "loss"):
            got = found.get((size, metric), set())
            rows.append(
                Row(f"MT series of {size}", f"{metric} series", len(keys), len(got & keys), None)
            )
    rows += _baseline_rows(fits, runs)
    unit = float(np.median(ratios)) if ratios else math.nan
    rows.append(
        Row(
            "MT Dp unit",
            "fitted Dp / paper Dp",
            1.0,
            unit,
            TOLERANCES["dp_unit"],
            "paper: steps x 256 x 512; coefficients below are compared in the paper's unit",
        )
    )
    rows.append(
        Row(
            "MT fits",
            "identifiable laws not converged",
            0,
            len(failed),
            None,
            "; ".join(failed)
            or f"{len(unconverged)} unidentifiable (κσ > {MAX_KAPPA_SIGMA}) "
            "fits end unconverged on a flat valley: curve compared only",
        )
    )
    return rows + coef_rows + curve_rows


def _baseline_rows(fits: Mapping[str, Any], runs: Sequence[Any]) -> list[Row]:
    """Every series' baseline is its own model's non-pretrained run (never the other model's)."""
    own: dict[tuple, str] = {}
    for r in runs:
        if r.strategy == Strategy.FINETUNE_SCRATCH:
            own[(r.base_size, r.coord("task"), int(r.coord("finetune_tokens")))] = r.run_id
    by_id = {r.run_id: r for r in runs}
    wrong, total = 0, 0
    values: dict[tuple, float] = {}
    for entry in fits.get("bleu", []):
        if entry["metric"] != "bleu":
            continue
        df = int(by_id[entry["runs"][0]].coord("finetune_tokens"))
        key = (entry["model"], entry["task"], df)
        total += 1
        values.setdefault(key, entry["baseline"])
        others = {v for k, v in values.items() if k[1:] == key[1:] and k[0] != key[0]}
        if key not in own or entry["baseline"] is None or entry["baseline"] in others:
            wrong += 1
    return [
        Row("MT baselines", "series with their own model's baseline", total, total - wrong, None)
    ]


# --- the check ------------------------------------------------------------------------------------


def run_paper_check(
    out: str | Path,
    *,
    seed: int = 0,
    truth: paper_truth.Truth = paper_truth.Truth(),
    log: Callable[[str], None] = print,
    grid: Mapping[str, Sequence[float]] | None = FAST_GRID,
    jobs: int = 2,
) -> list[Row]:
    """Writes the synthetic paper-scale study under `out`, fits it (`fitting.reports.fit_all.fit_runs`,
    every law, no bootstrap; the CPT and MT fits in parallel with `jobs` > 1) and returns the
    rows. `grid`: the Chinchilla fits' starts (None: the default 4,500-start grid)."""
    out = Path(out)
    t0 = time.time()
    dirs = paper_study.write_paper_study(out / "runs", truth=truth, seed=seed, log=log)
    jobs_ = {
        "CPT runs on the nominal N basis": dict(
            runs_dir=dirs.cpt, out_dir=out / "fits_cpt", n_basis="nominal", grid=grid
        ),
        "MT runs": dict(runs_dir=dirs.mt, out_dir=out / "fits_mt"),
    }
    log(f"[{time.time() - t0:.0f}s] fitting (xlscale fit) the {' and the '.join(jobs_)}")
    common = dict(bootstrap=0, seed=seed)
    if jobs > 1:
        # Spawned, not forked: expanding the manifests imported JAX, which must not be forked.
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
            min(jobs, len(jobs_)), mp_context=spawn
        ) as pool:
            futures = [pool.submit(pipeline.fit_runs, **kw, **common) for kw in jobs_.values()]
            cpt, mt = (f.result() for f in futures)
    else:
        cpt, mt = (pipeline.fit_runs(**kw, **common) for kw in jobs_.values())
    log(f"[{time.time() - t0:.0f}s] comparing")
    return cpt_rows(cpt) + mt_rows(mt, dirs.mt_runs, sigma=truth.mt_sigma)


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    return f"{v:.4g}"


def _tol(row: Row) -> str:
    if row.paper == "-":
        return "-"
    return "exact" if row.tolerance is None else f"{row.tolerance:.0%}"


def _status(row: Row) -> str:
    """ok / FAIL for a recovery row; n/a for an informational one; for a claim of the paper
    (CONSISTENCY) nothing: its verdict is the `fitted` column and never fails the check."""
    if row.paper == "-":
        return "n/a"
    if row.group == CONSISTENCY:
        return ""
    return "ok" if row.ok else "FAIL"


def format_table(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table: law, parameter, paper, fitted, rel. error, tolerance,
    status (`_status`), note."""
    head = ("law", "parameter", "paper", "fitted", "rel.err", "tol", "", "note")
    body = [
        (
            r.law,
            r.parameter,
            _fmt(r.paper),
            _fmt(r.fitted),
            "" if r.rel_error is None else f"{r.rel_error:.2%}",
            _tol(r),
            _status(r),
            r.note,
        )
        for r in rows
    ]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head) - 1)]
    lines = []
    for cells in (head, *body):
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1]
        )
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m studies.paper_check`: prints the table; exit status 1 on any FAIL."""
    parser = argparse.ArgumentParser(prog="paper-check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="paper_check_out", help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="noise seed")
    parser.add_argument("--jobs", type=int, default=2, help="fit processes (1: in this one)")
    parser.add_argument(
        "--full-grid", action="store_true", help="Chinchilla fits from the 4,500-start grid"
    )
    args = parser.parse_args(argv)
    grid = None if args.full_grid else FAST_GRID
    rows = run_paper_check(args.out, seed=args.seed, grid=grid, jobs=args.jobs)
    rows = [*rows, *cpt_consistency_rows(), *mt_consistency_rows()]
    recovery = [r for r in rows if (r.group or RECOVERY) == RECOVERY]
    consistency = [r for r in rows if r.group == CONSISTENCY]
    print(f"== 1. {RECOVERY} (synthetic runs drawn from the papers' laws; FAIL fails the check)\n")
    print(format_table(recovery))
    cpt_fits = json.loads((Path(args.out) / "fits_cpt" / "fits.json").read_text())
    print("\n== The CPT paper beside these fits (what `xlscale fit` reports)\n")
    print("\n".join(cpt_comparison.comparison_lines(cpt_fits)))
    mt_fits = json.loads((Path(args.out) / "fits_mt" / "fits.json").read_text())
    print("\n== The MT paper beside these fits (what `xlscale fit` reports)\n")
    print("\n".join(mt_paper_comparison.comparison_lines(mt_fits)))
    print(f"\n== 2. {CONSISTENCY} (the paper's claims against its own tables; not our failures)\n")
    print(format_table(consistency))
    failed = [r for r in recovery if not r.ok]
    verdicts = {v: sum(r.fitted == v for r in consistency) for v in printed_box.VERDICTS}
    claims = sum(verdicts.values())
    print(
        f"\n{RECOVERY}: {len(recovery) - len(failed)}/{len(recovery)} rows ok"
        + (f", {len(failed)} FAIL" if failed else "")
        + f"\n{CONSISTENCY}, of {claims} claims over every value the printed digits allow: "
        + ", ".join(f"{n} {v}" for v, n in verdicts.items())
        + " (a recovered law cannot agree with a claim its table contradicts at every value)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
