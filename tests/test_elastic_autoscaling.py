"""Trident's scale requests on Ray's local autoscaling cluster (the fake multi-node provider): a request is made by
node class, nodes of both worker types join and run replicas, and the request is cleared at the end, all read from
Ray's autoscaler state (``get_cluster_status``), not from trident's bookkeeping.

The scenario runs in a child process (``elastic_driver.py``: a driver joins one Ray cluster, and the other tests
share ``conftest.ray_cluster``); each test reads its observations. 39 s on this 2-core machine at load 1 (three
raylets and the autoscaler: marked slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DRIVER = Path(__file__).with_name("elastic_driver.py")
TIMEOUT_S = 900


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("elastic")
    # the cluster runs without token authentication, and a driver reads its mode once, at import: one this process's
    # ray.init left in the environment (RAY_AUTH_MODE=token, as another test's cluster sets it) made Ray drop the
    # driver's worker and cancel its runner before it ran (seen in CI and in `make test-slow`)
    inherited = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_CLIENT_MODE", "RAY_ADDRESS")}
    env = {**inherited, "PYTHONPATH": os.pathsep.join([str(DRIVER.parents[1]), str(DRIVER.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_THREAD_LIMIT": "1", "RAY_DEDUP_LOGS": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([sys.executable, str(DRIVER), str(out / "run")], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    (out / "driver.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        pytest.fail(f"the autoscaling cluster did not start (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(line[len("RESULT "):])
    assert "error" not in result, f"{result.get('error')}\n" + "\n".join(f"--- {k}\n{v}" for k, v in result.get("logs", {}).items())
    return result


def test_the_request_reaches_the_autoscaler_by_node_class(observed):
    assert observed["before"]["requested_bundles"] == [] and observed["before"]["workers"] == {}
    assert [d["action"] for d in observed["decisions"]] == ["add"] and observed["decisions"][0]["nodes"] == {"c1": 1, "c2": 1}
    bundles = sorted(observed["while_requested"]["requested_bundles"], key=lambda b: b["CPU"])
    assert bundles == [{"CPU": 1.0, "c1": 1.0}, {"CPU": 2.0, "c2": 1.0}]


def test_nodes_of_both_worker_types_join_and_run_replicas(observed):
    assert observed["joined"] and observed["while_requested"]["workers"] == {"c1": 1, "c2": 1}
    assert observed["outcome"]["status"] == "landed"
    on = {c for classes in observed["replicas_on"].values() for c in classes}
    assert any("-c1-" in c for c in on) and any("-c2-" in c for c in on), observed["replicas_on"]


def test_the_request_is_cleared_at_the_end_and_the_idle_nodes_go(observed):
    assert observed["after_release"]["requested_bundles"] == []
    assert observed["workers_gone"] and observed["final"]["workers"] == {} and observed["final"]["pending_launches"] == []
    assert observed["workers_gone_s"] <= 60
