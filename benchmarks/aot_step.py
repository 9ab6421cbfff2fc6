"""One train step of xlscale, compiled ahead of time for a TPU topology on this CPU; XLA's own
figures for it as JSON.

XLA's TPU compiler (libtpu; `make test` installs it in `.venv/libtpu-aot/`) compiles the trainer's
own step (`trainer.jobs.compile_job` through `compiled_step`: forward, backward, AdamW, the
non-finite guard, the per-component token counts, state sharded by logical axes and donated)
for compile-only devices of a topology, and reports per-device memory (`memory_analysis()`) and
FLOPs, bytes accessed and `optimal_seconds`, its estimate of the step time
(`cost_analysis()`). No TPU is needed; the figures are estimates, to compare as ratios between
programs of equal FLOPs (`aot_vs_maxtext.py` sets them beside MaxText's).

    .venv/bin/python benchmarks/aot_step.py --size llama2_1085m --topology v5p:2x2x1 \\
        --batch 16 --remat none --attention xla --no-scan --json out.json

Writes `{"program", "settings", "memory": {argument/output/alias/temp/generated code bytes,
"peak"}, "cost": {"flops", "bytes accessed", "optimal_seconds", ...}, "model_flops",
"estimated_mfu", "usable", "why_unusable", "uncosted_ops", "costed_seconds", "compile_s"}`.
A negative or missing `optimal_seconds` makes the estimate unusable: the JSON says so (`usable:
false`) and names the ops XLA could not cost (e.g. a scatter offloaded to the SparseCore, or
the custom calls of a program over several slices), and so does the printout. Where those are
only custom calls that XLA counts as -1 second each, `costed_seconds` is its estimate of the
rest. With a scanned layer stack XLA's cost analysis counts the body once: `--no-scan`
(every layer in the program) is what a comparison uses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile for the TPU, run nothing

# Peak dense bf16 FLOP/s per chip, by the topology's generation (the chips' data sheets).
PEAK_FLOPS = {"v4": 275e12, "v5e": 197e12, "v5litepod": 197e12, "v5p": 459e12, "v6e": 918e12}
MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)
COST_FIELDS = ("flops", "bytes accessed", "optimal_seconds", "transcendentals")
# Each family's optimizer (the papers' recipes: LLaMA2 AdamW, T5 Adafactor).
DEFAULT_OPTIMIZER = {"llama2": "adamw", "t5": "adafactor"}
DEFAULT_LIBTPU = Path(__file__).resolve().parent.parent / ".venv/libtpu-aot/libtpu/libtpu.so"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: the program's shape, mesh and settings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="llama2", choices=("llama2", "t5"))
    p.add_argument("--size", default="llama2_1085m", help="a size name of the family")
    p.add_argument("--topology", default="v5p:2x2x1", help="e.g. v5p:2x2x1, v5e:4x4, v6e:2x2")
    p.add_argument("--num-slices", type=int, default=1, help="slices, data parallel over DCN")
    p.add_argument("--batch", type=int, default=16, help="global batch, sequences")
    p.add_argument("--seq-len", type=int, default=2048, help="targets length")
    p.add_argument("--inputs-len", type=int, default=None, help="t5: inputs length (--seq-len)")
    p.add_argument("--remat", default="none", help="a remat policy name, or 'auto': the policy "
                   "and microbatches xlscale's memory model picks for the chip")  # fmt: skip
    p.add_argument("--attention", default="xla", help="xla, splash, auto")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size (default: the size's)")
    p.add_argument("--layers", type=int, default=None,
                   help="layers (default: the size's; t5: of each stack)")  # fmt: skip
    p.add_argument("--dropout", type=float, default=0.0,
                   help="t5: dropout rate (0: span pretraining's, as the MT paper's runs; "
                   "finetuning's is 0.1)")  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                   help="a model config field, e.g. float32_attention_logits=false")  # fmt: skip
    p.add_argument("--scan", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (parameters stay float32)")
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--components", type=int, default=1, help="mixture components counted")
    p.add_argument("--optimizer", choices=sorted(DEFAULT_OPTIMIZER.values()), default=None,
                   help="default: the family's (llama2 adamw, t5 adafactor)")  # fmt: skip
    p.add_argument("--libtpu", default=os.environ.get("XLSCALE_LIBTPU", str(DEFAULT_LIBTPU)))
    p.add_argument("--json", help="write the result here")
    p.add_argument("--hlo", help="write the optimised program's HLO text here")
    return p.parse_args(argv)


# Custom calls XLA's TPU cost model has no figure for: each adds exactly -1 to `optimal_seconds`
# (a sentinel, not a time). A program over several slices has them: `ZeroCrop` clears a buffer's
# tile padding before it crosses the data-center network (DCN), `SliceId` reads which slice a
# chip is in.
SENTINEL_CUSTOM_CALLS = ("ZeroCrop", "SliceId")


def _sparsecore_ops(hlo: str) -> list[str]:
    """The ops of `hlo` run on the SparseCore (a scatter offloaded there reports an unknown
    cost), by the JAX op that made them (`op_name` metadata) or else the instruction's name."""
    found = set()
    for line in hlo.splitlines():
        if 'execution_thread="sparsecore"' not in line:
            continue
        named = re.search(r'op_name="([^"]+)"', line)
        head = line.strip().split("=", 1)[0].strip()
        if named:
            found.add(named.group(1))
        elif head.startswith("%"):
            found.add(head)
    return sorted(found)


def sentinel_custom_calls(hlo: str) -> list[str]:
    """The custom calls of `hlo` whose cost XLA reports as -1 each (`SENTINEL_CUSTOM_CALLS`),
    as `target (instruction)`."""
    found = []
    for line in hlo.splitlines():
        target = re.search(r'custom_call_target="([^"]+)"', line)
        if target and target.group(1) in SENTINEL_CUSTOM_CALLS:
            head = line.strip().removeprefix("ROOT ").split("=", 1)[0].strip()
            found.append(f"{target.group(1)} ({head})")
    return sorted(found)


def uncosted_ops(hlo: str) -> list[str]:
    """The ops of `hlo` (optimised HLO text) that XLA's TPU cost model cannot price: those run
    on the SparseCore (by the JAX op that made them, e.g. `jit(train_step)/.../scatter-add`, or
    the instruction's name), then the custom calls it prices at -1 each
    (`SENTINEL_CUSTOM_CALLS`)."""
    return _sparsecore_ops(hlo) + sentinel_custom_calls(hlo)


def costed_seconds(cost: dict, hlo: str) -> float | None:
    """XLA's estimate for the ops it could cost, where all it could not cost are custom calls
    that add -1 each (`SENTINEL_CUSTOM_CALLS`): `optimal_seconds` with those taken back. None
    where there are none, where a SparseCore op (of unknown cost) is among them, or where what
    is left is not a time. Over several slices it is the step without the wait for the network
    between slices: the transfers across it are host sends and receives, which add next to
    nothing to the estimate (a 0.8 MB gradient's all-reduce across two v5p slices: 5
    microseconds)."""
    seconds = cost.get("optimal_seconds")
    sentinels = sentinel_custom_calls(hlo)
    if seconds is None or not sentinels or _sparsecore_ops(hlo):
        return None
    rest = seconds + len(sentinels)
    return rest if rest > 0 else None


def usability(cost: dict, hlo: str, *, num_slices: int = 1) -> tuple[bool, str | None, list[str]]:
    """`(usable, why not, uncosted ops)` of a cost analysis: `optimal_seconds` must be present
    and positive; where it is not, the reason names the ops XLA could not cost."""
    seconds = cost.get("optimal_seconds")
    ops = uncosted_ops(hlo)
    if seconds is None:
        return False, "cost_analysis() has no optimal_seconds", ops
    if not seconds > 0:
        named = f": ops XLA could not cost: {_summary(ops)}" if ops else ""
        if not ops and num_slices > 1:
            named = f": collectives across the {num_slices} slices (DCN) have no cost estimate"
        return False, f"optimal_seconds = {seconds:.4g} (not a time){named}", ops
    return True, None, ops


def _summary(ops: list[str], most: int = 5) -> str:
    """`ops` for a message: each kind once with its count (`ZeroCrop x4`), the first `most`."""
    counts: dict[str, int] = {}
    for op in ops:
        kind = op.split(" (", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in list(counts.items())[:most])


def _chip_generation(topology: str) -> str:
    return topology.split(":", 1)[0].split("-", 1)[0]


def _auto_remat(args: argparse.Namespace, built, optimizer) -> tuple[str, int]:
    """The remat policy and microbatches xlscale's memory model picks for this step on the
    topology's chip: the first policy in the planner's order (`modeling.memory.policy_order`),
    then the fewest microbatches, whose estimate fits (`modeling.step_memory.plan`, as
    `trainer.memory_check` advises)."""
    from modeling import family as family_lib
    from modeling import memory, step_memory
    from trainer import memory_check

    wrapper, partitioner, _ = built
    chip = memory.get_chip(_chip_generation(args.topology), flag="--topology")
    shape = memory_check.step_shape(
        model=wrapper,
        partitioner=partitioner,
        batch_size=args.batch,
        seq_len=args.seq_len,
        feature_lengths=(
            {"inputs": _inputs_len(args), "targets": args.seq_len} if _inputs_len(args) else None
        ),
        optimizer=optimizer,
        num_microbatches=args.microbatches,
    )
    family = family_lib.get(args.family)
    plan = step_memory.plan(family, wrapper.config, shape=shape, limit=chip.usable)
    return plan.remat_policy, plan.num_microbatches


def compile_program(args: argparse.Namespace) -> dict:
    """Compiles the step `args` describes and returns its figures (the JSON's fields)."""
    import compiled_step
    from jax.experimental import topologies

    from trainer import jobs, model_spec, steps
    from trainer.optimizers import OptimizerConfig
    from trainer.partitioning import MeshConfig
    from trainer.schedules import ScheduleConfig

    topology = topologies.get_topology_desc(
        args.topology, platform="tpu", num_slices=args.num_slices
    )
    devices = topology.devices
    per_slice = len(devices) // args.num_slices
    slices = {"num_slices": args.num_slices} if args.num_slices > 1 else {}
    mesh = MeshConfig(data=1, fsdp=per_slice, model=1, **slices)
    overrides = {"dtype": args.dtype}
    if args.family == "llama2":  # T5's stacks always run unrolled
        overrides["scan_layers"] = args.scan
    if args.vocab:
        overrides["vocab_size"] = args.vocab
    if args.family == "t5":
        overrides["dropout_rate"] = args.dropout
    if args.layers and args.family == "t5":  # each stack: the encoder's and the decoder's
        overrides.update(num_encoder_layers=args.layers, num_decoder_layers=args.layers)
    elif args.layers:
        overrides["num_layers"] = args.layers
    for item in args.set:  # a model config field, e.g. float32_attention_logits=false
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value)
    optimizer = OptimizerConfig(name=args.optimizer or DEFAULT_OPTIMIZER[args.family])

    def build(remat: str):
        spec = model_spec.ModelSpec(
            family=args.family,
            size=args.size,
            overrides={**overrides, "remat_policy": remat},
            attention_kernel=args.attention,
        )
        return jobs.build_partitioned_model(spec, mesh, devices=devices)

    remat, microbatches = args.remat, args.microbatches
    if remat == "auto":
        remat, microbatches = _auto_remat(args, build("none"), optimizer)
    built = build(remat)
    wrapper = built[0]
    start = time.perf_counter()
    job = compiled_step.compile_train_step(
        built,
        batch_size=args.batch,
        seq_len=args.seq_len,
        feature_lengths=(
            {"inputs": _inputs_len(args), "targets": args.seq_len} if _inputs_len(args) else None
        ),
        optimizer=optimizer,
        schedule=ScheduleConfig(),
        step_config=steps.StepConfig(num_microbatches=microbatches, num_components=args.components),
        components=[f"c{k}" for k in range(args.components)],
        total_steps=1000,
    )
    compile_s = time.perf_counter() - start
    memory, cost, (usable, why, ops), costed = compiled_figures(
        job.train_step, hlo_path=args.hlo, num_slices=args.num_slices
    )
    model_flops = _model_flops(wrapper, args)
    peak = PEAK_FLOPS.get(_chip_generation(args.topology))
    coverage = flops_coverage(cost.get("flops"), len(devices), model_flops, microbatches)
    mfu = (
        estimated_mfu(model_flops, cost["optimal_seconds"], len(devices) * peak, microbatches)
        if usable and peak and coverage is not None and coverage >= 1.0
        else None
    )
    return {
        "program": "xlscale",
        "settings": {
            **recorded_paths(vars(args)),
            "remat": remat,
            "microbatches": microbatches,
            "devices": len(devices),
        },
        "device_kind": devices[0].device_kind,
        "commit": source_commit(),
        "compile_s": compile_s,
        "memory": memory,
        "cost": cost,
        "model_flops": model_flops,
        "estimated_mfu": mfu,
        "flops_coverage": coverage,
        "counts": "one microbatch (a loop body counts once)" if microbatches > 1 else "the step",
        "usable": usable,
        "why_unusable": why,
        "uncosted_ops": ops,
        "costed_seconds": costed,
    }


def compiled_figures(
    compiled, *, hlo_path: str | None = None, num_slices: int = 1
) -> tuple[dict, dict, tuple[bool, str | None, list[str]], float | None]:
    """XLA's figures of a compiled program: per-device memory (with the peak: arguments +
    outputs − aliased + temporaries), the cost analysis's fields, `usability` and
    `costed_seconds`; the optimised HLO text is written to `hlo_path` when given."""
    mem = compiled.memory_analysis()
    memory = {f: int(getattr(mem, f)) for f in MEMORY_FIELDS}
    memory["peak"] = (
        memory["argument_size_in_bytes"]
        + memory["output_size_in_bytes"]
        - memory["alias_size_in_bytes"]
        + memory["temp_size_in_bytes"]
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else (cost or {})
    cost = {k: float(v) for k, v in cost.items() if k in COST_FIELDS}
    hlo = compiled.as_text()
    if hlo_path:
        Path(hlo_path).write_text(hlo, encoding="utf-8")
    return memory, cost, usability(cost, hlo, num_slices=num_slices), costed_seconds(cost, hlo)


def use_libtpu(path: str) -> bool:
    """Points JAX's TPU plugin at libtpu `path` for compile-only devices; False (and a line on
    stderr naming where it looked) when there is no such file."""
    if not Path(path).is_file():
        print(
            f"--libtpu {path}: no such file; `make test` installs libtpu in "
            ".venv/libtpu-aot/ (or pip install libtpu==0.0.42.1 --target DIR)",
            file=sys.stderr,
        )
        return False
    os.environ["TPU_LIBRARY_PATH"] = path
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return True


def report(result: dict, json_path: str | None) -> None:
    """Prints a result's summary and writes its JSON to `json_path` when given."""
    print(summary(result), flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def recorded_paths(settings: dict) -> dict:
    """`settings` with its paths as no machine's: the output files by name (the JSON and its
    HLO sit side by side wherever they were written) and libtpu relative to the checkout where it
    lies inside it, so a committed JSON names no machine's folders."""
    root = Path(__file__).resolve().parent.parent
    out = dict(settings)
    for key in ("json", "hlo", "libtpu"):
        if out.get(key):
            path = Path(out[key]).resolve()
            out[key] = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
    return out


def source_commit() -> str:
    """The repository's commit that compiled the step (short hash; `+changes` when tracked code
    differs from it: the docs and the grid's own JSONs aside), so a grid built up over several
    calls says which code made each row."""
    import subprocess

    def git(*args: str) -> str:
        run = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent.parent), *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return run.stdout.strip() if run.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    changed = git(
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":!docs",
        ":!benchmarks/aot_grid",
    )
    return commit + ("+changes" if changed else "")


def flops_coverage(
    flops: float | None, devices: int, model_flops: float, microbatches: int = 1
) -> float | None:
    """XLA's FLOPs over all devices ÷ the model FLOPs of what they count (one microbatch's).

    Below 1 XLA counted less than the model needs, which recomputation can only add to: its
    cost analysis counts a loop's body once, and a scanned model's layers, or (on 8 or more
    chips) FSDP's weight-gathering matmuls run as collective loops, are loops. The estimate
    then covers part of the step: its ratio to another program's that XLA counts alike
    compares, but MFU from it does not (`estimated_mfu` is left out)."""
    if not flops or not model_flops:
        return None
    return flops * devices / (model_flops / microbatches)


def estimated_mfu(model_flops: float, seconds: float, peak: float, microbatches: int) -> float:
    """Model FLOPs over `optimal_seconds` × the chips' peak FLOP/s. XLA's cost analysis counts
    a loop's body once, and microbatches run in a loop: with several, its figures are those of
    one microbatch (and the update), so are its model FLOPs here."""
    return model_flops / microbatches / (seconds * peak)


def _model_flops(wrapper, args: argparse.Namespace) -> float:
    """Model FLOPs of the step: every matmul of forward and backward over the global batch
    (6·N per token plus causal attention and the output projection, PaLM appendix B)."""
    from modeling import family as family_lib

    family = family_lib.get(args.family)
    per_token = family.cost_per_token(
        wrapper.config, seq_len=args.seq_len, inputs_len=_inputs_len(args)
    )
    return float(per_token) * args.batch * args.seq_len


def _inputs_len(args: argparse.Namespace) -> int | None:
    """The encoder length of an encoder-decoder family (None for decoder-only ones)."""
    return (args.inputs_len or args.seq_len) if args.family == "t5" else None


def summary(result: dict) -> str:
    """One readable paragraph of a result."""
    m, c = result["memory"], result["cost"]
    s = result["settings"]
    gb = 1e9
    lines = [
        f"{s['size']} on {s['topology']} x{s['num_slices']} ({result['device_kind']}, "
        f"{s['devices']} chips), batch {s['batch']} x {s['seq_len']}, remat {s['remat']}, "
        f"attention {s['attention']}, {'scanned' if s['scan'] else 'unscanned'}; compiled in "
        f"{result['compile_s']:.0f} s",
        f"  memory per device: peak {m['peak'] / gb:.2f} GB (temp {m['temp_size_in_bytes'] / gb:.2f}"
        f" GB, arguments {m['argument_size_in_bytes'] / gb:.2f} GB)",
        f"  flops {c.get('flops', float('nan')):.4g}, bytes accessed "
        f"{c.get('bytes accessed', float('nan')):.4g}, model flops {result['model_flops']:.4g}",
    ]
    if result["usable"]:
        mfu = result["estimated_mfu"]
        lines.append(
            f"  optimal_seconds {c['optimal_seconds']:.4f}"
            + (f", estimated MFU {100 * mfu:.1f}%" if mfu is not None else "")
        )
    else:
        lines.append(f"  estimate UNUSABLE: {result['why_unusable']}")
        if result.get("costed_seconds"):
            lines.append(
                f"  without those ops (each counted -1): {result['costed_seconds']:.4f} s "
                "(costed_seconds)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Compiles one program and prints (and with `--json` writes) its figures; exits 2 without
    libtpu, naming where it looked."""
    args = parse_args(argv)
    if not use_libtpu(args.libtpu):
        return 2
    report(compile_program(args), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
