"""Start the local Ray node a benchmark runs on, retried: on a heavily loaded machine Ray's raylet
may miss its fixed 30 s registration window ("The current node timed out during startup")."""

from __future__ import annotations

import time

import ray

RETRY_WAIT_S = 20.0  # lets the load that made the raylet miss its window pass before the next try


def start_local_ray(cpus: float, gpus: int, attempts: int) -> None:
    """``ray.init`` of a local node with ``cpus``/``gpus``, tried ``attempts`` times; the last failure is raised."""
    for attempt in range(attempts):
        try:
            ray.init("local", num_cpus=cpus, num_gpus=gpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
            return
        except Exception:  # noqa: BLE001 - retried; the last failure is raised
            ray.shutdown()
            if attempt == attempts - 1:
                raise
            time.sleep(RETRY_WAIT_S)
