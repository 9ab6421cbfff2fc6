"""The trainer's own step on whatever accelerator is here: step time, tokens/s, MFU, peak memory,
beside the Hugging Face peer on the same shape, built to survive a short lease.

    # a lent H100, the headline rows within 6 minutes, compiles included:
    python benchmarks/accelerator_step.py --quick --out quick.jsonl
    # any grid (remat x attention x packed per model, then the peer):
    python benchmarks/accelerator_step.py --models llama t5 --remat none full \
        --attention auto xla --packed both --budget-s 1200 --out grid.jsonl

Runs from a checkout without an install (the children get the repo root on `PYTHONPATH`), and
needs neither TensorFlow nor seqio nor gin (a test keeps it so).

How it runs (`bench_harness`): this parent process only plans and never imports JAX or torch, so
it holds no device memory; a short probe child reports the device (and, for `--quick`, the memory
model's estimate of each row's step per remat policy, below); then every configuration and
every peer is its own child process (`accelerator_rows.py`), so device memory starts fresh for
each (a torch peer's cache once starved the JAX rows), and a child dies with the parent. Each
row is printed and appended to `--out` (JSON lines: a `header` record, one `row` record per row,
a `summary` record) the moment it finishes; a failure is a row (`oom` with the size asked,
`compile_error`, `error`, `timeout`), never the end of the run. `--budget-s` bounds the whole
run: a row whose expected duration (`PRIOR_S` per kind of row, then the slowest measured row of
the same impl and model) exceeds what is left is `skipped`, and each child gets what is left as
its timeout. The JAX children share a compilation cache (`--compile-cache`, default a fresh
directory per run): the packed and unpacked rows of a configuration are one program (the
trainer's batch always carries segment ids; only the data differ), so the second loads it.

Memory settings are explicit and printed: JAX children get `XLA_PYTHON_CLIENT_PREALLOCATE`
(default true) and `XLA_PYTHON_CLIENT_MEM_FRACTION` (default 0.95). Preallocating gives XLA the
largest pool it can hold, up front, as a training job runs; JAX's default 75% is what turned a
1.1B step into an out-of-memory at 41.77 GiB. The measured peak is the allocator's high-water mark
of live buffers (`memory_stats()['peak_bytes_in_use']`), which preallocation does not inflate,
and each row owns its process, so nothing else needs the memory. `--no-preallocate` grows the
pool on demand instead (what `nvidia-smi` shows is then the real footprint). torch children get
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; their peak is
`torch.cuda.max_memory_allocated()` over the whole process.

Shapes: on an accelerator `llama2_1085m` at seq 2048 (batch 8) and `t5_770m` at inputs 512 /
targets 114 (batch 64), bf16 compute with float32 parameters, AdamW (LLaMA) or Adafactor (T5);
on CPU tiny shapes (`llama2_tiny` at seq 128, `t5_tiny` at 64/32, vocab 512) so the script stays
testable. Each xlscale row compiles the trainer's step (`trainer.jobs.compile_job`: mesh over all
devices, `NamedSharding`s, donation, the non-finite guard, token counters), feeds a synthetic
batch through `Partitioner.shard_batch` and reports the median of `--steps` timed steps after
`--warmup` steps, with XLA's `memory_analysis()` and `cost_analysis()` of the compiled step and
the memory model's estimate of the same step (`est_bytes`: `ModelFamily.memory_estimate` at
`trainer.memory_check.step_shape`, as the trainer's own memory check asks it), so every accelerator run
also validates the memory model against XLA (`xla_bytes`) and the allocator (`peak_bytes`).
LLaMA's layers are scanned (`scan_layers=True`), as at paper scale and as its memory model
assumes.

MFU = model FLOPs per step ÷ (step time × the chip's dense bf16 peak × devices). Model FLOPs are
the family's `flops_per_token(...).with_attention` per target token (LLaMA2: 6·N_non-emb +
6·layers·seq·heads·head_dim, PaLM appendix B with the causal half; T5: 6·N per stack and its
tokens plus its attention) times the target tokens of the step; MFU is a rate, so rows at
different batches compare. The peak comes from `accelerator_specs.PEAK_FLOPS` by device kind (H100/H200 989
TFLOP/s); a device not in the table prints no MFU. Packed rows hold 2-4 documents each, so the
attention kernel must keep them apart; their MFU uses the same formula at the row length.

The HF peer (`transformers.LlamaForCausalLM` with sdpa attention under `torch.compile`, or
`T5ForConditionalGeneration` eager: its relative bias defeats sdpa) runs where torch and
transformers import and, unless `--hf-on-cpu`, CUDA is there: same shape, float32 weights under
bf16 autocast, fused AdamW. It starts at the shape's batch and halves on out-of-memory. Once it
has finished, each xlscale row of its model gets `vs_hf` = xlscale tokens/s ÷ peer tokens/s.

`--quick` (default budget 360 s, 5 timed steps after 1 warm-up), in this order: LLaMA 1.1B
unpacked with the first remat policy that fits (`remat_candidates` over `--remat`, default none,
dots_saveable, full), packed with that policy, the HF `torch.compile` peer; T5-770M with the
first policy that fits, its HF peer at the largest batch it holds. `--models` narrows it (a
second lease can finish what a first one skipped). Before any row, the policies the memory model
puts over the device's `bytes_limit` are dropped (a line per model says which, with their
estimates against the limit; the header record's `remat_plan` keeps them), so a lease spends no
minute on a certain out-of-memory; the rest still fall back on a real one. Where the device
reports no limit (the CPU) nothing is dropped; where nothing is predicted to fit, the last policy
is still tried.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
CHILD = HERE / "accelerator_rows.py"  # the probe and the rows, each run as its own process
if str(HERE) not in sys.path:  # the harness beside us, also when loaded by file path
    sys.path.insert(0, str(HERE))

import bench_harness as harness  # noqa: E402
from accelerator_specs import (  # noqa: E402
    SHAPES,
    MemorySettings,
    RowSpec,
    Shape,
    is_accelerator,
    peak_flops,
)

# Remat policies by memory, most hungry (and fastest) first: the order a fitting search tries.
REMAT_ORDER = ("none", "dots_saveable", "full")
# Expected seconds of one row (child start, imports, compile, steps) by (impl, accelerator?),
# until a row of the same model has been measured. On an H100 the quick rows come to ~330 s.
PRIOR_S: dict[tuple[str, bool], float] = {
    ("xlscale", True): 60.0,
    ("hf_compile", True): 90.0,
    ("hf_eager", True): 40.0,
    ("xlscale", False): 20.0,
    ("hf_compile", False): 60.0,
    ("hf_eager", False): 30.0,
}
# Quick mode: which models also get a packed row (with the remat policy that fit unpacked).
QUICK_PACKED = {"llama": True, "t5": False}
PROBE_TIMEOUT_S = 120.0
QUICK_BUDGET_S = 360.0
MFU_FORMULA = "MFU = with-attention model FLOPs per step / (step s x peak FLOP/s x devices)"


def remat_candidates(
    shape: Shape,
    *,
    bytes_limit: float | None,
    estimate: Callable[[Shape, str], float] | None = None,
    order: Sequence[str] = REMAT_ORDER,
) -> tuple[str, ...]:
    """The remat policies to try for `shape`, in order; the first whose row does not run out of
    memory is the one used (for the packed row too).

    Given `estimate(shape, policy) -> bytes` (the memory model's bytes per device, which the
    probe child computes: `modeling.memory` through the family) and the device's `bytes_limit`,
    policies predicted not to fit are dropped, so a lease spends no minute on a certain
    out-of-memory; when none is predicted to fit, the last (leanest) is still tried. Without
    either every policy of `order` is tried, most memory-hungry (fastest) first."""
    if estimate is None or bytes_limit is None:
        return tuple(order)
    fits = tuple(policy for policy in order if estimate(shape, policy) <= bytes_limit)
    return fits or tuple(order[-1:])


@dataclasses.dataclass(frozen=True, kw_only=True)
class RematChoice:
    """The remat policies `--quick` tries for one model, and those the memory model dropped.

    Attributes:
      model: the model's name (`llama`, `t5`).
      size: its shape's size name.
      order: the policies asked for (`--remat`), in order.
      candidates: those to try, in order (`remat_candidates`).
      estimates: policy -> the memory model's bytes per device (empty: no estimate).
      kernel: the attention kernel the estimates assumed (None: no estimate).
      limit: the device's `bytes_limit` (None: unknown, as on the CPU: nothing is dropped).
      error: why there is no estimate (None: there is one, or none was asked for).
    """

    model: str
    size: str
    order: tuple[str, ...]
    candidates: tuple[str, ...]
    estimates: dict[str, float]
    kernel: str | None = None
    limit: float | None = None
    error: str | None = None

    @property
    def dropped(self) -> tuple[str, ...]:
        """The policies of `order` not tried."""
        return tuple(p for p in self.order if p not in self.candidates)

    def _est(self, policies: Sequence[str]) -> str:
        return ", ".join(f"{p} {harness.gib(self.estimates.get(p))}" for p in policies)

    def line(self) -> str:
        """One printed line: what was dropped, the estimates against the limit, what is tried."""
        head = f"memory model: {self.size}"
        trying = f"trying {', '.join(self.candidates)}"
        if not self.estimates:
            return f"{head}: no estimate ({self.error or 'not asked'}); {trying}"
        head += f" ({self.kernel} attention)"
        if self.limit is None:
            return (
                f"{head}: est. {self._est(self.order)}; no bytes_limit, nothing dropped; {trying}"
            )
        limit = f"bytes_limit {harness.gib(self.limit)}"
        if not self.dropped:
            return f"{head}: drops nothing (est. {self._est(self.order)} <= {limit}); {trying}"
        fits = any(self.estimates[p] <= self.limit for p in self.order)
        return (
            f"{head}: drops {', '.join(self.dropped)} (est. {self._est(self.dropped)} > {limit})"
            f"{'' if fits else ', nothing fits'}; {trying} (est. {self._est(self.candidates)})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The choice as JSON data (the header record's `remat_plan`)."""
        return {**dataclasses.asdict(self), "dropped": list(self.dropped)}


def remat_choice(
    model: str,
    shape: Shape,
    *,
    order: Sequence[str],
    limit: float | None,
    answer: dict[str, Any] | None,
) -> RematChoice:
    """The policies to try for `model`, from the probe's `answer` for it (`{"kernel", "bytes":
    {policy: bytes}, "error"}`; None: the probe estimated nothing)."""
    answer = answer or {}
    table = answer.get("bytes") or {}
    missing = [p for p in order if p not in table]
    error = answer.get("error")
    if table and missing:
        error = f"no estimate for {', '.join(missing)}"
    known = error is None and not missing
    return RematChoice(
        model=model,
        size=shape.size,
        order=tuple(order),
        candidates=remat_candidates(
            shape,
            bytes_limit=limit,
            estimate=(lambda _shape, policy: table[policy]) if known else None,
            order=order,
        ),
        estimates={p: table[p] for p in order} if known else {},
        kernel=answer.get("kernel") if known else None,
        limit=limit,
        error=error,
    )


def halvings(batch: int, *, times: int = 3) -> list[int]:
    """`batch` and up to `times` halvings of it (the batches a peer tries, largest first)."""
    return sorted({max(1, batch >> i) for i in range(times + 1)}, reverse=True)


@dataclasses.dataclass(frozen=True)
class Planner:
    """Turns row specs into child tasks with their environment, prior and budget key."""

    accelerator: bool
    steps: int
    warmup: int
    dtype: str
    memory: MemorySettings
    peer_device_ok: bool  # torch + transformers import, and CUDA is there (or --hf-on-cpu)
    compile_cache: str

    def task(self, spec: RowSpec) -> harness.Task:
        """The child task of one row."""
        extra = self.memory.torch_env()
        if spec.impl == "xlscale":
            extra = {**self.memory.jax_env(), **compile_cache_env(self.compile_cache)}
        return harness.Task(
            name=spec.name,
            fields=spec.fields(),
            key=f"{spec.impl}/{spec.shape.size}",
            prior_s=PRIOR_S[(spec.impl, self.accelerator)],
            argv=(sys.executable, str(CHILD), "--row", spec.to_json()),
            env=child_env(extra),
        )

    def xlscale(self, shape: Shape, *, remat: str, packed: bool, attention: str = "auto"):
        """The task of one xlscale row."""
        spec = RowSpec(
            impl="xlscale",
            shape=shape,
            remat=remat,
            attention=attention,
            packed=packed,
            dtype=self.dtype,
            steps=self.steps,
            warmup=self.warmup,
        )
        return self.task(spec)

    def peers(self, shape: Shape) -> list[harness.Task]:
        """The peer's tasks at the shape's batch and its halvings (empty: no peer here)."""
        if not self.peer_device_ok:
            return []
        impl = "hf_compile" if shape.family == "llama2" and self.accelerator else "hf_eager"
        return [
            self.task(
                RowSpec(
                    impl=impl,
                    shape=dataclasses.replace(shape, batch=b),
                    steps=self.steps,
                    warmup=self.warmup,
                )
            )
            for b in halvings(shape.batch)
        ]


def compile_cache_env(path: str) -> dict[str, str]:
    """JAX's persistent compilation cache in `path`, for every compile: the packed and unpacked
    rows of a configuration are one program (the trainer's batch always carries segment ids),
    so the second loads what the first compiled instead of spending a lease's minute on it."""
    return {
        "JAX_COMPILATION_CACHE_DIR": path,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """A child's environment: ours, the repo root first on `PYTHONPATH` (no install needed),
    plus `extra` (its memory settings)."""
    env = dict(os.environ)
    paths = [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(extra)
    return env


def plan_quick(
    session: harness.Session,
    planner: Planner,
    shapes: dict[str, Shape],
    choices: dict[str, RematChoice],
):
    """The headline rows, per model of `choices`: the first of its candidate remat policies that
    does not run out of memory, unpacked (then packed with that policy where `QUICK_PACKED`
    says), then the peer at the largest batch it holds."""
    for name, choice in choices.items():
        shape = shapes[name]
        tasks = [planner.xlscale(shape, remat=r, packed=False) for r in choice.candidates]
        fit = session.first_fit(tasks)
        if QUICK_PACKED[name] and fit is not None:
            session.run(planner.xlscale(shape, remat=fit["remat"], packed=True))
        elif QUICK_PACKED[name]:
            session.say(f"  packed {shape.size} not run: no remat policy ran unpacked")
        session.first_fit(planner.peers(shape))


def plan_grid(session: harness.Session, planner: Planner, shapes: dict[str, Shape], args):
    """Every remat x attention x packing asked for, per model, then the model's peer."""
    layouts = {"no": [False], "yes": [True], "both": [False, True]}[args.packed]
    for name in args.models:
        shape = shapes[name]
        for remat in args.remat:
            for attention in args.attention:
                for packed in layouts:
                    task = planner.xlscale(shape, remat=remat, packed=packed, attention=attention)
                    session.run(task)
        session.first_fit(planner.peers(shape))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    add = parser.add_argument
    add("--quick", action="store_true", help="the headline rows within 6 minutes on one H100")
    add("--models", nargs="+", default=["llama", "t5"], choices=["llama", "t5"])
    add("--remat", nargs="+", default=list(REMAT_ORDER), help="--quick: the order to try")
    add("--attention", nargs="+", default=["auto"])
    add("--packed", choices=["no", "yes", "both"], default="both")
    add("--dtype", default="bfloat16")
    add("--steps", type=int, help="timed steps per row (default 10; --quick 5)")
    add("--warmup", type=int, default=1, help="untimed steps before them (HF: at least 2)")
    add("--batch", type=int, help="override the shapes' batch")
    add("--no-hf", action="store_true", help="skip the Hugging Face peer")
    add("--hf-on-cpu", action="store_true", help="run the HF peer without CUDA too")
    add("--out", help="append every row to this JSON-lines file as it finishes")
    add("--logs", help="write each child's whole stdout/stderr to DIR/<row name>.log")
    add("--budget-s", type=float, help=f"whole-run wall clock (--quick: {QUICK_BUDGET_S:.0f})")
    add("--row-timeout-s", type=float, default=900.0, help="at most this long per row")
    add("--mem-fraction", type=float, default=0.95, help="XLA_PYTHON_CLIENT_MEM_FRACTION")
    add("--preallocate", action=argparse.BooleanOptionalAction, default=True)
    add("--compile-cache", help="JAX compilation cache dir (default: a fresh one per run)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, *, argv, compile_cache: str) -> list[dict]:
    """The run of `main`, its JAX children sharing `compile_cache`."""
    steps_ = args.steps or (5 if args.quick else 10)
    budget = harness.Budget(args.budget_s or (QUICK_BUDGET_S if args.quick else None))
    out = harness.JsonLines(args.out)
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    session = harness.Session(
        budget=budget, out=out, cwd=str(REPO), row_timeout_s=args.row_timeout_s, logs=args.logs
    )
    memory = MemorySettings(fraction=args.mem_fraction, preallocate=args.preallocate)
    found = run_probe(args, memory, budget)
    ok = found.get("status") == "ok"
    shapes = run_shapes(args, accelerator=ok and is_accelerator(found["backend"]))
    choices = quick_choices(args, shapes, found) if ok and args.quick else {}
    header = {
        "record": "header",
        "argv": list(argv if argv is not None else sys.argv[1:]),
        "probe": found,
        "memory": {**memory.jax_env(), **memory.torch_env()},
        "steps": steps_,
        "warmup": args.warmup,
        "budget_s": budget.total_s,
        "mfu_formula": MFU_FORMULA,
        "peak_flops": peak_flops(found.get("device_kind") or ""),
        "remat_plan": {m: choice.to_dict() for m, choice in choices.items()},
    }
    out.write(header)
    if not ok:
        session.say(f"probe failed ({found['status']}): {found.get('error')}")
        session.summary()
        raise SystemExit(1)
    planner = Planner(
        accelerator=is_accelerator(found["backend"]),
        steps=steps_,
        warmup=args.warmup,
        dtype=args.dtype,
        memory=memory,
        peer_device_ok=not args.no_hf
        and found["transformers"]
        and (found["torch_cuda"] or args.hf_on_cpu),
        compile_cache=compile_cache,
    )
    print_header(session, header, args, planner)
    for choice in choices.values():
        session.say(choice.line())
    if args.quick:
        plan_quick(session, planner, shapes, choices)
    else:
        plan_grid(session, planner, shapes, args)
    session.summary()
    return session.rows


def run_shapes(args: argparse.Namespace, *, accelerator: bool) -> dict[str, Shape]:
    """The shapes of this run on an accelerator or the CPU (`--batch` applied)."""
    shapes = {m: SHAPES[(m, accelerator)] for m in ("llama", "t5")}
    if args.batch:
        shapes = {m: dataclasses.replace(s, batch=args.batch) for m, s in shapes.items()}
    return shapes


def estimate_request(args: argparse.Namespace) -> dict[str, Any]:
    """What the probe child estimates for `--quick` (this process never imports JAX, so it
    cannot ask the memory model itself): the policies of `--remat` and, for the accelerator
    and the CPU shapes alike (which of them apply is the probe's finding), each model's row
    spec (its remat policy aside: the probe replaces it by each policy)."""
    return {
        "policies": list(args.remat),
        "rows": {
            kind: {
                m: RowSpec(impl="xlscale", shape=shape, dtype=args.dtype).to_dict()
                for m, shape in run_shapes(args, accelerator=accelerator).items()
                if m in args.models
            }
            for kind, accelerator in (("accelerator", True), ("cpu", False))
        },
    }


def quick_choices(
    args: argparse.Namespace, shapes: dict[str, Shape], found: dict[str, Any]
) -> dict[str, RematChoice]:
    """Per model asked for, the remat policies `--quick` tries: `--remat` less those the probe's
    estimates put over its `bytes_limit`."""
    answers = found.get("estimates") or {}
    return {
        m: remat_choice(
            m, shapes[m], order=args.remat, limit=found.get("bytes_limit"), answer=answers.get(m)
        )
        for m in args.models
    }


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Probes the device, runs the rows asked for (each in its own process) and returns them."""
    args = parse_args(argv)
    cache = (
        contextlib.nullcontext(args.compile_cache)
        if args.compile_cache
        else tempfile.TemporaryDirectory(prefix="xlscale-bench-cache-")
    )
    with cache as compile_cache:
        return run(args, argv=argv, compile_cache=compile_cache)


def run_probe(args, memory: MemorySettings, budget: harness.Budget) -> dict[str, Any]:
    """The probe child's findings (with its `status`): the device and, for `--quick`, the memory
    model's estimates of the rows' steps (`estimate_request`). It never preallocates."""
    mode = "jax" if args.no_hf else "torch"
    env = child_env({**memory.jax_env(), "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    left = budget.remaining()
    timeout = PROBE_TIMEOUT_S if left is None else max(1.0, min(left, PROBE_TIMEOUT_S))
    argv = (sys.executable, str(CHILD), "--probe", mode)
    if args.quick:
        argv += ("--shapes", json.dumps(estimate_request(args)))
    return harness.child_result(harness.run_child(argv, env=env, cwd=str(REPO), timeout_s=timeout))


def print_header(session: harness.Session, header: dict, args, planner: Planner) -> None:
    """The lines before the first row: device, memory settings, timing, formula, peer, budget."""
    p = header["probe"]
    peak = header["peak_flops"]
    say = session.say
    limit = "" if p["bytes_limit"] is None else f", bytes_limit {harness.gib(p['bytes_limit'])}"
    say(f"device: {p['device_count']} x {p['device_kind']} ({p['backend']}{limit}); jax {p['jax']}")
    say(
        "memory: JAX rows "
        + " ".join(f"{k}={v}" for k, v in sorted(planner.memory.jax_env().items()))
        + "; torch rows "
        + " ".join(f"{k}={v}" for k, v in sorted(planner.memory.torch_env().items()))
    )
    say(
        f"timing: median of {header['steps']} steps after {header['warmup']} warm-up, "
        f"{args.dtype} compute, float32 parameters; each row its own process"
    )
    say(f"compile cache: {planner.compile_cache} (a row's compile_s is a load when it hits)")
    say(f"{MFU_FORMULA}; peak {'unknown' if peak is None else f'{peak:.3g}'} FLOP/s per chip")
    if planner.peer_device_ok:
        say(f"peer: torch {p['torch']} on {p['torch_device'] or 'cpu'}")
    else:
        why = "--no-hf" if args.no_hf else "torch and transformers do not both import"
        if p["transformers"] and not p["torch_cuda"]:
            why = "torch sees no CUDA; --hf-on-cpu runs it on the CPU"
        say(f"peer: not run ({why})")
    budget = header["budget_s"]
    say(f"budget: {'none' if budget is None else f'{budget:.0f} s'}; out: {args.out or '-'}")


if __name__ == "__main__":
    main()
