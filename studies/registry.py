"""The studies `xlscale demo` runs, by name: "cpt" (the CPT paper) and "mt" (the MT paper)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from studies import cpt, mt
from studies.skeleton import run_profile

# Study name -> the function that runs it (`skeleton.run_profile` on the study's profiles and
# stages; keyword arguments: profile, out_dir, data_dir, log, jobs).
STUDIES: dict[str, Callable[..., dict]] = {
    "cpt": functools.partial(run_profile, cpt.PROFILES, cpt.stages, label="demo"),
    "mt": functools.partial(run_profile, mt.PROFILES, mt.stages, label="MT demo"),
}
# Study name -> its profiles (name -> profile with a `description`).
PROFILES: dict[str, dict] = {"cpt": cpt.PROFILES, "mt": mt.PROFILES}
# Study name -> (full profile's, smoke profile's) default output directory.
DEFAULT_OUT: dict[str, dict[str, str]] = {
    "cpt": {"full": "demo_out", "smoke": "demo_out/smoke"},
    "mt": {"full": "demo_out/mt", "smoke": "demo_out/mt/smoke"},
}


def run_demo(*, study: str = "cpt", out_dir: str | Path | None = None, **kwargs) -> dict:
    """Runs one of the studies (`STUDIES`): "cpt" (the CPT paper) or "mt" (the MT paper).

    Args:
      study: which study.
      out_dir: output directory (default `DEFAULT_OUT[study][profile]`).
      **kwargs: `profile` ("full" | "smoke"), `data_dir`, `log`, `jobs`, passed to the study.

    Returns:
      The study's summary dict (also written as `<out_dir>/demo.json`).
    """
    if study not in STUDIES:
        raise ValueError(f"unknown demo study {study!r}; choose one of {sorted(STUDIES)}")
    profile = kwargs.get("profile", "full")
    if out_dir is None:
        out_dir = DEFAULT_OUT[study].get(profile, f"demo_out/{study}/{profile}")
    return STUDIES[study](out_dir=out_dir, **kwargs)
