"""Does running jobs side by side pay on this machine? One trainer step alone vs N at once.

    .venv/bin/python benchmarks/parallel_jobs.py [--size mt_d128] [--jobs 2] [--steps 10]

The demos train their runs `launchers.default_jobs()` at a time (`LocalLauncher(jobs=...)`).
That only pays if one job leaves cores idle, which XLA's CPU backend does on small steps. This
script measures it in one go: it runs `benchmarks/t5_train.py` for `--size` (the trainer's own
compiled T5 step, see there) once alone, then `--jobs` copies of it at the same time, and prints
the median step times and the throughput ratio

    ratio = jobs x (step time alone) / (mean step time side by side),

steps per second of all jobs together over steps per second of one alone: above 1, side by side
wins. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _start(size: str, steps: int, out: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        str(HERE / "t5_train.py"),
        "--sizes",
        size,
        "--steps",
        str(steps),
        "--json",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *sys.path])}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _median_step(processes: list[tuple[subprocess.Popen, Path]]) -> list[float]:
    """Waits for the benchmark processes; returns each one's median step time (s)."""
    times = []
    for process, out in processes:
        _, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"t5_train.py failed:\n{err.decode()[-2000:]}")
        times.append(json.loads(out.read_text())[0]["median_step_s"])
    return times


def measure(size: str, jobs: int, steps: int) -> dict:
    """Median step time of `size` alone and with `jobs` copies at once, and their ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        alone = _median_step(
            [(_start(size, steps, Path(tmp) / "alone.json"), Path(tmp) / "alone.json")]
        )[0]
        outs = [Path(tmp) / f"job{i}.json" for i in range(jobs)]
        together = _median_step([(_start(size, steps, out), out) for out in outs])
    mean = sum(together) / len(together)
    return {
        "size": size,
        "jobs": jobs,
        "cores": os.cpu_count(),
        "step_alone_s": alone,
        "step_side_by_side_s": together,
        "throughput_ratio": jobs * alone / mean,
    }


def main() -> None:
    """Prints the step times and the throughput ratio of side-by-side jobs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mt_d128", help="a name in t5_train.CONFIGS")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    r = measure(args.size, args.jobs, args.steps)
    side = ", ".join(f"{t * 1e3:.0f}" for t in r["step_side_by_side_s"])
    print(f"{r['size']} on {r['cores']} cores, median of {args.steps} steps")
    print(f"  one job alone:          {r['step_alone_s'] * 1e3:.0f} ms/step")
    print(f"  {args.jobs} jobs side by side:   {side} ms/step")
    print(f"  throughput ratio (side by side / alone): {r['throughput_ratio']:.2f}x")


if __name__ == "__main__":
    main()
