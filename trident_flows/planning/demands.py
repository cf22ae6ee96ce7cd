"""The placement MILP's inputs for a planned corpus: one ``OperatorDemand`` per operator.

Contract:
- ``operator_demands(profile, features, memory_features, max_gpu_memory)`` returns, in pipeline
  order, each operator's candidate configurations as ``PlacementOption``s: every device its
  cost model covers, at the batch sizes below, one whole CPU per replica and, on a GPU, one whole
  GPU (an emulated device runs one kernel at a time, so replicas sharing a GPU split its time and
  gain nothing; the placement would count them as independent). A replica's rate is
  ``batch / DeviceCost.seconds(batch)`` for a batch of items with the mean ``features`` (linear in
  replicas); its device memory is its predicted peak at ``memory_features`` (the worst regime),
  and a GPU batch whose peak exceeds ``max_gpu_memory`` is not offered. ``work_per_item`` is the
  share of input items that reach the operator (upstream selectivities).
- The option list depends only on the profile, the memory features and the GPU memory, so the
  demands built for different ``features`` (each regime alone) have the same options in the same
  order: a placement's ``(operator, option, class)`` counts mean the same replicas in all of them.
"""

from __future__ import annotations

from typing import Mapping

from trident_flows.core.types import CPU, OpConfig
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.placement.types import OperatorDemand, PlacementOption
from trident_flows.sim.static_search import reach

CPU_BATCHES = (4,)  # the emulated pipelines' starting CPU batch; larger batches on slow operators (OCR: ~5 s an item) leave replicas without work within a regime block
GPU_BATCHES = (8, 32, 64)  # the closed-loop benchmarks' GPU batch range


def _rate(profile: PipelineProfile, operator: str, config: OpConfig, features: Mapping[str, float]) -> float:
    b = config.batch_size
    seconds = profile.operator(operator).device(config.device).seconds(b, {f: v * b for f, v in features.items()})
    return b / seconds if seconds > 0 else 1e9


def operator_demands(profile: PipelineProfile, features: Mapping[str, float], memory_features: Mapping[str, float],
                     max_gpu_memory: int) -> list[OperatorDemand]:
    """One ``OperatorDemand`` per operator (see the module docstring)."""
    share = reach(profile)
    demands = []
    for op in profile.operators:
        options = []
        for device, cost in op.devices.items():
            if device == CPU:
                configs = [OpConfig.make(CPU, batch_size=b) for b in CPU_BATCHES]
            elif max_gpu_memory > 0:
                configs = [OpConfig.make(device, batch_size=b, gpus=1.0) for b in GPU_BATCHES]
            else:
                configs = []
            for config in configs:
                b = config.batch_size
                peak = cost.peak_bytes(b, {f: v * b for f, v in memory_features.items()})
                if device != CPU and peak > max_gpu_memory:
                    continue
                options.append(PlacementOption.from_rate(config, _rate(profile, op.name, config, features),
                                                         device_mem_bytes=0 if device == CPU else peak,
                                                         cold_start_s=cost.cold_start_s))
        if not options:
            raise ValueError(f"operator {op.name!r}: no configuration fits the catalogue's GPUs ({max_gpu_memory / 2**30:.3g} GiB) "
                             "and it has no CPU cost model; add a node class with more GPU memory")
        demands.append(OperatorDemand(op.name, share[op.name], tuple(options)))
    return demands
