"""`xlscale sweep run --launcher slurm --nodes 2` on a real two-node SLURM cluster: two slurmd
daemons on this machine (`tests/slurm_cluster.py`, nodes `n1` and `n2`, a CPU each), so one job's
two JAX processes start on two nodes, find their coordinator at the first node's address
(`NodeAddr`; the node names resolve nowhere) and train the run one process trains alone.

The cluster takes the machine-wide cluster lock, so it runs before or after the single-node
cluster of `tests/test_slurm_cluster.py`, never beside it. Skipped, saying why, only where the
daemons cannot start.
"""

from __future__ import annotations

import pytest
from slurm_cluster import ClusterUnavailable, SlurmCluster, ensure_installed
from slurm_sweeps import run_beside_one_process, sweep_data

NODES = ("n1", "n2")


@pytest.fixture(scope="module")
def monkeypatch_module():
    """A module-scoped `pytest.MonkeyPatch` (the cluster's client environment)."""
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, monkeypatch_module):
    """A two-node SLURM cluster for this module; this process's SLURM clients talk to it."""
    root = tmp_path_factory.mktemp("slurm_nodes")
    try:
        ensure_installed(root / "apt-get.log")
    except ClusterUnavailable as e:
        pytest.skip(f"no SLURM cluster: {e}")
    cluster = SlurmCluster(root, nodes=NODES)
    try:
        cluster.start()
    except ClusterUnavailable as e:
        pytest.skip(f"no two-node SLURM cluster: the daemons cannot start here ({e})")
    for key, value in cluster.env().items():
        monkeypatch_module.setenv(key, value)
    yield cluster
    cluster.stop()


@pytest.mark.slow
def test_a_run_on_two_nodes_has_the_losses_of_one_process(
    two_nodes, tiny_data, tiny_prepared, tmp_path
):
    # `--nodes 2 --tasks-per-node 1`: one job, one JAX process (one CPU device) on each node,
    # splitting the global batch of 8; the same run as one process with two devices, beside the
    # job, logs the same losses.
    flags = ["--nodes", "2", "--tasks-per-node", "1"]
    data = sweep_data(tiny_data, tiny_prepared)
    run, job, log = run_beside_one_process(two_nodes, data, tmp_path, *flags)
    placed = (job["JobState"], job["NumNodes"], job["NumTasks"], job["NodeList"], job["ExitCode"])
    assert placed == ("COMPLETED", "2", "2", "n[1-2]", "0:0"), log
