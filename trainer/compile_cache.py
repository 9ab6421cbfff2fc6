"""The persistent XLA compilation cache every job uses (as MaxText's `jax_cache_dir`).

A sweep runs many jobs whose programs are identical: the source, scratch and CPT runs of one size
compile the same train and eval steps, and finetuning runs of one shape differ only in their data.
With the cache, the first of them compiles and the others load the executable from disk, which on
a CPU cuts each later run's start-up from seconds to a fraction of one; on TPU pods it saves the
minutes a restarted (preempted) job would spend recompiling.

Where it lives, first match wins:
  1. `XLSCALE_COMPILATION_CACHE`: a directory, or `off` to disable the cache;
  2. a cache directory already configured (`JAX_COMPILATION_CACHE_DIR`, or `jax.config`);
  3. `$XDG_CACHE_HOME/xlscale/xla` (default `~/.cache/xlscale/xla`).
Entries are keyed by the program, the compile options, the devices and the jaxlib version, so a
stale entry is never used.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

log = logging.getLogger(__name__)

ENV_VAR = "XLSCALE_COMPILATION_CACHE"
DISABLED = ("off", "none", "0", "false")
MIN_COMPILE_TIME_S = 0.2  # programs that compile faster than this are not worth a file


def default_dir() -> Path:
    """`$XDG_CACHE_HOME/xlscale/xla` (`~/.cache/xlscale/xla` when XDG_CACHE_HOME is unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "xlscale" / "xla"


def enable(path: str | os.PathLike | None = None) -> str | None:
    """Turns the persistent compilation cache on (idempotent); returns its directory or None.

    Args:
      path: the directory; None: from the environment as the module docstring says.
    """
    env = os.environ.get(ENV_VAR, "")
    if path is None and env.lower() in DISABLED and env:
        return None
    configured = jax.config.jax_compilation_cache_dir
    target = os.fspath(path or env or configured or default_dir())
    if configured == target:
        return target
    try:
        Path(target).mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a read-only home must not stop a job; it only compiles more
        log.warning("compilation cache %s unusable (%s); compiling without it", target, e)
        return None
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", target)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    compilation_cache.reset_cache()  # the cache object is created once, from the dir at the time
    return target
