"""Which accelerator a job runs on, and the refusal of a job whose accelerator JAX cannot see.

A job that asked for GPUs (a SLURM allocation with `--gpus-per-node`, `EXPECT_PLATFORM = 'gpu'`)
but whose JAX finds none would otherwise train on the CPU backend, silently and a thousand times
slower: a CPU-only jaxlib (the plain `pip install`), a CUDA plugin that failed to load, or
`CUDA_VISIBLE_DEVICES` hiding the allocation. `check` compares the platform JAX runs on with the
expected one (the `EXPECT_PLATFORM` gin macro, else `$XLSCALE_EXPECT_PLATFORM`, which launchers
export) and raises `PlatformError` (exit 69, `rundir.exits`) before anything is written or
compiled; `describe` is the start-up line every job logs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import jax

from rundir import exits
from trainer import validation

# Environment variable launchers set (SLURM with GPUs: 'gpu'; TPU VMs: 'tpu'); the gin macro
# EXPECT_PLATFORM, when set, takes precedence.
ENV = exits.EXPECT_PLATFORM_ENV
SETTING = "EXPECT_PLATFORM (train.expect_platform)"
# 'any' (or unset) expects nothing: the job runs on whatever JAX's default backend is.
ANY = "any"
# Expected platform -> what to do when JAX does not run on it.
FIXES: dict[str, str] = {
    "gpu": (
        "install JAX's CUDA plugin (pip install -e '.[gpu]', i.e. jax[cuda12]==0.10.2) and check "
        "that CUDA_VISIBLE_DEVICES and the job's allocation (--gpus-per-node) give this process "
        "its GPUs"
    ),
    "tpu": "install libtpu (pip install -e '.[tpu]') and run on the TPU VM's workers",
    "cpu": "unset JAX_PLATFORMS or set it to 'cpu'",
}
# Environment variables that decide what JAX sees, named in the refusal when set.
_VISIBILITY_VARS = ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS")


class PlatformError(RuntimeError):
    """The job asked for an accelerator that JAX cannot see (exit 69, EX_UNAVAILABLE)."""


@dataclasses.dataclass(frozen=True)
class Found:
    """What JAX runs on: its default backend's platform and devices.

    Attributes:
      platform: `jax.default_backend()` ('cpu', 'gpu', 'tpu').
      device_kinds: the distinct `device_kind`s of all devices, e.g. ('NVIDIA H100 80GB HBM3',).
      devices: all devices of the job (every process).
      local_devices: this process's devices.
      processes: `jax.process_count()`.
    """

    platform: str
    device_kinds: tuple[str, ...]
    devices: int
    local_devices: int
    processes: int

    def describe(self) -> str:
        """`gpu: 8 x NVIDIA H100 80GB HBM3 (8 devices, 1 process)`."""
        kinds = " + ".join(self.device_kinds) or "no devices"
        return (
            f"{self.platform}: {self.local_devices} x {kinds} "
            f"({_count(self.devices, 'device')}, {_count(self.processes, 'process')})"
        )


def _count(n: int, noun: str) -> str:
    plural = "es" if noun.endswith("s") else "s"
    return f"{n} {noun}" + ("" if n == 1 else plural)


def found() -> Found:
    """What JAX's default backend is (initialising the backends if nothing has yet).

    Raises:
      RuntimeError (or another exception of JAX's): JAX could not initialise the platforms
        `JAX_PLATFORMS` insists on.
    """
    devices = jax.devices()
    return Found(
        platform=jax.default_backend(),
        device_kinds=tuple(dict.fromkeys(d.device_kind for d in devices)),
        devices=len(devices),
        local_devices=jax.local_device_count(),
        processes=jax.process_count(),
    )


def expected(setting: str | None, *, env: Mapping[str, str] | None = None) -> str | None:
    """The platform a job expects: `setting` (the `EXPECT_PLATFORM` macro) when given, else
    `$XLSCALE_EXPECT_PLATFORM`; None when neither is set or the value is 'any'.

    Raises:
      trainer.validation.ConfigError: an unknown value, naming where it was set and the allowed
        values.
    """
    name, value = _source(setting, env=os.environ if env is None else env)
    if value is None:
        return None
    value = str(value).strip().lower()
    allowed = (*FIXES, ANY)
    if value not in allowed:
        raise validation.ConfigError(
            f"{name} = {value!r}: choose one of {', '.join(repr(a) for a in allowed)}"
        )
    return None if value == ANY else value


def _source(setting: str | None, *, env: Mapping[str, str]) -> tuple[str, str | None]:
    """(where the expectation comes from, its value as given)."""
    if setting is not None:
        return SETTING, setting
    return f"${ENV}", env.get(ENV) or None


def _visibility(env: Mapping[str, str]) -> str:
    shown = [f"{name}={env[name]!r}" for name in _VISIBILITY_VARS if name in env]
    return f"; {', '.join(shown)}" if shown else ""


def check(setting: str | None = None, *, env: Mapping[str, str] | None = None) -> Found | None:
    """Refuses a job whose expected platform (see `expected`) is not the one JAX runs on.

    Args:
      setting: the `EXPECT_PLATFORM` macro (None: the environment variable decides).
      env: the environment (default `os.environ`).

    Returns:
      What JAX found, or None when nothing is expected (JAX is then not queried here).

    Raises:
      PlatformError: in one line, the expected platform, what JAX found and the fix.
      trainer.validation.ConfigError: an unknown expected platform.
    """
    env = os.environ if env is None else env
    want = expected(setting, env=env)
    if want is None:
        return None
    try:
        have = found()
    # JAX_PLATFORMS names a platform that failed to start (RuntimeError), or one no installed
    # plugin provides (JAX 0.10 then fails an assertion).
    except Exception as e:  # noqa: BLE001
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PlatformError(
            f"this job expects the {want} platform but JAX could not start its backends "
            f"({reason}{_visibility(env)}); {FIXES[want]}"
        ) from None
    if have.platform != want:
        raise PlatformError(
            f"this job expects the {want} platform but JAX found no {want} device; it runs on "
            f"{have.describe()}{_visibility(env)}; {FIXES[want]} "
            f"(or set {_source(setting, env=env)[0]} to {ANY!r} to run on {have.platform})"
        )
    return have


def describe() -> str:
    """The start-up line: `platform gpu: 8 x NVIDIA H100 80GB HBM3 (8 devices, 1 process)`."""
    return f"platform {found().describe()}"
