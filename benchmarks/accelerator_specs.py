"""What the accelerator benchmark's parent (`accelerator_step.py`) and its children
(`accelerator_rows.py`) both speak: the shapes, a row's spec (sent to a child as JSON), the
memory settings every child gets, and the chips' peak FLOP/s. Imports no JAX, torch,
TensorFlow, seqio or gin.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

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


# (model, accelerator?) -> shape. The accelerator shapes are the measurements. LLaMA's
# layers are scanned, as the paper-scale runs' are (`xlscale sizes --memory`, the TPU
# ahead-of-time compiles): the memory model describes a scanned stack (unscanned, XLA may
# schedule a remat policy's recomputation early and save nothing), and 22 scanned layers
# compile as one.
SHAPES: dict[tuple[str, bool], Shape] = {
    ("llama", True): Shape(
        "llama2", "llama2_1085m", batch=8, targets=2048, overrides=(("scan_layers", True),)
    ),
    ("t5", True): Shape("t5", "t5_770m", batch=64, targets=114, inputs=512),
    ("llama", False): Shape(
        "llama2",
        "llama2_tiny",
        batch=8,
        targets=128,
        overrides=(("scan_layers", True), ("vocab_size", 512)),
    ),
    ("t5", False): Shape(
        "t5", "t5_tiny", batch=8, targets=32, inputs=64, overrides=(("vocab_size", 512),)
    ),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RowSpec:
    """Everything a child needs to run one row (sent to it as JSON)."""

    impl: str  # "xlscale", "hf_compile" or "hf_eager"
    shape: Shape
    remat: str = "none"
    attention: str = "auto"
    packed: bool = False
    dtype: str = "bfloat16"
    steps: int = 10
    warmup: int = 1

    @property
    def name(self) -> str:
        """The row's unique name, e.g. `xlscale/llama2_1085m/none/auto/packed/b8`."""
        if self.impl != "xlscale":
            return f"{self.impl}/{self.shape.size}/b{self.shape.batch}"
        layout = "packed" if self.packed else "unpacked"
        return (
            f"xlscale/{self.shape.size}/{self.remat}/{self.attention}/{layout}/b{self.shape.batch}"
        )

    def fields(self) -> dict[str, Any]:
        """The identifying fields every row of this spec carries, whatever its status."""
        hf = self.impl != "xlscale"
        return {
            "impl": self.impl,
            "family": self.shape.family,
            "model": self.shape.size,
            "remat": "none" if hf else self.remat,
            "attention": ("sdpa" if self.shape.family == "llama2" else "eager")
            if hf
            else self.attention,
            "packed": self.packed,
            "dtype": "bfloat16 autocast" if hf else self.dtype,
            "batch": self.shape.batch,
            "inputs": self.shape.inputs,
            "targets": self.shape.targets,
            "steps": self.steps,
            "warmup": self.warmup,
        }

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON data (a child's `--row`, the probe's `--shapes` entries)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RowSpec:
        """Inverse of `to_dict`."""
        raw = dict(raw)
        shape = dict(raw.pop("shape"))
        shape["overrides"] = tuple(tuple(kv) for kv in shape["overrides"])
        return cls(shape=Shape(**shape), **raw)

    def to_json(self) -> str:
        """The spec as one JSON string (a child's `--row`)."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> RowSpec:
        """Inverse of `to_json`."""
        return cls.from_dict(json.loads(text))


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """The device-memory settings every child gets, explicitly (and the header prints)."""

    fraction: float = 0.95
    preallocate: bool = True

    def jax_env(self) -> dict[str, str]:
        """Environment of a JAX child."""
        return {
            "XLA_PYTHON_CLIENT_PREALLOCATE": "true" if self.preallocate else "false",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{self.fraction:g}",
        }

    @staticmethod
    def torch_env() -> dict[str, str]:
        """Environment of a torch child."""
        return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def peak_flops(device_kind: str) -> float | None:
    """The dense bf16 peak of a device kind (None when unknown, e.g. a CPU)."""
    for prefix, peak in PEAK_FLOPS.items():
        if device_kind.startswith(prefix):
            return peak
    return None


def is_accelerator(backend: str) -> bool:
    """Whether JAX's `backend` gets the accelerator shapes (anything but the CPU)."""
    return backend != "cpu"
