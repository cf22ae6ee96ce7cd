"""How an emulated pipeline is laid out: its operators, its default regime mix, and a static
starting configuration sized from its measured cost model.

Contract:
- ``EmulatedLayout``: a pipeline's name, profile, operators in order, which may use a GPU, default
  regime shares and batch sizes.
- ``default_regimes(profile, n)`` splits ``n`` items over the profile's regimes by the shares.
- ``default_stages(profile, regimes, n, cpus, gpus)``: the static placement for one node: each
  GPU-capable operator one replica on an equal GPU share (at most one GPU; a CPU too), every CPU
  operator one replica, the CPUs left one by one to the operator with the most modelled seconds
  per input item per replica.
- ``build(...)`` follows the registry contract of ``trident_flows.pipelines``: ``input`` is refused
  and a missing profile raises ``FileNotFoundError`` naming the command that writes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from trident_flows.core.types import CPU, GPU, OpConfig
from trident_flows.pipelines.emulated import Stage, emulated_pipeline, regime_plan
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec


def mean_seconds_per_input_item(profile: PipelineProfile, device: str, name: str, regimes: str, n: int) -> float:
    """Modelled seconds one replica spends per *input* item of the stream (after upstream filters)."""
    blocks = regime_plan(profile.workloads, n, regimes)
    total = sum(c for _, c in blocks) or 1
    features: dict[str, float] = {}
    for regime, count in blocks:
        for f, mean in profile.workloads.get(regime, {}).items():
            features[f] = features.get(f, 0.0) + mean * count / total
    reach = 1.0
    for op in profile.operators:
        if op.name == name:
            break
        reach *= op.selectivity
    return reach * profile.operator(name).device(device).seconds(1, features)


@dataclass(frozen=True)
class EmulatedLayout:
    name: str
    profile: str
    operators: tuple[str, ...]
    gpu_operators: tuple[str, ...]
    default_shares: Mapping[str, int]
    batch_size: int
    gpu_batch_size: int

    def default_regimes(self, profile: PipelineProfile, n: int) -> str:
        known = list(profile.workloads) or ["default"]
        names = [r for r in self.default_shares if r in known] + [r for r in known if r not in self.default_shares]
        weights = [self.default_shares.get(r, 1) for r in names]
        counts = [n * w // sum(weights) for w in weights]
        counts[0] += n - sum(counts)
        return ",".join(f"{r}:{c}" for r, c in zip(names, counts) if c > 0)

    def default_stages(self, profile: PipelineProfile, regimes: str, n: int, cpus: int = 8, gpus: int = 1) -> list[Stage]:
        missing = [o for o in self.operators if o not in {op.name for op in profile.operators}]
        if missing:
            raise ValueError(f"profile {profile.name!r} lacks operators {missing}; re-run `trident-flows profile {self.profile}`")
        gpu_ops = [o for o in self.operators if o in self.gpu_operators and GPU in profile.operator(o).devices and gpus > 0]
        cpu_ops = [o for o in self.operators if o not in gpu_ops]
        replicas = {o: 1 for o in cpu_ops}
        load = {o: mean_seconds_per_input_item(profile, CPU, o, regimes, n) for o in cpu_ops}
        for _ in range(max(0, cpus - len(gpu_ops) - len(cpu_ops))):
            worst = max(cpu_ops, key=lambda o: load[o] / replicas[o])
            replicas[worst] += 1
        # a fractional replica must fit on one device (as Ray places it): the GPU operators share the devices in equal
        # parts that pack (3 operators on 2 GPUs get half a GPU each, not 2/3: the third 2/3 would fit on no device)
        share = 1.0 / math.ceil(len(gpu_ops) / gpus) if gpu_ops else 0.0
        stages = [Stage(o, OpConfig.make(CPU, batch_size=self.batch_size), replicas[o]) for o in cpu_ops]
        stages += [Stage(o, OpConfig.make(GPU, batch_size=self.gpu_batch_size, gpus=share), 1) for o in gpu_ops]
        return sorted(stages, key=lambda s: self.operators.index(s.operator))

    def build(self, *, input: Path | None = None, synth: int | None = None, seed: int = 0, regimes: str | None = None,
              work_dir: Path | None = None, profile: PipelineProfile | str | Path | None = None, time_scale: float = 1.0,
              **_: Any) -> PipelineSpec:
        if input is not None:
            raise ValueError(f"{self.name} generates its own workload stream: use --synth N (and --regimes), not --input")
        if not isinstance(profile, PipelineProfile):
            profile = PipelineProfile.load(profile or self.profile)
        n = synth if synth is not None else 1000
        regimes = regimes or self.default_regimes(profile, n)
        stages = self.default_stages(profile, regimes, n)
        return emulated_pipeline(profile, stages, name=self.name, items=n, regimes=regimes, seed=seed, time_scale=time_scale)
