"""Benchmark ``elastic``: does a run with a deadline ask Ray's autoscaler for the nodes the deadline needs, at about the
cost the capacity planner gives for it, and give them back at the end?

Contract of ``run(quick) -> BenchResult``:
- Cluster: Ray's local autoscaling cluster (fake multi-node provider): a head of ``HEAD_CPUS`` CPUs and up to
  ``MAX_WORKERS`` 1-CPU ``c1`` workers; prices (``PRICES``) and start-up (``STARTUP_S``) are declared (``POOL``).
- Workload: the emulated documents pipeline, ``short`` documents, started in the planner's placement for the
  head alone, under trident with an ``ElasticScaler``. Runs (``sizes``): ``needs-nodes`` (items due in ``DEADLINE_S``
  that the head alone needs ``NEEDS_OVER_DEADLINE`` times as long for, by the cost model), then ``head-suffices``
  (items due in ``DEADLINE_SMALL_S`` that take the head alone ``SUFFICES_OVER_DEADLINE`` of it).
- Baseline: the planner's price, the cheapest checked cluster of the head and 0..``MAX_WORKERS`` workers that
  finishes within the deadline (``cheapest_meeting``). Figures are read from Ray's autoscaler state, not from
  trident's bookkeeping (``figures_of``).
- Summary targets: ``deadline_met`` (== 1), ``nodes_requested`` (> 0), ``cost_vs_planner`` (run's node cost /
  planner's, <= 1.1) and ``cost_vs_planner_error`` (<= 0.1), ``idle_node_s_after_end`` (<= 60),
  ``requests_left_after_end`` (== 0), ``nodes_requested_when_head_suffices`` (== 0).
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import ray

from benchmarks.autoscaling_cluster import OwnAutoscalingCluster
from benchmarks.node_timeline import NodeSample, NodeSampler, first_at, most_requested, node_cost, node_seconds
from benchmarks.report import BenchResult, Target
from trident_flows.control.elastic import ElasticScaler
from trident_flows.control.launch import run_pipeline
from trident_flows.core.state import RunnerSettings, RunnerState
from trident_flows.core.types import ClusterSpec
from trident_flows.planning.catalogue import Catalogue, NodeType
from trident_flows.planning.demands import operator_demands
from trident_flows.planning.planner import ClusterOption, PlacementChecker
from trident_flows.planning.scale import HEAD_PRICE_CLASS, NodePool, RunGoal
from trident_flows.planning.simcheck import planned_spec
from trident_flows.planning.workload import from_regimes
from trident_flows.scheduler.policies import make_policy

MB = 2**20
HEAD_CPUS, WORKER = 6, "c1"
MAX_WORKERS = 3
PRICES = {HEAD_PRICE_CLASS: 0.30, WORKER: 0.40}  # per hour, emulated: a worker CPU dearer than the head's (a base node already paid for)
STARTUP_S = 30.0  # declared: the fake provider's raylet start (seconds here) plus an embed replica's cold start (~18 s in the cost model)
IDLE_TIMEOUT_MIN = 0.1
TIME_SCALE = 1.0
REGIME = "short"
DEADLINE_S, DEADLINE_SMALL_S = 215.0, 240.0
QUICK_DEADLINES = (125.0, 150.0)
# the runs' item counts follow the cost model's rate for the head alone (so a re-measured profile keeps the question):
# the first run's items take the head alone about twice its deadline (nodes are needed), the second's under half of it
NEEDS_OVER_DEADLINE, SUFFICES_OVER_DEADLINE = 1.9, 0.42
SAMPLE_S = 1.0
GONE_WAIT_S = 180.0
NAMESPACE = "bench-elastic"

CATALOGUE = Catalogue((NodeType(HEAD_PRICE_CLASS, HEAD_CPUS, PRICES[HEAD_PRICE_CLASS], max_count=1),
                       NodeType(WORKER, 1, PRICES[WORKER], max_count=MAX_WORKERS)), "USD", "bench elastic (emulated prices)",
                      startup_minutes=STARTUP_S / 60)
POOL = NodePool.from_catalogue(CATALOGUE)
HEAD = {"CPU": HEAD_CPUS, "object_store_memory": 200 * MB}
WORKERS = {WORKER: {"resources": {"CPU": 1, WORKER: 1, "object_store_memory": 80 * MB}, "node_config": {}, "min_workers": 0,
                    "max_workers": MAX_WORKERS}}


def cheapest_meeting(options: Sequence[ClusterOption], deadline_s: float) -> ClusterOption | None:
    """The planner's option of least job cost finishing within ``deadline_s`` (the catalogue's start-up included), None
    when none does: the price ``cost_vs_planner`` divides the run's node cost by."""
    meeting = [o for o in options if o.hours * 3600 <= deadline_s]
    return min(meeting, key=lambda o: (o.cost, o.hours)) if meeting else None


def planner_options(items: int) -> list[ClusterOption]:
    """The planner's checked clusters of the head and 0..MAX_WORKERS workers for ``items`` short documents."""
    workload = from_regimes("documents", f"{REGIME}:{items}")
    demands = operator_demands(workload.profile, workload.mean_features(), workload.worst_features(), 0)
    checker = PlacementChecker(demands, CATALOGUE, items)
    return [o for n in range(MAX_WORKERS + 1) if (o := checker({HEAD_PRICE_CLASS: 1, WORKER: n})) is not None]


def sizes(quick: bool) -> tuple["Case", "Case"]:
    """The two runs: their deadlines, and item counts from the planner's rate for the head alone (see
    ``NEEDS_OVER_DEADLINE``)."""
    rate = planner_options(1000)[0].items_per_s
    deadline, deadline_small = QUICK_DEADLINES if quick else (DEADLINE_S, DEADLINE_SMALL_S)
    return (Case("needs-nodes", round(NEEDS_OVER_DEADLINE * deadline * rate), deadline),
            Case("head-suffices", round(SUFFICES_OVER_DEADLINE * deadline_small * rate), deadline_small))


@dataclass
class Case:
    """One run: what it was asked and what was measured (wall-clock times, epoch seconds)."""

    name: str
    items: int
    deadline_s: float
    started: float = 0.0
    finished: float | None = None  # the last item done
    ended: float = 0.0  # run_pipeline returned: the runner stopped, trident's request cleared
    gone: float | None = None  # Ray's state shows no worker node (after ``ended``)
    requests_left: int = -1
    scaler: dict[str, Any] | None = None
    done: list[tuple[float, int]] | None = None
    error: str = ""

    @property
    def deadline_at(self) -> float:
        return self.started + self.deadline_s


def run_case(case: Case, cluster: OwnAutoscalingCluster, work: Path, log: Any) -> Case:
    """Run ``case`` on ``cluster`` to its end and wait for its workers to go (at most ``GONE_WAIT_S``): the emulated
    documents pipeline at time scale 1 (operators sleep their modelled seconds), started in the capacity planner's
    placement for the head alone (``planner.PlacementChecker``, ``simcheck.planned_spec``), under the trident policy in
    the control loop with an ``ElasticScaler`` (its default 15 s interval)."""
    workload = from_regimes("documents", f"{REGIME}:{case.items}")
    head_plan = planner_options(case.items)[0].plan
    spec, _ = planned_spec(workload, head_plan, case.items, HEAD_CPUS + MAX_WORKERS, time_scale=TIME_SCALE)
    policy = make_policy("trident", spec=spec, cluster=ClusterSpec.single_node(HEAD_CPUS, 0))
    case.done = []
    case.started = time.time()
    scaler = ElasticScaler(POOL, RunGoal(deadline_at=case.deadline_at), items_total=case.items)

    def progress(state: RunnerState) -> None:
        done = state.items_written + state.items_dead_lettered
        case.done.append((time.time(), done))
        if case.finished is None and done >= case.items:
            case.finished = time.time()

    summary = run_pipeline(spec, work / case.name, settings=RunnerSettings(warm_timeout_s=180.0), policy=policy, progress=progress,
                           name=f"elastic-{case.name}", namespace=NAMESPACE, scaler=scaler)
    case.ended = time.time()
    case.requests_left = len(cluster.status()["requested_bundles"])
    case.scaler, case.error = summary.elastic, summary.error
    log(f"elastic {case.name}: {summary.items_written + summary.items_dead_lettered}/{case.items} items in {case.ended - case.started:.0f} s "
        f"(deadline {case.deadline_s:.0f} s), most nodes requested {scaler.nodes_requested}, {case.requests_left} bundles left")
    deadline = time.monotonic() + GONE_WAIT_S
    while cluster.status()["workers"] and time.monotonic() < deadline:
        time.sleep(SAMPLE_S)
    case.gone = time.time() if not cluster.status()["workers"] else None
    return case


def figures_of(case: Case, samples: Sequence[NodeSample]) -> dict[str, Any]:
    """A run's summary figures and raw measurements from Ray's autoscaler samples (``node_timeline.NodeSampler``, a read
    every ``SAMPLE_S``): worker nodes alive and pending, the bundles requested. ``finish_s``: when its last item was
    done; ``deadline_met``; ``nodes_requested``: the most nodes trident asked for at once, or Ray saw requested,
    whichever is more; ``cost``: the head's price over the run's wall time from start to the run's end, plus each
    worker's price over the seconds Ray reported it pending or alive, idle time after the end included;
    ``idle_node_s_after_end``: worker node-seconds alive after the run ended, until they are gone or ``GONE_WAIT_S``
    passed; ``requests_left_after_end``: bundles Ray still holds requested, read right after the run ended."""
    upto = case.gone if case.gone is not None else max((s.t for s in samples), default=case.ended)
    worker_s = node_seconds(samples, case.started, upto, pending=True)
    run_end = case.finished if case.finished is not None else case.ended
    cost = PRICES[HEAD_PRICE_CLASS] * (run_end - case.started) / 3600 + node_cost(worker_s, PRICES)
    ray_requested = most_requested(samples, case.started, case.ended)
    first_request = first_at(samples, case.started, lambda s: s.requested > 0)
    joined = first_at(samples, first_request, lambda s: sum(s.alive.values()) >= s.requested > 0) if first_request is not None else None
    return {
        "deadline_met": case.finished is not None and case.finished <= case.deadline_at,
        "finish_s": None if case.finished is None else case.finished - case.started,
        "nodes_requested": max(ray_requested, int((case.scaler or {}).get("nodes_requested", 0))),
        "nodes_requested_ray": ray_requested, "nodes_requested_trident": (case.scaler or {}).get("nodes_requested"),
        "cost": cost, "worker_node_s": worker_s,
        "idle_node_s_after_end": sum(node_seconds(samples, case.ended, upto).values()),
        "requests_left_after_end": case.requests_left,
        "workers_gone_s_after_end": None if case.gone is None else case.gone - case.ended,
        "request_to_joined_s": None if joined is None else joined - first_request,
    }


def run(quick: bool = False, log: Any = print) -> BenchResult:
    """The benchmark (see the module docstring); ``quick`` runs both runs to shorter deadlines (``QUICK_DEADLINES``)."""
    needs, suffices = sizes(quick)
    plans = {c.name: planner_options(c.items) for c in (needs, suffices)}
    best = {name: cheapest_meeting(options, c.deadline_s) for (name, options), c in zip(plans.items(), (needs, suffices))}
    log(f"elastic: planner for {needs.items} items in {needs.deadline_s:.0f} s: "
        f"{best['needs-nodes'].label() if best['needs-nodes'] else 'none meets it'}; head alone {plans['needs-nodes'][0].hours * 3600:.0f} s")
    logging.getLogger("ray").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="trident-elastic-"))
    cluster = OwnAutoscalingCluster(HEAD, WORKERS, idle_timeout_minutes=IDLE_TIMEOUT_MIN)
    sampler = NodeSampler(cluster.status, SAMPLE_S)
    t_bench = time.perf_counter()
    try:
        cluster.start()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
        sampler.start()
        for case in (needs, suffices):
            run_case(case, cluster, work, log)
    finally:
        samples = sampler.stop()
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    measured = {c.name: figures_of(c, samples) for c in (needs, suffices)}
    planner_cost = best["needs-nodes"].cost if best["needs-nodes"] is not None else math.nan
    a = measured["needs-nodes"]
    summary = {
        "deadline_met": int(a["deadline_met"]),
        "nodes_requested": a["nodes_requested"],
        "cost_vs_planner": a["cost"] / planner_cost,
        "cost_vs_planner_error": abs(a["cost"] / planner_cost - 1),
        "idle_node_s_after_end": a["idle_node_s_after_end"],
        "requests_left_after_end": a["requests_left_after_end"],
        "nodes_requested_when_head_suffices": measured["head-suffices"]["nodes_requested"],
        "deadline_met_when_head_suffices": int(measured["head-suffices"]["deadline_met"]),
    }
    targets = {"deadline_met": Target("==", 1), "nodes_requested": Target(">", 0), "cost_vs_planner": Target("<=", 1.1),
               "cost_vs_planner_error": Target("<=", 0.1), "idle_node_s_after_end": Target("<=", 60),
               "requests_left_after_end": Target("==", 0), "nodes_requested_when_head_suffices": Target("==", 0)}
    raw = {"time_scale": TIME_SCALE, "bench_seconds": time.perf_counter() - t_bench, "prices_per_hour": PRICES, "startup_s_declared": STARTUP_S,
           "head_cpus": HEAD_CPUS, "worker": {"type": WORKER, "cpus": 1, "max": MAX_WORKERS}, "idle_timeout_min": IDLE_TIMEOUT_MIN,
           "samples_failed": sampler.failed,
           "runs": {c.name: {"items": c.items, "deadline_s": c.deadline_s, **measured[c.name], "error": c.error, "scaler": c.scaler,
                             "planner": [o.to_dict() for o in plans[c.name]],
                             "planner_choice": best[c.name].to_dict() if best[c.name] is not None else None}
                    for c in (needs, suffices)},
           "timeline": {c.name: _timeline(c, samples) for c in (needs, suffices)}}
    log(f"elastic: cost {a['cost']:.4f} vs planner {planner_cost:.4f} USD, idle {a['idle_node_s_after_end']:.0f} node-s after the end")
    return BenchResult("elastic", summary, targets=targets, raw=raw, figure=figure(raw["timeline"], (needs, suffices)),
                       notes=_notes(quick, best["needs-nodes"]))


def _timeline(case: Case, samples: Sequence[NodeSample]) -> dict[str, list[float]]:
    """A run's samples and items done, in seconds since it started."""
    upto = case.gone if case.gone is not None else case.ended + GONE_WAIT_S
    mine = [s for s in samples if case.started <= s.t <= upto]
    return {"t_s": [round(s.t - case.started, 2) for s in mine], "alive": [sum(s.alive.values()) for s in mine],
            "pending": [sum(s.pending.values()) for s in mine], "requested": [s.requested for s in mine],
            "done_t_s": [round(t - case.started, 2) for t, _ in case.done or []], "done": [n for _, n in case.done or []],
            "deadline_s": case.deadline_s, "ended_s": case.ended - case.started,
            "finished_s": None if case.finished is None else case.finished - case.started}


def _notes(quick: bool, choice: ClusterOption | None) -> str:
    return (("QUICK run (smaller sizes). " if quick else "")
            + f"Emulated: node prices (head {PRICES[HEAD_PRICE_CLASS]} and {WORKER} {PRICES[WORKER]} USD/h, placeholders of no cloud) and "
            f"the start-up a new node pays before it works ({STARTUP_S:.0f} s declared in the catalogue trident and the planner read; "
            "the fake multi-node provider starts a local raylet, and the pipeline's embed replica then has a modelled ~18 s cold "
            "start; the measured request-to-joined time is in raw.runs). The pipeline is the emulated documents pipeline "
            f"(short documents, operators sleep their modelled seconds, time scale {TIME_SCALE:g}) on a head of {HEAD_CPUS} logical CPUs "
            f"and up to {MAX_WORKERS} {WORKER} nodes of 1 logical CPU, all hosted by this machine's cores. "
            "Baseline planner: the capacity planner's cheapest cluster of the head and c1 nodes finishing the same items within the "
            "deadline by the cost model, its job cost counting the start-up for the whole job "
            f"({choice.label() if choice else 'none'}). Baseline head alone: the second run, whose deadline the head alone meets. "
            "Node counts, requests and idle node-seconds are read from Ray's autoscaler state every second; the run's cost is the "
            "head's price over the run and each worker's price over the seconds Ray reported it pending or alive.")


def figure(timelines: dict[str, dict[str, Any]], cases: Sequence[Case]) -> Any:
    """Per run: worker nodes alive and requested (Ray's view) and the items done per second over time, the deadline and
    the run's end marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(2, len(cases), figsize=(13, 6.5), sharex="col", gridspec_kw={"height_ratios": [1, 1.4]})
    for k, case in enumerate(cases):
        tl = timelines[case.name]
        ax_n, ax_t = axes[0][k], axes[1][k]
        ax_n.step(tl["t_s"], tl["alive"], where="post", label="worker nodes alive (Ray)")
        ax_n.step(tl["t_s"], [a + p for a, p in zip(tl["alive"], tl["pending"])], where="post", ls=":", label="alive + pending")
        ax_n.step(tl["t_s"], tl["requested"], where="post", ls="--", label="bundles requested")
        ax_n.set_ylabel("nodes")
        ax_n.set_title(f"{case.name}: {case.items} items, deadline {case.deadline_s:.0f} s", fontsize=9)
        t, done = np.array(tl["done_t_s"]), np.array(tl["done"], dtype=float)
        if len(t) > 1:
            window = 10.0
            back = np.interp(t - window, t, done, left=0.0)
            ax_t.plot(t, (done - back) / np.minimum(window, np.maximum(t, 1e-9)), label="items done per s (10 s window)")
        for ax in (ax_n, ax_t):
            ax.axvline(tl["deadline_s"], color="red", lw=1, label="deadline")
            ax.axvline(tl["ended_s"], color="grey", lw=1, ls="--", label="run ended")
        ax_t.set_ylabel("items/s")
        ax_t.set_xlabel("seconds since the run started")
        ax_n.legend(fontsize=7)
        ax_t.legend(fontsize=7)
    fig.tight_layout()
    return fig
