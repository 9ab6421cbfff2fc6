"""`xlscale sizes`: the LLaMA2 size table (CPT paper Table 4 plus our small sizes) with counts,
FLOPs per token and the paper's training recipe for each size."""

from __future__ import annotations

import argparse
import json
import sys

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


def _cell(row: dict, key: str | None, fmt: str | None) -> str:
    if key is None:
        return f"{row['d_model']}/{row['d_ff']}/{row['num_heads']}/{row['num_layers']}"
    value = row[key]
    return "-" if value is None else fmt.format(value)


def run(args: argparse.Namespace) -> int:
    """Prints the table (or JSON lines); an unknown name raises ValueError listing valid names."""
    from llama_jax import sizes

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
