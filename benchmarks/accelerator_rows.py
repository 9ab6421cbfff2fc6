"""The children of `accelerator_step.py`: the device probe and one benchmark row per process.

    python benchmarks/accelerator_rows.py --probe jax|torch      # one result line: the device
    python benchmarks/accelerator_rows.py --probe jax --shapes '<estimate_request JSON>'
    python benchmarks/accelerator_rows.py --row '<RowSpec JSON>'  # one result line: the row

The probe runs on the device, so it (not the parent) asks the memory model: given `--shapes`,
it also answers, per model, the estimated bytes per device of the row's step under each remat
policy, built exactly as a row builds its step (`model_spec`, `step_estimates`).

Each prints exactly one `bench_harness.ROW_MARK` line (its result, or its failure classified as
`oom`, `compile_error` or `error`). The parent (`accelerator_step.py`) imports none of this: it
never imports JAX or torch, so it never holds device memory the rows need. Row bodies: the
trainer's own compiled step (`run_xlscale`) and the Hugging Face peer (`run_hf`); see
`accelerator_step.py` for the MFU formula, `accelerator_specs.py` for the shapes, the row specs
and the memory settings both sides share.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
for _path in (str(HERE.parent), str(HERE)):  # a checkout, not an install; the parent beside us
    if _path not in sys.path:
        sys.path.insert(0, _path)

import bench_harness as harness  # noqa: E402
import compiled_step  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from accelerator_specs import RowSpec, Shape, is_accelerator, peak_flops  # noqa: E402

from llama_jax import hf_config  # noqa: E402
from modeling import family as families  # noqa: E402
from pipelines import features  # noqa: E402
from trainer import jobs, memory_check  # noqa: E402
from trainer import model_spec as spec_lib  # noqa: E402
from trainer.optimizers import OptimizerConfig, adafactor_defaults  # noqa: E402
from trainer.partitioning import MeshConfig, Partitioner, build_mesh  # noqa: E402
from trainer.schedules import ScheduleConfig  # noqa: E402


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
    b = shape.batch
    docs = rng.integers(2, 5, b) if packed else None
    tokens, layouts = {}, {}
    for feature, length in feature_lengths(shape).items():  # targets first: the same draws
        tokens[feature] = rng.integers(3, vocab, (b, length), dtype=np.int32)
        layouts[feature] = segment_layout(rng, batch=b, length=length, docs=docs)
    return features.synthetic_batch(
        feature_lengths(shape), batch_size=b, tokens=tokens, layouts=layouts
    )


def _optimizer(shape: Shape) -> tuple[OptimizerConfig, ScheduleConfig]:
    if shape.family == "t5":
        return adafactor_defaults(), ScheduleConfig(name="rsqrt", base=1.0, rsqrt_offset=10_000)
    return OptimizerConfig(name="adamw"), ScheduleConfig(name="cosine", peak=2e-4)


def xla_analysis(compiled) -> dict[str, Any]:
    """XLA's own view of the compiled step: memory (arguments + outputs - aliased + temporaries,
    and its parts) and FLOPs (None where the backend does not say)."""
    memory = compiled.memory_analysis()
    parts = None
    total = None
    if memory is not None:
        names = ("argument", "output", "alias", "temp", "generated_code")
        parts = {n: int(getattr(memory, f"{n}_size_in_bytes")) for n in names}
        total = float(parts["argument"] + parts["output"] + parts["temp"] - parts["alias"])
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) and cost else cost
    flops = cost.get("flops") if isinstance(cost, dict) else None
    return {"xla_bytes": total, "xla_memory": parts, "xla_flops": flops}


def device_memory() -> dict[str, float | None]:
    """The first device's allocator peak and limit (None where the backend keeps no stats)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak, limit = stats.get("peak_bytes_in_use"), stats.get("bytes_limit")
    return {
        "peak_bytes": None if peak is None else float(peak),
        "bytes_limit": None if limit is None else float(limit),
    }


def _rates(
    step_times: Sequence[float], *, tokens: int, flops: float, kind: str, devices: int
) -> dict:
    step_s = statistics.median(step_times)
    peak = peak_flops(kind)
    return {
        "device": kind,
        "devices": devices,
        "step_ms": 1e3 * step_s,
        "tokens_per_s": tokens / step_s,
        "mfu": None if peak is None else flops / step_s / (peak * devices),
        "model_flops_per_step": flops,
    }


def model_spec(spec: RowSpec) -> spec_lib.ModelSpec:
    """The trainer's model spec of an xlscale row: the shape's overrides, the row's compute
    dtype, remat policy and attention kernel (T5 without dropout, as the MT paper pretrains)."""
    shape = spec.shape
    overrides = {**dict(shape.overrides), "dtype": spec.dtype, "remat_policy": spec.remat}
    overrides["attention_kernel"] = spec.attention
    return spec_lib.ModelSpec(
        family=shape.family,
        size=shape.size,
        overrides=overrides,
        dropout_rate=0.0 if shape.family == "t5" else None,
    )


def feature_lengths(shape: Shape) -> dict[str, int]:
    """The task feature lengths of a shape (`inputs` only for an encoder-decoder)."""
    return {"targets": shape.targets, **({"inputs": shape.inputs} if shape.inputs else {})}


def step_estimates(
    spec: RowSpec, *, partitioner: Partitioner, policies: Sequence[str]
) -> dict[str, Any]:
    """The memory model's bytes per device of the row's train step under each remat policy:
    `{"kernel", "bytes": {policy: bytes}, "error": None}`, or `{"error": text}` when the model
    cannot say (a measurement must not be lost to the estimate).

    The step is the row's own: its model config (`model_spec`), optimizer, batch and lengths,
    the partitioner's mesh, `auto` attention resolved for the backend, packed (the trainer's
    batches always carry segment ids), one microbatch (`trainer.memory_check.step_shape`, as the
    trainer's own memory check builds it)."""
    shape = spec.shape
    try:
        fam = families.get(shape.family)
        wrapper = fam.build(model_spec(spec))
        step = memory_check.step_shape(
            model=wrapper,
            partitioner=partitioner,
            batch_size=shape.batch,
            seq_len=shape.targets,
            feature_lengths=feature_lengths(shape),
            optimizer=_optimizer(shape)[0],
            num_microbatches=1,
        )
        found = {
            p: fam.memory_estimate(dataclasses.replace(wrapper.config, remat_policy=p), shape=step)
            for p in policies
        }
    except Exception as e:  # noqa: BLE001 -- reported beside the measurement, never instead
        return {"error": f"{type(e).__name__}: {e}"}
    kernel = next(iter(found.values())).kernel if found else None
    return {"kernel": kernel, "bytes": {p: float(e.total) for p, e in found.items()}, "error": None}


def run_xlscale(spec: RowSpec) -> dict[str, Any]:
    """Compiles and times the trainer's step for one configuration; returns the row's fields,
    the memory model's estimate of the step (`est_bytes`) among them, beside XLA's."""
    shape = spec.shape
    fam = families.get(shape.family)
    with harness.phase("setup"):
        built = jobs.build_partitioned_model(model_spec(spec), MeshConfig())
        wrapper, partitioner, _ = built
        optimizer, schedule = _optimizer(shape)
    estimate = step_estimates(spec, partitioner=partitioner, policies=(spec.remat,))
    lengths = feature_lengths(shape)
    start = time.perf_counter()
    with harness.phase("compile"):
        job = compiled_step.compile_train_step(
            built,
            batch_size=shape.batch,
            seq_len=shape.targets,
            feature_lengths=lengths,
            optimizer=optimizer,
            schedule=schedule,
        )
    compile_s = time.perf_counter() - start
    with harness.phase("run"):
        state = job.init_state(np.asarray(jax.random.key_data(jax.random.key(0))))
        host = synthetic_batch(
            np.random.default_rng(0), shape, vocab=wrapper.vocab_size, packed=spec.packed
        )
        batch = partitioner.shard_batch(host)
        for _ in range(max(1, spec.warmup)):  # (and autotuning on GPU)
            state, m = job.train_step(state, batch)
        jax.block_until_ready(m)
        times = []
        for _ in range(spec.steps):
            t = time.perf_counter()
            state, m = job.train_step(state, batch)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t)
        loss = float(m["loss_sum"] / m["weight_sum"])
    _, with_attn = fam.flops_per_token(
        wrapper.config, seq_len=shape.targets, inputs_len=shape.inputs
    )
    return {
        **_rates(
            times,
            tokens=shape.batch * shape.targets,
            flops=with_attn * shape.batch * shape.targets,
            kind=jax.devices()[0].device_kind,
            devices=jax.device_count(),
        ),
        "compile_s": compile_s,
        "loss": loss,
        **device_memory(),
        **xla_analysis(job.train_step),
        "est_bytes": (estimate.get("bytes") or {}).get(spec.remat),
        "est_kernel": estimate.get("kernel"),
        "est_error": estimate["error"],
    }


def run_hf(spec: RowSpec) -> dict[str, Any]:
    """The Hugging Face peer on the spec's shape (CUDA when there, else the CPU): LLaMA with
    sdpa attention (under `torch.compile` for `hf_compile`), T5 eager."""
    import torch  # heavy optional dependencies: the peer's child only
    import transformers

    shape = spec.shape
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    fam = families.get(shape.family)
    torch.manual_seed(0)
    with harness.phase("setup"):
        cfg = fam.get_config(shape.size, **dict(shape.overrides))
        if shape.family == "llama2":
            # The exporter's config.json of this shape (`llama_jax.hf_config`), one mapping.
            fields = hf_config.hf_config(cfg, bos_id=1, eos_id=2)  # LlamaConfig's defaults
            fields["max_position_embeddings"] = max(cfg.max_len, shape.targets)
            hf_cfg = transformers.LlamaConfig(**fields, attn_implementation="sdpa")
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
                decoder_start_token_id=0,  # T5's: the pad id starts the decoder
                pad_token_id=0,
                eos_token_id=1,
            )
            model = transformers.T5ForConditionalGeneration(hf_cfg).to(device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=2e-4, **({"fused": True} if cuda else {}))
        rng = np.random.default_rng(0)
        tokens = torch.as_tensor(rng.integers(3, cfg.vocab_size, (shape.batch, shape.targets)))
        kwargs = {"labels": tokens.to(device)}
        if shape.inputs:
            enc = rng.integers(3, cfg.vocab_size, (shape.batch, shape.inputs))
            kwargs["input_ids"] = torch.as_tensor(enc).to(device)
        else:
            kwargs["input_ids"] = kwargs["labels"]
        forward = torch.compile(model) if spec.impl == "hf_compile" else model

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

    start = time.perf_counter()
    with harness.phase("compile" if spec.impl == "hf_compile" else "run"):
        for _ in range(max(2, spec.warmup)):  # torch.compile's forward and backward graphs
            loss = step()
        sync()
    compile_s = time.perf_counter() - start
    warm_peak = torch.cuda.max_memory_allocated() if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with harness.phase("run"):
        times = []
        for _ in range(spec.steps):
            t = time.perf_counter()
            loss = step()
            sync()
            times.append(time.perf_counter() - t)
    steady_peak = torch.cuda.max_memory_allocated() if cuda else None
    _, with_attn = fam.flops_per_token(cfg, seq_len=shape.targets, inputs_len=shape.inputs)
    return {
        **_rates(
            times,
            tokens=shape.batch * shape.targets,
            flops=with_attn * shape.batch * shape.targets,
            kind=torch.cuda.get_device_name() if cuda else "cpu",
            devices=1,
        ),
        "compile_s": compile_s,
        "loss": float(loss),
        "peak_bytes": None if not cuda else float(max(warm_peak, steady_peak)),
        "peak_steady_bytes": None if not cuda else float(steady_peak),
        "bytes_limit": float(torch.cuda.get_device_properties(0).total_memory) if cuda else None,
        "xla_bytes": None,
    }


ROW_BODIES: dict[str, Callable[[RowSpec], dict[str, Any]]] = {
    "xlscale": run_xlscale,
    "hf_compile": run_hf,
    "hf_eager": run_hf,
}


def probe(*, with_torch: bool, request: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the parent needs to plan: JAX's backend, device kind and count, the device memory
    limit where the backend reports one, whether the torch peer can run (torch and
    transformers import; CUDA there), and, given a `request` (`accelerator_step.
    estimate_request`), the memory model's estimates of the rows' steps on this backend:
    `estimates[model] = step_estimates(...)` for the request's accelerator or CPU specs."""
    devices = jax.devices()
    stats = devices[0].memory_stats() or {}
    found = {"backend": jax.default_backend(), "device_kind": devices[0].device_kind}
    found.update(
        device_count=len(devices), bytes_limit=stats.get("bytes_limit"), jax=jax.__version__
    )
    if request is not None:
        kind = "accelerator" if is_accelerator(found["backend"]) else "cpu"
        specs = {m: RowSpec.from_dict(raw) for m, raw in request["rows"][kind].items()}
        mesh = build_mesh(MeshConfig())  # the rows' mesh, with each family's rules
        partitioners = {
            s.shape.family: Partitioner(mesh=mesh, rules=families.get(s.shape.family).axis_rules())
            for s in specs.values()
        }
        found["estimates"] = {
            m: step_estimates(
                s, partitioner=partitioners[s.shape.family], policies=request["policies"]
            )
            for m, s in specs.items()
        }
    found.update(torch=None, torch_cuda=False, torch_device=None, transformers=False)
    if with_torch and importlib.util.find_spec("torch") is not None:
        import torch  # the probe's own process: nothing of torch stays in the rows' processes

        found.update(torch=torch.__version__, torch_cuda=torch.cuda.is_available())
        found["torch_device"] = torch.cuda.get_device_name() if found["torch_cuda"] else None
        found["transformers"] = importlib.util.find_spec("transformers") is not None
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """A child's whole life: run the probe or one row, print its result line, return the exit
    code (0 only when it measured)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--probe", choices=["jax", "torch"], help="report the device (and torch)")
    mode.add_argument("--row", help="run this RowSpec (JSON)")
    parser.add_argument("--shapes", help="--probe: estimate these rows' steps (JSON)")
    args = parser.parse_args(argv)
    if args.probe is not None:
        request = None if args.shapes is None else json.loads(args.shapes)
        return harness.child_main(
            "probe", lambda: probe(with_torch=args.probe == "torch", request=request)
        )
    spec = RowSpec.from_json(args.row)
    return harness.child_main(spec.name, lambda: ROW_BODIES[spec.impl](spec))


if __name__ == "__main__":
    sys.exit(main())
