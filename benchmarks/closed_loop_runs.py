"""One run of one system on one closed-loop workload, and the repeated rounds over systems.

Contract:
- ``RunRecord``: what one run measured (throughput from first to last output, accelerator busy
  fraction, OOMs, items lost, reconfigurations, apply outcomes, tick timings, the policy's
  decisions (each plan with it, ``Plan.to_dict``, so a simulator can replay the run's moves), timelines);
  ``to_dict()`` for the results file.
- ``run_runtime`` (this runtime, with a policy in the control loop every ``TICK_S``),
  ``run_ray_data`` (plain Ray Data ``map_batches`` with actor pools) and ``run_xenna_record``
  (cosmos-xenna streaming with its autoscaler every ``XENNA_AUTOSCALE_S``) each run one spec on
  the emulated devices and fill a record; items lost are counted by ``lineage.items_lost``. As in
  ``trident-flows run`` and the simulator, ``run_runtime`` starts the runner where a policy with
  ``starting_spec`` says (Trident: in what its memory learned) and hands the finished run's state to
  a policy with ``finish`` (Trident writes its memory).
- ``make_system_policy(system, ...)``: the policy a named system runs (None for the static ones).
- ``run_one`` runs one system and records a failure in ``error`` instead of raising;
  ``run_matrix`` runs ``repeats`` rounds over systems, the order rotated each round.
Ray must be initialised by the caller.
"""

from __future__ import annotations

import logging
import shutil
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import ray

from benchmarks.closed_loop_workload import CPUS, DEVICE_MEMORY, Tuning, Workload
from benchmarks.lineage import items_lost, source_ids
from benchmarks.oracle_policy import OraclePolicy
from trident_flows.control.launch import start_runner, stop_runner
from trident_flows.control.loop import ControlLoop
from trident_flows.core.decision import Action
from trident_flows.core.state import RunnerSettings, RunnerState
from trident_flows.core.types import ClusterSpec
from trident_flows.runtime import devices
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.sink import read_ids
from trident_flows.runtime.spec import ID, PipelineSpec
from trident_flows.scheduler.policies import make_policy

TICK_S = 1.0
NAMESPACE = "closed-loop"
XENNA_AUTOSCALE_S = 5.0
XENNA_WINDOW_S = 10.0


@dataclass
class RunRecord:
    """One run of one system on one workload."""

    system: str
    variant: str
    repeat: int
    items: int
    wall_s: float | None = None          # submission to last output, cold starts included
    startup_s: float | None = None       # submission to first output
    items_per_s: float | None = None     # items / (last output - first output): the headline
    items_per_s_total: float | None = None  # items / wall_s
    accel_busy: float | None = None
    ooms: int | None = None
    items_lost: int | None = None
    lost_ids: list[str] = field(default_factory=list)
    dead_lettered: int | None = None
    reconfigurations: int | None = None  # changes that landed
    applies_refused: int | None = None   # applies the runner refused or left partly done
    refused_repeated: int | None = None  # refused plans issued again unchanged (must be 0)
    apply_outcomes: list[dict[str, Any]] = field(default_factory=list)  # every apply's outcome, in order
    tick_ms: list[float] = field(default_factory=list)
    tick_steps_ms: dict[str, float] = field(default_factory=dict)  # median milliseconds per tick step
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the policy's ticks that changed, refused, saw an event or verified; t: s since start
    timeline: list[tuple[float, int]] = field(default_factory=list)   # (seconds, items completed)
    tail: list[tuple[float, int]] = field(default_factory=list)       # (seconds, items taken by the last operator)
    replicas: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The record for the results file, with its poll series thinned: a live run polls every 0.2 s,
        and a 15-minute run's full series took 14 MB of indented JSON. Replica counts keep their change
        points (the step plot is unchanged); the item counts keep one point per second."""
        data = asdict(self)
        data["lost_ids"] = self.lost_ids[:20]
        data["timeline"], data["tail"] = _per_second(self.timeline), _per_second(self.tail)
        data["replicas"] = {name: _change_points(series) for name, series in self.replicas.items()}
        return data


def _per_second(series: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The last point of every second of ``series``, and its final point."""
    kept = [p for p, nxt in zip(series, series[1:]) if int(nxt[0]) != int(p[0])]
    return kept + list(series[-1:])


def _change_points(series: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """The first point, every point whose value differs from the one before, and the final point."""
    kept = [p for k, p in enumerate(series) if k == 0 or p[1] != series[k - 1][1]]
    return kept + ([series[-1]] if series and kept[-1] is not series[-1] else [])


def _finish(record: RunRecord, items: int, wall_s: float, first_s: float | None, busy_s: float, gpus: int) -> None:
    record.wall_s, record.startup_s = wall_s, first_s
    record.items_per_s_total = items / wall_s if wall_s > 0 else None
    record.items_per_s = items / (wall_s - first_s) if first_s is not None and wall_s > first_s else None
    record.accel_busy = busy_s / (gpus * (wall_s - first_s)) if gpus and first_s is not None and wall_s > first_s else None


def _ray_gpus() -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def _busy_s(handles: Sequence[Any]) -> float:
    """Kernel seconds run so far on these emulated devices, together."""
    return sum(float(i["busy_s"]) for i in ray.get([h.info.remote() for h in handles]))


def _device_busy_s(prefix: str, namespace: str | None) -> float:
    """``_busy_s`` of the devices a runner created under ``prefix`` (found by name)."""
    handles = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        for gpu in range(int(node.get("Resources", {}).get("GPU", 0))):
            try:
                handles.append(ray.get_actor(devices.device_name(prefix, node["NodeID"], gpu), namespace=namespace))
            except ValueError:
                continue
    return _busy_s(handles)


def make_system_policy(system: str, spec: PipelineSpec, tuning: Tuning, workload: Workload) -> Any:
    """The policy ``system`` runs in the control loop: None for static-avg and static-large (no loop),
    ``OraclePolicy`` for oracle, else the registry's policy on the benchmark's one node."""
    if system in ("static-avg", "static-large"):
        return None
    if system == "oracle":
        return OraclePolicy(workload.blocks(), tuning.per_regime, tuning.cpus, tuning.gpus)
    return make_policy(system, spec=spec, cluster=ClusterSpec.single_node(tuning.cpus, tuning.gpus, gpu_memory_bytes=DEVICE_MEMORY))


def run_runtime(system: str, spec: PipelineSpec, policy: Any, out: Path, record: RunRecord, poll_s: float = 0.2) -> RunRecord:
    """Run ``spec`` on this runtime (with ``policy`` in the control loop, if any) and fill ``record``."""
    name = f"cl-{system}-{uuid.uuid4().hex[:6]}"
    settings = RunnerSettings(device_memory_bytes=DEVICE_MEMORY)
    t0, t_wall0 = time.perf_counter(), time.time()
    starting = getattr(policy, "starting_spec", None)
    handle = start_runner(starting(spec) if starting is not None else spec, out, name=name, namespace=NAMESPACE, settings=settings)
    loop = ControlLoop(handle, policy, TICK_S).start() if policy is not None else None
    try:
        while True:
            summary = ray.get(handle.wait.remote(poll_s))
            state: RunnerState = ray.get(handle.state.remote())
            t = time.perf_counter() - t0
            record.timeline.append((round(t, 3), state.items_written + state.items_dead_lettered))
            record.tail.append((round(t, 3), state.operators[-1].items_in))
            for op in state.operators:
                record.replicas.setdefault(op.name, []).append((round(t, 3), len(op.active)))
            if summary["finished"]:
                break
        wall = time.perf_counter() - t0
        busy = _device_busy_s(f"{name}-device", NAMESPACE)
    finally:
        stop_runner(handle, loop)
    finish = getattr(policy, "finish", None)
    if finish is not None:
        finish(state)
    data_ids, dead_ids = read_ids(out)
    lost = items_lost((r[ID] for r in spec.source()), data_ids, dead_ids)
    # first output: the first poll that saw one, less half a poll interval (the end is exact: wait() returns at once)
    first = next((t - poll_s / 2 for t, n in record.timeline if n > 0), None)
    _finish(record, spec.items, wall, first, busy, _ray_gpus())
    record.ooms, record.reconfigurations = state.ooms, state.reconfigurations
    record.applies_refused = loop.applies_refused if loop is not None else 0
    record.refused_repeated = loop.refused_repeated if loop is not None else 0
    record.apply_outcomes = [o.to_dict() for o in loop.outcomes] if loop is not None else []
    record.items_lost, record.lost_ids, record.dead_lettered = len(lost), lost, len(source_ids(dead_ids))
    record.tick_ms = [float(r.timings_ms.get("total", 0.0)) for r in getattr(policy, "records", [])]
    steps = [r.timings_ms for r in getattr(policy, "records", [])]
    record.tick_steps_ms = {k: round(float(np.median([t.get(k, 0.0) for t in steps])), 2) for k in (steps[-1] if steps else {})}
    record.decisions = [{"t": round(r.at - t_wall0, 2), "action": r.decision.action.value, "reason": r.decision.reason[:400],
                         "events": [str(e) for e in r.events][:5], "predicted": round(r.decision.predicted_throughput, 3),
                         "measured": round(r.pipeline_throughput, 3), "verification": r.verification[:300],
                         **({"plan": r.decision.plan.to_dict()} if r.decision.plan is not None else {})}
                        for r in getattr(policy, "records", []) if r.decision.action != Action.NONE or r.events or r.verification]
    record.error = state.error
    return record


class _BoundOperator:
    """A Ray Data UDF: binds the benchmark's emulated devices, then runs the operator."""

    def __init__(self, *, operator: type, device_prefix: str, device_namespace: str | None, **params: Any) -> None:
        devices.bind(device_prefix, device_namespace)
        self.impl = operator(**params)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.impl(batch)


def run_ray_data(spec: PipelineSpec, record: RunRecord, autoscale: bool = True) -> RunRecord:
    """Plain Ray Data with actor-pool autoscaling on the same operators (see the module docstring);
    ``autoscale=False``: fixed-size pools of the spec's replicas (``ActorPoolStrategy(size=...)``)."""
    from ray.data import ActorPoolStrategy

    prefix = f"cl-rd-{uuid.uuid4().hex[:6]}"
    devs = devices.create_devices(prefix, None, DEVICE_MEMORY)
    try:
        rows = list(spec.source())
        # a CPU operator may grow into every CPU the GPU operators and one replica of each other CPU operator leave
        cpu_ops = [o for o in spec.operators if not o.config.gpus]
        cpu_max = int(ray.cluster_resources().get("CPU", CPUS)) - sum(o.config.cpus * o.replicas for o in spec.operators if o.config.gpus) - (len(cpu_ops) - 1)
        t0 = time.perf_counter()
        ds = ray.data.from_items(rows)
        for op in spec.operators:
            c = op.config
            max_size = _ray_gpus() if c.gpus else int(cpu_max)
            ds = ds.map_batches(_BoundOperator, batch_size=c.batch_size, batch_format="numpy", num_cpus=c.cpus, num_gpus=c.gpus or None,
                                fn_constructor_kwargs={"operator": op.cls, "device_prefix": prefix, "device_namespace": None,
                                                       "config": c, **dict(op.params)},
                                compute=(ActorPoolStrategy(min_size=1, max_size=max(max_size, op.replicas), initial_size=op.replicas)
                                         if autoscale else ActorPoolStrategy(size=op.replicas)))
        ids: list[str] = []
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            ids.extend(str(x) for x in batch[ID])
            record.timeline.append((round(time.perf_counter() - t0, 3), len(ids)))
        wall = time.perf_counter() - t0
        busy = _busy_s(devs)
    finally:
        for d in devs:
            ray.kill(d)
    lost = items_lost((r[ID] for r in rows), ids, ())
    _finish(record, spec.items, wall, record.timeline[0][0] if record.timeline else None, busy, _ray_gpus())
    record.items_lost, record.lost_ids = len(lost), lost
    return record


def run_xenna_record(spec: PipelineSpec, record: RunRecord) -> RunRecord:
    """cosmos-xenna streaming with its autoscaler (``xenna_adapter``) on the same operators."""
    from benchmarks.xenna_adapter import run_xenna

    prefix = f"cl-xn-{uuid.uuid4().hex[:6]}"
    devs = devices.create_devices(prefix, NAMESPACE, DEVICE_MEMORY)
    try:
        result = run_xenna(spec, device_prefix=prefix, device_namespace=NAMESPACE, autoscale_interval_s=XENNA_AUTOSCALE_S,
                           window_s=XENNA_WINDOW_S)
        busy = _busy_s(devs)
    finally:
        for d in devs:
            ray.kill(d)
    done = np.sort(np.asarray(result.done_at, dtype=float))
    record.timeline = [(round(float(t), 3), k + 1) for k, t in enumerate(done)][:: max(1, len(done) // 400)]
    lost = items_lost((r[ID] for r in spec.source()), result.ids, ())
    _finish(record, spec.items, result.wall_s, float(done[0]) if len(done) else None, busy, _ray_gpus())
    record.items_lost, record.lost_ids = len(lost), lost
    return record


def run_one(system: str, profile: PipelineProfile, workload: Workload, tuning: Tuning, repeat: int, work: Path) -> RunRecord:
    """One run of ``system``; a failure is recorded in ``error`` (and its figures stay None)."""
    record = RunRecord(system, workload.variant, repeat, workload.items)
    config = tuning.static_large if system == "static-large" else tuning.static_avg
    spec = workload.spec(profile, config, f"closed-loop-{workload.variant}")
    out = work / f"{workload.variant}-{system}-{repeat}"
    try:
        if system == "ray-data":
            return run_ray_data(spec, record)
        if system == "xenna":
            return run_xenna_record(spec, record)
        return run_runtime(system, spec, make_system_policy(system, spec, tuning, workload), out, record)
    except Exception as exc:  # noqa: BLE001 - a system that cannot run is reported, not fatal for the others
        record.error = f"{type(exc).__name__}: {exc}"
        record.timeline, record.replicas = [], {}
        logging.getLogger(__name__).warning("closed-loop: %s failed: %s\n%s", system, exc, traceback.format_exc())
        return record
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_matrix(profile: PipelineProfile, workload: Workload, tuning: Tuning, systems: Sequence[str], repeats: int,
               work: Path, log: Any = None) -> list[RunRecord]:
    """``repeats`` rounds over ``systems``, the order rotated each round so load noise hits all alike."""
    records = []
    for rep in range(repeats):
        order = list(systems[rep % len(systems):]) + list(systems[:rep % len(systems)])
        for system in order:
            rec = run_one(system, profile, workload, tuning, rep, work)
            records.append(rec)
            if log:
                log(f"{workload.variant} rep {rep} {system}: {rec.items_per_s} items/s, ooms {rec.ooms}, lost {rec.items_lost}"
                    f"{', error ' + rec.error if rec.error else ''}")
    return records

