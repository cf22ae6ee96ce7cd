"""Idle capacity: CPUs and GPUs that no replica holds, or CPU replicas that sit mostly idle, given to operators
with work waiting and no replica free.

Contract:
- ``observe(state)`` (every tick) keeps each operator's occupancy, serving configs and busy replicas.
- ``spare(state) -> {operator: replicas}``: replicas of CPU-only operators never saturated over the
  lending window that can go while what stays serves twice today's pace.
- ``plan(state) -> Plan | None``: free CPUs and GPUs (one CPU kept for a canary while ``keep_cpu``
  says so: where the placement keeps one), then spare replicas, go one replica at a time to operators saturated throughout the
  last ``idle_growth_s`` (the first operator only when no other is), the one with most items queued
  per replica first, within ``max_replicas``, declared host memory and GPU packing; never an unsafe
  config. None when nothing is free or spare, or nothing waits.
- A plan that stops no replica is an ``IDLE_CAPACITY`` rollout (neither priced nor verified); one
  taking spare replicas a ``REBALANCE`` rollout, verified like a placement. ``moves`` counts replicas added.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from trident_flows.core.state import RunnerState
from trident_flows.core.types import CPU, ClusterSpec, OpConfig, OperatorPlan, Plan, PlanKind, Rationale
from trident_flows.scheduler.occupancy import Occupancy, classify, serving, serving_configs
from trident_flows.scheduler.replicas import canary_config, free_resources, gpus_pack, main_config, replica_groups, replica_limits
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident_settings import IdleCapacitySettings, MemorySafetySettings

HISTORY = 64  # ticks of occupancy kept
LEND_WINDOW = 2.0  # an operator lends replicas after LEND_WINDOW x idle_growth_s seconds never saturated
LEND_UTILIZATION = 0.5  # a lender keeps the replicas it needs at twice its measured pace


class IdleCapacity:
    """Grows saturated operators onto resources no replica holds (see the module docstring)."""

    def __init__(self, settings: IdleCapacitySettings, ctx: Context, safety: MemorySafety, *, memory_safety: MemorySafetySettings,
                 memory_bound: Callable[[str, OpConfig], float | None], keep_cpu: Callable[[RunnerState], bool]) -> None:
        self.settings = settings
        self.memory_safety = memory_safety
        self.ctx = ctx
        self.safety = safety
        self.memory_bound = memory_bound
        self.keep_cpu = keep_cpu
        self._history: deque[tuple[float, dict[str, _Seen]]] = deque(maxlen=HISTORY)
        self.moves = 0

    def observe(self, state: RunnerState) -> None:
        self._history.append((state.wall_s, {op.name: _Seen(classify(op), serving_configs(op), sum(1 for r in serving(op) if r.inflight > 0))
                                             for op in state.operators}))

    def _held_since(self, now: float, seconds: float) -> list[dict[str, _Seen]] | None:
        """The snapshots that say what held over the last ``seconds``: those taken in it and the last one before it (the
        state at its start; a tick after a long apply has none in it but that one); None when the history is shorter."""
        since = now - seconds - 1e-9
        before = [snap for at, snap in self._history if at < since]
        if not before:
            return None
        return [before[-1]] + [snap for at, snap in self._history if at >= since]

    def spare(self, state: RunnerState) -> dict[str, int]:
        """Replicas each mostly idle CPU-only operator can lend (see the module docstring)."""
        window = self._held_since(state.wall_s, LEND_WINDOW * self.settings.growth_s) if self.settings.growth_s else None
        if window is None:
            return {}
        out = {}
        for op in state.operators:
            configs = serving_configs(op)
            if not configs or any(c.gpus > 0 for c, _ in configs) or any(r.canary or r.draining for r in op.replicas):
                continue
            seen = [snap.get(op.name) for snap in window]
            if any(x is None or x.occupancy is Occupancy.SATURATED or x.configs != configs for x in seen):
                continue
            mean_busy = sum(x.busy for x in seen) / len(seen)
            keep = max(replica_limits(op.name, self.ctx.spec)[0], 1, math.ceil(mean_busy / LEND_UTILIZATION - 1e-9))
            held_now = sum(n for _, n in configs)
            if held_now > keep:
                out[op.name] = held_now - keep
        return out

    def saturated(self, state: RunnerState) -> list[str]:
        """Operators saturated with unchanged serving configs in every tick of the last ``idle_growth_s`` seconds."""
        window = self._held_since(state.wall_s, self.settings.growth_s) if self.settings.growth_s else None
        if window is None:
            return []
        out = []
        for op in state.operators:
            configs = serving_configs(op)
            seen = [snap.get(op.name) for snap in window]
            if classify(op) is Occupancy.SATURATED and all(x is not None and x.occupancy is Occupancy.SATURATED and x.configs == configs
                                                           for x in seen):
                out.append(op.name)
        return out

    def plan(self, state: RunnerState) -> Plan | None:
        if self.settings.growth_s is None:
            return None
        cpus, gpus = free_resources(state)
        if self.keep_cpu(state):
            cpus -= 1.0
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
        spare = {name: n for name, n in self.spare(state).items() if name not in candidates}
        if cpus < 1e-9 and gpus < 1e-9 and not spare:
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
            within_limit = sum(groups.values()) <= replica_limits(name, self.ctx.spec)[1]
            if config.gpus == 0 and config.cpus > cpus + 1e-9 and spare and within_limit:
                lender = max(spare, key=lambda n: (spare[n], n))
                grown[lender], freed = _one_fewer(grown.get(lender) or state.operator(lender).configs(include_canary=False))
                spare[lender] -= 1
                if not spare[lender]:
                    del spare[lender]
                cpus += freed.cpus
                if memory_left is not None:
                    memory_left += self.memory_bound(lender, freed) or 0.0
                continue
            fits = (config.cpus <= cpus + 1e-9 and config.gpus <= gpus + 1e-9 and within_limit
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
        if not any(name in candidates for name in grown):
            return None
        ops = []
        for name, groups in grown.items():
            op = state.operator(name)
            added = sum(groups.values()) - sum(op.configs(include_canary=False).values())
            if name in candidates:
                why = (f"{name}: +{added} replica(s) of {candidates[name].label()}: "
                       f"saturated for {self.settings.growth_s:g} s with {op.queue_items} items queued")
                self.moves += added
            else:
                why = f"{name}: {added} replica(s): never saturated for {LEND_WINDOW * self.settings.growth_s:g} s"
            ops.append(OperatorPlan(name, replica_groups(groups),
                                    why, canary_config(op)))
        free = free_resources(state)
        if any(name not in candidates for name in grown):  # replicas were taken from a lender
            reason = (f"rebalance: replicas of operators that sat mostly idle go to operators with work waiting "
                      f"({free[0]:g} CPU(s) held by no replica): " + "; ".join(o.reason for o in ops))
            return Plan(tuple(ops), 0.0, reason, Rationale(PlanKind.REBALANCE))
        reason = (f"idle capacity: {free[0]:g} CPU(s) and {free[1]:g} GPU(s) held by no replica go to operators with work waiting: "
                  + "; ".join(o.reason for o in ops))
        return Plan(tuple(ops), 0.0, reason, Rationale(PlanKind.IDLE_CAPACITY))

    def _host_memory_left(self, state: RunnerState, cluster: ClusterSpec) -> float | None:
        """Declared host memory minus the safety margin and every CPU replica's memory bound (None: none declared)."""
        total = sum(nc.host_memory_bytes * nc.count for nc in cluster.node_classes)
        if total <= 0:
            return None
        used = sum(self.memory_bound(op.name, r.config) or 0.0 for op in state.operators for r in op.replicas if r.config.device == CPU)
        return total * (1.0 - self.memory_safety.margin) - used


@dataclass(frozen=True)
class _Seen:
    """One operator in one snapshot: its occupancy, serving configs and serving replicas holding a batch."""

    occupancy: Occupancy
    configs: tuple
    busy: int


def _one_fewer(groups: dict[OpConfig, int]) -> tuple[dict[OpConfig, int], OpConfig]:
    """``groups`` with one replica fewer, taken from its most numerous config, and that config."""
    groups = dict(groups)
    config = max(groups, key=lambda c: (groups[c], c.label()))
    groups[config] -= 1
    if not groups[config]:
        del groups[config]
    return groups, config


def _replicas(state: RunnerState, name: str, grown: dict[str, dict[OpConfig, int]]) -> int:
    groups = grown.get(name) or state.operator(name).configs(include_canary=False)
    return max(1, sum(groups.values()))
