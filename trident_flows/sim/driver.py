"""``simulate``: a policy controlling a simulated run, its summary and its plot.

Contract:
- ``simulate(spec, cluster, policy, duration_s=..., tick_s=..., tick_charge_s=..., decide_s_per_cpu_s=..., ...)`` starts a
  ``SimRunner`` (on the policy's ``starting_spec(spec)`` where it has one) and ticks the policy in a
  ``loop.TickLoop`` on a ``sim.tick_clock.SimClock``: a tick every ``tick_s`` simulated seconds,
  each decision's CPU time times ``decide_s_per_cpu_s`` (or the fixed ``tick_charge_s``) charged before its plan lands. A refused
  plan or a raising policy is logged and the run goes on, until the stream is done or
  ``duration_s``. ``decision_log`` is the loop's JSON-lines log.
- ``SimRun.summary``: ``loop.run_summary.RunSummary.to_dict()`` (built by ``run_summary``, as the CLI's
  ``--summary-json``; no Ray here, so no run session) with its ``simulation`` figures: ``simulated: true``, ``items_in_flight``,
  ``steady_items_per_s``, tick CPU and wall percentiles, ``tick_errors``, ``sim_wall_s``,
  ``sim_cpu_s`` (nothing is written); ``decisions`` and ``errors`` list plans and failed ticks.
- ``SimRun.timeline``: every ``record_s`` the items done, throughput, replicas and CPUs/GPUs held;
  ``plot(run, path)`` draws it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerSettings
from trident_flows.core.types import ClusterSpec
from trident_flows.loop.apply import Applied, apply_plan
from trident_flows.loop.run_summary import OutputCounts, RunSummary, run_summary
from trident_flows.loop.tick_loop import Recorder, TickLoop
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.scheduler.policies import Policy
from trident_flows.sim.actor_start import ActorStart
from trident_flows.sim.call_cost import CallCost
from trident_flows.sim.runner import SimRunner
from trident_flows.sim.tick_clock import SimClock
from trident_flows.sim.workload import Stream


@dataclass
class SimRun:
    summary: dict[str, Any]
    timeline: list[dict[str, Any]] = field(default_factory=list)
    tick_ms: list[float] = field(default_factory=list)       # CPU milliseconds of each policy tick (charged)
    tick_wall_ms: list[float] = field(default_factory=list)  # wall milliseconds of each policy tick (not charged)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # each plan handed to the runner: sim_t, reason, error
    errors: list[dict[str, Any]] = field(default_factory=list)     # each failed tick: sim_t, error
    runner: SimRunner | None = None


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def simulate(spec: PipelineSpec, cluster: ClusterSpec, policy: Policy | None, *, duration_s: float | None = None, tick_s: float = 2.0,
             settings: RunnerSettings | None = None, stream: Stream | None = None, node_loss: Sequence[tuple[float, int]] = (),
             record_s: float | None = None, decision_log: Path | None = None, actor_start: ActorStart = ActorStart(),
             call_cost: CallCost = CallCost(), tick_charge_s: float | None = None, decide_s_per_cpu_s: float = 1.0) -> SimRun:
    """Run ``spec`` on the simulated ``cluster`` under ``policy`` (see the module docstring)."""
    if tick_s <= 0:
        raise ValueError(f"tick_s must be > 0, got {tick_s}")
    if tick_charge_s is not None and tick_charge_s < 0:
        raise ValueError(f"tick_charge_s must be >= 0 (or None: each tick's CPU time), got {tick_charge_s}")
    if decide_s_per_cpu_s < 1:
        raise ValueError(f"decide_s_per_cpu_s must be >= 1 (a decision takes at least its CPU time), got {decide_s_per_cpu_s}")
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    starting = getattr(policy, "starting_spec", None)
    if starting is not None:
        spec = starting(spec)  # a policy that remembers earlier runs (Trident) may start the pipeline in what it learned
    runner = SimRunner(spec, cluster, settings=settings, stream=stream, node_loss=node_loss, actor_start=actor_start,
                       call_cost=call_cost)
    run = SimRun({}, runner=runner)
    runner.start()
    clock = SimClock(runner, tick_s if policy is not None else None, record_s or tick_s, math.inf if duration_s is None else float(duration_s),
                     _point, tick_charge_s, decide_s_per_cpu_s)
    loop = None
    if policy is None:
        clock.wait()  # no ticks: the simulation runs to its end
    else:
        # a plan goes to the runner unless the run ended while the policy decided; a refused plan is logged and the run goes on
        loop = TickLoop(runner, policy, clock, apply=lambda decision: None if runner.finished else apply_plan(runner.apply, decision.plan),
                        recorders=(_Decisions(run),), decision_log=decision_log)
        loop.run()
    clock.finish()
    run.timeline, run.tick_ms, run.tick_wall_ms = clock.timeline, clock.tick_ms, clock.tick_wall_ms
    finish = getattr(policy, "finish", None)
    if finish is not None:
        finish(runner.state())  # a policy that keeps something across runs (Trident's memory) writes it now
    run.summary = _summary(runner, policy, loop.loop_state.decisions if loop is not None else 0, run, time.perf_counter() - wall0,
                           time.process_time() - cpu0).to_dict()
    return run


class _Decisions(Recorder):
    """Keeps each plan handed to the runner (simulated time, reason, apply error) and each failed tick in the ``SimRun``."""

    def __init__(self, run: SimRun) -> None:
        self.run = run

    def decided(self, state: Any, decision: Decision, applied: Applied, line: dict[str, Any]) -> None:
        error = applied.error or (applied.report.error if applied.report is not None else "")
        self.run.decisions.append({"sim_t": line["t"], "reason": line["reason"], "error": error})

    def failed(self, line: dict[str, Any]) -> None:
        self.run.errors.append({"sim_t": line["t"], "error": line["error"]})


def _point(runner: SimRunner, last_done: int, last_t: float) -> dict[str, Any]:
    dt = runner.now - last_t
    cpus = gpus = 0.0
    replicas = {}
    for name, pool in zip(runner.names, runner.pools):
        active = pool.active()
        replicas[name] = len(active)
        cpus += sum(r.config.cpus for r in pool.replicas.values())
        gpus += sum(r.config.gpus for r in pool.replicas.values())
    return {"t": round(runner.now, 3), "inputs_done": runner.inputs_done,
            "items_per_s": (runner.inputs_done - last_done) / dt if dt > 0 else 0.0, "replicas": replicas, "cpus": cpus, "gpus": gpus}


def _summary(runner: SimRunner, policy: Policy | None, decisions: int, run: SimRun, sim_wall_s: float, sim_cpu_s: float) -> RunSummary:
    state = runner.state()
    in_flight = int(np.count_nonzero(runner._pending[: runner.items_in]))
    first, last = runner.first_output_at, runner.last_output_at
    outputs = OutputCounts(items_written=runner.inputs_done - runner.inputs_dead, items_dead_lettered=runner.inputs_dead,
                           items_dropped=runner.rows_dropped, rows_written=runner.rows_written, duplicate_ids=0)
    figures = getattr(policy, "run_figures", None)
    simulation = {
        "simulated": True, "items_in_flight": in_flight, "first_output_s": first,
        "steady_items_per_s": (runner.inputs_done / (last - first)) if first is not None and last is not None and last > first else None,
        "tick_ms_p50": _pct(run.tick_ms, 50), "tick_ms_p95": _pct(run.tick_ms, 95), "tick_wall_ms_p95": _pct(run.tick_wall_ms, 95),
        "tick_errors": len(run.errors), "sim_wall_s": sim_wall_s, "sim_cpu_s": sim_cpu_s, "events": runner.events.events_run,
        "decisions": decisions,
    }
    return run_summary(runner.spec.name, policy.name if policy is not None else "none", "", state, outputs, items_in=runner.items_in,
                       items_done=runner.inputs_done, decisions_made=decisions, apply_reports=[r.to_dict() for r in runner.apply_reports],
                       items_in_flight=in_flight, policy_figures=figures() if figures is not None else None, simulation=simulation)


def plot(run: SimRun, path: Path, title: str = "") -> Path:
    """Throughput, replicas per operator and GPUs held over simulated time (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = run.timeline
    hours = max(p["t"] for p in tl) > 7200 if tl else False
    scale, unit = (3600.0, "h") if hours else (1.0, "s")
    t = np.array([p["t"] for p in tl]) / scale
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].plot(t, [p["items_per_s"] for p in tl], lw=0.8)
    axes[0].set_ylabel("input items/s")
    for name in (tl[0]["replicas"] if tl else {}):
        axes[1].step(t, [p["replicas"].get(name, 0) for p in tl], where="post", label=name, lw=0.9)
    axes[1].set_ylabel("replicas")
    axes[1].legend(fontsize=7, ncol=4)
    axes[2].step(t, [p["gpus"] for p in tl], where="post", label="GPUs held")
    axes[2].step(t, [p["cpus"] for p in tl], where="post", label="CPUs held")
    axes[2].set_ylabel("resources")
    axes[2].legend(fontsize=7)
    axes[2].set_xlabel(f"simulated time ({unit})")
    s = run.summary
    fig.suptitle(title or f"SIMULATED: {s.get('pipeline')} / {s.get('policy')}: {s.get('throughput_items_per_s', 0):.1f} items/s, "
                 f"{s.get('reconfigurations')} reconfigurations, {s.get('ooms')} OOMs")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
