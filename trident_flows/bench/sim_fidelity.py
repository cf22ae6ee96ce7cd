"""Benchmark ``sim-fidelity``: the same workloads and policies on the emulated Ray runtime and in
the simulator, side by side: can the simulated figures be trusted?

Contract of ``run(quick) -> BenchResult``:
- Workloads (``WORKLOADS``), each on one logical node of 16 CPUs + 2 emulated GPUs (8 GiB
  each), the closed-loop benchmark's static-avg configuration (``closed_loop.tune``) and its
  seeded streams: ``docs-static`` (emulated documents, no policy), ``video-static`` (emulated
  video, no policy), ``docs-rolling`` (documents with a scripted rolling update: once
  ``ROLL_AT_S`` seconds have passed, ``embed`` is replaced by replicas at another batch size,
  start-before-retire) and ``docs-ds2`` (documents under the DS2 policy, ticking every
  ``closed_loop.TICK_S``).
- Live: ``launch.start_runner`` + the runtime's ``ControlLoop`` on a local Ray cluster (the
  emulated operators sleep their modelled seconds). Simulated: ``sim.driver.simulate`` on the
  same ``PipelineSpec`` (the very rows of its source) and the same policy class.
- Per workload: throughput = input items / (last output - first output) (the initial cold
  start excluded, as the closed-loop benchmark does), each operator's busy fraction at the end,
  reconfigurations. Errors: relative throughput error, largest busy-fraction gap in points,
  reconfiguration difference.
- Summary: ``max_throughput_error`` (largest relative error over the workloads), ``max_busy_error_points``,
  ``max_reconfiguration_diff``; targets 10%, 10 points, 1.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import ray

from trident_flows.bench.closed_loop import DEVICE_MEMORY, PIPELINES, TICK_S, tune, workloads
from trident_flows.bench.report import BenchResult, Target
from trident_flows.runtime.control import ControlLoop
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.launch import start_runner, stop_runner
from trident_flows.runtime.state import RunnerSettings, RunnerState
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.types import GPU, BatchSample, ClusterSpec, OperatorPlan, Plan, ReplicaGroup
from trident_flows.sim.driver import simulate

CPUS, GPUS = 16, 2
ROLL_AT_S = 4.0
NAMESPACE = "sim-fidelity"


class RollingUpdate:
    """A scripted policy: once the run is ``at_s`` seconds old, replace ``operator``'s replicas
    with the same number at ``batch_size`` (one rolling update, then nothing)."""

    name = "rolling-update"

    def __init__(self, operator: str, batch_size: int, at_s: float) -> None:
        self.operator, self.batch_size, self.at_s = operator, batch_size, at_s
        self.done = False

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None:
        if self.done or state.wall_s < self.at_s:
            return None
        self.done = True
        op = state.operator(self.operator)
        groups = tuple(ReplicaGroup(c.with_changes(batch_size=self.batch_size), n) for c, n in op.configs().items())
        return Plan((OperatorPlan(self.operator, groups, f"scripted rolling update to batch {self.batch_size}"),),
                    reason="scripted rolling update")


@dataclass(frozen=True)
class FidelityWorkload:
    name: str
    pipeline: str          # a key of closed_loop.PIPELINES
    policy: str            # "static", "rolling" or a registered policy


WORKLOADS = (FidelityWorkload("docs-static", "documents", "static"), FidelityWorkload("video-static", "video", "static"),
             FidelityWorkload("docs-rolling", "documents", "rolling"), FidelityWorkload("docs-ds2", "documents", "ds2"))


def _policy(kind: str, spec: Any, cluster: ClusterSpec) -> Any:
    if kind == "static":
        return None
    if kind == "rolling":
        gpu_op = next(o for o in spec.operators if o.config.device == GPU)
        return RollingUpdate(gpu_op.name, max(1, gpu_op.config.batch_size // 2), ROLL_AT_S)
    return make_policy(kind, spec=spec, cluster=cluster)


def _cluster() -> ClusterSpec:
    return ClusterSpec.single_node(CPUS, GPUS, gpu_memory_bytes=DEVICE_MEMORY)


def run_live(spec: Any, policy: Any, out: Path, poll_s: float = 0.2) -> dict[str, Any]:
    handle = start_runner(spec, out, name=f"fid-{uuid.uuid4().hex[:6]}", namespace=NAMESPACE,
                          settings=RunnerSettings(device_memory_bytes=DEVICE_MEMORY))
    loop = ControlLoop(handle, policy, TICK_S).start() if policy is not None else None
    t0 = time.perf_counter()
    first = None
    try:
        while True:
            summary = ray.get(handle.wait.remote(poll_s))
            state: RunnerState = ray.get(handle.state.remote())
            if first is None and state.items_written + state.items_dead_lettered > 0:
                first = time.perf_counter() - t0 - poll_s / 2
            if summary["finished"]:
                break
        last = time.perf_counter() - t0
    finally:
        stop_runner(handle, loop)
    return {"items_per_s": spec.items / (last - first) if first is not None and last > first else None,
            "busy": {o.name: o.busy_fraction for o in state.operators}, "reconfigurations": state.reconfigurations,
            "ooms": state.ooms, "wall_s": state.wall_s, "error": state.error}


def run_sim(spec: Any, policy: Any) -> dict[str, Any]:
    run = simulate(spec, _cluster(), policy, tick_s=TICK_S)
    s, state = run.summary, run.runner.state()
    return {"items_per_s": s["steady_items_per_s"], "busy": {o.name: o.busy_fraction for o in state.operators},
            "reconfigurations": s["reconfigurations"], "ooms": s["ooms"], "wall_s": s["wall_s"], "sim_wall_s": s["sim_wall_s"],
            "error": s["error"]}


def compare(live: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    err = abs(sim["items_per_s"] - live["items_per_s"]) / live["items_per_s"] if live["items_per_s"] and sim["items_per_s"] else None
    busy = {n: round(100 * abs(sim["busy"][n] - live["busy"][n]), 2) for n in live["busy"]}
    return {"throughput_error": err, "busy_error_points": busy, "max_busy_error_points": max(busy.values()),
            "reconfiguration_diff": abs(sim["reconfigurations"] - live["reconfigurations"])}


def figure(rows: list[dict[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["workload"] for r in rows]
    x = np.arange(len(rows))
    axes[0].bar(x - 0.2, [r["live"]["items_per_s"] or 0 for r in rows], 0.4, label="emulated Ray runtime (live)")
    axes[0].bar(x + 0.2, [r["sim"]["items_per_s"] or 0 for r in rows], 0.4, label="simulator")
    axes[0].set_xticks(x, names, fontsize=8)
    axes[0].set_ylabel("input items/s")
    axes[0].legend(fontsize=8)
    axes[0].set_title("throughput")
    for k, r in enumerate(rows):
        ops = list(r["live"]["busy"])
        axes[1].scatter([100 * r["live"]["busy"][o] for o in ops], [100 * r["sim"]["busy"][o] for o in ops], label=r["workload"], s=18)
    axes[1].plot([0, 100], [0, 100], "k--", lw=0.7)
    axes[1].plot([10, 100], [0, 90], "k:", lw=0.5)
    axes[1].plot([0, 90], [10, 100], "k:", lw=0.5)
    axes[1].set_xlabel("busy % live")
    axes[1].set_ylabel("busy % simulated")
    axes[1].legend(fontsize=7)
    axes[1].set_title("per-operator busy fraction (dotted: +-10 points)")
    fig.suptitle("sim-fidelity: the simulator against the emulated Ray runtime, same workloads and policies")
    fig.tight_layout()
    return fig


def _start_ray(attempts: int = 15) -> None:
    """A local Ray node; retried, because on a heavily loaded machine Ray's raylet may miss its
    fixed 30 s registration window ("The current node timed out during startup")."""
    for attempt in range(attempts):
        try:
            ray.init("local", num_cpus=CPUS, num_gpus=GPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
            return
        except Exception:  # noqa: BLE001 - retried; the last failure is raised
            ray.shutdown()
            if attempt == attempts - 1:
                raise
            time.sleep(20)


def run(quick: bool = False, log: Any = print) -> BenchResult:
    started = not ray.is_initialized()
    if started:
        _start_ray()
    work = Path(tempfile.mkdtemp(prefix="trident-sim-fidelity-"))
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        for w in WORKLOADS:
            bench = PIPELINES[w.pipeline]
            profile = PipelineProfile.load(bench.profile)
            # time scale 1 even when quick (a shorter stream instead): at smaller scales the live runtime's
            # per-batch overhead on a 2-core machine, not the cost model, sets the pace
            workload = dataclasses.replace(workloads(quick, bench)[0], time_scale=1.0)
            tuning = tune(profile, workload)
            spec = workload.spec(profile, tuning.static_avg, f"fidelity-{w.name}")
            live = run_live(spec, _policy(w.policy, spec, _cluster()), work / w.name)
            sim = run_sim(spec, _policy(w.policy, spec, _cluster()))
            row = {"workload": w.name, "pipeline": w.pipeline, "policy": w.policy, "regimes": workload.regimes,
                   "time_scale": workload.time_scale, "items": workload.items, "config": tuning.static_avg.label(),
                   "live": live, "sim": sim, **compare(live, sim)}
            log(f"{w.name}: live {live['items_per_s']:.2f} items/s, sim {sim['items_per_s']:.2f} items/s "
                f"(error {row['throughput_error']:.1%}), busy gap {row['max_busy_error_points']:.1f} points, "
                f"reconfigurations {live['reconfigurations']} vs {sim['reconfigurations']}")
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if started:
            ray.shutdown()
    errors = [r["throughput_error"] for r in rows if r["throughput_error"] is not None]
    summary = {"max_throughput_error": max(errors) if errors else None,
               "max_busy_error_points": max(r["max_busy_error_points"] for r in rows),
               "max_reconfiguration_diff": max(r["reconfiguration_diff"] for r in rows), "workloads": len(rows)}
    targets = {"max_throughput_error": Target("<=", 0.10), "max_busy_error_points": Target("<=", 10.0),
               "max_reconfiguration_diff": Target("<=", 1)}
    notes = (f"Live: the emulated Ray runtime on one logical node of {CPUS} CPUs + {GPUS} emulated GPUs hosted by this machine's "
             "cores (emulated operators sleep their modelled seconds, so the live figures carry this machine's scheduling noise "
             "and load). Simulated: trident_flows.sim on the same PipelineSpec, rows and policy class. Throughput = input items / "
             f"(last output - first output). docs-rolling: embed replaced at half its batch size once {ROLL_AT_S:g} s have "
             f"passed. bench seconds {time.perf_counter() - t0:.0f}.")
    return BenchResult("sim-fidelity", summary, targets, {"workloads": rows}, figure(rows), notes)
