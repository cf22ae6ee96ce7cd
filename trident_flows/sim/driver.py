"""``simulate``: a policy controlling a simulated run, its summary and its plot.

Contract:
- ``simulate(spec, cluster, policy, duration_s=..., tick_s=..., actor_start=..., call_cost=...)`` starts a ``SimRunner`` and,
  like the live ``ControlLoop``, every ``tick_s`` simulated seconds calls ``state()``,
  ``samples(since)``, ``policies.decide_once`` and, for a plan, ``apply``
  (``control.step.decide_and_apply``, shared with the live loop and the controller). The policy runs
  unchanged in this process; the time its tick really takes (model fits, BO, MILP) is charged
  to the simulated clock (the pipeline streams on while it decides); ``tick_charge_s`` charges a
  fixed time instead, so that a run's decisions do not depend on the machine (same inputs, same
  decisions: what a behaviour-preserving change is checked against). Charged is the tick's
  CPU time (``time.process_time``, all threads of this process): what the tick takes on a
  machine that is not shared; its wall time on a shared machine adds waiting for a core
  (both are kept: ``tick_ms`` and ``tick_wall_ms``), and an apply
  blocks the loop until its steps are done, as the live loop's ``ray.get(apply)`` does. A
  refused plan is logged and the run goes on. It ends when the stream is done or at
  ``duration_s`` simulated seconds.
- ``SimRun.summary`` has the keys of ``trident-flows run --summary-json`` (``RunSummary``) plus
  ``simulated: true``, ``items_in_flight`` (items admitted and not yet done when a run is cut
  at ``duration_s``), ``steady_items_per_s`` (input items / (last output - first output)),
  ``tick_ms_p50`` / ``tick_ms_p95`` (CPU), ``tick_wall_ms_p95``, ``sim_wall_s`` (real seconds the simulation took) and ``sim_cpu_s``
  (its CPU seconds: the wall time it would take on a machine it does not share).
  Items are never written anywhere: ``out_dir`` is empty and ``duplicate_ids`` is 0 by construction.
- ``SimRun.timeline``: every ``record_s`` simulated seconds, input items done, throughput over
  the interval, replicas per operator, CPUs and GPUs held. ``plot(run, path)`` draws it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from trident_flows.control.launch import _operator_figures
from trident_flows.control.step import decide_and_apply
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.core.state import RunnerSettings
from trident_flows.scheduler.policies import Policy, decide_once
from trident_flows.core.types import ClusterSpec, StepKind
from trident_flows.sim.actor_start import ActorStart
from trident_flows.sim.call_cost import CallCost
from trident_flows.sim.runner import SimRunner
from trident_flows.sim.workload import Stream


@dataclass
class SimRun:
    summary: dict[str, Any]
    timeline: list[dict[str, Any]] = field(default_factory=list)
    tick_ms: list[float] = field(default_factory=list)       # CPU milliseconds of each policy tick (charged)
    tick_wall_ms: list[float] = field(default_factory=list)  # wall milliseconds of each policy tick (not charged)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    runner: SimRunner | None = None


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def simulate(spec: PipelineSpec, cluster: ClusterSpec, policy: Policy | None, *, duration_s: float | None = None, tick_s: float = 2.0,
             settings: RunnerSettings | None = None, stream: Stream | None = None, node_loss: Sequence[tuple[float, int]] = (),
             record_s: float | None = None, decision_log: Path | None = None, actor_start: ActorStart = ActorStart(),
             call_cost: CallCost = CallCost(), tick_charge_s: float | None = None) -> SimRun:
    """Run ``spec`` on the simulated ``cluster`` under ``policy`` (see the module docstring)."""
    if tick_s <= 0:
        raise ValueError(f"tick_s must be > 0, got {tick_s}")
    if tick_charge_s is not None and tick_charge_s < 0:
        raise ValueError(f"tick_charge_s must be >= 0 (or None: each tick's CPU time), got {tick_charge_s}")
    if duration_s is not None and duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    runner = SimRunner(spec, cluster, settings=settings, stream=stream, node_loss=node_loss, actor_start=actor_start,
                       call_cost=call_cost)
    run = SimRun({}, runner=runner)
    log = None
    if decision_log is not None:
        Path(decision_log).parent.mkdir(parents=True, exist_ok=True)
        log = Path(decision_log).open("w")
    record_s = record_s or tick_s
    end = math.inf if duration_s is None else float(duration_s)
    runner.start()
    cursor, decisions = 0, 0
    next_tick, next_record, last_done, last_t = runner.now + tick_s, runner.now, 0, runner.now
    try:
        while not runner.finished and runner.now < end:
            target = min(end, next_record if policy is None else min(next_tick, next_record))
            runner.run_until(target)
            if runner.now >= next_record or runner.finished:
                run.timeline.append(_point(runner, last_done, last_t))
                last_done, last_t = runner.inputs_done, runner.now
                next_record = runner.now + record_s
            if policy is None or runner.finished or runner.now < next_tick:
                continue
            state = runner.state()
            page = runner.samples(cursor)
            cursor = page.next
            decided_at: list[float] = []  # the simulated time the plan goes to the runner, after the charge

            def charged_decide(policy: Policy, state: Any, samples: Sequence[Any]) -> Any:
                t0, c0 = time.perf_counter(), time.process_time()
                decision = decide_once(policy, state, samples)
                spent = time.process_time() - c0
                run.tick_ms.append(spent * 1e3)
                run.tick_wall_ms.append((time.perf_counter() - t0) * 1e3)
                # the decision's real compute time (or the fixed charge), charged to the simulated clock
                runner.run_until(runner.now + (spent if tick_charge_s is None else tick_charge_s))
                decided_at.append(runner.now)
                return decision

            # a refused plan is logged and the pipeline keeps running; every outcome goes back to the policy (as live)
            step = decide_and_apply(policy, state, page.samples, runner.apply, decide=charged_decide,
                                    may_apply=lambda: not runner.finished)
            decision, applied = step.decision, step.applied
            if applied is not None:
                decisions += 1
                record = decision.to_dict()
                record["sim_t"] = round(decided_at[0], 3)
                if applied.report is not None:
                    record["apply"] = applied.report.to_dict()
                else:
                    record["apply_error"] = applied.error
                run.decisions.append({k: record[k] for k in ("sim_t", "reason") if k in record}
                                     | {"error": record.get("apply_error") or record.get("apply", {}).get("error", "")})
                if log is not None:
                    log.write(json.dumps(record, default=str) + "\n")
            next_tick = runner.now + tick_s
    finally:
        if log is not None:
            log.close()
    run.timeline.append(_point(runner, last_done, last_t))
    finish = getattr(policy, "finish", None)
    if finish is not None:
        finish(runner.state())  # a policy that keeps something across runs (Trident's memory) writes it now
    run.summary = _summary(runner, policy, decisions, run.tick_ms, run.tick_wall_ms, time.perf_counter() - wall0)
    run.summary["sim_cpu_s"] = time.process_time() - cpu0
    return run


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


def _summary(runner: SimRunner, policy: Policy | None, decisions: int, tick_ms: Sequence[float], tick_wall_ms: Sequence[float],
             sim_wall_s: float) -> dict[str, Any]:
    state = runner.state()
    wall = state.wall_s
    in_flight = int(np.count_nonzero(runner._pending[: runner.items_in]))
    rolling = [r.dip for r in runner.apply_reports if any(s["kind"] == StepKind.RETIRE.value for s in r.steps_done)
               and any(s["kind"] == StepKind.START.value for s in r.steps_done)]
    first, last = runner.first_output_at, runner.last_output_at
    return {
        "pipeline": runner.spec.name, "policy": policy.name if policy is not None else "none", "out_dir": "",
        "items_in": runner.items_in, "items_written": runner.inputs_done - runner.inputs_dead,
        "items_dead_lettered": runner.inputs_dead, "items_dropped": runner.rows_dropped,
        "items_missing": runner.items_in - runner.inputs_done - in_flight, "rows_written": runner.rows_written, "duplicate_ids": 0,
        "wall_s": wall, "throughput_items_per_s": runner.inputs_done / wall if wall > 0 else 0.0, "ooms": state.ooms,
        "reconfigurations": state.reconfigurations, "rolling_update_dip": max(rolling) if rolling else 0.0, "decisions": decisions,
        "operators": _operator_figures(state), "apply_reports": [r.to_dict() for r in runner.apply_reports], "error": state.error,
        "simulated": True, "items_in_flight": in_flight, "first_output_s": first,
        "steady_items_per_s": (runner.inputs_done / (last - first)) if first is not None and last is not None and last > first else None,
        "tick_ms_p50": _pct(tick_ms, 50), "tick_ms_p95": _pct(tick_ms, 95), "tick_wall_ms_p95": _pct(tick_wall_ms, 95),
        "sim_wall_s": sim_wall_s,
        "events": runner.events.events_run,
    }


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
