"""Placement, node loss and a node joining, on a real 3-node Ray cluster on this machine.

The scenarios run in one child process (``multinode_driver.py``) on one cluster per test session:
a head of 1 CPU, a worker of 2 CPUs and a worker of 2 CPUs + 1 logical GPU, each its own raylet.
A driver joins one Ray cluster only, and the other tests share ``conftest.ray_cluster``, so the
multi-node cluster cannot live in this process. Each test reads its scenario's observations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("multinode_driver.py")
TIMEOUT_S = 1200  # the whole session: 3 min measured on this 2-core machine at load 40-60


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("multinode")
    # The GCS health-checks every node each second instead of every 3 s: a killed node (its raylet refuses the
    # check at once) is declared dead after 5 failed checks, ~5 s instead of ~15 s. A live node on a loaded
    # machine still has each check's full timeout (10 s) to answer.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DRIVER.parents[1]), os.environ.get("PYTHONPATH", "")]),
           "OMP_THREAD_LIMIT": "1", "RAY_DEDUP_LOGS": "0", "RAY_health_check_period_ms": "1000"}
    proc = subprocess.run([sys.executable, str(DRIVER), str(out)], capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    (out / "driver.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            data = json.loads(line[len("RESULT "):])
            results[data["scenario"]] = data
    if "cluster" not in results:
        pytest.fail(f"the 3-node cluster did not start (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    cluster = results["cluster"]
    assert cluster["driver_node"] == cluster["nodes"]["head"], "the driver (and so the runner) must be on the head, which no test kills"
    return results


def _scenario(scenarios: dict, name: str) -> dict:
    result = scenarios.get(name)
    assert result is not None, f"scenario {name} did not report"
    assert "exception" not in result, result["exception"]
    print(f"{name}: {result}")  # shown with the failure
    return result


def _exactly_once(result: dict) -> None:
    assert result["finished"] and not result["error"], result["error"]
    assert result["missing"] == 0 and result["duplicates"] == 0
    # these inputs have no bad items: a dead letter here would be an item lost to the node's loss
    assert result["dead_lettered"] == 0 and result["written"] == result["items_in"]


def test_replicas_land_on_the_node_classes_the_plan_names(scenarios):
    r = _scenario(scenarios, "placement")
    nodes, classes = r["nodes"], r["classes"]
    assert len(set(classes.values())) == 3  # head, cpu worker and gpu worker differ: three classes from ray.nodes()
    assert all(node == nodes["gpu"] for node, _ in r["before"]["embed"])  # the only node with a GPU
    assert r["landed"]["status"] == "landed"
    assert [c for _, c in r["after"]["parse"]] == [classes[nodes["cpu"]]] * 2
    assert [n for n, _ in r["after"]["parse"]] == [nodes["cpu"]] * 2
    assert [n for n, _ in r["after"]["filter"]] == [nodes["head"]]
    # 3 x 1 CPU fits the cluster's 5 CPUs but not the one 2-CPU node of that class: refused, nothing moved
    assert r["refused"]["status"] == "refused" and "does not fit the live nodes" in r["refused"]["reason"]
    assert r["after_refusal"] == r["after"]
    assert any("does not fit the live nodes" in a["reason"] for a in r["applies_refused"])
    _exactly_once(r)
    assert r["replicas_by_node"][nodes["cpu"]]["parse"] >= 2


def test_killing_a_worker_node_mid_run_loses_no_item(scenarios):
    r = _scenario(scenarios, "node_loss")
    nodes = r["nodes"]
    assert r["put"]["status"] == "landed"
    assert [n for n, _ in r["before"]["parse"]] == [nodes["cpu"]] * 2
    assert r["done_at_kill"] < r["items_in"]  # the node died mid-run
    assert nodes["cpu"] not in r["live_nodes_after"] and r["cluster_cpus_after"] == 3 and r["smaller_total_cpus"] == 3
    # the next plan is for the smaller cluster and lands; a plan for the lost class is refused
    assert r["next_outcome"]["status"] == "landed", r["next_outcome"]
    assert all(node in (nodes["head"], nodes["gpu"]) for op in r["after"].values() for node, _ in op)
    assert r["stale_outcome"]["status"] == "refused" and "no live node has" in r["stale_outcome"]["reason"]
    _exactly_once(r)


def test_a_node_added_mid_run_is_used(scenarios):
    r = _scenario(scenarios, "node_join")
    new = r["nodes"]["new"]
    assert new not in r["before_nodes"]
    assert r["new_class"] in r["plan_classes"]
    assert r["outcome"]["status"] == "landed", r["outcome"]
    assert any(node == new for op in r["after"].values() for node, _ in op)
    assert sum(r["replicas_by_node"][new].values()) >= 1
    _exactly_once(r)


def test_rows_lost_with_their_node_are_produced_again_once(scenarios):
    r = _scenario(scenarios, "lost_outputs")
    assert r["put"]["status"] == "landed"
    assert [n for n, _ in r["before"]["make"]] == [r["nodes"]["new"]]
    assert r["done_at_kill"] < r["items_in"]  # the node died mid-run
    assert r["rows_lost"] > 0  # rows held by reference on the dead node were lost, and produced again
    _exactly_once(r)
