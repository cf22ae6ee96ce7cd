"""Setting up a simulated run: the pipeline's starting placement on a cluster and its input stream.

Contract:
- ``initial_config(profile, cluster, features, ...)``: the static configuration a user would
  deploy (``static_search.search_static`` on one node of the class with the most GPUs, then CPUs,
  replicas times that class's node count; other classes start empty).
- ``schedule_counts(regimes, profile, config)`` turns duration blocks (``short:10m,long:90s``) into
  item counts at the rate ``config`` is predicted (or, with ``rates``, measured) to sustain on
  each regime; count blocks (``short:600``) stay.
- ``build(pipeline, cluster, regimes, items, seed, ...)`` returns ``(PipelineSpec, Stream,
  StaticConfig)`` for ``emulated-docs`` or ``emulated-video``: the spec starts from
  ``initial_config`` (``max_replicas`` up to the cluster's CPUs), the stream is
  ``Stream.generate`` over the schedule (``items=None``: without end) or, with ``trace``, the trace.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from trident_flows.core.types import ClusterSpec
from trident_flows.pipelines.emulated import Stage, emulated_pipeline, parse_regimes
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.sim.static_search import StaticConfig, predict_throughput, search_static
from trident_flows.sim.workload import Stream

PROFILES = {"emulated-docs": "documents", "emulated-video": "video"}
# candidate batch sizes of the starting configuration: the closed-loop benchmark's (GPU) and its CPU batch
GPU_BATCHES = (8, 16, 32, 64, 128)
CPU_BATCH = 4
_DURATION = re.compile(r"^([0-9.]+)(s|m|h)$")


def parse_duration(text: str) -> float:
    """``"4h"``, ``"30m"``, ``"90s"`` or plain seconds -> seconds."""
    m = _DURATION.match(text.strip())
    if m:
        return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"duration {text!r}: write seconds or e.g. 90s, 30m, 4h") from None


def mean_features(profile: PipelineProfile, regimes: Mapping[str, float]) -> dict[str, float]:
    """The mean item of a mix of regimes (weights: items)."""
    total = sum(regimes.values()) or 1.0
    out: dict[str, float] = {}
    for regime, weight in regimes.items():
        for f, mean in profile.workloads.get(regime, {}).items():
            out[f] = out.get(f, 0.0) + mean * weight / total
    return out


def initial_config(profile: PipelineProfile, cluster: ClusterSpec, features: Mapping[str, float]) -> StaticConfig:
    node = max(cluster.node_classes, key=lambda n: (n.gpus, n.cpus))
    one = search_static(profile, features, cpus=int(node.cpus), gpus=node.gpus, device_memory_bytes=node.gpu_memory_bytes or 1,
                        gpu_batches=GPU_BATCHES, cpu_batch=CPU_BATCH)
    return StaticConfig(tuple((n, c, r * node.count) for n, c, r in one.assignment), one.predicted_items_per_s * node.count)


def schedule_counts(regimes: str, profile: PipelineProfile, config: StaticConfig, rates: Mapping[str, float] | None = None) -> str:
    parts = []
    for part in filter(None, (p.strip() for p in regimes.split(","))):
        name, sep, amount = part.partition(":")
        m = _DURATION.match(amount.strip())
        if sep and m:
            rate = rates[name.strip()] if rates is not None else \
                predict_throughput(profile, config.as_dict(), mean_features(profile, {name.strip(): 1.0}))
            parts.append(f"{name.strip()}:{max(1, int(parse_duration(amount) * rate))}")
        else:
            parts.append(part)
    schedule = ",".join(parts)
    parse_regimes(schedule)  # refuse a malformed schedule here, naming it
    return schedule


def build(pipeline: str, cluster: ClusterSpec, *, regimes: str | None = None, items: int | None = None, seed: int = 0,
          trace: Path | None = None, config: StaticConfig | None = None) -> tuple[PipelineSpec, Stream, StaticConfig]:
    if pipeline not in PROFILES:
        raise ValueError(f"the simulator runs emulated pipelines: choose one of {sorted(PROFILES)}, not {pipeline!r}")
    profile = PipelineProfile.load(PROFILES[pipeline])
    regimes = regimes or ",".join(f"{r}:1" for r in profile.workloads)
    weights: dict[str, float] = {}
    for name, _sep, amount in (p.strip().partition(":") for p in regimes.split(",") if p.strip()):
        weights[name] = weights.get(name, 0.0) + (parse_duration(amount) if _DURATION.match(amount) else float(amount or 1))
    unknown = sorted(set(weights) - set(profile.workloads))
    if unknown:
        raise ValueError(f"unknown regime(s) {unknown}; the {pipeline} profile has {sorted(profile.workloads)}")
    config = config or initial_config(profile, cluster, mean_features(profile, weights))
    schedule = schedule_counts(regimes, profile, config)
    cap = int(cluster.total_cpus)
    stages = [Stage(n, c, r, max_replicas=max(cap, r)) for n, c, r in config.assignment]
    spec = emulated_pipeline(profile, stages, name=pipeline, items=items if items is not None else 0, regimes=schedule, seed=seed)
    features = sorted({f for m in profile.workloads.values() for f in m})
    stream = Stream.from_trace(trace, features) if trace else Stream.generate(profile.workloads, schedule, items, features, seed)
    return spec, stream, config
