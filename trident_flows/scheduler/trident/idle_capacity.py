"""Idle capacity: CPUs and GPUs that no replica holds, given to operators with work waiting and no replica free.

Contract:
- ``observe(state)`` (every tick) keeps each operator's occupancy (``occupancy.classify``) and serving configs.
- ``plan(state) -> Plan | None``: the cluster's CPUs and GPUs that no replica holds (starting, serving,
  draining or canary; one CPU kept for a canary while ``keep_cpu`` says so) go to operators ``SATURATED``
  in every tick of the last ``idle_growth_s`` seconds with unchanged serving configs (work waiting, every
  serving replica holding a batch, nothing holding it back downstream; the first operator only when no other
  is: its queue is the source's read-ahead, full whatever the pipeline needs): one replica of the operator's main
  serving config (``replicas.main_config``) at a time, each to the operator with the most items queued per
  replica, while the free CPUs and GPUs, its ``max_replicas`` and the nodes' declared host memory
  (``memory_bound`` per replica, its ``memory_safety_margin`` kept free) hold. A config that is unsafe now
  (``MemorySafety.unsafe``) is not grown; a GPU config only where the GPUs pack device by device
  (``replicas.gpus_pack``). None when nothing is free or nothing waits.
- No replica is stopped or moved: the plan costs only the new replicas' cold starts and cannot slow
  another operator, so it needs no evidence, no pricing and no verification. It is an
  ``IDLE_CAPACITY`` rollout whose reason names each operator, its queue and the free resources.
  ``moves`` counts the replicas added.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from trident_flows.core.state import RunnerState
from trident_flows.core.types import CPU, ClusterSpec, OpConfig, OperatorPlan, Plan, PlanKind, Rationale, ReplicaGroup
from trident_flows.scheduler.occupancy import Occupancy, classify, serving_configs
from trident_flows.scheduler.replicas import canary_config, free_resources, gpus_pack, main_config, replica_limits
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident_settings import TridentSettings

HISTORY = 64  # ticks of occupancy kept


class IdleCapacity:
    """Grows saturated operators onto resources no replica holds (see the module docstring)."""

    def __init__(self, settings: TridentSettings, ctx: Context, safety: MemorySafety, *,
                 memory_bound: Callable[[str, OpConfig], float | None], keep_cpu: Callable[[RunnerState], bool]) -> None:
        self.settings = settings
        self.ctx = ctx
        self.safety = safety
        self.memory_bound = memory_bound
        self.keep_cpu = keep_cpu
        self._history: deque[tuple[float, dict[str, tuple[Occupancy, tuple]]]] = deque(maxlen=HISTORY)
        self.moves = 0

    def observe(self, state: RunnerState) -> None:
        self._history.append((state.wall_s, {op.name: (classify(op), serving_configs(op)) for op in state.operators}))

    def saturated(self, state: RunnerState) -> list[str]:
        """Operators saturated with unchanged serving configs in every tick of the last ``idle_growth_s`` seconds."""
        if self.settings.idle_growth_s is None or not self._history or state.wall_s - self._history[0][0] < self.settings.idle_growth_s:
            return []
        since = state.wall_s - self.settings.idle_growth_s
        window = [snap for at, snap in self._history if at >= since - 1e-9]
        out = []
        for op in state.operators:
            now = (classify(op), serving_configs(op))
            if now[0] is Occupancy.SATURATED and all(snap.get(op.name) == now for snap in window):
                out.append(op.name)
        return out

    def plan(self, state: RunnerState) -> Plan | None:
        if self.settings.idle_growth_s is None:
            return None
        cpus, gpus = free_resources(state)
        if self.keep_cpu(state):
            cpus -= 1.0
        if cpus < 1e-9 and gpus < 1e-9:
            return None
        saturated = self.saturated(state)
        if len(saturated) > 1 and state.operators[0].name in saturated:
            saturated.remove(state.operators[0].name)  # its queue is the source's read-ahead: a full one says nothing of need
        candidates: dict[str, OpConfig] = {}  # operator -> the config it grows by
        for name in saturated:
            config = main_config(state.operator(name), self.ctx.spec)
            if config is not None and self.safety.unsafe(name, config) is None:
                candidates[name] = config
        if not candidates:
            return None
        open_names = set(candidates)  # operators that may still grow: one leaves once its next replica does not fit
        cluster = self.ctx.planned_for(state)
        memory_left = self._host_memory_left(state, cluster)
        grown: dict[str, dict[OpConfig, int]] = {}
        queued = {op.name: op.queue_items for op in state.operators}
        while open_names:
            name = max(open_names, key=lambda n: (queued[n] / _replicas(state, n, grown), n))
            config = candidates[name]
            groups = dict(grown.get(name) or state.operator(name).configs(include_canary=False))
            groups[config] = groups.get(config, 0) + 1
            bound = (self.memory_bound(name, config) or 0.0) if config.device == CPU else 0.0
            fits = (config.cpus <= cpus + 1e-9 and config.gpus <= gpus + 1e-9
                    and sum(groups.values()) <= replica_limits(name, self.ctx.spec)[1]
                    and (memory_left is None or bound <= memory_left)
                    and (config.gpus == 0 or gpus_pack(state, cluster, {**grown, name: groups})))
            if not fits:
                open_names.remove(name)
                continue
            grown[name] = groups
            cpus -= config.cpus
            gpus -= config.gpus
            if memory_left is not None:
                memory_left -= bound
        if not grown:
            return None
        ops = []
        for name, groups in grown.items():
            op = state.operator(name)
            added = sum(groups.values()) - sum(op.configs(include_canary=False).values())
            ops.append(OperatorPlan(name, tuple(ReplicaGroup(c, n) for c, n in sorted(groups.items(), key=lambda g: g[0].label())),
                                    f"{name}: +{added} replica(s) of {candidates[name].label()}: "
                                    f"saturated for {self.settings.idle_growth_s:g} s with {op.queue_items} items queued",
                                    canary_config(op)))
            self.moves += added
        free = free_resources(state)
        reason = (f"idle capacity: {free[0]:g} CPU(s) and {free[1]:g} GPU(s) held by no replica go to operators with work waiting: "
                  + "; ".join(o.reason for o in ops))
        return Plan(tuple(ops), 0.0, reason, Rationale(PlanKind.IDLE_CAPACITY))

    def _host_memory_left(self, state: RunnerState, cluster: ClusterSpec) -> float | None:
        """Declared host memory minus the safety margin and every CPU replica's memory bound (None: none declared)."""
        total = sum(nc.host_memory_bytes * nc.count for nc in cluster.node_classes)
        if total <= 0:
            return None
        used = sum(self.memory_bound(op.name, r.config) or 0.0 for op in state.operators for r in op.replicas if r.config.device == CPU)
        return total * (1.0 - self.settings.memory_safety_margin) - used


def _replicas(state: RunnerState, name: str, grown: dict[str, dict[OpConfig, int]]) -> int:
    groups = grown.get(name) or state.operator(name).configs(include_canary=False)
    return max(1, sum(groups.values()))
