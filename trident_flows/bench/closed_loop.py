"""Benchmark ``closed-loop``: Trident against static, per-regime-oracle, DS2, threshold, plain Ray
Data autoscaling and cosmos-xenna, side by side on an emulated pipeline.

Contract of ``run(quick, pipeline="documents") -> BenchResult`` (``closed_loop_video`` runs
``pipeline="video"`` as the benchmark ``closed-loop-video``):
- Workload (``PIPELINES``): the emulated document pipeline (parse -> ocr -> langid -> quality ->
  dedup -> embed, cost models from the committed ``profiles/documents.json``; schedule short
  born-digital -> long reports -> scans -> short) or the emulated video pipeline (decode ->
  scenes -> motion -> dedup_frames -> text_detect -> safety -> embed from ``profiles/video.json``;
  small -> hd -> long -> small), on one logical node of 16 CPUs + 2 emulated GPUs
  (``DEVICE_MEMORY`` each), fed a seeded stream (``Workload``). Variant ``spikes``: the same
  stream with the middle 80% of the spike regime's first block at 5x memory per item
  (``memory_spikes``).
- Systems, each on the same items and seed, interleaved round-robin within each repeat:
  ``static-avg`` (``static_search.search_static`` on the mean features of a random 10% sample
  of the stream: the cost model's prediction, not a trial run), ``static-large`` (the same
  replicas, GPU operators at the largest batch that fits the device for the mean item of every regime
  the profile knows: the hand-tuned "max batch size"), ``oracle`` (knows the schedule: each
  operator switches to its regime's best static configuration from the same search when the
  block reaches it, ``OraclePolicy``), ``ds2``,
  ``threshold``, ``trident`` (the policy registry, the runtime's control loop every
  ``TICK_S``, starting from static-avg), ``ray-data`` (``map_batches`` chain with
  ``ActorPoolStrategy(min_size=1, max_size, initial_size=static-avg replicas)``) and ``xenna``
  (``xenna_adapter``, streaming, its autoscaler). Throughput = input items / (last output -
  first output): the initial cold start (which differs by system and by this machine's load)
  is left out, the cold starts of reconfigurations are in.
- Per run: throughput, accelerator busy fraction (emulated kernel seconds / (GPUs x wall)),
  OOMs, items lost (``items_lost``: input ids - output ids - dead-letter ids), reconfigurations,
  controller milliseconds per tick and per tick step, and the ticks that acted, verified a rollout or saw a regime
  change with their reasons (policies that keep ``records``). Medians over repeats.
- Summary: ``speedup_vs_static_avg``, ``speedup_vs_ray_data``, ``speedup_vs_xenna``,
  ``ratio_to_oracle`` (trident's median throughput over the other's, regimes variant),
  ``trident_ooms`` and ``trident_items_lost`` (all trident runs, both variants), ``tick_ms_p95``,
  ``applies_refused`` (trident's applies the runner refused or left partly done, both variants;
  every apply's outcome is in ``raw.runs[].apply_outcomes``), ``refused_repeated`` (refused
  plans issued again unchanged: must be 0),
  and ``oracle_headroom_model`` (``model_headroom``: what switching to each regime's best static
  config for free would gain over static-avg by the cost model: the ceiling the workload leaves).
  A system that could not run has ``None`` figures and its error in ``raw``.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import tempfile
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import ray

from trident_flows.bench.report import BenchResult, Target
from trident_flows.bench.static_search import StaticConfig, largest_batch, predict_throughput, search_static
from trident_flows.pipelines.emulated import emulated_pipeline, regime_plan, synthetic_rows
from trident_flows.runtime import devices
from trident_flows.control.loop import ControlLoop
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.control.launch import start_runner, stop_runner
from trident_flows.runtime.sink import read_ids
from trident_flows.runtime.spec import ID, PipelineSpec
from trident_flows.core.state import RunnerSettings, RunnerState
from trident_flows.scheduler.decision_log import Action
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.replicas import held
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.core.types import GPU, BatchSample, ClusterSpec, OpConfig, OperatorPlan, Plan, ReplicaGroup

CPUS, GPUS = 16, 2
DEVICE_MEMORY = 8 * 2**30
GPU_BATCHES = (8, 16, 32, 64, 128)
CPU_BATCH = 4
SPIKE_FACTOR = 5.0
TICK_S = 1.0
NAMESPACE = "closed-loop"
XENNA_AUTOSCALE_S = 5.0
XENNA_WINDOW_S = 10.0
OURS = ("static-avg", "static-large", "oracle", "ds2", "threshold", "trident")
SYSTEMS = OURS + ("ray-data", "xenna")
SPIKE_SYSTEMS = ("static-avg", "static-large", "trident")


# ---------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class Workload:
    """A seeded input stream: regime schedule, time scale, optional memory spikes."""

    variant: str
    regimes: str
    seed: int
    time_scale: float
    memory_spikes: tuple[tuple[int, int, float], ...] = ()

    @property
    def items(self) -> int:
        return sum(c for _, c in regime_plan({}, None, self.regimes))

    def blocks(self) -> list[tuple[str, int, int]]:
        """(regime, first item, end item) of each block of the schedule."""
        out, start = [], 0
        for regime, count in regime_plan({}, None, self.regimes):
            out.append((regime, start, start + count))
            start += count
        return out

    def rows(self, profile: PipelineProfile) -> list[dict[str, Any]]:
        return list(synthetic_rows(profile.workloads, self.items, self.regimes, self.seed, memory_spikes=self.memory_spikes))

    def spec(self, profile: PipelineProfile, config: StaticConfig, name: str) -> PipelineSpec:
        return emulated_pipeline(profile, config.stages(), name=name, items=self.items, regimes=self.regimes, seed=self.seed,
                                 time_scale=self.time_scale, memory_spikes=self.memory_spikes)


@dataclass(frozen=True)
class BenchPipeline:
    """Which emulated pipeline a closed-loop run uses: its profile, its regime schedule (full and
    quick), the time scale, and the regime whose middle 80% gets the memory spikes."""

    profile: str
    label: str
    regimes: str
    quick_regimes: str
    time_scale: float
    quick_time_scale: float
    spike_regime: str
    colors: Mapping[str, str]


# Counts chosen so each block lasts about as long as the others (10-20 s) under static-avg at time scale 1:
# a block has to outlast detection (a few batches), a tick and a cold start for any adaptation to pay.
PIPELINES: dict[str, BenchPipeline] = {
    "documents": BenchPipeline("documents", "emulated document pipeline (parse, OCR, langid, quality, dedup, embed)",
                               "short:600,long:60,scans:40,short:600", "short:240,long:24,scans:16,short:240", 1.0, 0.25, "long",
                               {"short": "#dbe9f6", "long": "#fde4c8", "scans": "#e0f0d9"}),
    "video": BenchPipeline("video", "emulated video pipeline (decode, scenes, motion, dedup_frames, text_detect, safety, embed)",
                           "small:150,hd:150,long:30,small:150", "small:60,hd:60,long:12,small:60", 1.0, 0.25, "long",
                           {"small": "#dbe9f6", "long": "#fde4c8", "hd": "#e0f0d9"}),
}


def workloads(quick: bool, pipeline: BenchPipeline = PIPELINES["documents"]) -> tuple[Workload, Workload]:
    """The regimes workload and its memory-spike variant (spikes: the middle 80% of the spike regime's first block)."""
    regimes = pipeline.quick_regimes if quick else pipeline.regimes
    scale = pipeline.quick_time_scale if quick else pipeline.time_scale
    base = Workload("regimes", regimes, seed=11, time_scale=scale)
    _, start, end = next(b for b in base.blocks() if b[0] == pipeline.spike_regime)
    tenth = (end - start) // 10
    return base, Workload("spikes", regimes, seed=11, time_scale=scale, memory_spikes=((start + tenth, 8 * tenth, SPIKE_FACTOR),))


def mean_features(rows: Sequence[Mapping[str, Any]], names: Iterable[str]) -> dict[str, float]:
    return {f: float(np.mean([float(r.get(f, 0.0)) for r in rows])) for f in names}


@dataclass(frozen=True)
class Tuning:
    """The static configurations every system starts from, and how they were found."""

    static_avg: StaticConfig
    static_large: StaticConfig
    per_regime: Mapping[str, StaticConfig]
    sample_items: int
    sample_features: Mapping[str, float]
    large_batch: int
    cpus: int = CPUS
    gpus: int = GPUS


def tune(profile: PipelineProfile, workload: Workload, sample_fraction: float = 0.1, cpus: int = CPUS, gpus: int = GPUS) -> Tuning:
    """static-avg, static-large and the oracle's per-regime configs (see the module docstring)."""
    rows = workload.rows(profile)
    rng = np.random.default_rng(workload.seed + 1)
    sample = [rows[i] for i in sorted(rng.choice(len(rows), max(1, int(len(rows) * sample_fraction)), replace=False))]
    names = sorted({f for m in profile.workloads.values() for f in m})
    features = mean_features(sample, names)
    kw = dict(cpus=cpus, gpus=gpus, device_memory_bytes=DEVICE_MEMORY, gpu_batches=GPU_BATCHES, cpu_batch=CPU_BATCH)
    avg = search_static(profile, features, **kw)
    per_regime = {r: search_static(profile, mean_features([x for x in rows if x["regime"] == r], names), **kw)
                  for r in dict.fromkeys(b[0] for b in workload.blocks())}
    # the hand-tuned "max batch size": the largest batch that fits the mean item of every kind of input the profile knows
    gpu_ops = [n for n, c, _ in avg.assignment if c.device == GPU]
    large = min((largest_batch(profile, n, means, DEVICE_MEMORY, GPU_BATCHES) for n in gpu_ops for means in profile.workloads.values()),
                default=max(GPU_BATCHES))
    assignment = tuple((n, c.with_changes(batch_size=large) if c.device == GPU else c, r) for n, c, r in avg.assignment)
    return Tuning(avg, StaticConfig(assignment, avg.predicted_items_per_s), per_regime, len(sample), features, large, cpus, gpus)


def model_headroom(profile: PipelineProfile, workload: Workload, tuning: Tuning) -> dict[str, Any]:
    """What any adaptive scheduler could gain on this stream, by the cost model the emulator runs:
    the stream's predicted throughput (items / sum over blocks of block items / predicted items/s)
    of static-avg and of the per-regime configs switched for free at every boundary. Their ratio
    bounds a scheduler's speed-up over static-avg within the searched space (whole-GPU replicas,
    one config per operator), before any cold start."""
    rows = workload.rows(profile)
    names = sorted({f for m in profile.workloads.values() for f in m})
    blocks, t_avg, t_oracle = [], 0.0, 0.0
    for regime, start, end in workload.blocks():
        features = mean_features(rows[start:end], names)
        avg = predict_throughput(profile, tuning.static_avg.as_dict(), features)
        best = predict_throughput(profile, tuning.per_regime[regime].as_dict(), features)
        blocks.append({"regime": regime, "items": end - start, "static_avg_items_per_s": avg, "oracle_items_per_s": best})
        t_avg += (end - start) / avg
        t_oracle += (end - start) / best
    return {"static_avg_items_per_s": workload.items / t_avg, "oracle_items_per_s": workload.items / t_oracle,
            "ratio": t_avg / t_oracle, "blocks": blocks}


def source_ids(ids: Iterable[str]) -> set[str]:
    """Input ids of output rows: an emulated split names a child ``{input id}/{k}``."""
    return {str(x).split("/", 1)[0] for x in ids}


def items_lost(input_ids: Iterable[str], output_ids: Iterable[str], dead_ids: Iterable[str]) -> list[str]:
    """Input ids that are neither in the output nor in the dead-letter table (by input id), sorted."""
    return sorted(set(map(str, input_ids)) - source_ids(output_ids) - source_ids(dead_ids))


# ---------------------------------------------------------------------------- the oracle
class OraclePolicy:
    """Knows the regime schedule: every operator runs the best static configuration of the regime
    its own input is in. An operator's position in the input stream comes from the runner's
    counters: the head's items taken, then for each later operator the share of the rows
    delivered to it that it has taken, applied to the position of the operator before it (so a
    downstream operator switches when the new block reaches it, not when it enters the pipeline).
    A mix of configurations that does not fit the cluster waits: only the operators whose new
    configuration holds no more than the current one switch until the rest fit."""

    name = "oracle"

    def __init__(self, blocks: Sequence[tuple[str, int, int]], configs: Mapping[str, StaticConfig], cpus: float, gpus: float) -> None:
        self.blocks = list(blocks)
        self.configs = {r: c.as_dict() for r, c in configs.items()}
        self.labels = {r: c.label() for r, c in configs.items()}
        self.predicted = {r: c.predicted_items_per_s for r, c in configs.items()}
        self.cpus, self.gpus = cpus, gpus

    def regime_at(self, item: float) -> str:
        for regime, start, end in self.blocks:
            if start <= item < end:
                return regime
        return self.blocks[-1][0]

    @staticmethod
    def positions(state: RunnerState) -> dict[str, float]:
        """Each operator's estimated position (input items) in the stream (``throughput_measure.stream_positions``)."""
        return stream_positions(state)

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None:
        positions = self.positions(state)
        current = {op.name: op.configs() for op in state.operators}
        target: dict[str, tuple[str, OpConfig, int]] = {}
        for op in state.operators:
            regime = self.regime_at(positions[op.name])
            config, replicas = self.configs[regime][op.name]
            target[op.name] = (regime, config, replicas)
        changing = [n for n, (_, c, r) in target.items() if current[n] != {c: r}]
        if not changing:
            return None
        final = {n: ({c: r} if n in changing else current[n]) for n, (_, c, r) in target.items()}
        cpus = sum(held(g)[0] for g in final.values())
        gpus = sum(held(g)[1] for g in final.values())
        if cpus > self.cpus + 1e-9 or gpus > self.gpus + 1e-9:
            changing = [n for n in changing if all(a <= b + 1e-9 for a, b in zip(held(final[n]), held(current[n])))]
            if not changing:
                return None
        ops = []
        for n in changing:
            regime, config, replicas = target[n]
            ops.append(OperatorPlan(n, (ReplicaGroup(config, replicas),),
                                    f"oracle: {n} is at input item ~{positions[n]:.0f}, regime {regime!r}: its best static config "
                                    f"{self.labels[regime]}"))
        head_regime = target[state.operators[0].name][0]
        return Plan(tuple(ops), self.predicted[head_regime], "; ".join(o.reason for o in ops))


# ---------------------------------------------------------------------------- one run
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
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the policy's ticks that changed, refused, saw an event or verified
    timeline: list[tuple[float, int]] = field(default_factory=list)   # (seconds, items completed)
    tail: list[tuple[float, int]] = field(default_factory=list)       # (seconds, items taken by the last operator)
    replicas: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lost_ids"] = self.lost_ids[:20]
        return data


def _finish(record: RunRecord, items: int, wall_s: float, first_s: float | None, busy_s: float, gpus: int) -> None:
    record.wall_s, record.startup_s = wall_s, first_s
    record.items_per_s_total = items / wall_s if wall_s > 0 else None
    record.items_per_s = items / (wall_s - first_s) if first_s is not None and wall_s > first_s else None
    record.accel_busy = busy_s / (gpus * (wall_s - first_s)) if first_s is not None and wall_s > first_s else None


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


def _make_policy(system: str, spec: PipelineSpec, tuning: Tuning, workload: Workload) -> Any:
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
    handle = start_runner(spec, out, name=name, namespace=NAMESPACE, settings=settings)
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
    record.decisions = [{"t": round(r.at - t_wall0, 2), "action": Action(r.action).value, "reason": r.reason[:400], "events": [str(e) for e in r.events][:5],
                         "predicted": round(r.predicted_throughput, 3), "measured": round(r.pipeline_throughput, 3), "verification": r.verification[:300]}
                        for r in getattr(policy, "records", []) if r.action != Action.NONE or r.events or r.verification]
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
    from trident_flows.bench.xenna_adapter import run_xenna

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
        return run_runtime(system, spec, _make_policy(system, spec, tuning, workload), out, record)
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


# ---------------------------------------------------------------------------- summary and figure
def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def per_system(records: Sequence[RunRecord]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for system in dict.fromkeys(r.system for r in records):
        rs = [r for r in records if r.system == system]
        ok = [r for r in rs if not r.error and r.items_per_s is not None]
        out[system] = {
            "runs": len(rs), "ok_runs": len(ok),
            "items_per_s_median": _median(r.items_per_s for r in ok),
            "items_per_s": [r.items_per_s for r in rs],
            "accel_busy_median": _median(r.accel_busy for r in ok),
            "ooms": None if any(r.ooms is None for r in ok) or not ok else sum(r.ooms for r in ok),
            "items_lost": None if not ok else sum(r.items_lost or 0 for r in ok),
            "reconfigurations_median": _median(r.reconfigurations for r in ok),
            "applies_refused": sum(r.applies_refused or 0 for r in ok),
            "refused_repeated": sum(r.refused_repeated or 0 for r in ok),
            "errors": sorted({r.error for r in rs if r.error}),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(main: Sequence[RunRecord], spikes: Sequence[RunRecord]) -> dict[str, Any]:
    stats = per_system(main)
    tp = {s: v["items_per_s_median"] for s, v in stats.items()}
    trident = [r for r in (*main, *spikes) if r.system == "trident" and not r.error]
    ticks = [t for r in trident for t in r.tick_ms]
    return {
        "speedup_vs_static_avg": _ratio(tp.get("trident"), tp.get("static-avg")),
        "speedup_vs_ray_data": _ratio(tp.get("trident"), tp.get("ray-data")),
        "speedup_vs_xenna": _ratio(tp.get("trident"), tp.get("xenna")),
        "ratio_to_oracle": _ratio(tp.get("trident"), tp.get("oracle")),
        "trident_ooms": sum(r.ooms or 0 for r in trident) if trident else None,
        "trident_items_lost": sum(r.items_lost or 0 for r in trident) if trident else None,
        "tick_ms_p95": float(np.percentile(ticks, 95)) if ticks else None,
        "applies_refused": sum(r.applies_refused or 0 for r in trident) if trident else None,
        "refused_repeated": sum(r.refused_repeated or 0 for r in trident) if trident else None,
    }


def _median_run(records: Sequence[RunRecord], system: str) -> RunRecord | None:
    ok = sorted((r for r in records if r.system == system and not r.error and r.timeline), key=lambda r: r.items_per_s or 0)
    return ok[len(ok) // 2] if ok else None


def _rate(timeline: Sequence[tuple[float, int]], bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    if len(timeline) < 2:
        return np.array([]), np.array([])
    t = np.array([p[0] for p in timeline])
    n = np.array([p[1] for p in timeline], dtype=float)
    edges = np.arange(0.0, t[-1] + bin_s, bin_s)
    done = np.interp(edges, np.concatenate([[0.0], t]), np.concatenate([[0.0], n]))
    return edges[1:] - bin_s / 2, np.diff(done) / bin_s


def _since_first_output(run: RunRecord) -> list[tuple[float, int]]:
    """The run's timeline with time counted from its first output (cold starts differ between systems)."""
    t0 = run.startup_s or 0.0
    return [(t - t0, n) for t, n in run.timeline if t >= t0]


def _regime_spans(run: RunRecord, blocks: Sequence[tuple[str, int, int]], reach: float) -> list[tuple[str, float, float]]:
    """About when the run's last operator worked on each block: its items taken / ``reach`` (the share of
    input items that get past the upstream filters) read as a position in the input stream."""
    t0 = run.startup_s or 0.0
    t = np.array([p[0] - t0 for p in run.tail])
    n = np.maximum.accumulate(np.array([p[1] for p in run.tail], dtype=float)) / reach
    return [(r, float(np.interp(s, n, t)), float(np.interp(e, n, t))) for r, s, e in blocks]


def figure(main: Sequence[RunRecord], spikes: Sequence[RunRecord], workload: Workload, summary: Mapping[str, Any],
           reach: float = 1.0, colors: Mapping[str, str] | None = None, title: str = "") -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5))
    bin_s = 1.0
    trident = _median_run(main, "trident")
    for ax, records, title in ((axes[0][0], main, "regimes"), (axes[1][0], spikes, "memory spikes (5x per item, inside the long block)")):
        ref = _median_run(records, "trident")
        if ref is not None and ref.tail:
            for regime, a, b in _regime_spans(ref, workload.blocks(), reach):
                ax.axvspan(a, b, color=(colors or {}).get(regime, "#eeeeee"), alpha=0.8, lw=0)
                ax.text((a + b) / 2, 1.0, regime, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8)
        for system in dict.fromkeys(r.system for r in records):
            run = _median_run(records, system)
            if run is None:
                continue
            x, y = _rate(_since_first_output(run), bin_s)
            extra = f", {run.ooms} OOMs" if run.ooms else ""
            ax.plot(x, y, lw=2.2 if system == "trident" else 1.2, label=f"{system} ({run.items_per_s:.1f}/s{extra})")
        ax.set_title(f"{title}: completed items/s ({bin_s:g} s bins, median repeat);\nshaded: regime at trident's last operator (approx.)",
                     fontsize=9)
        ax.set_xlabel("seconds since the run's first output")
        ax.set_ylabel("items/s")
        ax.set_yscale("symlog", linthresh=5)
        ax.legend(fontsize=7, ncol=2)
    ax = axes[0][1]
    if trident is not None:
        t0 = trident.startup_s or 0.0
        for op, series in trident.replicas.items():
            ax.step([p[0] - t0 for p in series], [p[1] for p in series], where="post", label=op)
        ax.set_title("trident: replicas per operator (runner state, median repeat)", fontsize=9)
        ax.set_xlabel("seconds since the run's first output (negative: cold start)")
        ax.set_ylabel("active replicas")
        ax.legend(fontsize=7)
    ax = axes[1][1]
    stats = per_system(main)
    names = list(stats)
    vals = [stats[s]["items_per_s_median"] or 0.0 for s in names]
    bars = ax.bar(range(len(names)), vals, color=["C3" if s == "trident" else "C0" for s in names])
    for k, s in enumerate(names):
        label = "n/a" if stats[s]["items_per_s_median"] is None else f"{vals[k]:.1f}"
        ax.text(k, vals[k], label, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    ax.set_ylabel("items/s (median of repeats)")
    fmt = {k: ("n/a" if v is None else f"{v:.2f}x") for k, v in summary.items()}
    fmt.setdefault("oracle_headroom_model", "n/a")
    ax.set_title(f"{title}regimes: median throughput (first to last output). trident vs static-avg {fmt['speedup_vs_static_avg']}, "
                 f"Ray Data {fmt['speedup_vs_ray_data']},\nxenna {fmt['speedup_vs_xenna']}, oracle {fmt['ratio_to_oracle']}", fontsize=9)
    del bars
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------- entry point
def run(quick: bool = False, *, pipeline: str = "documents", systems: Sequence[str] = SYSTEMS,
        spike_systems: Sequence[str] = SPIKE_SYSTEMS, repeats: int | None = None, log: Any = print) -> BenchResult:
    """The benchmark on ``pipeline`` (a key of ``PIPELINES``; see the module docstring); ``quick``:
    a smaller stream at a quarter of the time scale, one repeat."""
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown closed-loop pipeline {pipeline!r}; choose one of {sorted(PIPELINES)}")
    bench = PIPELINES[pipeline]
    profile = PipelineProfile.load(bench.profile)
    main_wl, spike_wl = workloads(quick, bench)
    repeats = repeats if repeats is not None else (1 if quick else 2)
    tuning = tune(profile, main_wl)
    started = not ray.is_initialized()
    if started:
        # the dashboard serves Ray's state API, which xenna's monitor calls
        ray.init("local", num_cpus=CPUS, num_gpus=GPUS, include_dashboard="xenna" in systems, log_to_driver=False,
                 configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="trident-closed-loop-"))
    t_start = time.perf_counter()
    try:
        main = run_matrix(profile, main_wl, tuning, systems, repeats, work, log)
        spikes = run_matrix(profile, spike_wl, tuning, spike_systems, 1, work, log) if spike_systems else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if started:
            ray.shutdown()
    summary = summarise(main, spikes)
    headroom = model_headroom(profile, main_wl, tuning)
    summary["oracle_headroom_model"] = headroom["ratio"]
    targets = {"speedup_vs_static_avg": Target(">=", 1.8), "speedup_vs_ray_data": Target(">=", 1.3), "speedup_vs_xenna": Target(">=", 1.2),
               "ratio_to_oracle": Target(">=", 0.9), "trident_ooms": Target("==", 0), "trident_items_lost": Target("==", 0),
               "tick_ms_p95": Target("<=", TICK_S * 1000), "refused_repeated": Target("==", 0)}
    raw = {
        "workloads": {w.variant: {"regimes": w.regimes, "items": w.items, "seed": w.seed, "time_scale": w.time_scale,
                                  "memory_spikes": [list(s) for s in w.memory_spikes]} for w in (main_wl, spike_wl)},
        "cluster": {"cpus": CPUS, "gpus": GPUS, "device_memory_bytes": DEVICE_MEMORY, "tick_s": TICK_S, "cpu_batch": CPU_BATCH,
                    "gpu_batches": list(GPU_BATCHES)},
        "tuning": {"static_avg": tuning.static_avg.to_dict(), "static_large": tuning.static_large.to_dict(),
                   "per_regime": {r: c.to_dict() for r, c in tuning.per_regime.items()}, "sample_items": tuning.sample_items,
                   "sample_mean_features": dict(tuning.sample_features), "large_batch": tuning.large_batch,
                   "method": "cost-model prediction on the mean features of a seeded random 10% sample of the stream"},
        "pipeline": pipeline, "model_headroom": headroom, "repeats": repeats, "bench_seconds": time.perf_counter() - t_start,
        "per_system": per_system(main), "per_system_spikes": per_system(spikes),
        "runs": [r.to_dict() for r in (*main, *spikes)],
        "versions": {"ray": ray.__version__, "cosmos_xenna": _xenna_version()},
    }
    notes = _notes(bench, raw)
    # the last operator's items taken per input item: upstream filters (< 1) and splits (> 1)
    reach = float(np.prod([op.selectivity for op in profile.operators[:-1]]))
    name = "closed-loop" if pipeline == "documents" else f"closed-loop-{pipeline}"
    fig = figure(main, spikes, main_wl, summary, reach, bench.colors, f"{pipeline}: ")
    return BenchResult(name, summary, targets, raw, fig, notes)


def _xenna_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("cosmos-xenna")
    except Exception:  # noqa: BLE001 - not installed
        return None


def _notes(bench: BenchPipeline, raw: Mapping[str, Any]) -> str:
    errors = {s: v["errors"] for s, v in raw["per_system"].items() if v["errors"]}
    gpu_batches = {n: o["config"]["batch_size"] for n, o in raw["tuning"]["static_avg"]["operators"].items() if o["config"]["device"] == GPU}
    headroom = raw["model_headroom"]
    return (f"{bench.label[0].upper()}{bench.label[1:]}, cost models from the measured {bench.profile} profile (GPU entries derived "
            f"from CPU, see the profile), on one logical node of {CPUS} CPUs + {GPUS} emulated GPUs hosted by this machine's "
            f"cores; time scale {raw['workloads']['regimes']['time_scale']}. Throughput = input items / (last output - first "
            f"output): the initial cold start is excluded (raw: startup_s, items_per_s_total), reconfiguration cold starts are "
            f"not; median of {raw['repeats']} interleaved repeats. Static configs from the cost model on a 10% sample "
            f"(static-avg GPU batches: {gpu_batches or 'none'}; static-large: {raw['tuning']['large_batch']}). Model headroom: "
            f"the per-regime configs switched for free would reach {headroom['ratio']:.3f}x static-avg by the cost model "
            f"({headroom['oracle_items_per_s']:.2f} vs {headroom['static_avg_items_per_s']:.2f} items/s at time scale 1). "
            f"Ray Data: ActorPoolStrategy(min 1, max, initial = static-avg). xenna: streaming, autoscaler every "
            f"{XENNA_AUTOSCALE_S:g} s over a {XENNA_WINDOW_S:g} s window (its defaults, 180 s, never fire in a run this short). "
            f"Errors: {errors or 'none'}.")
