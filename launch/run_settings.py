"""A manifest's `[settings]`: how its runs are scored, passed to every runner, not part of run ids.

Some choices change what a run *reports*, not what it *trains*: the COMET checkpoint that scores
its translations and the interpreter of COMET's side environment. They are declared here once,
set in a manifest's `[settings]` table (usually as `${VARIABLES}`, since they name paths on the
machines that run the jobs), validated when the manifest is read, and handed to each runner:
xlscale's trainer gets them as gin macros (`--gin.COMET_MODEL=...`, runs/common/decode.gin), real
T5X as the environment of `launch.t5x_comet`, which scores T5X's inference outputs after
`t5x.train` (`launch.t5x_runner`). A run's id hashes its training configuration only, so adding
or changing a setting keeps every run id, and a finished run can be re-scored with another model.

Each setting has an "off" word: `COMET_MODEL = "none"` scores no COMET, `COMET_PYTHON = "default"`
uses `$COMET_PYTHON` or `.comet-venv/bin/python` on the job's machine (`pipelines.comet.scoring`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

_VAR = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One manifest setting.

    Attributes:
      off: the value that means "not set" (nothing is passed to the job).
      allowed: what the value may be, in words (errors quote it).
      valid: whether a value (variables substituted) other than `off` is allowed.
    """

    off: str
    allowed: str
    valid: Callable[[str], bool]


def _path_ending(suffix: str) -> Callable[[str], bool]:
    return lambda value: value.endswith(suffix) and not any(c.isspace() for c in value)


def _is_path(value: str) -> bool:
    return bool(value) and not any(c.isspace() for c in value)


# Setting name -> its rule. The names are the gin macros of t5x_configs/runs/common/decode.gin.
SETTINGS: Mapping[str, Setting] = {
    "COMET_MODEL": Setting(
        off="none",
        allowed="'none' (no COMET) or a local COMET checkpoint path ending in .ckpt "
        "(<model dir>/checkpoints/model.ckpt, e.g. of Unbabel/wmt22-comet-da)",
        valid=_path_ending(".ckpt"),
    ),
    "COMET_PYTHON": Setting(
        off="default",
        allowed="'default' ($COMET_PYTHON, else .comet-venv/bin/python on the job's machine) or "
        "the path of the Python of COMET's environment (`make comet-env`)",
        valid=_is_path,
    ),
}


def check(value: str, *, name: str, where: str) -> None:
    """Raises ValueError naming `where`, the setting, its value and the allowed values when
    `value` (variables substituted; one still holding a `${VAR}` is checked at launch) is not
    allowed for setting `name`."""
    rule = SETTINGS[name]
    if value == rule.off or _VAR.search(value):
        return
    if not rule.valid(value):
        raise ValueError(f"{where} {name} = {value!r}: allowed: {rule.allowed}")


def parse(
    table: Mapping[str, Any], *, where: str, substitute: Callable[[str], str]
) -> dict[str, str]:
    """A manifest's `[settings]` table, checked: known names, string values, allowed values once
    the manifest's variables are substituted by `substitute` (missing ones left as written).

    Raises:
      ValueError: an unknown name (naming the allowed ones) or a value not allowed.
    """
    out = {}
    for name, value in table.items():
        if name not in SETTINGS:
            raise ValueError(f"{where}: unknown setting {name!r}; allowed: {', '.join(SETTINGS)}")
        if not isinstance(value, str):
            raise ValueError(f"{where} {name} = {value!r}: give a string")
        check(substitute(value), name=name, where=where)
        out[name] = value
    return out


def active(settings: Mapping[str, str], *, where: str) -> dict[str, str]:
    """The settings that are on (variables substituted; a dry run's missing ones stay
    `${VAR}`), each checked again with its final value."""
    out = {}
    for name, value in settings.items():
        check(value, name=name, where=where)
        if value != SETTINGS[name].off:
            out[name] = value
    return out
