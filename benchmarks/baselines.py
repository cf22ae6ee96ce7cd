"""The static configurations a user would really have, as named systems of the closed-loop benchmarks.

Contract:
- ``tune_baselines(profile, layout, rows, blocks, cpus=, gpus=, ...) -> Baselines`` finds, for one
  emulated pipeline on one stream, ``static-default`` (the pipeline's own default sizing for the
  cluster), ``static-first-n`` (the cost model's best static for the stream's first ``first_n`` items,
  as a careful user profiles before a run) and ``static-hindsight`` (the best single static
  configuration for the whole stream, with knowledge of the stream no user has).
- ``Baselines.start(system)`` is the configuration a system starts from: its own for the three static
  systems, ``static-default`` for every other system.
- ``DEFINITIONS`` defines every system of the suite in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from trident_flows.pipelines.emulated_layout import EmulatedLayout
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.static_search import StaticConfig, search_static, search_static_stream, stream_seconds

STATIC_DEFAULT, STATIC_FIRST_N, STATIC_HINDSIGHT = "static-default", "static-first-n", "static-hindsight"
STATIC_SYSTEMS = (STATIC_DEFAULT, STATIC_FIRST_N, STATIC_HINDSIGHT)

DEFINITIONS: dict[str, str] = {
    STATIC_DEFAULT: ("the pipeline's own default sizing for the node (one replica per operator, GPU operators on the GPUs, the spare "
                     "CPUs shared by the modelled cost of the pipeline's default regime mix): what a user who writes the pipeline runs"),
    STATIC_FIRST_N: ("the best static configuration by the cost model for the mean item of the stream's first N items, as a careful "
                     "user profiles before a run"),
    STATIC_HINDSIGHT: ("the static configuration with the shortest predicted duration of the whole stream, found with the cost model "
                       "and the stream's regime blocks: it uses knowledge no user has"),
    "trident": "this project's closed-loop policy in the runtime's control loop, starting from static-default",
    "ds2": ("DS2 (Kalavri et al., OSDI 2018) as its paper and reference implementation define it, run as a policy of this "
            "runtime from static-default: every 10 s, after a 20 s warm-up following each step, every operator's parallelism "
            "from its true rates over busy time, all in one step, taken only when the current parallelism sustains under "
            "1/1.2 of the highest rate the node fits"),
    "threshold": "Ray Data's utilisation-threshold autoscaling rule run as a policy of this runtime, starting from static-default",
    "ray-data-fixed": "plain Ray Data, map_batches with fixed-size actor pools of static-default's replicas",
    "ray-data-autoscaling": "plain Ray Data, map_batches with ActorPoolStrategy(min 1, max, initial = static-default's replicas)",
}


def mean_features(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, float]:
    return {f: float(np.mean([float(r.get(f, 0.0)) for r in rows])) if rows else 0.0 for f in names}


@dataclass(frozen=True)
class Baselines:
    """The three static configurations of one stream and how they were found."""

    configs: Mapping[str, StaticConfig]
    first_n: int
    predicted_stream_items_per_s: Mapping[str, float]  # each config's predicted items/s over the whole stream

    def start(self, system: str) -> StaticConfig:
        """The configuration ``system`` starts from: its own for the three static systems, ``static-default`` for every
        adaptive system and for Ray Data (``trident``, ``ds2``, ``threshold``, ``ray-data-fixed``,
        ``ray-data-autoscaling``), as a user would run them."""
        return self.configs.get(system, self.configs[STATIC_DEFAULT])

    def to_dict(self) -> dict[str, Any]:
        return {"first_n": self.first_n, "predicted_stream_items_per_s": dict(self.predicted_stream_items_per_s),
                "configs": {name: {"label": c.label(), **c.to_dict()} for name, c in self.configs.items()}}


def tune_baselines(profile: PipelineProfile, layout: EmulatedLayout, rows: Sequence[Mapping[str, Any]],
                   blocks: Sequence[tuple[str, int, int]], *, cpus: int, gpus: int, device_memory_bytes: int,
                   gpu_batches: Sequence[int], cpu_batch: int, first_n: int) -> Baselines:
    """``static-default``, ``static-first-n`` and ``static-hindsight`` for ``rows``:
    - ``static-default``: the pipeline's own default sizing (``EmulatedLayout.default_stages``: one replica per
      operator, GPU operators on the GPUs, the spare CPUs shared by the modelled cost of the pipeline's *default*
      regime mix, not the stream's), for the cluster's CPUs and GPUs;
    - ``static-first-n``: ``static_search.search_static`` on the mean features of the stream's first ``first_n`` items;
    - ``static-hindsight``: ``static_search.search_static_stream`` over the stream's blocks (the two configurations
      above among its candidates), found with the cost model."""
    if not 1 <= first_n <= len(rows):
        raise ValueError(f"static-first-n: first_n={first_n} must lie in 1..{len(rows)} (the stream's items)")
    names = sorted({f for m in profile.workloads.values() for f in m})
    stream = [(mean_features(rows[start:end], names), end - start) for _, start, end in blocks]
    default_stages = layout.default_stages(profile, layout.default_regimes(profile, len(rows)), len(rows), cpus=cpus, gpus=gpus)
    default = {s.operator: (s.config, s.replicas) for s in default_stages}
    total = sum(n for _, n in stream)
    first = search_static(profile, mean_features(rows[:first_n], names), cpus=cpus, gpus=gpus, device_memory_bytes=device_memory_bytes,
                          gpu_batches=gpu_batches, cpu_batch=cpu_batch)
    configs = {
        STATIC_DEFAULT: StaticConfig(tuple((s.operator, s.config, s.replicas) for s in default_stages),
                                     total / stream_seconds(profile, default, stream)),
        STATIC_FIRST_N: first,
        # the user's own configurations are candidates too: hindsight is never predicted slower than either
        STATIC_HINDSIGHT: search_static_stream(profile, stream, cpus=cpus, gpus=gpus, device_memory_bytes=device_memory_bytes,
                                               gpu_batches=gpu_batches, cpu_batch=cpu_batch, candidates=(default, first.as_dict())),
    }
    predicted = {name: total / stream_seconds(profile, c.as_dict(), stream) for name, c in configs.items()}
    return Baselines(configs, first_n, predicted)
