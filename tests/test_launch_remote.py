"""Dry runs of the TPU-VM, SLURM and xmanager launchers and the TPU setup script: each renders the
same `trainer.train` command line as the local launcher, with its own wrapping."""

import argparse
import dataclasses
import datetime
import importlib.util
import io
import json
import shlex
import subprocess
import threading
from pathlib import Path

import pytest
from launch_fakes import smoke_runs

from launch import slurm, status, sweep, tpu_vm, xm_launch

REPO = Path(sweep.__file__).resolve().parent.parent


@pytest.fixture
def runs(tmp_path):
    return smoke_runs(tmp_path / "runs", data_dir="gs://b/data dir", vocab_path="gs://b/v.model")


def progress(runs):
    return status.Progress(runs, stream=io.StringIO())


def test_tpu_vm_dry_run_renders_one_gcloud_ssh_per_run(runs):
    launcher = tpu_vm.TpuVmLauncher(tpu="v4-32", zone="us-central2-b", project="proj")
    report = launcher.launch(runs, dry_run=True, progress=progress(runs))
    assert len(report.commands) == len(runs)
    for run, command in zip(runs, report.commands, strict=True):
        argv = shlex.split(command)
        assert argv[:11] == [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            "v4-32",
            "--zone",
            "us-central2-b",
            "--project",
            "proj",
            "--worker=all",
        ]
        assert argv[11] == "--command" and len(argv) == 13
        remote = argv[12]
        # the expectation makes a worker without a TPU refuse to start (trainer/platform.py)
        assert remote.startswith(
            "cd ~/xlscale && export PYTHONUNBUFFERED=1 XLSCALE_EXPECT_PLATFORM=tpu && "
        )
        train = remote.split(" && ")[-1]
        assert shlex.split(train) == run.argv(".venv/bin/python")
    remote = shlex.split(report.commands[0])[-1]
    assert "--gin.DATA_DIR='gs://b/data dir'" in shlex.split(remote.split(" && ")[-1])


def test_tpu_vm_runs_each_job_once_in_order(runs):
    called = []

    def fake_call(argv, stdout, stderr):
        remote = shlex.split(argv[-1].split(" && ")[-1])
        model_dir = Path(
            dict(a[6:].split("=", 1) for a in remote if a.startswith("--gin."))["MODEL_DIR"].strip(
                "'"
            )
        )
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "COMPLETED").write_text("{}")
        called.append(model_dir.name)
        stdout.write("worker output\n")
        return 0

    launcher = tpu_vm.TpuVmLauncher(
        tpu="t", zone="z", call=fake_call, log_dir=str(Path(runs[0].model_dir).parent / "logs")
    )
    report = launcher.launch(runs, progress=progress(runs))
    assert report.ok and called == [r.run_id for r in runs]
    assert (Path(launcher.log_dir) / f"{runs[0].run_id}.log").read_text() == "worker output\n"
    called.clear()
    assert launcher.launch(runs, progress=progress(runs)).skipped == [r.run_id for r in runs]
    assert called == []


def test_tpu_vm_on_two_slices_runs_each_job_on_both_at_once_with_a_mesh_across_them(runs):
    launcher = tpu_vm.TpuVmLauncher(
        tpu="qr", zone="z", num_slices=2, log_dir=str(Path(runs[0].model_dir).parent / "logs")
    )
    # The dry run is shell that starts both slices in the background and waits for them.
    lines = launcher.describe(runs[0]).splitlines()
    assert len(lines) == 3 and lines[-1] == "wait" and all(x.endswith(" &") for x in lines[:2])
    names = [shlex.split(line[: -len(" &")])[5] for line in lines[:2]]
    assert names == ["qr-0", "qr-1"]  # a multislice queued resource's nodes
    remote = shlex.split(shlex.split(lines[0][: -len(" &")])[-1].split(" && ")[-1])
    assert remote == [*runs[0].argv(".venv/bin/python"), f"--gin.{tpu_vm.NUM_SLICES_BINDING}=2"]

    # Both slices' ssh run at once: a job on several slices starts only when all have joined,
    # so one waiting for the other would never return (the barrier would break instead).
    barrier, seen = threading.Barrier(2, timeout=120), []

    def fake_call(argv, stdout, stderr):
        barrier.wait()
        seen.append(argv[5])
        stdout.write(f"worker output on {argv[5]}\n")
        return 3 if argv[5] == "qr-1" else 0

    launcher.call = fake_call
    assert launcher.execute(runs[0], progress(runs)) == 3  # the failing slice's status
    assert sorted(seen) == ["qr-0", "qr-1"]
    logs = [p.read_text() for p in launcher.log_paths(runs[0])]
    assert logs == ["worker output on qr-0\n", "worker output on qr-1\n"]
    assert [p.name for p in launcher.log_paths(runs[0])] == [
        f"{runs[0].run_id}.slice-0.log",
        f"{runs[0].run_id}.slice-1.log",
    ]


def test_the_slice_binding_reaches_the_trainers_mesh(runs, clean_gin):
    import gin

    from trainer import gin_entry

    launcher = tpu_vm.TpuVmLauncher(tpu="qr", zone="z", num_slices=4)
    run = next(r for r in runs if not r.waits_for_selection)
    gin_entry.parse(launcher.job_argv(run)[3:], job="train")
    assert gin.query_parameter("partitioning.MeshConfig.num_slices") == 4


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_tpu_vm_slice_counts_are_checked(value):
    with pytest.raises(ValueError, match=rf"--num-slices {value!r}: allowed an integer >= 1"):
        tpu_vm.TpuVmLauncher(tpu="qr", zone="z", num_slices=value)


def test_tpu_vm_parses_num_slices_and_refuses_it_for_t5x_runs(runs):
    from xlscale_cli import sweep as sweep_cli

    parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(parser)
    args = parser.parse_args(
        ["run", "smoke", "--launcher", "tpu_vm", "--tpu", "qr", "--zone", "z", "--num-slices", "2"]
    )
    launcher = tpu_vm.TpuVmLauncher.from_args(args)
    assert launcher.slices == ["qr-0", "qr-1"]
    t5x_run = dataclasses.replace(runs[0], runner="t5x")
    with pytest.raises(ValueError, match=r"--num-slices 2: run .* 't5x' runner.*allowed"):
        launcher.job_argv(t5x_run)


def test_slurm_scripts_chain_dependencies_and_set_up_jax_distributed(runs, tmp_path):
    launcher = slurm.SlurmLauncher(
        nodes=2,
        gpus_per_node=4,
        partition="gpu",
        script_dir=str(tmp_path / "slurm"),
        workdir="/repo",
    )
    report = launcher.launch(runs, dry_run=True, progress=progress(runs))
    assert len(report.commands) == len(runs)
    by_id = {r.run_id: c for r, c in zip(runs, report.commands, strict=True)}
    for run in runs:
        argv = shlex.split(by_id[run.run_id])
        assert argv[:2] == ["sbatch", "--parsable"] and argv[-1].endswith(f"{run.run_id}.sbatch")
        if run.depends_on:
            assert argv[2] == f"--dependency=afterok:<job:{run.depends_on[0]}>"
        else:
            assert len(argv) == 3
    script = (tmp_path / "slurm" / f"{runs[-1].run_id}.sbatch").read_text()
    for line in [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "cd /repo",
        'export JAX_NUM_PROCESSES="$SLURM_NTASKS"',
        "export PYTHONUNBUFFERED=1",
    ]:
        assert line in script, line
    assert shlex.split(_trainer_command(script)) == runs[-1].argv("python")
    assert "{{" not in script
    subprocess.run(
        ["bash", "-n", str(tmp_path / "slurm" / f"{runs[-1].run_id}.sbatch")], check=True
    )


def test_slurm_submits_with_real_job_ids(runs, tmp_path):
    submitted = []

    def fake_sbatch(argv):
        submitted.append(argv)
        return str(1000 + len(submitted))

    launcher = slurm.SlurmLauncher(
        script_dir=str(tmp_path / "s"), submit=fake_sbatch, queued=lambda: {}
    )
    report = launcher.launch(runs, progress=progress(runs))
    assert report.submitted == [r.run_id for r in runs]
    job_of = {r.run_id: str(1001 + i) for i, r in enumerate(runs)}
    for run, argv in zip(runs, submitted, strict=True):
        if run.depends_on:
            assert argv[2] == f"--dependency=afterok:{job_of[run.depends_on[0]]}"

    # Submitting again while the sources are still queued: only the others go, chained to them.
    sources = {r.run_id: f"77{i}" for i, r in enumerate(runs) if r.strategy == "source"}
    submitted.clear()
    launcher.queued = lambda: sources
    report = launcher.launch(runs, progress=progress(runs))
    assert set(report.submitted) == {r.run_id for r in runs} - set(sources)
    for argv in submitted:
        name = Path(argv[-1]).stem
        run = next(r for r in runs if r.run_id == name)
        if run.parent in sources:
            assert argv[2] == f"--dependency=afterok:{sources[run.parent]}"


def _trainer_command(script: str) -> str:
    """The trainer's command line in a rendered script (the line after `srun ... trainer \\`)."""
    lines = script.splitlines()
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    return lines[srun + 2].strip()


def _sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_slurm_script_on_a_cpu_partition_asks_only_for_what_was_given(runs, tmp_path):
    launcher = slurm.SlurmLauncher(
        gpus_per_node=0, cpus_per_task=2, script_dir=str(tmp_path / "s"), workdir="/repo"
    )
    script = launcher.render(runs[0])
    assert _sbatch_lines(script) == [
        f"#SBATCH --job-name={runs[0].run_id}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --time=48:00:00",
        f"#SBATCH --output={tmp_path / 's' / 'logs'}/%x-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --kill-on-invalid-dep=yes",
        "#SBATCH --requeue",
    ]
    code = [line for line in script.lower().splitlines() if not line.strip().startswith("# ")]
    assert not [line for line in code if "gpu" in line]  # comments may say what GPUs would do
    assert shlex.split(_trainer_command(script)) == runs[0].argv("python")
    path = tmp_path / "cpu.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_slurm_script_with_gpus_and_every_placement_option(runs, tmp_path):
    launcher = slurm.SlurmLauncher(
        gpus_per_node=8,
        cpus_per_task=16,
        mem="64G",
        partition="gpu",
        account="proj",
        qos="high",
        sbatch_lines=["--constraint=h100", "#SBATCH --exclusive"],
        max_requeues=0,
        signal_before=120,
        time_limit="2:00:00",
        script_dir=str(tmp_path / "s"),
    )
    lines = _sbatch_lines(launcher.render(runs[0]))
    for line in [
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --mem=64G",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=h100",
        "#SBATCH --exclusive",
        "#SBATCH --no-requeue",
        "#SBATCH --time=2:00:00",
    ]:
        assert line in lines, line
    assert "#SBATCH --requeue" not in lines
    with pytest.raises(ValueError, match="--sbatch-line .*: give one sbatch long option"):
        slurm.SlurmLauncher(sbatch_lines=["--mem=1G\nrm -rf /"])
    with pytest.raises(ValueError, match="'-C h100': give one sbatch long option"):
        slurm.SlurmLauncher(sbatch_lines=["-C h100"])
    with pytest.raises(ValueError, match="--time is set by --time-limit"):
        slurm.SlurmLauncher(sbatch_lines=["--time=1:00:00"])


def test_slurm_extra_lines_come_from_the_manifest_then_the_command_line(tmp_path):
    manifest = tmp_path / "m.toml"
    text = (sweep.MANIFESTS_DIR / "smoke.toml").read_text()
    manifest.write_text(text + '\n[slurm]\nsbatch_lines = ["--constraint=h100", "--exclusive"]\n')
    variables = {"DATA_DIR": "/d", "VOCAB_PATH": "/v.model"}
    loaded = sweep.load_manifest(manifest, variables=variables, runs_dir=str(tmp_path / "r"))
    runs = sweep.expand(loaded)
    assert {r.sbatch_lines for r in runs} == {("--constraint=h100", "--exclusive")}
    # Where the job runs is not what it computes: the run ids are the manifest's without [slurm].
    plain = sweep.load_manifest("smoke", variables=variables, runs_dir=str(tmp_path / "r"))
    assert [r.run_id for r in runs] == [r.run_id for r in sweep.expand(plain)]
    launcher = slurm.SlurmLauncher(
        gpus_per_node=0,
        sbatch_lines=["--exclusive", "--comment=cli"],
        script_dir=str(tmp_path / "s"),
    )
    assert _sbatch_lines(launcher.render(runs[0]))[-4:] == [
        "#SBATCH --requeue",
        "#SBATCH --constraint=h100",
        "#SBATCH --exclusive",
        "#SBATCH --comment=cli",
    ]
    with pytest.raises(ValueError, match="out of range"):
        slurm.SlurmLauncher(gpus_per_node=-1)


def test_slurm_command_line_reaches_the_script(tmp_path):
    import argparse

    from xlscale_cli import sweep as sweep_cli

    parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "run",
            "smoke",
            "--launcher",
            "slurm",
            "--gpus-per-node",
            "0",
            "--tasks-per-node",
            "2",
            "--cpus-per-task",
            "1",
            "--mem",
            "2G",
            "--qos",
            "low",
            "--sbatch-line=--constraint=cpu",
            "--sbatch-line=--exclusive",
            "--max-requeues",
            "5",
            "--signal-before",
            "60",
            "--slurm-workdir",
            "/nodes/xlscale",
        ]
    )
    launcher = slurm.SlurmLauncher.from_args(args)
    assert launcher.sbatch_options() == [
        "#SBATCH --mem=2G",
        "#SBATCH --qos=low",
        "#SBATCH --requeue",
        "#SBATCH --constraint=cpu",
        "#SBATCH --exclusive",
    ]
    assert (launcher.cpus_per_task, launcher.max_requeues, launcher.signal_before) == (1, 5, 60)
    assert launcher.tasks_per_node == 2
    assert launcher.workdir == "/nodes/xlscale"


def _fake_srun_script(
    script: str,
    tmp_path: Path,
    *,
    exit_code: int,
    restarts: int,
    nodes: int = 1,
    tasks_per_node: int = 1,
    end_time: str = "Unknown",
    train_s: float = 0,
    node_addr: bool = True,
    fails: int = 0,
) -> tuple:
    """Runs a rendered script under bash with stand-ins for `srun` (starts the tasks one after
    another, each with its SLURM_PROCID and SLURM_LOCALID), `scontrol` (hosts node7, node8, ...;
    other calls recorded), `squeue` (the job's `end_time`), `scancel` (recorded) and the
    trainer's `python` (prints the jax.distributed variables it sees, takes `train_s` seconds,
    then exits `exit_code`); returns (exit code, output, calls). `node_addr`: `scontrol show
    node nodeN` gives the node's address 10.0.0.N (else nothing, as where SLURM has none).
    `fails`: `squeue` and `scancel` each fail their first `fails` calls, as a busy controller's
    do (recorded too)."""
    bin_dir = tmp_path / f"bin{exit_code}_{restarts}_{nodes}x{tasks_per_node}_{train_s}"
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    calls.write_text("")
    (bin_dir / "srun").write_text(
        f"#!/bin/bash\necho srun >> {calls}\nshift\ncode=0\n"
        "for ((i = 0; i < SLURM_NTASKS; i++)); do\n"
        '  SLURM_PROCID=$i SLURM_LOCALID=$((i % SLURM_NTASKS_PER_NODE)) "$@" || code=$?\n'
        "done\nexit $code\n"
    )
    hosts = "\\n".join(f"node{7 + i}" for i in range(nodes))
    # `show node nodeN`: as SLURM prints it, with the node's address 10.0.0.N (NodeAddr).
    node = (
        'printf "NodeName=$3 Arch=x86_64 CoresPerSocket=1\\n   '
        'NodeAddr=10.0.0.${3#node} NodeHostName=$3 Version=22.05.8\\n"'
        if node_addr
        else "true"
    )
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\nif [ "$1 $2" = "show node" ]; then {node}; exit; fi\n'
        f'if [ "$1" = show ]; then printf "{hosts}\\n"; exit; fi\n'
        f'echo "scontrol $*" >> {calls}\n'
    )
    for tool, answer in (
        ("squeue", f"echo {end_time}"),
        ("scancel", f'echo "scancel $*" >> {calls}'),
    ):
        tries = bin_dir / f"{tool}.tries"
        (bin_dir / tool).write_text(
            f"#!/bin/sh\necho x >> {tries}\n"
            f'if [ "$(wc -l < {tries})" -le {fails} ]; then\n'
            f'  echo "{tool} failed" >> {calls}\n'
            f'  echo "{tool}: error: Socket timed out on send/recv operation" >&2; exit 1\nfi\n'
            f"{answer}\n"
        )
    (bin_dir / "python").write_text(
        '#!/bin/sh\necho "task $SLURM_PROCID: coordinator=${JAX_COORDINATOR_ADDRESS:-} '
        "processes=${JAX_NUM_PROCESSES:-} id=${JAX_PROCESS_ID:-} "
        'devices=${JAX_LOCAL_DEVICE_IDS:-} collectives=${JAX_CPU_COLLECTIVES_IMPLEMENTATION:-}"\n'
        f"sleep {train_s}\nexit {exit_code}\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "1042",
        "SLURM_JOB_NODELIST": f"node[7-{6 + nodes}]",
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS": str(nodes * tasks_per_node),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_RESTART_COUNT": str(restarts),
    }
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True)
    return done.returncode, done.stdout, calls.read_text().splitlines()


@pytest.mark.parametrize(
    ("nodes", "tasks", "gpus", "devices"),
    [
        (1, 1, 8, None),  # one plain process: no jax.distributed
        (2, 1, 8, ["0,1,2,3,4,5,6,7"] * 2),  # one process per node drives all 8 GPUs
        (1, 4, 8, ["0,1", "2,3", "4,5", "6,7"]),
        (2, 2, 2, ["0", "1", "0", "1"]),  # one process per GPU
        (1, 2, 0, [""] * 2),  # CPU partition: 2 processes, gloo collectives
    ],
)
def test_slurm_script_starts_jax_distributed_for_every_task(
    runs, tmp_path, nodes, tasks, gpus, devices
):
    launcher = slurm.SlurmLauncher(
        nodes=nodes, tasks_per_node=tasks, gpus_per_node=gpus, workdir=str(tmp_path)
    )
    script = launcher.render(runs[0])
    assert f"#SBATCH --ntasks-per-node={tasks}" in _sbatch_lines(script)
    code, out, calls = _fake_srun_script(
        script, tmp_path, exit_code=0, restarts=0, nodes=nodes, tasks_per_node=tasks
    )
    assert code == 0 and calls == ["srun"], out
    seen = [line for line in out.splitlines() if line.startswith("task ")]
    if devices is None:
        assert seen == ["task 0: coordinator= processes= id= devices= collectives="]
        return
    # Every task finds process 0 on the first host, at its address (NodeAddr) and the port
    # offset by the job id (1042).
    assert seen == [
        f"task {i}: coordinator=10.0.0.7:12387 processes={nodes * tasks} id={i} "
        f"devices={devices[i]} collectives=gloo"
        for i in range(nodes * tasks)
    ]


def test_slurm_coordinator_is_the_first_node_name_where_slurm_has_no_address(runs, tmp_path):
    launcher = slurm.SlurmLauncher(nodes=2, gpus_per_node=0, workdir=str(tmp_path))
    code, out, calls = _fake_srun_script(
        launcher.render(runs[0]), tmp_path, exit_code=0, restarts=0, nodes=2, node_addr=False
    )
    assert code == 0 and calls == ["srun"], out
    assert "task 0: coordinator=node7:12387 processes=2 id=0" in out, out


def test_slurm_tasks_per_node_must_split_the_gpus_evenly():
    with pytest.raises(ValueError, match="--tasks-per-node 3: .* divides --gpus-per-node 8"):
        slurm.SlurmLauncher(gpus_per_node=8, tasks_per_node=3)
    with pytest.raises(ValueError, match="--tasks-per-node 0"):
        slurm.SlurmLauncher(gpus_per_node=0, tasks_per_node=0)
    assert slurm.SlurmLauncher(gpus_per_node=0, tasks_per_node=3).tasks_per_node == 3


@pytest.mark.parametrize(
    ("exit_code", "restarts", "requeued", "job_exit"),
    [
        (75, 0, True, 0),
        (75, 2, True, 0),
        (75, 3, False, 75),
        (143, 0, True, 0),  # a SIGTERM the trainer could not catch (starting, or exiting)
        (1, 0, False, 1),
        (0, 0, False, 0),
    ],
)
def test_slurm_script_requeues_itself_only_after_a_checkpointed_stop(
    runs, tmp_path, exit_code, restarts, requeued, job_exit
):
    launcher = slurm.SlurmLauncher(gpus_per_node=0, workdir=str(tmp_path))
    code, out, calls = _fake_srun_script(
        launcher.render(runs[0]), tmp_path, exit_code=exit_code, restarts=restarts
    )
    assert code == job_exit, out
    assert calls == ["srun"] + (["scontrol requeue 1042"] if requeued else [])
    assert f"requeue {restarts} of at most 3" in out
    if requeued:
        assert f"requeue {restarts + 1} of at most 3" in out
    elif exit_code == 75:
        assert "trainer exited 75 after 3 requeues (at most 3): not requeued" in out
    if exit_code == 143:
        assert "trainer exited 143 (SIGTERM before it could save; resumes from its last" in out
    assert f"trainer exited {exit_code}" in out or requeued
    assert "no time limit known (squeue %e): no SIGTERM before it" in out


@pytest.mark.slow
def test_slurm_script_sends_sigterm_before_the_time_limit_of_each_start(runs, tmp_path):
    # The script's own timer, from the end time squeue gives this start (sbatch --signal would
    # reach a requeued job as soon as it restarts): SIGTERM to the job's steps 2 s before it.
    launcher = slurm.SlurmLauncher(gpus_per_node=0, signal_before=2, workdir=str(tmp_path))
    script = launcher.render(runs[0])
    assert not [line for line in _sbatch_lines(script) if "--signal" in line]
    # The limit is 11 s away (10 s after the seconds are cut), so a loaded machine that takes
    # several seconds to start bash still finds it more than 2 s away; the trainer outlasts it.
    soon = datetime.datetime.now() + datetime.timedelta(seconds=11)
    code, out, calls = _fake_srun_script(
        script,
        tmp_path,
        exit_code=75,
        restarts=1,
        end_time=soon.isoformat(timespec="seconds"),
        train_s=12,
    )
    assert code == 0, out
    assert calls == ["srun", "scancel --signal=TERM 1042", "scontrol requeue 1042"], out
    assert "xlscale: SIGTERM to the trainer, 2 s before the time limit" in out
    # Training that ends first stops the timer: no SIGTERM after it.
    code, out, calls = _fake_srun_script(
        script, tmp_path, exit_code=0, restarts=0, end_time=soon.isoformat(timespec="seconds")
    )
    assert code == 0 and calls == ["srun"], out
    # A limit closer than --signal-before: no early SIGTERM at all.
    now = datetime.datetime.now().isoformat(timespec="seconds")
    code, out, calls = _fake_srun_script(script, tmp_path, exit_code=0, restarts=2, end_time=now)
    assert "the time limit is less than 2 s away: no SIGTERM before it" in out


@pytest.mark.slow
def test_slurm_script_asks_a_busy_controller_again(runs, tmp_path):
    # squeue (the end time) and scancel (the SIGTERM) each time out once, as a busy slurmctld's
    # do: each asks again, and the trainer still gets its SIGTERM 2 s before the limit.
    launcher = slurm.SlurmLauncher(gpus_per_node=0, signal_before=2, workdir=str(tmp_path))
    # squeue's retry waits 5 s: the limit is 16 s away, the trainer would outlast it.
    soon = datetime.datetime.now() + datetime.timedelta(seconds=16)
    code, out, calls = _fake_srun_script(
        launcher.render(runs[0]),
        tmp_path,
        exit_code=75,
        restarts=0,
        end_time=soon.isoformat(timespec="seconds"),
        train_s=17,
        fails=1,
    )
    assert code == 0, out
    assert calls == [
        "squeue failed",
        "srun",
        "scancel failed",
        "scancel --signal=TERM 1042",
        "scontrol requeue 1042",
    ], out
    assert "xlscale: squeue failed (try 1 of 3): squeue: error: Socket timed out" in out
    assert "xlscale: scancel --signal=TERM 1042 failed (try 1 of 3)" in out
    assert "xlscale: SIGTERM to the trainer, 2 s before the time limit" in out


@pytest.mark.slow
def test_slurm_script_follows_a_time_limit_changed_while_the_job_runs(runs, tmp_path, monkeypatch):
    # The job starts with a far time limit; an administrator (or a test) then brings it near
    # (scontrol update TimeLimit=...): the script asks SLURM again every LIMIT_POLL_S and sends
    # the SIGTERM before the new limit, not the old one.
    monkeypatch.setattr(slurm, "LIMIT_POLL_S", 1)
    launcher = slurm.SlurmLauncher(gpus_per_node=0, signal_before=2, workdir=str(tmp_path))
    near = datetime.datetime.now() + datetime.timedelta(seconds=8)
    tries = tmp_path / "bin75_0_1x1_15" / "squeue.tries"  # the stand-in's call count
    end_time = (
        f'"$(if [ "$(wc -l < {tries})" -le 1 ]; then echo 2099-01-01T00:00:00; '
        f'else echo {near.isoformat(timespec="seconds")}; fi)"'
    )
    code, out, calls = _fake_srun_script(
        launcher.render(runs[0]),
        tmp_path,
        exit_code=75,
        restarts=0,
        end_time=end_time,
        train_s=15,
    )
    assert code == 0, out
    assert calls == ["srun", "scancel --signal=TERM 1042", "scontrol requeue 1042"], out
    assert "xlscale: SIGTERM to the trainer, 2 s before the time limit" in out


def test_slurm_sbatch_refusal_fails_the_run_and_blocks_its_dependents(runs, tmp_path):
    def refuse_sources(argv):
        if "--dependency" not in " ".join(argv):
            raise slurm.SubmitError("sbatch refused the job: invalid partition specified")
        return "7"

    launcher = slurm.SlurmLauncher(
        script_dir=str(tmp_path / "s"), submit=refuse_sources, queued=lambda: {}
    )
    stream = io.StringIO()
    report = launcher.launch(runs, progress=status.Progress(runs, stream=stream))
    sources = {r.run_id for r in runs if not r.depends_on}
    assert set(report.failed) == sources
    assert set(report.blocked) == {r.run_id for r in runs if r.depends_on}
    assert "invalid partition specified" in stream.getvalue()


def test_template_placeholders_must_match():
    assert slurm.render_template("a {{X}} b", {"X": "1"}) == "a 1 b"
    with pytest.raises(ValueError, match="missing values \\['Y'\\]"):
        slurm.render_template("{{X}} {{Y}}", {"X": "1"})
    with pytest.raises(ValueError, match="unused values \\['Z'\\]"):
        slurm.render_template("{{X}}", {"X": "1", "Z": "2"})


def test_xmanager_dry_run_needs_no_xmanager(runs):
    stream = io.StringIO()
    launcher = xm_launch.XManagerLauncher(title="smoke", accelerator="TPU_V4", accelerator_count=8)
    report = launcher.launch(runs, dry_run=True, progress=status.Progress(runs, stream=stream))
    text = stream.getvalue()
    assert f"xmanager experiment 'smoke': {len(runs)} work units" in text
    assert "Vertex(TPU_V4=8)" in text and "jax[tpu]==0.10.2" in text
    units = [json.loads(line) for line in report.commands if line.startswith("  {")]
    assert [u["work_unit"] for u in units] == [r.run_id for r in xm_launch_order(runs)]
    for unit in units:
        run = next(r for r in runs if r.run_id == unit["work_unit"])
        assert unit["args"] == run.gin_args()
    waves = xm_launch.waves(runs)
    assert [len(w) for w in waves] == [8, 7]
    assert {r.strategy for r in waves[0]} == {"source", "scratch"}
    assert {r.strategy for r in waves[1]} == {"cpt", "cpt_replay"}


def test_xmanager_checkout_packaging_runs_this_checkouts_python_on_the_local_executor(runs):
    # No image: each unit is `sh -c 'exec PYTHON -m MODULE ARGS >> LOG'` on xmanager's local
    # executor (tests/test_xmanager_local.py launches it for real).
    stream = io.StringIO()
    launcher = xm_launch.XManagerLauncher(executor="local", packaging="checkout", python="/py")
    report = launcher.launch(runs, dry_run=True, progress=status.Progress(runs, stream=stream))
    assert "Local(TPU_V3=8), processes /py -m trainer.train" in report.commands[0]
    assert not any("docker" in line for line in report.commands)
    with pytest.raises(
        ValueError, match="needs --xm-executor local \\(given: --xm-executor vertex"
    ):
        xm_launch.XManagerLauncher(packaging="checkout")
    with pytest.raises(ValueError, match="--xm-packaging 'image': allowed: checkout, container"):
        xm_launch.XManagerLauncher(packaging="image")


def xm_launch_order(runs):
    return [r for wave in xm_launch.waves(runs) for r in wave]


@pytest.mark.skipif(importlib.util.find_spec("xmanager") is not None, reason="xmanager installed")
def test_xmanager_real_launch_without_xmanager_says_how_to_get_it(runs):
    with pytest.raises(RuntimeError, match="pip install xmanager"):
        xm_launch.XManagerLauncher().launch(runs, progress=progress(runs))


def test_xm_launch_script_dry_run(capsys):
    assert xm_launch.main(["cpt_replay", "--dry-run", "--xm-accelerator", "A100"]) == 0
    out = capsys.readouterr().out
    assert "xmanager experiment 'cpt_replay': 9 work units" in out
    assert "jax[cuda12]==0.10.2" in out and "wave 1 (8 work units; waits for wave 0)" in out


def test_tpu_vm_setup_script_dry_run():
    script = REPO / "launch" / "tpu_vm_setup.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(
        ["bash", str(script), "--dry-run", "my-tpu", "us-central2-b", "proj"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = [shlex.split(line) for line in out.splitlines() if line.startswith("gcloud")]
    assert [line[:5] for line in lines] == [
        ["gcloud", "compute", "tpus", "tpu-vm", "scp"],
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
    ]
    for line in lines:
        assert "--worker=all" in line and "us-central2-b" in line and "proj" in line
    remote = lines[1][lines[1].index("--command") + 1]
    assert "pip install -e . 'jax[tpu]==0.10.2'" in remote
    bad = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_squeue_lines_become_each_runs_newest_job():
    text = (
        "12|a|FAILED|NonZeroExitCode|0:03|node1|0|\n"
        "15|a|RUNNING|None|1:02:03|node2|1|\n"
        "16|b|PENDING|Dependency|0:00||0|\n"
        "17|c|PENDING|PartitionConfig|0:00||0|\n"
        "garbage\n"
    )
    jobs = slurm.parse_squeue(text)
    assert sorted(jobs) == ["a", "b", "c"]
    assert jobs["a"].describe() == "15 RUNNING 1:02:03 on node2, requeued 1"
    assert jobs["b"].describe() == "16 PENDING (Dependency)" and jobs["b"].stuck is None
    assert jobs["c"].stuck.startswith("the partition cannot give")
    assert slurm.parse_squeue("12|a|FAILED|NonZeroExitCode|0:03|node1|0|\n")["a"].describe() == (
        "12 FAILED (NonZeroExitCode) 0:03 on node1"
    )


def test_status_asks_slurm_only_where_it_is_configured(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert not slurm.slurm_configured()
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue
    assert not slurm.slurm_configured() and slurm.scheduler_jobs(["a"]) is None


# `sacct --allocations --duplicates --parsable2 --noheader` with launch.slurm's columns (JobID,
# JobName, State, Reason, Elapsed, NodeList, ExitCode), in the format sacct(1) of SLURM 22.05
# documents; the test cluster has no accounting database, so sacct there only says
# "Slurm accounting storage is disabled". Job 102 ran three times (requeued twice).
SACCT = """\
101|a|COMPLETED|None|00:12:03|node7|0:0
102|b|REQUEUED|None|00:00:58|node7|0:0
102|b|REQUEUED|None|00:00:40|node8|0:0
102|b|COMPLETED|None|00:05:00|node8|0:0
103|c|FAILED|NonZeroExitCode|00:00:03|node7|2:0
104|d|CANCELLED by 0|DependencyNeverSatisfied|00:00:00|None assigned|0:0
105|e|TIMEOUT|TimeLimit|01:00:07|node9|0:15
"""


def test_sacct_lines_become_each_runs_newest_job_with_its_requeues():
    jobs = slurm.parse_sacct(SACCT)
    assert jobs["a"].describe() == "101 COMPLETED 00:12:03 on node7"
    assert (jobs["b"].job_id, jobs["b"].restarts, jobs["b"].nodes) == ("102", 2, "node8")
    assert jobs["b"].describe() == "102 COMPLETED 00:05:00 on node8, requeued 2"
    assert jobs["c"].describe() == "103 FAILED (NonZeroExitCode) exit 2:0 00:00:03 on node7"
    assert jobs["d"].describe() == "104 CANCELLED (DependencyNeverSatisfied)"
    assert jobs["d"].nodes == ""
    assert jobs["e"].describe() == "105 TIMEOUT (TimeLimit) exit 0:15 01:00:07 on node9"


def _fake_clients(tmp_path, monkeypatch, *, squeue: str, sacct: str | None) -> Path:
    """`squeue` printing `squeue`, and `sacct` printing `sacct` (None: the answer of a cluster
    without accounting), on PATH; both record their arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue.out").write_text(squeue)
    (bin_dir / "squeue").write_text(
        f'#!/bin/sh\necho "$@" > {bin_dir}/squeue.args\ncat {bin_dir}/squeue.out\n'
    )
    if sacct is None:
        body = "echo 'Slurm accounting storage is disabled' >&2\nexit 1\n"
    else:
        (bin_dir / "sacct.out").write_text(sacct)
        body = f"cat {bin_dir}/sacct.out\n"
    (bin_dir / "sacct").write_text(f'#!/bin/sh\necho "$@" > {bin_dir}/sacct.args\n{body}')
    for tool in ("squeue", "sacct"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_status_joins_the_queue_and_accounting(tmp_path, monkeypatch):
    # squeue knows the live jobs (e requeued, pending again; b still remembered); sacct the
    # finished ones of any age, with exit codes and requeues.
    squeue = "106|e|PENDING|BeginTime|0:00||1|\n102|b|COMPLETED|None|5:00|node8|2|\n"
    bin_dir = _fake_clients(tmp_path, monkeypatch, squeue=squeue, sacct=SACCT)
    jobs = slurm.scheduler_jobs(["a", "b", "c", "d", "e", "f"])
    assert sorted(jobs) == ["a", "b", "c", "d", "e"]
    assert jobs["e"].describe() == "106 PENDING (BeginTime), requeued 1"
    assert jobs["b"].describe() == "102 COMPLETED 5:00 on node8, requeued 2"
    assert jobs["c"].exit_code == "2:0" and jobs["d"].reason == "DependencyNeverSatisfied"
    args = (bin_dir / "sacct.args").read_text().split()
    assert "--duplicates" in args and "--allocations" in args and "--parsable2" in args
    assert "--name=a,b,c,d,e,f" in args and "--starttime=1970-01-01" in args
    assert "--format=JobID,JobName,State,Reason,Elapsed,NodeList,ExitCode" in args


def test_status_falls_back_to_the_queue_where_accounting_is_off(tmp_path, monkeypatch):
    squeue = "12|a|FAILED|NonZeroExitCode|0:03|node1|0|\n"
    _fake_clients(tmp_path, monkeypatch, squeue=squeue, sacct=None)
    jobs = slurm.scheduler_jobs(["a", "b"])
    assert (
        list(jobs) == ["a"] and jobs["a"].describe() == "12 FAILED (NonZeroExitCode) 0:03 on node1"
    )
    (tmp_path / "bin" / "squeue").write_text("#!/bin/sh\nexit 1\n")  # no controller either
    assert slurm.scheduler_jobs(["a"]) is None
