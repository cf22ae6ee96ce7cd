"""The committed live traces as references for the simulator: what each live run measured, and
whether it is a reference at all.

Contract:
- ``reference(trace) -> TraceReference``: everything the simulator needs to run what the trace ran
  (profile, stream, starting configuration, cluster, policy) and ``stale``: why it is not a run of
  today's stream and configuration ("" when it is; ``stale_reason``).
- ``overrun(trace, profile)``: median measured / modelled seconds per batch; a trace above
  ``OVERRUN_MAX`` ran on a starved machine and is no reference. ``total_stretch``: the same over all
  batches together, the work the live run did beyond the model.
- ``live_figures(trace, gpus)``: the live run's throughput, GPU busy, per-operator busy fractions
  (``busy_fractions``) and reconfigurations, measured as the simulator measures them.
- ``live_moves(trace)``: the live run's decisions, to replay (``replay_policy.ReplayPolicy``) at the same
  seconds into streaming; ``start_overheads(trace, profile)``: what starting a replica costs live
  beyond its modelled cold start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from benchmarks.closed_loop_workload import DEVICE_MEMORY, PIPELINES, BenchPipeline, Workload, tune, workloads
from benchmarks.live_trace import Trace, profile_digest
from benchmarks.record_traces import EMULATED
from trident_flows.core.state import RunnerState
from trident_flows.core.types import GPU, BatchSample, ClusterSpec, Plan
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.sim.static_search import StaticConfig

# A live run whose batches took more than this times their modelled seconds (median) measured the
# machine's load, not the runtime. The committed traces: documents 1.014-1.023, video 1.040-1.069
# (video-static at 1.040 is within 1.8% of the committed 3-repeat static-avg, 10.63 vs 10.83 items/s).
OVERRUN_MAX = 1.10
# batches shorter than this are mostly call overhead; their ratio says nothing about starvation
_MIN_MODELLED_S = 0.005


def trace_workload(name: str) -> tuple[BenchPipeline, str]:
    """The benchmark pipeline and policy name (``"static"``: no policy) a closed-loop trace ran, from its name
    (``docs-ds2``, ``video-static``, ...; ``record_traces.EMULATED``): the closed-loop benchmark's full stream and tuning."""
    if name not in EMULATED:
        raise ValueError(f"trace {name!r} is not an emulated closed-loop trace; known: {sorted(EMULATED)}")
    pipeline, policy = EMULATED[name]
    return PIPELINES["documents" if pipeline == "docs" else "video"], policy


def stale_reason(trace: Trace, blocks: list[tuple[str, int, int]], start_config: str) -> str:
    """Why ``trace`` is not a run of today's cost profile, stream (``blocks``) and starting configuration ("" if it is).
    A trace that names no profile digest (recorded before traces did) is judged by its overrun instead."""
    recorded = trace.header.get("profile_sha256")
    if recorded is not None and recorded != profile_digest(str(trace.header["pipeline"])):
        return f"recorded under another cost profile of {trace.header['pipeline']!r} (its operators slept by earlier costs)"
    if [list(b) for b in trace.blocks] != [list(b) for b in blocks]:
        return f"recorded on another stream (blocks {trace.blocks}, today {blocks})"
    if trace.header.get("start_config") != start_config:
        return f"recorded from another starting configuration ({trace.header.get('start_config')!r}, today {start_config!r})"
    return ""


@dataclass(frozen=True)
class TraceReference:
    """What a live trace ran, rebuilt for the simulator: the profile, the stream (``closed_loop_workload.Workload``),
    the starting configuration, the cluster, the policy (built for a spec) and ``stale``."""

    label: str                   # "documents/ds2", "cpu-only/trident": the compared workload
    policy: str                  # "static" (no policy) or a policy name
    profile: PipelineProfile
    workload: Workload
    start: StaticConfig
    cluster: ClusterSpec
    make_policy: Callable[[PipelineSpec], Any]
    stale: str                   # why it is not a run of today's stream or start ("" when it is)

    def spec(self, name: str) -> PipelineSpec:
        return self.workload.spec(self.profile, self.start, name)


def reference(trace: Trace) -> TraceReference:
    """What ``trace`` ran. A closed-loop trace (``docs-ds2``, ...) is rebuilt as ``trace_workload`` says; a
    ``closed-loop-suite`` trace (header ``suite_workload``, e.g. ``cpu-only-trident``) from its suite workload's
    stream (``suite_workloads.suite_workloads``: its blocks must be the header's), the configuration its replicas
    ran at the first poll (the header's ``start_config`` must name it), its header's cluster and the registry's
    policy on that cluster."""
    if "suite_workload" in trace.header:
        return _suite_reference(trace)
    from benchmarks.closed_loop_runs import make_system_policy

    bench, policy = trace_workload(trace.name)
    profile = PipelineProfile.load(bench.profile)
    workload, _ = workloads(False, bench)
    tuning = tune(profile, workload)
    cluster = ClusterSpec.single_node(tuning.cpus, tuning.gpus, gpu_memory_bytes=DEVICE_MEMORY)
    return TraceReference(f"{bench.profile}/{'static-avg' if policy == 'static' else policy}", policy, profile, workload,
                          tuning.static_avg, cluster, lambda spec: make_system_policy(policy, spec, tuning, workload),
                          stale_reason(trace, workload.blocks(), tuning.static_avg.label()))


def start_config(state: RunnerState) -> StaticConfig:
    """The configuration the replicas of ``state`` run: per operator its one config and replica count."""
    assignment = []
    for o in state.operators:
        configs = {r.config for r in o.replicas}
        if len(configs) != 1:
            raise ValueError(f"operator {o.name!r} runs {len(configs)} configs at the trace's first poll; a starting "
                             "configuration has exactly one per operator")
        assignment.append((o.name, configs.pop(), len(o.replicas)))
    return StaticConfig(tuple(assignment), 0.0)


def _suite_reference(trace: Trace) -> TraceReference:
    from benchmarks import suite_workloads
    from trident_flows.scheduler.policies import make_policy

    name, policy = str(trace.header["suite_workload"]), str(trace.header.get("policy", ""))
    suite = suite_workloads.suite_workloads(False, (name,))[0]
    profile = PipelineProfile.load(suite.profile)
    workload = suite.streams()[0]
    if abs(float(trace.header.get("time_scale", workload.time_scale)) - workload.time_scale) > 1e-9:
        workload = Workload(workload.variant, workload.regimes, workload.seed, float(trace.header["time_scale"]))
    start = start_config(trace.ticks[0].state)
    stale = stale_reason(trace, workload.blocks(), start.label())
    cpus, gpus = float(trace.header["cluster"]["cpus"]), int(trace.header["cluster"].get("gpus", 0))
    cluster = ClusterSpec.single_node(cpus, gpus, gpu_memory_bytes=DEVICE_MEMORY)
    return TraceReference(f"{name}/{policy}", policy, profile, workload, start, cluster,
                          lambda spec: None if policy == "static" else make_policy(policy, spec=spec, cluster=cluster), stale)


def _measured_and_modelled(trace: Trace, profile: PipelineProfile) -> list[tuple[float, float]]:
    scale = float(trace.header.get("time_scale", 1.0))
    pairs = []
    for s in trace.samples():
        modelled = profile.operator(s.operator).device(s.config.device).seconds(s.items_in, s.features) * scale
        if s.items_in and modelled >= _MIN_MODELLED_S:
            pairs.append((s.busy_s, modelled))
    return pairs


def overrun(trace: Trace, profile: PipelineProfile) -> float:
    """The median over the trace's batches of measured busy seconds / the cost model's seconds for that batch. The
    emulated operators sleep their modelled seconds, so a machine that starved the live runtime stretches every
    batch; ``OVERRUN_MAX`` is the limit for a reference."""
    ratios = [busy / modelled for busy, modelled in _measured_and_modelled(trace, profile)]
    return float(np.median(ratios)) if ratios else float("nan")


def total_stretch(trace: Trace, profile: PipelineProfile) -> float:
    """All the trace's batches' measured seconds / their modelled seconds (the few batches a busy machine stretched
    many times count here, not in ``overrun``'s median): the work the live run did beyond the model, which the
    simulator does not do."""
    pairs = _measured_and_modelled(trace, profile)
    modelled = sum(m for _, m in pairs)
    return sum(b for b, _ in pairs) / modelled if modelled > 0 else float("nan")


def live_figures(trace: Trace, gpus: int) -> dict[str, Any]:
    """Throughput, GPU busy, per-operator busy and reconfigurations of a live trace. Throughput = input items /
    (last output - first output) from the batches' end times (first output: the first batch of the last operator,
    or of a filter that dropped rows; last: the last batch); GPU busy = all GPU batches' busy seconds / (GPUs x that
    span); each operator's busy fraction over the run (``busy_fractions``, replica-seconds from the states polled
    every tick)."""
    samples = trace.samples()
    last_op = trace.operators[-1]
    first = min(s.end for s in samples if s.operator == last_op or s.items_out < s.items_in)
    last = max(s.end for s in samples)
    span = last - first
    gpu_busy = sum(s.busy_s for s in samples if s.config.device == GPU)  # all of them, as the simulator's device seconds
    seconds: dict[str, float] = {}
    for tick, after in zip(trace.ticks, trace.ticks[1:]):
        for o in tick.state.operators:
            seconds[o.name] = seconds.get(o.name, 0.0) + len(o.replicas) * (after.at - tick.at)
    return {"items_per_s": trace.summary["items_in"] / span, "accel_busy": gpu_busy / (gpus * span) if gpus else None,
            "busy": busy_fractions(samples, seconds), "reconfigurations": trace.summary["reconfigurations"], "span_s": span}


def busy_fractions(samples: Sequence[BatchSample], replica_seconds: Mapping[str, float]) -> dict[str, float]:
    """Per operator: busy seconds of its batches / its replica-seconds (every replica, starting, warm or draining,
    times seconds; live: from the states polled every tick, simulated: ``SimRunner.replica_seconds``). The final
    state's ``busy_fraction`` is not used: it averages only the replicas alive at the end, since each started, so
    it changes with which replica a policy happened to keep."""
    busy: dict[str, float] = {}
    for s in samples:
        busy[s.operator] = busy.get(s.operator, 0.0) + s.busy_s
    return {name: min(1.0, busy.get(name, 0.0) / sec) if sec > 0 else 0.0 for name, sec in replica_seconds.items()}


def live_moves(trace: Trace) -> list[tuple[float, Plan]]:
    """(seconds since streaming began, plan) of every plan the live policy returned, in order; streaming begins
    at the first batch's start."""
    origin = min(s.start for s in trace.samples())
    return [(d.at - origin, d.plan) for d in trace.decisions if d.plan is not None]


def start_groups(trace: Trace, profile: PipelineProfile) -> list[tuple[int, list[float]]]:
    """Per group of replicas first seen at the same poll: its size and each one's start beyond its constructor."""
    scale = float(trace.header.get("time_scale", 1.0))
    first_seen: dict[str, int] = {}
    overhead: dict[str, float] = {}
    for k, tick in enumerate(trace.ticks):
        for o in tick.state.operators:
            for r in o.replicas:
                first_seen.setdefault(r.replica_id, k)
                if r.warm and r.cold_start_s > 0:
                    overhead[r.replica_id] = r.cold_start_s - profile.operator(o.name).device(r.config.device).cold_start_s * scale
    groups: dict[int, list[float]] = {}
    for rid, k in first_seen.items():
        if rid in overhead:
            groups.setdefault(k, []).append(overhead[rid])
    return [(len(g), g) for _, g in sorted(groups.items())]


def start_overheads(trace: Trace, profile: PipelineProfile) -> list[float]:
    """Measured cold start (request to warm, ``ReplicaState.cold_start_s``) minus the constructor's modelled
    ``cold_start_s``, per replica started during the run (not one of the initial replicas): what starting a Ray
    actor costs in a rollout."""
    scale = float(trace.header.get("time_scale", 1.0))
    initial = {r.replica_id for o in trace.ticks[0].state.operators for r in o.replicas}
    measured: dict[tuple[str, str], float] = {}
    for tick in trace.ticks:
        for o in tick.state.operators:
            for r in o.replicas:
                if r.warm and r.cold_start_s > 0 and r.replica_id not in initial:
                    measured[(o.name, r.replica_id)] = r.cold_start_s - profile.operator(o.name).device(r.config.device).cold_start_s * scale
    return list(measured.values())
