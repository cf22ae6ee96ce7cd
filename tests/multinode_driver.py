"""Scenarios on a real 3-node Ray cluster on this machine, run in their own process.

``tests/test_multinode.py`` starts ``python tests/multinode_driver.py OUT_DIR`` once per test
session: a driver can join only one Ray cluster and the other tests share the single-node
``ray_cluster`` of ``conftest.py``, so the multi-node cluster lives in this separate process.
It starts a head (1 CPU) and two workers with different resources (``ray.cluster_utils.Cluster``:
one raylet each), runs the scenarios in order on that one cluster, prints one
``RESULT {json}`` line per scenario with what it observed, and shuts the cluster down.

- ``placement``: replicas land on the node classes a plan names; a plan that fits the cluster's
  CPUs in total but not its nodes is refused with the reason; every item is written once.
- ``node_loss``: a worker node is killed mid-run (no graceful shutdown); its replicas'
  in-flight batches are retried on the remaining nodes, the next plan (the placement MILP on the
  live classes) fits the smaller cluster and lands, the run finishes with every item once.
- ``node_join``: a node joins mid-run; the runner lists it, the MILP's next plan uses its class
  and replicas start on it; the run finishes with every item once.
- ``lost_outputs``: rows held by reference (256 KB each, so in the object store of the node that
  made them) are lost when the node that joined is killed; they are produced again from their
  source items and the run finishes with every item once.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path

import ray
from ray.cluster_utils import Cluster
from test_runtime_support import small_pipeline

from trident_flows.control.launch import start_runner
from trident_flows.core.state import ApplyOutcome, RunnerSettings, RunnerState
from trident_flows.core.types import OperatorPlan, Plan, ReplicaGroup
from trident_flows.runtime.sink import read_ids
from trident_flows.scheduler.live_cluster import live_cluster
from trident_flows.scheduler.placement.inputs import current_placement
from trident_flows.scheduler.placement.milp import solve_placement
from trident_flows.scheduler.placement.types import OperatorDemand, PlacementOption

GiB = 2**30
# Every raylet holds ~700 MB; the nodes are as small as the scenarios allow. Memory is given so
# that identical nodes form one class (Ray's own estimate differs by node on a shared machine).
HEAD = {"num_cpus": 1, "memory": 2 * GiB, "object_store_memory": 80 * 2**20, "include_dashboard": False}
CPU_WORKER = {"num_cpus": 2, "memory": 2 * GiB, "object_store_memory": 80 * 2**20}
GPU_WORKER = {"num_cpus": 2, "num_gpus": 1, "memory": 2 * GiB, "object_store_memory": 80 * 2**20}
SETTINGS = RunnerSettings(warm_timeout_s=120.0, device_memory_bytes=2 * GiB)
# Ray gives a starting raylet a fixed 30 s to register with the GCS (a constant inside
# ``ray._private.node.Node``), which a 2-core machine at load 50-70 misses most times: the
# registration check it calls is made to keep trying for up to ``REGISTER_WAIT_S``, and a node
# that still fails is started again (``START_ATTEMPTS``).
REGISTER_WAIT_S = 120.0
START_ATTEMPTS = 3


def _patient_registration() -> None:
    import os

    import ray._private.services as services

    # a raylet also waits for its dashboard agent's port file, and dies when that takes too long
    os.environ.setdefault("RAY_agent_register_timeout_ms", str(int(REGISTER_WAIT_S * 1000)))

    get_node = services.get_node

    def patient(gcs_address, node_id, *args, **kwargs):
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                return get_node(gcs_address, node_id, *args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
    services.get_node = patient


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: every socket stays bound until all are chosen (one at a time, the OS can hand
    out a port just released again: two agents of one node were once given 56999)."""
    import socket

    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _add_node(cluster: Cluster, **args):
    """``cluster.add_node`` tried ``START_ATTEMPTS`` times; the processes of a failed attempt are stopped.
    The agents' ports are given: with ports of its own choosing, a raylet waits for its agents to
    write them to files, and dies when a loaded machine makes that take longer than it waits."""
    import psutil

    me = psutil.Process()
    for attempt in range(START_ATTEMPTS):
        before = {p.pid for p in me.children(recursive=True)}
        names = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")
        ports = dict(zip(names, _free_ports(len(names))))
        try:
            return cluster.add_node(**args, **ports)
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception on its start-up timeout
            if "timed out during startup" not in str(exc) or attempt == START_ATTEMPTS - 1:
                raise
            for p in me.children(recursive=True):
                if p.pid not in before:
                    p.kill()
            print(f"node start timed out (attempt {attempt + 1}); retrying", file=sys.stderr, flush=True)


def _state(handle) -> RunnerState:
    return ray.get(handle.state.remote())


def _where(state: RunnerState) -> dict[str, list[list[str]]]:
    """operator -> [node id, node class] of each active replica."""
    return {op.name: [[r.node_id, r.node_class] for r in op.active] for op in state.operators}


def _wait_for(predicate, handle, timeout_s: float = 120.0) -> RunnerState:
    deadline = time.monotonic() + timeout_s
    while True:
        state = _state(handle)
        if predicate(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _start(spec, out: Path, name: str):
    """A runner fed shard by shard (``add_shard``), so that it runs until the scenario closes its input."""
    return start_runner(spec, out, name=name, namespace="multinode", settings=SETTINGS, external_input=True)


def _feed(handle, spec, part: int, parts: int = 2) -> None:
    rows = list(spec.source())
    size = -(-len(rows) // parts)
    ray.get(handle.add_shard.remote(f"shard-{part:05d}", rows[part * size:(part + 1) * size]))


def _finish(handle, spec, out: Path, timeout_s: float = 600.0) -> dict:
    _feed(handle, spec, 1)
    ray.get(handle.close_input.remote())
    summary = ray.get(handle.wait.remote(timeout_s))
    ray.get(handle.stop.remote())
    ray.kill(handle)
    data, dead = read_ids(out)
    ids = [row["id"] for row in spec.source()]
    return {"finished": summary["finished"], "error": summary["error"], "items_in": len(ids), "written": len(data),
            "dead_lettered": len(dead), "duplicates": len(data) - len(set(data)) + len(set(data) & set(dead)),
            "missing": len(set(ids) - set(data) - set(dead)), "replicas_by_node": summary["replicas_by_node"],
            "applies_refused": summary["applies_refused"], "rows_lost": summary["runner"]["rows_lost"]}


def _apply(handle, plan: Plan) -> dict:
    """Apply as the control loop does: an exception from ``apply`` is a refusal with its reason."""
    try:
        return ray.get(handle.apply.remote(plan)).outcome.to_dict()
    except Exception as exc:  # noqa: BLE001 - the refusal is the result
        return ApplyOutcome.refused(f"{type(exc).__name__}: {exc}").to_dict()


def _milp_plan(state: RunnerState, spec) -> Plan:
    """The placement MILP's plan on the live classes, the serving configs at a fixed rate each
    (parse the bottleneck): what the Trident policy solves each tick, without its learned models."""
    rates = {"parse": 40.0, "filter": 2000.0, "embed": 2000.0}
    demands = []
    for op in spec.operators:
        config = state.operator(op.name).configs().popitem()[0] if state.operator(op.name).configs() else op.config
        demands.append(OperatorDemand(op.name, 1.0, (PlacementOption.from_rate(config, rates[op.name], max_replicas=8),),
                                      min_replicas=1, max_replicas=8))
    return solve_placement(demands, live_cluster(state), current_placement(state)).plan


def placement(cluster: Cluster, out: Path, nodes: dict) -> dict:
    spec = small_pipeline(200, embed_device="gpu", time_scale=2.0)
    handle = _start(spec, out, "mn-placement")
    _feed(handle, spec, 0)
    state = _wait_for(lambda s: all(r.warm for o in s.operators for r in o.replicas), handle)
    before = _where(state)
    classes = {n.node_id: n.node_class for n in state.nodes}
    cpu_class, head_class = classes[nodes["cpu"]], classes[nodes["head"]]
    config = lambda name: state.operator(name).configs().popitem()[0]  # noqa: E731
    plan = Plan((OperatorPlan("parse", (ReplicaGroup(config("parse"), 2, cpu_class),)),
                 OperatorPlan("filter", (ReplicaGroup(config("filter"), 1, head_class),))), reason="test: parse on the cpu worker")
    landed = _apply(handle, plan)
    after = _where(_state(handle))
    # 3 parse replicas of 1 CPU on a class of one 2-CPU node: 5 CPUs in the cluster, but no room on its nodes
    unplaceable = Plan((OperatorPlan("parse", (ReplicaGroup(config("parse"), 3, cpu_class),)),), reason="test: too many")
    refused = _apply(handle, unplaceable)
    return {"nodes": nodes, "classes": classes, "before": before, "landed": landed, "after": after, "refused": refused,
            "after_refusal": _where(_state(handle)), **_finish(handle, spec, out)}


def node_loss(cluster: Cluster, out: Path, nodes: dict, workers: dict) -> dict:
    spec = small_pipeline(400, embed_device="gpu", time_scale=8.0)
    handle = _start(spec, out, "mn-loss")
    state = _wait_for(lambda s: all(r.warm for o in s.operators for r in o.replicas), handle)
    config = lambda name: state.operator(name).configs().popitem()[0]  # noqa: E731
    classes = {n.node_id: n.node_class for n in state.nodes}
    put = Plan((OperatorPlan("parse", (ReplicaGroup(config("parse"), 2, classes[nodes["cpu"]]),)),
                OperatorPlan("filter", (ReplicaGroup(config("filter"), 1, classes[nodes["head"]]),))), reason="test: parse on the cpu worker")
    put_outcome = _apply(handle, put)
    _feed(handle, spec, 0)
    mid = _wait_for(lambda s: s.items_written + s.items_dead_lettered >= 60, handle)
    before = _where(mid)
    cluster.remove_node(workers["cpu"], allow_graceful=False)
    killed_at = time.monotonic()
    gone = _wait_for(lambda s: nodes["cpu"] not in {n.node_id for n in s.nodes}, handle, timeout_s=120.0)
    seen_gone_s = time.monotonic() - killed_at
    smaller = live_cluster(gone)
    next_plan = _milp_plan(gone, spec)
    next_outcome = _apply(handle, next_plan)
    after = _where(_state(handle))
    stale = Plan((OperatorPlan("parse", (ReplicaGroup(config("parse"), 1, classes[nodes["cpu"]]),)),), reason="test: stale plan")
    stale_outcome = _apply(handle, stale)
    result = _finish(handle, spec, out)
    return {"nodes": nodes, "put": put_outcome, "before": before, "done_at_kill": mid.items_written + mid.items_dead_lettered,
            "seen_gone_s": round(seen_gone_s, 1), "live_nodes_after": [n.node_id for n in gone.nodes],
            "cluster_cpus_after": gone.cluster_cpus, "smaller_total_cpus": smaller.total_cpus,
            "next_plan_classes": sorted({g.node_class for o in next_plan.operators for g in o.groups if g.replicas}),
            "next_outcome": next_outcome, "after": after, "stale_outcome": stale_outcome, **result}


def node_join(cluster: Cluster, out: Path, nodes: dict) -> dict:
    spec = small_pipeline(200, embed_device="gpu", time_scale=2.0)
    handle = _start(spec, out, "mn-join")
    _feed(handle, spec, 0)
    state = _wait_for(lambda s: all(r.warm for o in s.operators for r in o.replicas), handle)
    before_nodes = [n.node_id for n in state.nodes]
    new = _add_node(cluster, **CPU_WORKER)
    joined = _wait_for(lambda s: new.node_id in {n.node_id for n in s.nodes}, handle, timeout_s=180.0)
    plan = _milp_plan(joined, spec)
    new_class = next((n.node_class for n in joined.nodes if n.node_id == new.node_id), "")
    outcome = _apply(handle, plan)
    after = _where(_state(handle))
    return {"nodes": {**nodes, "new": new.node_id}, "before_nodes": before_nodes, "new_class": new_class,
            "plan_classes": sorted({g.node_class for o in plan.operators for g in o.groups if g.replicas}), "outcome": outcome,
            "after": after, **_finish(handle, spec, out)}


def lost_outputs(cluster: Cluster, out: Path, nodes: dict) -> dict:
    from benchmarks.dataplane import build_spec

    spec = build_spec(256 * 1024, 4, 80)
    # half a CPU per replica, so all four fit the head and the GPU worker once the joined node is gone;
    # a slow touch2 keeps produced rows queued (by reference) when the node dies
    ops = tuple(dataclasses.replace(op, config=dataclasses.replace(op.config, cpus=0.5),
                                    params={**op.params, "delay_s": 0.4} if op.name == "touch2" else op.params) for op in spec.operators)
    spec = dataclasses.replace(spec, operators=ops)
    joined = next(n for n in cluster.worker_nodes if n.node_id == nodes["new"])
    handle = _start(spec, out, "mn-lost")
    state = _wait_for(lambda s: all(r.warm for o in s.operators for r in o.replicas), handle)
    joined_class = next(n.node_class for n in state.nodes if n.node_id == nodes["new"])
    make = state.operator("make").configs().popitem()[0]
    put = _apply(handle, Plan((OperatorPlan("make", (ReplicaGroup(make, 1, joined_class),)),), reason="test: make on the joined node"))
    _feed(handle, spec, 0)
    mid = _wait_for(lambda s: s.items_written + s.items_dead_lettered >= 8, handle)
    before = _where(mid)
    cluster.remove_node(joined, allow_graceful=False)
    return {"nodes": nodes, "put": put, "before": before, "done_at_kill": mid.items_written + mid.items_dead_lettered,
            **_finish(handle, spec, out)}


def main(out_dir: str) -> None:
    out = Path(out_dir)
    t0 = time.monotonic()
    _patient_registration()
    cluster = Cluster()
    try:
        _add_node(cluster, **HEAD)
        cluster.connect(namespace="multinode")
        workers = {"cpu": _add_node(cluster, **CPU_WORKER), "gpu": _add_node(cluster, **GPU_WORKER)}
        cluster.wait_for_nodes()
        nodes = {"head": cluster.head_node.node_id, "cpu": workers["cpu"].node_id, "gpu": workers["gpu"].node_id}
        driver_node = ray.get_runtime_context().get_node_id()  # the runner is pinned here: it must be the head
        print(f"RESULT {json.dumps({'scenario': 'cluster', 'nodes': nodes, 'driver_node': driver_node, 'seconds': round(time.monotonic() - t0, 1)})}",
              flush=True)
        results: dict[str, dict] = {}
        for name, run in (("placement", lambda: placement(cluster, out / "placement", nodes)),
                          ("node_loss", lambda: node_loss(cluster, out / "loss", nodes, workers)),
                          ("node_join", lambda: node_join(cluster, out / "join", nodes)),
                          ("lost_outputs", lambda: lost_outputs(cluster, out / "lost", {**nodes, "new": results["node_join"]["nodes"]["new"]}))):  # noqa: E501
            t = time.monotonic()
            try:
                result = run()
            except Exception:  # noqa: BLE001 - reported to the test, which fails on it
                result = {"exception": traceback.format_exc()}
            result.update(scenario=name, seconds=round(time.monotonic() - t, 1))
            results[name] = result
            print(f"RESULT {json.dumps(result, default=str)}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
