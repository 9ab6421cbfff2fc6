"""The trainer's own step on whatever accelerator is here: step time, tokens/s, MFU, peak memory,
and (when torch and transformers import) the Hugging Face peer on the same shape in the same run.

    .venv/bin/python benchmarks/accelerator_step.py                       # paper shapes on GPU/TPU
    .venv/bin/python benchmarks/accelerator_step.py --models llama t5 --remat none full \
        --attention auto xla --packed both --json out.json

Shapes: on an accelerator `llama2_1085m` at seq 2048 (batch 8) and `t5_770m` at inputs 512 /
targets 114 (batch 64), bf16 compute with float32 parameters, AdamW (LLaMA) or Adafactor (T5),
as in the issue's measurements; on CPU tiny shapes (`llama2_tiny` at seq 128, `t5_tiny` at
64/32) so the script stays testable. Each row compiles the trainer's step
(`trainer.jobs.compile_job`: mesh over all devices, `NamedSharding`s, donation, the non-finite
guard, token counters), feeds synthetic batches through `Partitioner.shard_batch` and reports the
median of `--steps` timed steps after a warm-up.

MFU = model FLOPs per step ÷ (step time × the chip's dense bf16 peak × devices). Model FLOPs are
the family's `flops_per_token(...).with_attention` per target token (LLaMA2: 6·N_non-emb +
6·layers·seq·heads·head_dim, PaLM appendix B with the causal half; T5: 6·N per stack and its
tokens plus its attention) times the target tokens of the step. The peak comes from `PEAK_FLOPS`
by device kind (H100/H200 989 TFLOP/s); a device not in the table prints no MFU. Packed rows
(`--packed`) hold 2-4 documents each, so the attention kernel must keep them apart; their MFU
uses the same formula at the row length (an upper bound of the attention work actually done).

The HF peer (`transformers.LlamaForCausalLM` with sdpa attention under `torch.compile`, or
`T5ForConditionalGeneration` eager) runs only when torch and transformers import and, unless
`--hf-on-cpu`, a CUDA device is there; same shape, float32 weights under bf16 autocast, fused
AdamW; its row carries the xlscale ÷ HF throughput ratio measured in this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np

from modeling import family as families
from trainer import jobs, models, steps
from trainer.optimizers import OptimizerConfig, adafactor_defaults
from trainer.partitioning import MeshConfig
from trainer.schedules import ScheduleConfig

# Dense bf16 peak FLOP/s per chip, by `device_kind` prefix (vendor data sheets, no sparsity).
PEAK_FLOPS: dict[str, float] = {
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA A100": 312e12,
    "TPU v5p": 459e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v4": 275e12,
}


@dataclasses.dataclass(frozen=True)
class Shape:
    """One benchmark shape: family, size, config overrides, batch and lengths."""

    family: str
    size: str
    batch: int
    targets: int
    inputs: int | None = None
    overrides: tuple[tuple[str, object], ...] = ()


# (model, accelerator?) -> shape. The accelerator shapes are the issue's measurements.
SHAPES: dict[tuple[str, bool], Shape] = {
    ("llama", True): Shape("llama2", "llama2_1085m", batch=8, targets=2048),
    ("t5", True): Shape("t5", "t5_770m", batch=64, targets=114, inputs=512),
    ("llama", False): Shape(
        "llama2", "llama2_tiny", batch=8, targets=128, overrides=(("vocab_size", 512),)
    ),
    ("t5", False): Shape(
        "t5", "t5_tiny", batch=8, targets=32, inputs=64, overrides=(("vocab_size", 512),)
    ),
}


def peak_flops(device_kind: str) -> float | None:
    """The dense bf16 peak of a device kind (None when unknown, e.g. a CPU)."""
    for prefix, peak in PEAK_FLOPS.items():
        if device_kind.startswith(prefix):
            return peak
    return None


def segment_layout(
    rng: np.random.Generator, *, batch: int, length: int, docs: np.ndarray | None = None
):
    """Segment ids and positions `[batch, length]`: one document per row when `docs` is None,
    else `docs[row]` packed documents (at least an eighth of the row each)."""
    seg = np.ones((batch, length), np.int32)
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length)).copy()
    if docs is not None:
        margin = max(1, length // 8)
        starts = np.arange(margin, length - margin + 1, margin)
        for row in range(batch):
            cuts = np.sort(rng.choice(starts, int(docs[row]) - 1, replace=False))
            for doc, start in enumerate(cuts, start=2):
                seg[row, start:] = doc
                pos[row, start:] = np.arange(length - start)
    return seg, pos


def synthetic_batch(
    rng: np.random.Generator, shape: Shape, *, vocab: int, packed: bool
) -> dict[str, np.ndarray]:
    """A trainer batch of random tokens with every position real: one document per row, or
    2-4 packed ones (encoder and decoder rows of T5 pack the same number of examples)."""
    b, lt = shape.batch, shape.targets
    docs = rng.integers(2, 5, b) if packed else None
    tokens = rng.integers(3, vocab, (b, lt), dtype=np.int32)
    seg, pos = segment_layout(rng, batch=b, length=lt, docs=docs)
    batch = {
        "decoder_target_tokens": tokens,
        "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
        "decoder_loss_weights": np.ones_like(tokens),
        "decoder_segment_ids": seg,
        "decoder_positions": pos,
        "decoder_task_ids": np.zeros_like(tokens),
    }
    if shape.inputs:
        enc = rng.integers(3, vocab, (b, shape.inputs), dtype=np.int32)
        enc_seg, enc_pos = segment_layout(rng, batch=b, length=shape.inputs, docs=docs)
        batch.update(
            encoder_input_tokens=enc, encoder_segment_ids=enc_seg, encoder_positions=enc_pos
        )
    return batch


def _optimizer(shape: Shape) -> tuple[OptimizerConfig, ScheduleConfig]:
    if shape.family == "t5":
        return adafactor_defaults(), ScheduleConfig(name="rsqrt", base=1.0, rsqrt_offset=10_000)
    return OptimizerConfig(name="adamw"), ScheduleConfig(name="cosine", peak=2e-4)


def memory_bytes(compiled) -> dict[str, float | None]:
    """Peak device memory in use (where the backend reports it) and XLA's own estimate."""
    stats = jax.devices()[0].memory_stats() or {}
    analysis = compiled.memory_analysis() if hasattr(compiled, "memory_analysis") else None
    estimate = None
    if analysis is not None:
        estimate = float(
            analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            + analysis.temp_size_in_bytes
            - analysis.alias_size_in_bytes
        )
    peak = stats.get("peak_bytes_in_use")
    return {"peak_bytes": None if peak is None else float(peak), "xla_bytes": estimate}


def run_xlscale(
    shape: Shape, *, remat: str, attention: str, packed: bool, dtype: str, steps_: int, seed=0
) -> dict:
    """Compiles and times the trainer's step for one configuration; returns a JSON-able row."""
    fam = families.get(shape.family)
    overrides = {**dict(shape.overrides), "dtype": dtype, "remat_policy": remat}
    overrides["attention_kernel"] = attention
    spec = models.ModelSpec(
        family=shape.family,
        size=shape.size,
        overrides=overrides,
        dropout_rate=0.0 if shape.family == "t5" else None,
    )
    wrapper, partitioner, abstract = jobs.build_partitioned_model(spec, MeshConfig())
    optimizer, schedule = _optimizer(shape)
    lengths = {"targets": shape.targets, **({"inputs": shape.inputs} if shape.inputs else {})}
    start = time.perf_counter()
    job = jobs.compile_job(
        model=wrapper,
        partitioner=partitioner,
        abstract_params=abstract,
        components=["synthetic"],
        total_steps=10_000,
        batch_size=shape.batch,
        seq_len=shape.targets,
        feature_lengths=lengths,
        eval_batch_size=None,
        optimizer=optimizer,
        schedule=schedule,
        step_config=steps.StepConfig(num_components=1),
    )
    compile_s = time.perf_counter() - start
    state = job.init_state(np.asarray(jax.random.key_data(jax.random.key(seed))))
    rng = np.random.default_rng(seed)
    host = synthetic_batch(rng, shape, vocab=wrapper.vocab_size, packed=packed)
    batch = partitioner.shard_batch(host)
    state, m = job.train_step(state, batch)  # warm-up (and autotuning on GPU)
    jax.block_until_ready(m)
    times = []
    for _ in range(steps_):
        t = time.perf_counter()
        state, m = job.train_step(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    _, with_attn = fam.flops_per_token(
        wrapper.config, seq_len=shape.targets, inputs_len=shape.inputs
    )
    kind = jax.devices()[0].device_kind
    peak = peak_flops(kind)
    model_flops = with_attn * shape.batch * shape.targets
    return {
        "impl": "xlscale",
        "model": shape.size,
        "remat": remat,
        "attention": attention,
        "packed": packed,
        "dtype": dtype,
        "batch": shape.batch,
        "inputs": shape.inputs,
        "targets": shape.targets,
        "device": kind,
        "devices": jax.device_count(),
        "compile_s": compile_s,
        "step_ms": 1e3 * step_s,
        "tokens_per_s": shape.batch * shape.targets / step_s,
        "mfu": None if peak is None else model_flops / step_s / (peak * jax.device_count()),
        "model_flops_per_step": model_flops,
        "loss": float(m["loss_sum"] / m["weight_sum"]),
        **memory_bytes(job.train_step),
    }


def run_hf(shape: Shape, *, steps_: int, on_cpu: bool, seed: int = 0) -> dict | None:
    """The Hugging Face peer on the same shape (None where torch/transformers or CUDA are
    missing). LLaMA under `torch.compile` with sdpa; T5 eager (its relative bias defeats sdpa)."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    cuda = torch.cuda.is_available()
    if not cuda and not on_cpu:
        return None
    device = "cuda" if cuda else "cpu"
    fam = families.get(shape.family)
    cfg = fam.get_config(shape.size, **dict(shape.overrides))
    torch.manual_seed(seed)
    if shape.family == "llama2":
        hf_cfg = transformers.LlamaConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.d_model,
            intermediate_size=cfg.d_ff,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.kv_heads,
            head_dim=cfg.head_size,
            max_position_embeddings=max(cfg.max_len, shape.targets),
            rms_norm_eps=cfg.norm_eps,
            rope_theta=cfg.rope_theta,
            attn_implementation="sdpa",
        )
        model = transformers.LlamaForCausalLM(hf_cfg).to(device)
    else:
        hf_cfg = transformers.T5Config(
            vocab_size=cfg.vocab_size,
            d_model=cfg.d_model,
            d_kv=cfg.head_dim,
            d_ff=cfg.d_ff,
            num_layers=cfg.num_encoder_layers,
            num_decoder_layers=cfg.num_decoder_layers,
            num_heads=cfg.num_heads,
            feed_forward_proj="gated-gelu" if len(cfg.mlp_activations) == 2 else "relu",
            dropout_rate=0.0,
            tie_word_embeddings=cfg.logits_via_embedding,
        )
        model = transformers.T5ForConditionalGeneration(hf_cfg).to(device)
    model.train()
    fused = {"fused": True} if cuda else {}
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, **fused)
    rng = np.random.default_rng(seed)
    tokens = torch.as_tensor(rng.integers(3, cfg.vocab_size, (shape.batch, shape.targets)))
    tokens = tokens.to(device)
    kwargs = {"labels": tokens}
    if shape.inputs:
        enc = rng.integers(3, cfg.vocab_size, (shape.batch, shape.inputs))
        kwargs["input_ids"] = torch.as_tensor(enc).to(device)
    else:
        kwargs["input_ids"] = tokens
    forward = torch.compile(model) if shape.family == "llama2" and cuda else model

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = forward(**kwargs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(2):  # compile and warm up
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps_):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    _, with_attn = fam.flops_per_token(cfg, seq_len=shape.targets, inputs_len=shape.inputs)
    kind = torch.cuda.get_device_name() if cuda else "cpu"
    peak = peak_flops(kind)
    model_flops = with_attn * shape.batch * shape.targets
    return {
        "impl": "hf_compile" if forward is not model else "hf_eager",
        "model": shape.size,
        "remat": "none",
        "attention": "sdpa" if shape.family == "llama2" else "eager",
        "packed": False,
        "dtype": "bfloat16 autocast",
        "batch": shape.batch,
        "inputs": shape.inputs,
        "targets": shape.targets,
        "device": kind,
        "devices": 1,
        "step_ms": 1e3 * step_s,
        "tokens_per_s": shape.batch * shape.targets / step_s,
        "mfu": None if peak is None else model_flops / step_s / peak,
        "peak_bytes": float(torch.cuda.max_memory_allocated()) if cuda else None,
        "xla_bytes": None,
    }


def _cell(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def print_table(rows: Sequence[dict], stream=None) -> None:
    """One line per row; MFU and memory where known."""
    stream = stream or sys.stdout
    header = (
        f"{'impl':<10} {'model':<16} {'remat':<14} {'attn':<6} {'packed':<6} {'step ms':>9} "
        f"{'tokens/s':>10} {'MFU':>6} {'peak GiB':>8} {'XLA GiB':>8} {'vs HF':>6}"
    )
    print(header, file=stream)
    print("-" * len(header), file=stream)
    for r in rows:
        mfu = None if r.get("mfu") is None else 100 * r["mfu"]
        peak = None if r.get("peak_bytes") is None else r["peak_bytes"] / 2**30
        xla = None if r.get("xla_bytes") is None else r["xla_bytes"] / 2**30
        print(
            f"{r['impl']:<10} {r['model']:<16} {r['remat']:<14} {r['attention']:<6} "
            f"{str(r['packed']):<6} {r['step_ms']:>9.1f} {r['tokens_per_s']:>10,.0f} "
            f"{_cell(mfu, '5.1f'):>5}% {_cell(peak, '8.1f')} {_cell(xla, '8.1f')} "
            f"{_cell(r.get('vs_hf'), '6.2f')}",
            file=stream,
        )


def main(argv: Sequence[str] | None = None) -> list[dict]:
    """Parses flags, runs every configuration asked for and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama", "t5"], choices=["llama", "t5"])
    parser.add_argument("--remat", nargs="+", default=["none", "full", "dots_saveable"])
    parser.add_argument("--attention", nargs="+", default=["auto"])
    parser.add_argument("--packed", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, help="override the shape's batch")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face peer")
    parser.add_argument("--hf-on-cpu", action="store_true", help="run the HF peer on CPU too")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    accelerator = jax.default_backend() != "cpu"
    packed = {"no": [False], "yes": [True], "both": [False, True]}[args.packed]
    rows: list[dict] = []
    for name in args.models:
        shape = SHAPES[(name, accelerator)]
        if args.batch:
            shape = dataclasses.replace(shape, batch=args.batch)
        hf = None if args.no_hf else run_hf(shape, steps_=args.steps, on_cpu=args.hf_on_cpu)
        for remat in args.remat:
            for attention in args.attention:
                for pack in packed:
                    try:
                        row = run_xlscale(
                            shape,
                            remat=remat,
                            attention=attention,
                            packed=pack,
                            dtype=args.dtype,
                            steps_=args.steps,
                        )
                    except Exception as e:  # noqa: BLE001 -- e.g. out of memory: report, go on
                        print(f"{shape.size} remat={remat} attention={attention}: {e!r}"[:300])
                        continue
                    if hf is not None:
                        row["vs_hf"] = row["tokens_per_s"] / hf["tokens_per_s"]
                    rows.append(row)
        if hf is not None:
            rows.append(hf)
    print(
        f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; dtype {args.dtype}; "
        f"median of {args.steps} steps; MFU = with-attention model FLOPs / (step s x peak), "
        f"peak {peak_flops(jax.devices()[0].device_kind) or 'unknown'} FLOP/s per chip"
    )
    print_table(rows)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
