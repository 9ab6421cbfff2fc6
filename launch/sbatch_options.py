"""Extra `#SBATCH` options, from the command line (`--sbatch-line`) or a manifest's
`[slurm] sbatch_lines`: each is one long option (`--constraint=h100`, `--exclusive`), checked
before anything is written or submitted, so a bad one cannot break or silently reshape a job."""

from __future__ import annotations

import re
from collections.abc import Iterable

_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=\S.*| \S.*)?")

# Options the SLURM launcher writes itself -> the launcher flag (or rule) that sets them; given
# again as an extra line they would contradict the script's own.
LAUNCHER_OPTIONS = {
    "job-name": "the run id",
    "nodes": "--nodes",
    "ntasks-per-node": "--tasks-per-node",
    "cpus-per-task": "--cpus-per-task",
    "gpus-per-node": "--gpus-per-node",
    "mem": "--mem",
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "time": "--time-limit",
    "signal": "--signal-before",
    "output": "--script-dir",
    "open-mode": "the launcher (append: one log per run across requeues)",
    "requeue": "--max-requeues",
    "no-requeue": "--max-requeues 0",
    "dependency": "the sweep's dependencies",
    "kill-on-invalid-dep": "the launcher (dependents of a failed run are cancelled)",
}


def sbatch_option(option: str, *, where: str) -> str:
    """One extra sbatch option (`--constraint=h100`, with or without a leading `#SBATCH`),
    checked to be a single long option that the launcher does not set itself.

    Args:
      option: the option as given.
      where: what gave it, for the error (`--sbatch-line`, `<manifest> [slurm] sbatch_lines`).

    Returns:
      The option without the `#SBATCH` prefix.

    Raises:
      ValueError: one line naming `where`, the value, and what is allowed.
    """
    if not isinstance(option, str):
        raise ValueError(f"{where} {option!r}: give each sbatch option as a string")
    text = option.strip().removeprefix("#SBATCH").strip()
    if "\n" in text or "\r" in text or not _OPTION.fullmatch(text):
        raise ValueError(
            f"{where} {option!r}: give one sbatch long option per entry, '--name' or "
            "'--name=value', e.g. '--constraint=h100'"
        )
    name = re.split(r"[= ]", text[2:], maxsplit=1)[0]
    if name in LAUNCHER_OPTIONS:
        raise ValueError(
            f"{where} {option!r}: --{name} is set by {LAUNCHER_OPTIONS[name]}, not by an extra "
            "sbatch line"
        )
    return text


def merge(*groups: Iterable[str]) -> list[str]:
    """The options of several sources in order (manifest first, then the command line, whose
    later lines sbatch reads last), each once."""
    out: list[str] = []
    for group in groups:
        out += [option for option in group if option not in out]
    return out
