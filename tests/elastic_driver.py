"""Trident's scale requests on Ray's local autoscaling cluster, in a process of its own.

``tests/test_elastic_autoscaling.py`` runs ``python tests/elastic_driver.py OUT_DIR`` (a driver joins one Ray
cluster; the other tests share the single-node one of ``conftest.py``). It starts
``benchmarks.autoscaling_cluster.OwnAutoscalingCluster``: a head of 3 CPUs and two worker node types, ``c1``
(1 CPU) and ``c2`` (2 CPUs), each carrying its marker resource, at most one node each. A pipeline
runner runs on the head; an ``ElasticScaler`` reads its live state every 2 s with a goal the head cannot
meet (the scaler is told the job is 10^6 items due in 10 minutes: every node the pool has finishes
soonest), so it requests one node of each type. When both joined, the placement MILP's plan on the live
classes puts replicas on them. The run then ends: the runner stops and the scaler releases its request.
It prints one ``RESULT {json}`` line with what Ray's autoscaler reported (``OwnAutoscalingCluster.status``)
at each point, and shuts the cluster down.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from multinode_driver import _apply, _feed, _milp_plan, _where  # noqa: E402
from test_runtime_support import small_pipeline  # noqa: E402

from benchmarks.autoscaling_cluster import OwnAutoscalingCluster  # noqa: E402
from trident_flows.control.elastic import ElasticScaler  # noqa: E402
from trident_flows.control.launch import start_runner  # noqa: E402
from trident_flows.core.state import RunnerSettings  # noqa: E402
from trident_flows.planning.catalogue import Catalogue, NodeType  # noqa: E402
from trident_flows.planning.scale import NodePool, RunGoal  # noqa: E402

MB = 2**20
HEAD = {"CPU": 3, "object_store_memory": 80 * MB}
WORKERS = {"c1": {"resources": {"CPU": 1, "c1": 1, "object_store_memory": 80 * MB}, "node_config": {}, "min_workers": 0, "max_workers": 1},
           "c2": {"resources": {"CPU": 2, "c2": 1, "object_store_memory": 80 * MB}, "node_config": {}, "min_workers": 0, "max_workers": 1}}
POOL = NodePool(Catalogue((NodeType("c1", 1, 0.5, max_count=1), NodeType("c2", 2, 0.8, max_count=1)), startup_minutes=0.5), 0.3)
JOIN_WAIT_S, GONE_WAIT_S = 300.0, 180.0


def _wait(predicate, timeout_s: float, every_s: float = 2.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def _log_tails(cluster: OwnAutoscalingCluster, lines: int = 30) -> dict[str, str]:
    """The last lines of the cluster's own logs (raylet, GCS, autoscaler), for a failure's report."""
    logs = cluster.temp_dir / "session_latest" / "logs"
    files = [logs / name for name in ("gcs_server.out", "monitor.log", "monitor.out", "raylet.out")]
    return {f.name: "\n".join(f.read_text(errors="replace").splitlines()[-lines:]) for f in files if f.is_file()}


def scenario(cluster: OwnAutoscalingCluster, out: Path) -> dict:
    spec = small_pipeline(400, time_scale=2.0)
    handle = start_runner(spec, out, name="elastic-test", namespace="elastic", settings=RunnerSettings(warm_timeout_s=180.0),
                          external_input=True)
    _feed(handle, spec, 0)
    scaler = ElasticScaler(POOL, RunGoal(deadline_at=time.time() + 600), items_total=10**6, interval_s=2.0)
    before = cluster.status()

    def joined():
        state = ray.get(handle.state.remote())
        scaler.step(state)
        return state if scaler.counts(state.nodes) == {"c1": 1, "c2": 1} else None

    state = _wait(joined, JOIN_WAIT_S)
    requested = cluster.status()
    result = {"before": before, "decisions": [d.to_dict() for d in scaler.decisions], "while_requested": requested,
              "joined": state is not None}
    if state is not None:
        outcome = _apply(handle, _milp_plan(state, spec))
        where = _where(ray.get(handle.state.remote()))
        classes = {n.node_id: n.node_class for n in ray.get(handle.state.remote()).nodes}
        result.update(outcome=outcome, replicas_on={op: sorted({c for _, c in places}) for op, places in where.items()},
                      node_classes=sorted(set(classes.values())))
    ray.get(handle.stop.remote())
    ray.kill(handle)
    scaler.release()  # the run ended: as run_pipeline and the sidecar do
    ended = time.monotonic()
    cleared = cluster.status()
    gone = _wait(lambda: not cluster.status()["workers"], GONE_WAIT_S)
    result.update(after_release=cleared, workers_gone=bool(gone), workers_gone_s=time.monotonic() - ended, final=cluster.status())
    return result


def main(out_dir: str) -> None:
    cluster = OwnAutoscalingCluster(HEAD, WORKERS, idle_timeout_minutes=0.1)
    try:
        cluster.start()
        ray.init(address=cluster.address, namespace="elastic", log_to_driver=False, configure_logging=False)
        try:
            result = scenario(cluster, Path(out_dir))
        except Exception:  # noqa: BLE001 - the test reads the traceback from the result
            result = {"error": traceback.format_exc(), "logs": _log_tails(cluster)}
        print("RESULT " + json.dumps(result, default=str), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
