"""xlscale's LLaMA train step beside MaxText's, both compiled ahead of time by the same jax and
libtpu for the same TPU topology and shapes; a table of XLA's own figures as ratios.

Each row compiles xlscale's step with `aot_step.py` and, when a MaxText runner is given, MaxText's
with its own `train_compile` (`--maxtext-runner RUNNER --maxtext DEST`: RUNNER is a command
`RUNNER DEST OUT.json key=value...` that compiles MaxText's step for MaxText config overrides
and writes `{"memory": {...}, "cost": {...}}` as `aot_step.py` does; DEST its MaxText setup). Every
compile runs in its own process and writes `OUT/<row>.<program>.json` (and its program,
`.hlo.txt`, to read where the bytes go); a rerun reuses the files
that exist, so a grid can be built up over several calls. The table (`OUT/table.md`) gives per
row `optimal_seconds` (XLA's estimate of the step time), its ratio, the ratios of FLOPs and bytes
accessed, per-device temporary and peak memory, and the estimated MFU of each side.

    .venv/bin/python benchmarks/aot_vs_maxtext.py --out aot_grid --rows 1085m_none 1085m_full \\
        --maxtext-runner path/to/run.sh --maxtext path/to/maxtext-setup

Fair by construction: same shape, vocabulary, global batch, dtypes (bf16 compute, f32
parameters), AdamW, pure FSDP over the topology's chips, the same remat policy, unscanned layers
(XLA's cost analysis counts a scanned body once), and `xla` attention against MaxText's
`dot_product` (a Pallas kernel is opaque to the cost model; splash vs flash rows compare only
with each other).

The T5 rows' peer is T5X (`--t5x PATHS`: its checkout and its git-only dependencies, as
PYTHONPATH entries): `t5x_step.py` compiles T5X's own step and T5.1.1 network at the same shape,
batch, microbatches and Adafactor, parameters sharded over the data axis.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aot_step  # its sibling: the chips' peak FLOP/s

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One comparison: a LLaMA size at a topology and batch, remat and attention kernel."""

    size: str
    d_model: int = 0  # the LLaMA shape MaxText is given (0: no MaxText peer, e.g. T5)
    heads: int = 0
    d_ff: int = 0
    layers: int | None = None  # None: the size's own
    topology: str  # jax's name, e.g. v5p:2x2x1
    maxtext_topology: str  # MaxText's, e.g. v5p-8 (v5p counts two TensorCores a chip)
    chips: int
    batch: int
    remat: str = "none"  # xlscale's policy; MaxText's of the same effect below
    attention: str = "xla"  # xla or splash (MaxText: dot_product or flash)
    num_slices: int = 1
    vocab: int = 32000
    seq_len: int = 2048
    scan: bool = False
    family: str = "llama2"
    inputs_len: int | None = None  # t5: the encoder length
    microbatches: int = 1  # gradient accumulation (MaxText: gradient_accumulation_steps)

    @property
    def has_peer(self) -> bool:
        """Whether MaxText compiles the same program (LLaMA rows)."""
        return self.family == "llama2" and self.d_model > 0

    @property
    def peer(self) -> str | None:
        """The trainer whose step this row sets beside xlscale's: MaxText for LLaMA, T5X (its
        own T5 network and step, `t5x_step.py`) for T5."""
        if self.has_peer:
            return "maxtext"
        return "t5x" if self.family == "t5" else None


# MaxText's policy of the same effect as xlscale's (`none` and `full` are named alike; keeping
# only the weight matmuls' outputs is MaxText's `minimal`, which saves its named projections);
# for `auto` (the policy xlscale's memory model picks) MaxText's stock least-remat policy.
MAXTEXT_REMAT = {
    "none": "none",
    "full": "full",
    "dots_with_no_batch_dims_saveable": "minimal",
    "auto": "minimal_with_context",
}
MAXTEXT_ATTENTION = {"xla": "dot_product", "splash": "flash"}
# The peers' names in the tables.
PEER_NAMES = {"maxtext": "MaxText", "t5x": "T5X (its T5.1.1 network)"}

_1085M = dict(size="llama2_1085m", d_model=1792, heads=14, d_ff=9728, layers=20)
_V5P8 = dict(topology="v5p:2x2x1", maxtext_topology="v5p-8", chips=4, batch=16)
# The larger paper sizes, at 4 sequences per chip (the paper's 2,048-sequence batches would need
# gradient accumulation on these slices).
_2791M = dict(
    size="llama2_2791m",
    d_model=2304,
    heads=18,
    d_ff=12800,
    layers=32,
    topology="v5p:2x2x2",
    maxtext_topology="v5p-16",
    chips=8,
    batch=32,
)
_5534M = dict(
    size="llama2_5534m",
    d_model=3072,
    heads=24,
    d_ff=16896,
    layers=36,
    topology="v5p:2x2x4",
    maxtext_topology="v5p-32",
    chips=16,
    batch=64,
)
ROWS: dict[str, Row] = {
    "1085m_none": Row(**_1085M, **_V5P8, remat="none"),
    "1085m_full": Row(**_1085M, **_V5P8, remat="full"),
    "1085m_auto": Row(**_1085M, **_V5P8, remat="auto"),
    "1085m_full_splash": Row(**_1085M, **_V5P8, remat="full", attention="splash"),
    # The least-remat policy whose memory is MaxText's stock policy's: only the weight matmuls'
    # outputs kept, unrolled (`auto` keeps everything there, which fits and is faster).
    "1085m_minimal": Row(**_1085M, **_V5P8, remat="dots_with_no_batch_dims_saveable"),
    # Both programs scanned: memory as a scanned run allocates it; XLA's cost analysis counts
    # the scanned layer once on both sides, so the seconds and FLOPs compare one layer and
    # everything outside the scan, alike.
    "1085m_full_scan": Row(**_1085M, **_V5P8, remat="full", scan=True),
    # The larger sizes with full remat, the policy they would run; unscanned and scanned.
    "2791m_full": Row(**_2791M, remat="full"),
    "5534m_full": Row(**_5534M, remat="full"),
    "2791m_full_scan": Row(**_2791M, remat="full", scan=True),
    "5534m_full_scan": Row(**_5534M, remat="full", scan=True),
    # Scanned, at the policies each side would run (xlscale's memory model's pick, MaxText's
    # least-remat stock policy), and the larger sizes with the Pallas kernels.
    "1085m_auto_scan": Row(**_1085M, **_V5P8, remat="auto", scan=True),
    "2791m_auto_scan": Row(**_2791M, remat="auto", scan=True),
    "5534m_auto_scan": Row(**_5534M, remat="auto", scan=True),
    "2791m_full_splash_scan": Row(**_2791M, remat="full", attention="splash", scan=True),
    "5534m_full_splash_scan": Row(**_5534M, remat="full", attention="splash", scan=True),
    # The paper's batch tokens (2M for 1-2.5B models, 4M above), by gradient accumulation on
    # both sides; each side's loop body counts once, so the seconds compare one microbatch and
    # the update.
    "1085m_none_paper": Row(**_1085M, **{**_V5P8, "batch": 1024}, remat="none", microbatches=64),
    "2791m_full_paper_scan": Row(
        **{**_2791M, "batch": 2048}, remat="full", scan=True, microbatches=64
    ),
    "5534m_full_paper_scan": Row(
        **{**_5534M, "batch": 2048}, remat="full", scan=True, microbatches=32
    ),
    "1085m_none_2slices": Row(**_1085M, **{**_V5P8, "batch": 32}, remat="none", num_slices=2),
    # T5 at the MT paper's batch (128 examples of 512 input and 114 target tokens), Adafactor,
    # the remat policy xlscale's memory model picks; T5X's step is the peer (`--t5x`).
    "t5_770m_auto": Row(
        family="t5",
        size="t5_770m",
        **{**_V5P8, "batch": 128},
        remat="auto",
        vocab=32128,
        seq_len=114,
        inputs_len=512,
    ),
    "t5_3b_auto": Row(
        family="t5",
        size="t5_3b",
        **{**_V5P8, "batch": 128},
        remat="auto",
        vocab=32128,
        seq_len=114,
        inputs_len=512,
    ),
}


def xlscale_args(row: Row, out: Path) -> list[str]:
    """`aot_step.py`'s command line for `row`."""
    return [
        sys.executable,
        str(HERE / "aot_step.py"),
        f"--family={row.family}",
        f"--size={row.size}",
        f"--topology={row.topology}",
        f"--num-slices={row.num_slices}",
        f"--batch={row.batch}",
        f"--seq-len={row.seq_len}",
        f"--remat={row.remat}",
        f"--attention={row.attention}",
        f"--vocab={row.vocab}",
        f"--microbatches={row.microbatches}",
        "--scan" if row.scan else "--no-scan",
        f"--json={out}",
        f"--hlo={out.with_suffix('.hlo.txt')}",
        *([f"--layers={row.layers}"] if row.layers else []),
        *([f"--inputs-len={row.inputs_len}"] if row.inputs_len else []),
    ]


def maxtext_overrides(row: Row, microbatches: int | None = None) -> list[str]:
    """MaxText config overrides (its `base.yml` keys) for the same program as `row`, with
    `microbatches` gradient accumulation steps (default: the row's; an `auto` row passes what
    xlscale's memory model picked, so both sides count the same loop body)."""
    microbatches = microbatches or row.microbatches
    per_device = row.batch // (row.chips * row.num_slices * microbatches)
    overrides = {
        "compile_topology": row.maxtext_topology,
        "compile_topology_num_slices": row.num_slices,
        "base_emb_dim": row.d_model,
        "base_num_query_heads": row.heads,
        "base_num_kv_heads": row.heads,
        "base_mlp_dim": row.d_ff,
        "head_dim": row.d_model // row.heads,
        "vocab_size": row.vocab,
        "max_target_length": row.seq_len,
        "dtype": "bfloat16",
        "weight_dtype": "float32",
        "base_num_decoder_layers": row.layers,
        "per_device_batch_size": per_device,
        "scan_layers": str(row.scan).lower(),
        "remat_policy": MAXTEXT_REMAT[row.remat],
        "attention": MAXTEXT_ATTENTION[row.attention],
    }
    if row.num_slices > 1:
        overrides["dcn_data_parallelism"] = row.num_slices
    if microbatches > 1:
        overrides["gradient_accumulation_steps"] = microbatches
    return [f"{k}={v}" for k, v in overrides.items()]


def t5x_args(row: Row, out: Path, microbatches: int) -> list[str]:
    """`t5x_step.py`'s command line for a T5 row: T5X's step at the same shape, batch and
    microbatches as xlscale's program (`microbatches`: what xlscale's `auto` picked)."""
    return [
        sys.executable,
        str(HERE / "t5x_step.py"),
        f"--size={row.size}",
        f"--topology={row.topology}",
        f"--batch={row.batch}",
        f"--inputs-len={row.inputs_len}",
        f"--seq-len={row.seq_len}",
        f"--vocab={row.vocab}",
        f"--microbatches={microbatches}",
        f"--json={out}",
        f"--hlo={out.with_suffix('.hlo.txt')}",
    ]


def t5x_env(paths: str) -> dict[str, str]:
    """The environment of a T5X compile: T5X's checkout and its git-only dependencies
    (`paths`, separated as PYTHONPATH is) before this repository and its benchmarks."""
    parts = [paths, str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in parts if p)}


def _run(cmd: list[str], log: Path, timeout_s: int, env: dict[str, str] | None = None) -> int:
    """Runs one compile in its own process, its output to `log`; returns the exit status."""
    with open(log, "w", encoding="utf-8") as f:
        try:
            return subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, env=env
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def _picked_microbatches(row: Row, xlscale: dict) -> int:
    """The microbatches xlscale's program ran (what its memory model picked for an `auto`
    row), for the peer to accumulate the same: each side's loop body counts once."""
    return xlscale.get("settings", {}).get("microbatches") or row.microbatches


def compile_row(name: str, row: Row, args: argparse.Namespace) -> dict[str, dict | None]:
    """Both programs of a row (from their JSON where it exists): `xlscale` and `peer` (MaxText's
    or T5X's, None where there is none or it was not given)."""
    found = {}
    for key, program in (("xlscale", "xlscale"), ("peer", row.peer)):
        out = args.out / f"{name}.{program}.json"
        if program is None:
            found[key] = None
            continue
        if not out.exists():
            env = None
            if program == "xlscale":
                cmd = xlscale_args(row, out)
            elif program == "maxtext" and args.maxtext_runner and args.maxtext and found["xlscale"]:
                cmd = ["bash", str(args.maxtext_runner), str(args.maxtext), str(out)]
                cmd += maxtext_overrides(row, _picked_microbatches(row, found["xlscale"]))
            elif program == "t5x" and args.t5x and found["xlscale"]:
                micro = _picked_microbatches(row, found["xlscale"])
                cmd, env = t5x_args(row, out, micro), t5x_env(args.t5x)
            else:
                found[key] = None
                continue
            start = time.perf_counter()
            rc = _run(cmd, args.out / f"{name}.{program}.log", args.timeout, env)
            took = time.perf_counter() - start
            print(f"  {name} {program}: exit {rc} in {took:.0f} s", flush=True)
        found[key] = json.loads(out.read_text()) if out.exists() else None
        if found[key] is not None and program == "maxtext":
            found[key] = annotate_peer(out, found[key])
    return found


# MaxText's tool compiles with a scratch output directory, recorded among its overrides.
_SCRATCH_OVERRIDE = "base_output_directory="


def annotate_peer(out: Path, result: dict) -> dict:
    """Adds to a peer's JSON (MaxText's tool writes its program beside it, `.hlo.txt`) what
    `aot_step.py` reports of xlscale's: the ops XLA could not cost and `costed_seconds`; and
    names its scratch output directory `TMPDIR`, so that no machine's path is recorded. The JSON
    is rewritten only where that changes it."""
    overrides = [
        f"{_SCRATCH_OVERRIDE}TMPDIR" if o.startswith(_SCRATCH_OVERRIDE) else o
        for o in result.get("overrides", [])
    ]
    annotated = {**result, **({"overrides": overrides} if "overrides" in result else {})}
    hlo_path = out.with_suffix(".hlo.txt")
    if "costed_seconds" not in result and hlo_path.exists():
        hlo = hlo_path.read_text(encoding="utf-8")
        cost = result.get("cost", {})
        usable, why, ops = aot_step.usability(cost, hlo)
        annotated.update(
            usable=usable,
            why_unusable=why,
            uncosted_ops=ops,
            costed_seconds=aot_step.costed_seconds(cost, hlo),
        )
    if annotated != result:
        out.write_text(json.dumps(annotated, indent=1) + "\n", encoding="utf-8")
    return annotated


def figures(result: dict | None, row: Row) -> dict | None:
    """The table's figures of one program: optimal_seconds (None when unusable), FLOPs, bytes
    accessed, temporary and peak memory (GB per device), estimated MFU (None where XLA counted
    fewer FLOPs than the model's: a partial count, `aot_step.flops_coverage`)."""
    if result is None:
        return None
    mem, cost = result["memory"], result.get("cost", {})
    peak = mem.get("peak")
    if peak is None:
        peak = (
            mem["argument_size_in_bytes"]
            + mem["output_size_in_bytes"]
            - mem["alias_size_in_bytes"]
            + mem["temp_size_in_bytes"]
        )
    seconds = cost.get("optimal_seconds")
    seconds = seconds if seconds is not None and seconds > 0 else None
    mfu = result.get("estimated_mfu")
    coverage = aot_step.flops_coverage(
        cost.get("flops"),
        row.chips * row.num_slices,
        result.get("model_flops") or 0.0,
        result.get("settings", {}).get("microbatches") or row.microbatches,  # `auto` picks some
    )
    if coverage is not None and coverage < 1.0:  # XLA counted part of the step: no MFU
        mfu = None
    return {
        "remat": result.get("settings", {}).get("remat"),
        "microbatches": result.get("settings", {}).get("microbatches", 1),
        "seconds": seconds,
        "raw_seconds": cost.get("optimal_seconds"),
        # Unusable over several slices: XLA's estimate without the custom calls it counts as
        # -1 s each (`aot_step.costed_seconds`), shown in parentheses.
        "costed": None if seconds else result.get("costed_seconds"),
        "flops": cost.get("flops"),
        "bytes": cost.get("bytes accessed"),
        "temp_gb": mem["temp_size_in_bytes"] / 1e9,
        "peak_gb": peak / 1e9,
        "mfu": mfu,
    }


def _ratio(a, b) -> str:
    return f"{a / b:.3f}" if a and b else "–"


def _num(x, fmt: str) -> str:
    return format(x, fmt) if x is not None else "unusable"


def _seconds(f: dict) -> str:
    """One program's seconds: `optimal_seconds`, or where it is unusable, `unusable` with XLA's
    estimate of what it could cost in parentheses where there is one."""
    if f.get("seconds") is None and f.get("costed"):
        return f"unusable ({f['costed']:.4f})"
    return _num(f.get("seconds"), ".4f")


def _pair(xl: dict, mt: dict | None, key: str, fmt: str) -> str:
    """`xlscale / MaxText` of one figure."""

    def one(f):
        return "–" if f is None or f.get(key) is None else format(f[key], fmt)

    return f"{one(xl)} / {one(mt)}"


def table(rows: dict[str, tuple[Row, dict, dict | None]]) -> str:
    """The markdown table of compiled rows (xlscale's figures, its peer's, their ratios)."""
    lines = [
        "| row | optimal s (xlscale / peer) | ratio | FLOPs ratio | bytes ratio "
        "| temp GB | peak GB | est. MFU |",
        "|" + "---|" * 8,
    ]
    for name, (row, xl, mt) in rows.items():
        mt_ = mt or {}
        seconds = f"{_seconds(xl)} / {_seconds(mt_) if mt else '–'}"
        ratio = _ratio(xl["seconds"], mt_.get("seconds"))
        if ratio == "–" and _ratio(xl.get("costed"), mt_.get("costed")) != "–":
            ratio = f"({_ratio(xl['costed'], mt_['costed'])})"
        # A scanned program's seconds count one layer: no MFU against the whole model's FLOPs.
        mfu = {
            k: (100 * f["mfu"] if f and f.get("mfu") and not row.scan else None)
            for k, f in (("x", xl), ("m", mt))
        }
        lines.append(
            f"| {name} | {seconds} | {ratio} "
            f"| {_ratio(xl['flops'], mt_.get('flops'))} | {_ratio(xl['bytes'], mt_.get('bytes'))} "
            f"| {_pair(xl, mt, 'temp_gb', '.2f')} | {_pair(xl, mt, 'peak_gb', '.2f')} "
            f"| {_pair({'v': mfu['x']}, {'v': mfu['m']}, 'v', '.1f')} |"
        )
    return "\n".join(lines)


def provenance(
    args: argparse.Namespace, commits: dict[str, list[str]], t5x_revision: str = "–"
) -> dict[str, str]:
    """What produced the figures: the xlscale commit of each row's program (`commits`: commit →
    rows, from each JSON), jax and libtpu versions, MaxText's revision (its setup's `REVISION`
    file, where there is one), T5X's (from its JSONs), the machine that compiled."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def package(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    if len(commits) == 1:
        commit = next(iter(commits))
    else:
        commit = "; ".join(f"{c} ({', '.join(rows)})" for c, rows in commits.items())
    revision = args.maxtext / "REVISION" if args.maxtext else None
    # libtpu installed off the import path (`make test`): its version from the dist-info beside it
    libtpu_dir = Path(os.environ.get("XLSCALE_LIBTPU", HERE.parent / ".venv/libtpu-aot/libtpu/x"))
    infos = sorted(libtpu_dir.parent.parent.glob("libtpu-*.dist-info"))
    return {
        "xlscale commit": commit or "unknown",
        "jax / jaxlib": f"{package('jax')} / {package('jaxlib')}",
        "libtpu": infos[-1].name.split("-")[1].removesuffix(".dist")
        if infos
        else package("libtpu"),
        "MaxText revision": revision.read_text().strip()[:12]
        if revision and revision.exists()
        else "–",
        "T5X revision": t5x_revision,
        "compiled on": f"{platform.machine()} CPU, {os.cpu_count()} cores, Python "
        f"{platform.python_version()} (ahead of time; no TPU)",
    }


def write_doc(path: Path, text: str, info: dict[str, str], rows: dict) -> None:
    """Writes a grid into a documentation page: provenance, the settings of each row, the table,
    as one generated block that replaces the page's previous one (the rest of the page is
    left as it is)."""
    lines = [
        "| | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info.items()),
        "",
        "| row | size | topology | chips × slices | global batch × length | remat | attention "
        "| peer |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (row, xl, _) in rows.items():
        remat, attention = xl.get("remat") or row.remat, row.attention
        if (xl.get("microbatches") or 1) > 1:
            remat += f" ({xl['microbatches']} microbatches)"
        if row.has_peer:
            remat += f" / {MAXTEXT_REMAT.get(row.remat, row.remat)}"
            attention += f" / {MAXTEXT_ATTENTION[row.attention]}"
        elif row.peer == "t5x":  # T5X's network has no remat; its attention is plain XLA
            remat += " / none"
            attention += " / xla"
        shape = f"vocab {row.vocab}" + (f", {row.layers} layers" if row.layers else "")
        length = f"{row.inputs_len} + {row.seq_len}" if row.inputs_len else f"{row.seq_len}"
        lines.append(
            f"| {name} | {row.size} ({shape}) | {row.topology} | {row.chips} × {row.num_slices} "
            f"| {row.batch} × {length} | {remat} | {attention} | {PEER_NAMES.get(row.peer, '–')} |"
        )
    lines += ["", text]
    block = "\n".join([BEGIN, *lines, END])
    page = path.read_text(encoding="utf-8") if path.exists() else ""
    if BEGIN in page and END in page:  # the page's own text stays; the block is replaced
        head, rest = page.split(BEGIN, 1)
        page = head + block + rest.split(END, 1)[1]
    else:
        page = page + ("\n" if page else "") + block + "\n"
    path.write_text(page, encoding="utf-8")


# The generated block of a documentation page (`--doc`), between these two lines.
BEGIN = "<!-- generated by benchmarks/aot_vs_maxtext.py --doc: begin -->"
END = "<!-- generated by benchmarks/aot_vs_maxtext.py --doc: end -->"


def main(argv: list[str] | None = None) -> int:
    """Compiles the chosen rows (reusing existing JSON) and prints and writes the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for each program's JSON")
    p.add_argument("--rows", nargs="+", default=list(ROWS), help=f"of {', '.join(ROWS)}")
    p.add_argument("--maxtext-runner", type=Path, help="RUNNER DEST OUT.json key=value...")
    p.add_argument("--maxtext", type=Path, help="DEST given to the runner (MaxText's setup)")
    p.add_argument("--t5x", help="T5X's checkout and its git-only dependencies (airio, "
                   "jestimator), as PYTHONPATH entries: the T5 rows' peer")  # fmt: skip
    p.add_argument("--timeout", type=int, default=1800, help="seconds per compile")
    p.add_argument("--doc", type=Path, help="also write the table with its provenance here")
    args = p.parse_args(argv)
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        print(f"--rows {' '.join(unknown)}: allowed {', '.join(ROWS)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    done = {}
    commits: dict[str, list[str]] = {}  # the commit each row's xlscale program was compiled at
    t5x_revision = "–"
    for name in args.rows:
        row = ROWS[name]
        found = compile_row(name, row, args)
        xl = figures(found["xlscale"], row)
        if xl is None:
            print(f"  {name}: xlscale did not compile (see {args.out / (name + '.xlscale.log')})")
            continue
        mt = figures(found["peer"], row)
        model_flops = found["xlscale"].get("model_flops") or 0.0
        coverage = mt and aot_step.flops_coverage(
            mt["flops"], row.chips * row.num_slices, model_flops, row.microbatches
        )
        if (
            row.has_peer
            and mt
            and mt["mfu"] is None
            and mt["seconds"]
            and coverage
            and coverage >= 1.0
        ):
            # the same program: xlscale's model FLOPs are MaxText's too (one microbatch's,
            # as the loop body counts once); not where MaxText's count is partial either
            mt["mfu"] = (
                model_flops
                / row.microbatches
                / (
                    mt["seconds"]
                    * row.chips
                    * row.num_slices
                    * aot_step.PEAK_FLOPS[row.topology.split(":")[0]]
                )
            )
        done[name] = (row, xl, mt)
        commits.setdefault(found["xlscale"].get("commit", "unknown"), []).append(name)
        if found["peer"] and found["peer"].get("t5x_revision"):
            t5x_revision = found["peer"]["t5x_revision"]
    text = table(done)
    print(text)
    (args.out / "table.md").write_text(text + "\n", encoding="utf-8")
    grid = {
        n: {
            "row": dataclasses.asdict(r),
            "xlscale": x,
            "peer": r.peer if m else None,
            "peer_figures": m,
        }
        for n, (r, x, m) in done.items()
    }
    (args.out / "grid.json").write_text(json.dumps(grid, indent=1) + "\n", encoding="utf-8")
    if args.doc:
        write_doc(args.doc, text, provenance(args, commits, t5x_revision), done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
