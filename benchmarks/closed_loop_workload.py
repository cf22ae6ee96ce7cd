"""The closed-loop benchmarks' cluster, input streams and starting configurations.

Contract:
- The emulated cluster every closed-loop run uses: one logical node of ``CPUS`` CPUs + ``GPUS``
  emulated GPUs of ``DEVICE_MEMORY`` each.
- ``Workload``: a seeded input stream (regime schedule, time scale, optional memory spikes) that
  yields its rows, its blocks and the emulated ``PipelineSpec`` of a static configuration.
- ``PIPELINES``: the emulated pipelines a closed-loop run can use (``BenchPipeline``);
  ``workloads(quick, pipeline)``: the regimes stream and its memory-spike variant.
- ``tune(profile, workload) -> Tuning``: static-avg, static-large and each regime's best static
  configuration (the oracle's); ``model_headroom``: what switching to those for free would gain over
  static-avg by the cost model. Nothing here starts Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trident_flows.core.types import GPU
from trident_flows.pipelines.emulated import emulated_pipeline, regime_plan, synthetic_rows
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.sim.static_search import StaticConfig, largest_batch, predict_throughput, search_static

CPUS, GPUS = 16, 2
DEVICE_MEMORY = 8 * 2**30
GPU_BATCHES = (8, 16, 32, 64, 128)
CPU_BATCH = 4
SPIKE_FACTOR = 5.0


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

    def spec(self, profile: PipelineProfile, config: StaticConfig, name: str, max_replicas: int | None = None) -> PipelineSpec:
        """The emulated pipeline started from ``config``; ``max_replicas``: each operator's replica cap (None: the default)."""
        return emulated_pipeline(profile, config.stages(max_replicas), name=name, items=self.items, regimes=self.regimes, seed=self.seed,
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
    """The regimes workload and its memory-spike variant (spikes: the middle 80% of the spike regime's first block at
    ``SPIKE_FACTOR`` x memory per item)."""
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
    """static-avg (cost-model search on the mean features of a seeded ``sample_fraction`` sample of the stream),
    static-large (the same replicas at the largest GPU batch that fits) and the best static configuration of each
    regime (the oracle's). The static search tries ``GPU_BATCHES`` on GPU and ``CPU_BATCH`` on CPU."""
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

