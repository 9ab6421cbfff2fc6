"""Test setup: 8 host CPU devices for sharding tests, set before anything imports JAX."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402


@pytest.fixture
def seqio_registry():
    """Empties seqio's task and mixture registries around a test, so tests never see each other's
    registrations (and never depend on import-time side effects)."""
    import seqio

    saved_tasks = dict(seqio.TaskRegistry._REGISTRY)
    saved_mixtures = dict(seqio.MixtureRegistry._REGISTRY)
    seqio.TaskRegistry.reset()
    seqio.MixtureRegistry.reset()
    yield
    seqio.TaskRegistry.reset()
    seqio.MixtureRegistry.reset()
    seqio.TaskRegistry._REGISTRY.update(saved_tasks)
    seqio.MixtureRegistry._REGISTRY.update(saved_mixtures)
