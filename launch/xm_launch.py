"""The xmanager launcher: one experiment per sweep, one work unit per run.

Runs are added in dependency waves (every run whose parents are done), and each wave is waited
for before the next, so a CPT work unit starts only once its source checkpoint exists. The
container runs `python -m trainer.train` (`t5x.train` for the t5x runner) with the same gin flags
as every other launcher.

Work units are packaged as a container built from this checkout (`--xm-packaging container`, the
default: what Vertex AI and Kubernetes run), or, with `--xm-executor local --xm-packaging checkout`,
run as processes of this machine from this checkout's Python, with no image: a workstation's
sweep, each unit's output appended to its run's `train.log` as the local launcher does.

xmanager is imported only when launching for real; `--dry-run` works without it or any
credentials. As a script (e.g. under `xmanager launch`):

    python -m launch.xm_launch cpt_paper --var DATA_DIR=gs://... --dry-run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from launch import zeroshot_stage
from launch.launchers import LaunchReport, log_path, options_from_args, start_launch
from launch.runs import Run
from launch.status import Progress
from launch.sweep import topological_order
from rundir import names

REPO_ROOT = Path(__file__).resolve().parent.parent
# Executor name -> xmanager.xm_local class name.
JAX_VERSION = "0.10.2"
EXECUTORS: dict[str, str] = {"vertex": "Vertex", "local": "Local", "kubernetes": "Kubernetes"}
# How a work unit's program is packaged -> what it is.
PACKAGINGS: dict[str, str] = {
    "container": "an image built from this checkout",
    "checkout": "this checkout's Python, as a process of this machine (--xm-executor local only)",
}
# The checkout packaging's unit: `sh -c SCRIPT PYTHON -m MODULE ARGS...`, its output appended to
# the log named by LOG_ENV (set per job: xmanager merges an executable's args before the job's).
LOG_ENV = "XLSCALE_WORK_UNIT_LOG"
LOGGED = f'exec "$0" "$@" >> "${LOG_ENV}" 2>&1'


def waves(runs: Sequence[Run]) -> list[list[Run]]:
    """Groups runs into waves: each run lands in the first wave after all its dependencies
    (dependencies outside `runs`, e.g. already completed, do not hold it back)."""
    ids = {r.run_id for r in runs}
    level: dict[str, int] = {}
    ordered = topological_order(runs)
    for run in ordered:
        deps = [level[d] for d in run.depends_on if d in ids]
        level[run.run_id] = 1 + max(deps) if deps else 0
    grouped: list[list[Run]] = [[] for _ in range(1 + max(level.values(), default=-1))]
    for run in ordered:
        grouped[level[run.run_id]].append(run)
    return grouped


def _is_unit_exit(error: BaseException | None) -> bool:
    """Whether `error` is xm_local's for a local unit that ended non-zero (a RuntimeError, or
    xmanager's ExperimentUnitError around one)."""
    return isinstance(error, RuntimeError) and "returned non-zero code" in str(error)


class _ReportedUnitFailures(logging.Filter):
    """Drops xm_local's tracebacks of local units that ended non-zero, which it logs as the
    experiment ends ("Multiple exceptions occurred ... ignored"): the launcher awaited each unit
    and reported it (failed, or stopped on request) already."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (
            record.getMessage().startswith("Multiple exceptions occurred") and _is_unit_exit(error)
        )


class XManagerLauncher:
    """Launches a sweep as one xmanager experiment (see the module docstring)."""

    name = "xmanager"

    def __init__(
        self,
        *,
        title: str = "xlscale",
        executor: str = "vertex",
        accelerator: str = "TPU_V3",
        accelerator_count: int = 8,
        base_image: str = "python:3.11",
        project_path: str | Path = REPO_ROOT,
        packaging: str = "container",
        python: str | None = None,
    ):
        if executor not in EXECUTORS:
            raise ValueError(f"unknown executor {executor!r}; choose one of {sorted(EXECUTORS)}")
        if packaging not in PACKAGINGS:
            raise ValueError(
                f"--xm-packaging {packaging!r}: allowed: {', '.join(sorted(PACKAGINGS))}"
            )
        if packaging == "checkout" and executor != "local":
            raise ValueError(
                f"--xm-packaging checkout runs work units as processes of this machine: it needs "
                f"--xm-executor local (given: --xm-executor {executor})"
            )
        self.title, self.executor, self.packaging = title, executor, packaging
        self.python = python or sys.executable
        self.accelerator, self.accelerator_count = accelerator, accelerator_count
        self.base_image, self.project_path = base_image, str(project_path)

    @classmethod
    def add_arguments(cls, group) -> None:
        """Command-line options of this launcher."""
        group.add_argument("--xm-title", help="experiment title (default: the manifest name)")
        group.add_argument("--xm-executor", default="vertex", choices=sorted(EXECUTORS))
        group.add_argument("--xm-accelerator", default="TPU_V3", help="e.g. TPU_V3, A100")
        group.add_argument("--xm-accelerator-count", type=int, default=8)
        group.add_argument("--xm-base-image", default="python:3.11")
        group.add_argument(
            "--xm-packaging",
            default="container",
            choices=sorted(PACKAGINGS),
            help="; ".join(f"{k}: {v}" for k, v in PACKAGINGS.items()),
        )

    @classmethod
    def from_args(cls, args) -> XManagerLauncher:
        """Builds the launcher from parsed command-line options."""
        return cls(
            title=args.xm_title or getattr(args, "manifest_name", "xlscale"),
            **options_from_args(
                args,
                executor="xm_executor",
                accelerator="xm_accelerator",
                accelerator_count="xm_accelerator_count",
                base_image="xm_base_image",
                packaging="xm_packaging",
            ),
        )

    def docker_instructions(self) -> list[str]:
        """Image build steps: copy the checkout and install it with the accelerator's JAX."""
        name = Path(self.project_path).name
        jax = "jax[tpu]" if self.accelerator.startswith("TPU") else "jax[cuda12]"
        return [
            f"COPY {name}/ {name}",
            f"WORKDIR {name}",
            f"RUN python -m pip install . '{jax}=={JAX_VERSION}'",
        ]

    def plan(
        self, runs: Sequence[Run], *, allow_missing: bool = True, completed: Sequence[Run] = ()
    ) -> list[str]:
        """Human-readable description of the experiment and its work units, wave by wave, then
        the zero-shot stage's units (`launch.zeroshot_stage`): one per run that has one, after
        the run's unit, and one per `completed` run not yet scored."""
        modules = " | ".join(sorted({run.module for run in runs}) or ["trainer.train"])
        header = (
            f"xmanager experiment {self.title!r}: {len(runs)} work units, executor "
            f"{EXECUTORS[self.executor]}({self.accelerator}={self.accelerator_count}), "
        )
        if self.packaging == "checkout":
            lines = [header + f"processes {self.python} -m {modules}, each run's output to its log"]
        else:
            lines = [
                header + f"container python -m {modules} from {self.project_path}",
                *(f"  docker: {line}" for line in self.docker_instructions()),
            ]
        for i, wave in enumerate(waves(runs)):
            lines.append(
                f"wave {i} ({len(wave)} work units; waits for wave {i - 1})"
                if i
                else f"wave 0 ({len(wave)} work units)"
            )
            for run in wave:
                unit = {
                    "work_unit": run.run_id,
                    "module": run.module,
                    "args": run.gin_args(allow_missing=allow_missing),
                    "env_vars": run.environment(allow_missing=allow_missing),
                }
                lines.append("  " + json.dumps(unit))
        scoring = [r for r in runs if r.zeroshot is not None]
        scoring += [r for r in completed if zeroshot_stage.needs_scoring(r)]
        if scoring:
            lines.append(f"zero-shot ({len(scoring)} work units; each after its run's)")
        for run in scoring:
            argv = zeroshot_stage.run_argv(run, allow_missing=allow_missing)
            unit = {
                "work_unit": zeroshot_stage.job_name(run),
                "module": zeroshot_stage.SCORE_MODULE,
                "args": argv[3:],
                "env_vars": run.environment(allow_missing=allow_missing),
            }
            lines.append("  " + json.dumps(unit))
        return lines

    def launch(
        self, runs: Sequence[Run], *, dry_run: bool = False, progress: Progress | None = None
    ) -> LaunchReport:
        """Adds a work unit per pending run (prints the plan instead when `dry_run`)."""
        pending, progress, report = start_launch(runs, progress)
        completed = [r for r in runs if r.run_id in set(report.skipped)]
        if dry_run:
            report.commands = self.plan(pending, completed=completed)
            print("\n".join(report.commands), file=progress.stream, flush=True)
            return report
        try:
            from xmanager import xm, xm_local  # noqa: F401 -- checked here, used in _launch
        except ImportError as e:
            raise RuntimeError(
                "the xmanager launcher needs `pip install xmanager` and GCP credentials; "
                "--dry-run shows what it would launch without either"
            ) from e
        unscored = [r for r in completed if zeroshot_stage.needs_scoring(r)]
        if pending or unscored:
            asyncio.run(self._launch(pending, progress, report, unscored))
        return report

    async def _launch(
        self, runs: list[Run], progress: Progress, report: LaunchReport, unscored: list[Run]
    ) -> None:
        from absl import flags
        from xmanager import xm, xm_local

        # xmanager reads its absl flags (its database, Docker options) at launch; under
        # `xlscale sweep run` nothing has parsed them (`xmanager launch` would): their defaults.
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        executor_cls = getattr(xm_local, EXECUTORS[self.executor])
        requirements = xm.JobRequirements(**{self.accelerator: self.accelerator_count})
        # One executable per module: the runner's (t5x.train, or with COMET the finetunes'
        # launch.t5x_comet beside the pretraining's t5x.train), then the scorer's.
        training = sorted({r.module for r in runs}) or [unscored[0].module]
        modules = [*training, zeroshot_stage.SCORE_MODULE]
        unit_failures = []  # units that ended non-zero, each recorded in the report
        quiet = _ReportedUnitFailures()
        logging.getLogger("absl").addFilter(quiet)
        try:
            async with xm_local.create_experiment(experiment_title=self.title) as experiment:
                packaged = experiment.package(
                    [self._packageable(xm, executor_cls, module) for module in modules]
                )
                executables = dict(zip(modules, packaged, strict=True))
                executor = executor_cls(requirements=requirements)
                await self._add_units(
                    xm,
                    experiment,
                    executables,
                    executor,
                    runs=runs,
                    unscored=unscored,
                    progress=progress,
                    report=report,
                    failures=unit_failures,
                )
        except Exception as e:
            # xm_local raises a failed local unit's error again as the experiment ends; each
            # such unit is already in the report (failed, stopped on request, or score_failed).
            if not (unit_failures and _is_unit_exit(e)):
                raise
        finally:
            logging.getLogger("absl").removeFilter(quiet)

    def _packageable(self, xm, executor_cls, module: str):
        """The xmanager packageable that runs `python -m module` (see PACKAGINGS)."""
        if self.packaging == "checkout":
            return xm.binary(
                path="/bin/sh",
                args=["-c", LOGGED, self.python, "-m", module],
                executor_spec=executor_cls.Spec(),
            )
        return xm.python_container(
            executor_spec=executor_cls.Spec(),
            path=self.project_path,
            base_image=self.base_image,
            entrypoint=xm.ModuleName(module),
            docker_instructions=self.docker_instructions(),
        )

    def _environment(self, run: Run) -> dict[str, str]:
        """A unit's environment: the run's, and with the checkout packaging its log's path."""
        env = run.environment()
        if self.packaging == "checkout":
            env[LOG_ENV] = os.fspath(log_path(run))
        return env

    async def _add_units(
        self, xm, experiment, executables, executor, *, runs, unscored, progress, report, failures
    ) -> None:
        """Adds the work units wave by wave, waiting for each wave, and the zero-shot units;
        records each unit's end in `report` and each unit that ended non-zero in `failures`."""
        scorer = executables[zeroshot_stage.SCORE_MODULE]

        async def score(run: Run):
            job = xm.Job(
                executable=scorer,
                executor=executor,
                args=zeroshot_stage.run_argv(run)[3:],
                env_vars=self._environment(run),
            )
            return run, await experiment.add(job)

        scoring = [await score(run) for run in unscored]
        for wave in waves(runs):
            units = []
            for run in wave:
                if report.block_if_dependency_failed(run, progress):
                    continue
                if report.stop_if_requested(run, progress):  # since the launch began
                    continue
                job = xm.Job(
                    executable=executables[run.module],
                    executor=executor,
                    args=run.gin_args(),
                    env_vars=self._environment(run),
                )
                started = progress.start(run)
                units.append((run, started, await experiment.add(job)))
                report.submitted.append(run.run_id)
            for run, started, unit in units:
                try:
                    await unit.wait_until_complete()
                    ok = True
                except Exception as e:  # noqa: BLE001 -- xmanager's ExperimentUnitError
                    ok, why = False, f"({e})"
                    failures.append(run.run_id)
                report.ended(run, ok)  # a unit that stopped on request is stopped
                if run.run_id in report.stopped:  # not a failure, as the other launchers
                    progress.skip(run, f"stopped on request ({names.STOP_REQUEST_FILE})")
                    continue
                progress.finish(run, ok, started, "" if ok else why)
                if ok and run.zeroshot is not None:
                    scoring.append(await score(run))
                elif not ok:
                    progress.fail(run)
        for run, unit in scoring:  # the zero-shot stage: each unit ran beside later waves
            try:
                await unit.wait_until_complete()
                report.scored.append(run.run_id)
            except Exception as e:  # noqa: BLE001 -- xmanager's ExperimentUnitError
                progress.note(f"zero-shot work unit of {run.run_id} failed: {e}")
                failures.append(run.run_id)
                report.score_failed.append(run.run_id)


def main(argv: list[str] | None = None) -> int:
    """`python -m launch.xm_launch MANIFEST [--var K=V] [--runs-dir D] [--dry-run] [xm options]`."""
    from launch import cli_options
    from launch.run_selection import launch_in_stages
    from launch.sweep import load_manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli_options.add_manifest_arguments(parser)
    parser.add_argument("--dry-run", action="store_true")
    XManagerLauncher.add_arguments(parser)
    args = parser.parse_args(argv)
    variables = cli_options.manifest_variables(args)
    manifest = load_manifest(args.manifest, variables=variables, runs_dir=args.runs_dir)
    args.manifest_name = manifest.name
    launcher = XManagerLauncher.from_args(args)
    reports, _ = launch_in_stages(manifest, launcher, dry_run=args.dry_run)  # around [[select]]s
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
