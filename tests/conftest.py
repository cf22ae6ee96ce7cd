"""Shared fixtures: one local Ray cluster and one Prefect test harness per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_THREAD_LIMIT", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# The test Prefect server works offline: no telemetry (it would also lock the test database).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

# The logical node the runtime tests run on: more logical CPUs than the machine has cores
# (emulated operators sleep while holding a logical CPU) and two logical GPUs.
TEST_CPUS = 8
TEST_GPUS = 2


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of our own (never address='auto'), shared by the whole session."""
    import ray

    if not ray.is_initialized():
        ray.init("local", num_cpus=TEST_CPUS, num_gpus=TEST_GPUS, object_store_memory=256 * 2**20, include_dashboard=False,
                 namespace="trident-tests", log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def prefect_harness():
    """A Prefect API for the session (SQLite, temporary), with flow heartbeats off."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield
