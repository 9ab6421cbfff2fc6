"""`xlscale sizes`: the LLaMA2 size table (CPT paper Table 4 plus our small sizes) with counts,
FLOPs per token and the paper's training recipe for each size.

With `--memory --hardware CHIP [--chips N]` it shows instead, per size at the paper's recipe
(batch tokens by size band, context `--seq-len`), the memory model's per-chip parts (parameters,
optimizer state, gradients, saved activations, logits) and the cheapest remat policy and fewest
microbatches that fit the chip, parameters sharded over the chips (FSDP)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

_COLUMNS = (
    # (header, key, format)
    ("name", "name", "{}"),
    ("paper M", "paper_m", "{}"),
    ("d/ff/h/L", None, None),
    ("N non-emb", "params_non_embedding", "{:,}"),
    ("N total", "params_total", "{:,}"),
    ("N/paper", "ratio_to_paper", "{:.3f}"),
    ("FLOPs/tok 6N", "flops_per_token", "{:.3e}"),
    ("FLOPs/tok +attn", "flops_per_token_attn", "{:.3e}"),
    ("tokens 20x", "tokens", "{:.3e}"),
    ("batch tok", "batch_tokens", "{:,}"),
    ("steps", "train_steps", "{:,}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `sizes` options."""
    parser.add_argument("names", nargs="*", help="sizes to show (default: all)")
    parser.add_argument("--seq-len", type=int, default=2048, help="context length (paper: 2048)")
    parser.add_argument(
        "--basis",
        choices=("paper", "ours"),
        default="paper",
        help="parameters behind tokens=20x params and the batch band: the paper's nominal size "
        "(what the paper trained; default) or our exact non-embedding count",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="per-chip memory at the paper's recipe and the remat policy and microbatches "
        "that fit --hardware",
    )
    parser.add_argument(
        "--hardware",
        metavar="CHIP",
        help="the chip --memory plans for: h100-80g, h200, a100-80g, a100-40g, v5p, v5e, v4, "
        "v6e (default h100-80g)",
    )
    parser.add_argument(
        "--chips", type=int, default=8, help="chips the batch and parameters are split over"
    )
    parser.add_argument(
        "--dtype", default="bfloat16", help="compute dtype with --memory (parameters float32)"
    )


def _cell(row: dict, key: str | None, fmt: str | None) -> str:
    if key is None:
        return f"{row['d_model']}/{row['d_ff']}/{row['num_heads']}/{row['num_layers']}"
    value = row[key]
    return "-" if value is None else fmt.format(value)


def memory_rows(names: list[str], *, chip: Any, chips: int, seq_len: int, dtype: str) -> list[dict]:
    """Per size: the plan (`modeling.memory.plan`) at the paper's recipe on `chips` chips."""
    from llama_jax import sizes
    from modeling import family as family_lib
    from modeling import memory, step_memory

    family = family_lib.get("llama2")
    rows = []
    for name in names:
        recipe = sizes.paper_recipe(name, seq_len=seq_len)
        config = family.get_config(name, dtype=dtype, scan_layers=True)
        shape = step_memory.step_shape(
            family,
            config,
            batch_size=max(recipe.batch_size, chips),
            seq_len=seq_len,
            inputs_len=None,
            data_parallel=chips,
            param_shards=chips,
            optimizer="adamw",
            platform=memory.CHIP_PLATFORM[chip.name],
        )
        plan = step_memory.plan(family, config, shape=shape, limit=chip.usable)
        rows.append(
            {
                "name": name,
                "batch": shape.batch_size,
                "per_chip": shape.batch_size // chips,
                "kernel": plan.estimate.kernel,
                **plan.estimate.parts_gib(),
                "remat_policy": plan.remat_policy,
                "num_microbatches": plan.num_microbatches,
                "fits": plan.fits,
            }
        )
    return rows


def _run_memory(args: argparse.Namespace, names: list[str]) -> int:
    from modeling import memory

    try:
        chip = memory.get_chip(args.hardware or "h100-80g")
    except ValueError as error:
        print(f"xlscale sizes: {error}", file=sys.stderr)
        return 2
    if args.chips <= 0:
        print(f"xlscale sizes: --chips {args.chips}: allowed a positive count", file=sys.stderr)
        return 2
    rows = memory_rows(names, chip=chip, chips=args.chips, seq_len=args.seq_len, dtype=args.dtype)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    header = (
        f"{'name':<14} {'batch':>6} {'/chip':>5} {'kernel':<6} {'params':>7} {'optim':>7} "
        f"{'grads':>7} {'activ':>7} {'logits':>7} {'total':>7}  {'remat':<32} {'micro':>5} fits"
    )
    print(header)
    for r in rows:
        print(
            f"{r['name']:<14} {r['batch']:>6} {r['per_chip']:>5} {r['kernel']:<6} "
            f"{r['params']:>7.2f} {r['optimizer']:>7.2f} {r['gradients']:>7.2f} "
            f"{r['activations']:>7.2f} {r['logits']:>7.2f} {r['total']:>7.2f}  "
            f"{r['remat_policy']:<32} {r['num_microbatches']:>5} {'yes' if r['fits'] else 'NO'}"
        )
    print(
        f"\nGiB per chip on {args.chips} x {chip.name} ({chip.usable / 2**30:.1f} GiB usable of "
        f"{chip.memory / 2**30:.1f}), FSDP over the chips, {args.dtype} compute, float32 "
        f"parameters, AdamW, layers scanned, seq {args.seq_len}, the paper's batch tokens by "
        "size band. activ: residuals saved for the backward pass (one microbatch); logits: "
        "float32 logits and their gradient. remat/micro: the cheapest policy (none < "
        "dots_saveable < dots_with_no_batch_dims_saveable < full), then the fewest "
        "microbatches, whose estimate fits (modeling.memory)."
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """Prints the table (or JSON lines); an unknown name raises ValueError listing valid names."""
    from llama_jax import sizes

    if args.memory or args.hardware:
        unknown = [n for n in args.names if n not in sizes.SIZES]
        if unknown:
            print(f"xlscale sizes: unknown size {unknown[0]!r}", file=sys.stderr)
            return 2
        return _run_memory(args, args.names or list(sizes.SIZES))

    names = args.names or list(sizes.SIZES)
    try:
        rows = [sizes.describe(name, seq_len=args.seq_len, basis=args.basis) for name in names]
    except ValueError as error:
        print(f"xlscale sizes: {error}", file=sys.stderr)
        return 2
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    cells = [[header for header, _, _ in _COLUMNS]]
    cells += [[_cell(row, key, fmt) for _, key, fmt in _COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    for line in cells:
        padded = [c.rjust(w) for c, w in zip(line, widths, strict=True)]
        print("  ".join([line[0].ljust(widths[0]), *padded[1:]]))
    print(
        f"\nN non-emb excludes the input embedding and the untied output projection (Kaplan); "
        "N total includes both;\nN/paper is our N non-emb over the paper's nominal size. "
        f"FLOPs/token: 6N, and 6N + 6*layers*seq*heads*head_dim "
        f"(PaLM app. B, causal) at seq {args.seq_len}.\ntokens = 20 x "
        + ("the paper's nominal size (ours where none)" if args.basis == "paper" else "our N")
        + f"; batch tokens by the paper's bands (2^20 <=1B, 2^21 <=2.5B, 2^22 above); "
        f"steps at context {args.seq_len}.\npaper M is the paper's label; our exact counts "
        "differ and are not fitted to it. llama2_4016m uses head_dim 128 (2688 is not divisible "
        "by its 22 heads)."
    )
    return 0
