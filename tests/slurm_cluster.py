"""A real SLURM cluster for the tests: munged, slurmctld and slurmd from Debian's `slurm-wlm`
and `munge` packages, on 127.0.0.1, with everything they keep (munge key, generated
`slurm.conf`, state, spool, logs) in one directory.

By default one node, `localhost`, with this machine's CPUs (`nproc`); with `nodes=("n1", "n2")`
one slurmd per node on this machine, each with its own port and an equal part of the CPUs, so
a job of several nodes really starts its tasks through two daemons. No GPU; one partition
`debug`; no accounting database (so `sacct` answers nothing: ask `squeue` and `scontrol show
job`, which remembers finished jobs for `MinJobAge` seconds); requeued jobs wait
`REQUEUE_DELAY_S` seconds before they start again (SLURM's job-credential lifetime, 120 s by
default), and pending jobs are looked at every 2 s (`sched_interval`, `bf_interval`; 60 and 30 s
by default), so a requeued job starts again within seconds. Clients find the cluster through
`SLURM_CONF` (`env()`); the daemons are this process's children, stopped by pid in `stop()`.

One cluster at a time per machine: `start()` takes an exclusive lock (`LOCK_PATH`, waiting at
most `lock_timeout` seconds) that `stop()` releases, so pytest-xdist workers (or two pytest
sessions) that each need a cluster take turns instead of running two clusters on the same CPUs
and racing for ports.

    cluster = SlurmCluster(tmp_dir)
    cluster.start()            # ClusterUnavailable, saying why, where the daemons cannot start
    subprocess.run(["sbatch", ...], env={**os.environ, **cluster.env()})
    cluster.stop()             # cancels the jobs left, stops the daemons, checks they are gone
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

DAEMONS = ("munged", "slurmctld", "slurmd")
PACKAGES = ("slurm-wlm", "munge")
SBIN = ("/usr/sbin", "/sbin")
NODE = "localhost"
PARTITION = "debug"
REQUEUE_DELAY_S = 5  # the least cred_expire SLURM takes (3 is "invalid" in its logs)
LOCK_PATH = Path(tempfile.gettempdir()) / "xlscale-slurm-test-cluster.lock"


class ClusterUnavailable(RuntimeError):
    """The SLURM or munge daemons are missing or do not start on this machine."""


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return shutil.which(name, path=path)


def missing_programs() -> list[str]:
    """The daemons and client programs of the cluster that are not installed here."""
    return [p for p in (*DAEMONS, "sbatch", "squeue", "scontrol", "sinfo") if _which(p) is None]


def ensure_installed(log_path: Path) -> None:
    """Installs Debian's `slurm-wlm` and `munge` when a program is missing, and only then (as
    root, with apt-get; the output goes to `log_path`), so a machine without them can still run
    the cluster tests; nothing is installed where the programs are already there.

    Raises:
      ClusterUnavailable: a program is missing and cannot be installed (not root, no apt-get,
        or the installation failed), naming which and why.
    """
    missing = missing_programs()
    if not missing:
        return
    why = f"{', '.join(missing)} not installed"
    if os.geteuid() != 0 or _which("apt-get") is None:
        raise ClusterUnavailable(f"{why}, and apt-get cannot install them here (root with apt)")
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    log.warning("%s: running %s (output in %s)", why, " ".join(argv), log_path)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(log_path, "ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900)
        if done.returncode != 0:  # a fresh image often has no package lists yet: fetch them once
            update = ["apt-get", "update"]
            subprocess.run(update, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900)
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900)
    if done.returncode != 0 or missing_programs():
        raise ClusterUnavailable(
            f"{why}; `{' '.join(argv)}` exited {done.returncode} (see {log_path}), still "
            f"missing: {', '.join(missing_programs()) or 'nothing'}"
        )


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on now (all held open while
    choosing, so the same port cannot come back twice)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def slurm_conf(
    root: Path,
    *,
    cpus: int,
    ctld_port: int,
    slurmd_ports: tuple[int, ...],
    nodes: tuple[str, ...] = (NODE,),
) -> str:
    """The generated `slurm.conf`: nodes of `cpus` CPUs each without GPUs, one partition, no
    accounting, no cgroups (process tracking by /proc), requeue allowed, files under `root`.

    One node is this machine as `localhost`. Several are slurmd daemons on this machine, each
    with its own name, port (its entry of `slurmd_ports`) and spool, pid and log files (`%n`);
    SLURM refuses a node named `localhost` beside another, so several nodes have other names,
    all reached at 127.0.0.1 (their `NodeAddr`).
    """
    if nodes == (NODE,):
        node_lines = f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1024 State=UNKNOWN"
        per_node = ""
    else:
        node_lines = "\n".join(
            f"NodeName={name} NodeHostname={NODE} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus} RealMemory=1024 State=UNKNOWN"
            for name, port in zip(nodes, slurmd_ports, strict=True)
        )
        per_node = ".%n"
    return f"""\
# Generated by tests/slurm_cluster.py: a test cluster of {len(nodes)} node(s) on 127.0.0.1.
ClusterName=xlscaletest
SlurmctldHost={NODE}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_ports[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket,cred_expire={REQUEUE_DELAY_S}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool{per_node}
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd{per_node}.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd{per_node}.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
{node_lines}
PartitionName={PARTITION} Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """munged, slurmctld and a slurmd per node for one cluster kept under `root`: `start`,
    `stop`, `env()` for clients, `run(argv)` for a client command, and `jobs()`/`job(id)` for
    what the scheduler says.

    `nodes`: the node names; one (`localhost`, the default) has this machine's CPUs, several
    (other names, see `slurm_conf`) share them, each with an equal part (at least one).
    """

    def __init__(self, root: Path, *, nodes: tuple[str, ...] = (NODE,)):
        if len(nodes) > 1 and NODE in nodes:
            raise ValueError(f"nodes {nodes}: several nodes cannot include {NODE!r}")
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.nodes = tuple(nodes)
        self.cpus = max(1, (os.cpu_count() or 1) // len(self.nodes))
        self._processes: dict[str, subprocess.Popen] = {}
        self._lock: int | None = None  # the file descriptor holding LOCK_PATH

    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, scontrol) needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
        """Runs a SLURM client against this cluster; returns its completed process (text)."""
        env = {**os.environ, **self.env()}
        return subprocess.run(argv, env=env, capture_output=True, text=True, check=check)

    def start(self, *, timeout: float = 60.0, lock_timeout: float = 900.0) -> None:
        """Takes the machine's cluster lock (waiting at most `lock_timeout` seconds for another
        cluster to stop), writes the key and `slurm.conf`, starts the three daemons and waits (at
        most `timeout` seconds) until `sinfo` shows the node idle.

        Raises:
          ClusterUnavailable: a daemon exits or the node does not become idle in time (the
            daemons' logs are quoted); the daemons already started are stopped.
          TimeoutError: another cluster held the lock for `lock_timeout` seconds.
        """
        if os.geteuid() != 0:
            raise ClusterUnavailable("slurmd runs jobs as their users, so it must run as root")
        self._take_lock(lock_timeout)
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        try:
            ctld_port, *slurmd_ports = free_ports(1 + len(self.nodes))
            self.conf.write_text(
                slurm_conf(
                    self.root,
                    cpus=self.cpus,
                    ctld_port=ctld_port,
                    slurmd_ports=tuple(slurmd_ports),
                    nodes=self.nodes,
                )
            )
            self._spawn(
                "munged",
                "-F",
                "-f",
                f"--socket={self.root}/munge.socket",
                f"--key-file={key}",
                f"--pid-file={self.root}/munged.pid",
                f"--log-file={self.root}/log/munged.log",
                f"--seed-file={self.root}/munged.seed",
            )
            self._wait(lambda: (self.root / "munge.socket").exists(), "munged's socket", 15)
            self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
            for node in self.nodes:
                self._spawn("slurmd", "-D", "-N", node, "-f", str(self.conf), key=node)
            self._wait(self._nodes_idle, f"nodes {','.join(self.nodes)} idle in sinfo", timeout)
        except BaseException:
            self.stop()
            raise

    def _take_lock(self, timeout: float) -> None:
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise TimeoutError(
                        f"another SLURM test cluster held {LOCK_PATH} for {timeout:.0f} s"
                    ) from None
                time.sleep(1.0)
        self._lock = fd

    def _spawn(self, name: str, *args: str, key: str = "") -> None:
        program = _which(name)
        if program is None:
            raise ClusterUnavailable(f"{name} is not installed")
        label = f"{name}.{key}" if key and len(self.nodes) > 1 else name
        out = open(self.root / "log" / f"{label}.out", "ab")  # noqa: SIM115 -- the daemon's
        self._processes[label] = subprocess.Popen(
            [program, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env()},
        )
        out.close()

    def _nodes_idle(self) -> bool:
        nodes = ",".join(self.nodes)
        argv = ["sinfo", "--noheader", "--Node", "--format=%N %t", f"--nodes={nodes}"]
        done = self.run(argv, check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = {n: p.returncode for n, p in self._processes.items() if p.poll() is not None}
            if dead or time.monotonic() > deadline:
                cause = f"{', '.join(f'{n} exited {c}' for n, c in dead.items())}" or "timed out"
                raise ClusterUnavailable(f"waiting for {what}: {cause}\n{self.logs()}")
            time.sleep(0.25)

    def logs(self, tail: int = 15) -> str:
        """The last lines of each daemon's log, for failure messages."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def jobs(self) -> list[dict[str, str]]:
        """The jobs in the queue: id, name, state and reason (`squeue`)."""
        out = self.run(["squeue", "--noheader", "--format=%i|%j|%T|%r"]).stdout
        keys = ("id", "name", "state", "reason")
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines()]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a mapping (JobState, Reason, Restarts, ExitCode, ...); finished
        jobs stay visible for `MinJobAge` seconds."""
        out = self.run(["scontrol", "--oneliner", "show", "job", job_id]).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def stop(self, *, timeout: float = 30.0) -> None:
        """Cancels every job left, then stops the daemons by pid (SIGTERM, then SIGKILL after
        `timeout` s) and checks that each is gone.

        Raises:
          RuntimeError: a daemon is still alive after SIGKILL.
        """
        if "slurmctld" in self._processes and self._processes["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user=root"], check=False)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                done = self.run(["squeue", "--noheader", "--format=%i"], check=False)
                if done.returncode != 0 or not done.stdout.strip():
                    break
                time.sleep(0.5)
        for name in reversed(list(self._processes)):
            process = self._processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        alive = [n for n, p in self._processes.items() if _alive(p.pid)]
        self._processes.clear()
        if self._lock is not None and not alive:  # the next cluster may start now
            os.close(self._lock)
            self._lock = None
        if alive:
            raise RuntimeError(f"SLURM test cluster: {', '.join(alive)} still running after stop")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
