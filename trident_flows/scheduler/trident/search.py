"""Config search of the Trident policy: the config spaces, the memory budget and one optimiser per (operator, regime).

Contract:
- ``space(name)`` is the operator's config space from the pipeline spec, its devices limited to those
  the cluster has (None: no spec, an operator the spec does not name, or no device left).
- ``budget()`` is the memory a replica may use per device (host memory per CPU of the largest node
  class, the smallest GPU's memory); ``limit(config)`` that budget less ``memory_safety_margin``.
- ``optimizer(name)`` is the operator's ``ConfigOptimizer`` for its current regime, made on first use
  and warm-started with what the operator's earlier optimisers measured; it raises ``ValueError``
  for an operator with no config space.
- ``tell(state, name, new)`` gives the operator's optimiser the workload features of its new samples
  and, every ``tell_every`` batches of a config, the measurement of the running replicas (canaries
  excluded: their verdict is told by the canaries part).
- ``memory_bound(name, config)``: one replica's peak memory upper bound (mean + k std of the model)
  at the worst workload the optimiser saw recently, else at the model's own; None when unknown.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import CPU, BatchSample, ClusterSpec, ConfigSpace, OpConfig, Outcome
from trident_flows.scheduler import canary as canary_protocol
from trident_flows.scheduler.constraint import MemoryBudget
from trident_flows.scheduler.model_values import NoModelError
from trident_flows.scheduler.optimize import ConfigOptimizer
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.operators import Operators
from trident_flows.scheduler.trident_settings import MemorySafetySettings, SearchSettings


class ConfigSearch:
    """Config spaces, memory budget and optimisers (see the module docstring)."""

    def __init__(self, settings: SearchSettings, memory_safety: MemorySafetySettings, ctx: Context, ops: Operators) -> None:
        self.settings = settings
        self.memory_safety = memory_safety
        self.ctx = ctx
        self.ops = ops

    def space(self, name: str) -> ConfigSpace | None:
        spec, cluster = self.ctx.spec, self.ctx.cluster
        if spec is None:
            return None
        try:
            space = spec.operator(name).space
        except (KeyError, ValueError):
            return None
        gpus = cluster.total_gpus if cluster is not None else 0
        devices = tuple(d for d in space.devices if d == CPU or gpus > 0)
        return replace(space, devices=devices) if devices else None

    def budget(self) -> MemoryBudget:
        cluster = self.ctx.cluster or ClusterSpec.single_node(16, 0)
        node = max(cluster.node_classes, key=lambda n: n.cpus)
        host = node.host_memory_bytes / max(1.0, node.cpus) if node.host_memory_bytes else 4 * 2**30
        gpu_nodes = [n for n in cluster.node_classes if n.gpus > 0]
        gpu = min(n.gpu_memory_bytes for n in gpu_nodes) if gpu_nodes else None
        return MemoryBudget(cpu_bytes=int(host), gpu_bytes=int(gpu) if gpu else None)

    def limit(self, config: OpConfig) -> float:
        return self.budget().limit(config.device, self.memory_safety.margin)

    def optimizer(self, name: str) -> ConfigOptimizer:
        op = self.ops[name]
        regime = op.detector.current
        if regime not in op.optimizers:
            space = self.space(name)
            if space is None:
                raise ValueError(f"operator {name!r}: no config space known (the policy needs the pipeline spec)")
            incumbent = self.ctx.spec.operator(name).config
            opt = ConfigOptimizer(space, self.budget(), operator=name, safety_margin=self.memory_safety.margin, k=self.memory_safety.k, seed=self.settings.seed,
                                  max_evals=None, incumbent=incumbent if incumbent.device in space.devices else None)
            previous = next((o for r, o in op.optimizers.items() if o is not None), None)
            if previous is not None:
                opt.warm_start(previous.observations)
            op.optimizers[regime] = opt
        return op.optimizers[regime]

    def tell(self, state: RunnerState, name: str, space: ConfigSpace, new: Sequence[BatchSample]) -> ConfigOptimizer:
        """Tell ``name``'s optimiser (whose config space is ``space``) what its running replicas measured; returns it."""
        op = self.ops[name]
        opt = self.optimizer(name)
        canary_ids = {r.replica_id for r in state.operator(name).active if r.canary}
        opt.observe_batches([(s.features, s.items_in) for s in new])
        for s in new:
            if s.outcome == Outcome.OK and s.replica_id not in canary_ids and s.config.device in space.devices:
                op.to_tell.setdefault(s.config, []).append(s)
        for config, batch in list(op.to_tell.items()):
            if len(batch) >= self.settings.tell_every:
                m = canary_protocol.measure(batch)
                if m.throughput > 0 and m.peak_memory > 0 and space.batch_size_min <= config.batch_size <= space.batch_size_max:
                    opt.tell(config, m.throughput, m.peak_memory, m.features, items=m.items)
                op.to_tell[config] = []
        return opt

    def memory_bound(self, name: str, config: OpConfig) -> float | None:
        op = self.ops[name]
        try:
            worst = self.optimizer(name).worst_features() if self.space(name) is not None else {}
        except ValueError:
            worst = {}
        try:
            return op.model.memory_upper(config, self.memory_safety.k, worst or None)
        except (NoModelError, ValueError):
            try:
                return op.model.memory_upper(config, self.memory_safety.k)
            except (NoModelError, ValueError):
                return None
