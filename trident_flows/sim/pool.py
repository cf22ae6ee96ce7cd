"""One operator's simulated replicas (the twin of ``runtime.pool.OperatorPool``).

Contract:
- A ``SimReplica`` is placed on a node (``cluster.Placement``) when it starts and becomes warm
  after its cold start; it serves one batch at a time from the batches assigned to it (at
  most ``max_inflight``, as a Ray actor queues calls), so ``inflight`` counts both.
- ``pick()`` is the warm, non-draining replica with the fewest batches in flight below
  ``max_inflight`` (the runner reports ``mark_warm`` and every ``load_changed``); ``choose_retire`` the least loaded (not yet warm first) replicas of a
  config; ``config_epoch`` increases whenever the set of (config, canary) among active
  replicas changes; ``snapshot(now)`` gives the ``ReplicaState``s ``RunnerState`` carries
  (busy fraction = busy seconds / seconds since warm).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from trident_flows.runtime.state import ReplicaState
from trident_flows.scheduler.types import OpConfig
from trident_flows.sim.cluster import Placement


@dataclass(eq=False)
class SimReplica:
    replica_id: str
    actor_name: str
    config: OpConfig
    canary: bool
    epoch: int
    requested_at: float
    placement: Placement | None = None
    host_bytes: int = 0
    warm: bool = False
    draining: bool = False
    dead: bool = False
    serving: bool = False
    inflight: int = 0          # batches assigned and not yet back (queued on the replica or being served)
    serving_unit: Any = None   # the rows being served (re-queued if the node is lost)
    serving_reserve: int = 0
    assigned: collections.deque = field(default_factory=collections.deque)  # (rows, reserved items, inflight at dispatch)
    batches: int = 0
    busy_s: float = 0.0
    warm_at: float = 0.0
    cold_start_s: float = 0.0
    on_warm: list[Callable[["SimReplica"], Any]] = field(default_factory=list)
    on_idle: list[Callable[["SimReplica"], Any]] = field(default_factory=list)

    def snapshot(self, now: float) -> ReplicaState:
        alive = now - self.warm_at if self.warm else 0.0
        busy = min(1.0, self.busy_s / alive) if alive > 0 else 0.0
        return ReplicaState(self.replica_id, self.actor_name, self.config, self.warm, self.draining, self.canary, self.inflight,
                            busy, self.batches, self.epoch, self.cold_start_s)


class SimPool:
    def __init__(self, name: str, runner_name: str, max_inflight: int) -> None:
        self.name = name
        self.runner_name = runner_name
        self.max_inflight = max_inflight
        self.replicas: dict[str, SimReplica] = {}
        self.config_epoch = 0
        self._ids = itertools.count()
        # warm, non-draining replicas by batches in flight (0 .. max_inflight-1): pick() in O(1)
        # (a pool may hold hundreds of replicas at 8+ nodes, and pick runs on every event)
        self._free: list[dict[str, SimReplica]] = [{} for _ in range(max_inflight)]

    def _unlist(self, record: SimReplica) -> None:
        for level in self._free:
            level.pop(record.replica_id, None)

    def mark_warm(self, record: SimReplica) -> None:
        if not record.draining and not record.dead and record.inflight < self.max_inflight:
            self._free[record.inflight][record.replica_id] = record

    def load_changed(self, record: SimReplica, before: int) -> None:
        """``record``'s batches in flight went from ``before`` to ``record.inflight``."""
        if not record.warm or record.draining or record.dead:
            return
        if before < self.max_inflight:
            self._free[before].pop(record.replica_id, None)
        if record.inflight < self.max_inflight:
            self._free[record.inflight][record.replica_id] = record

    def _configs(self) -> frozenset[tuple[OpConfig, bool]]:
        return frozenset((r.config, r.canary) for r in self.replicas.values() if not r.draining and not r.dead)

    def _bump_epoch_if_changed(self, before: frozenset) -> None:
        if self._configs() != before:
            self.config_epoch += 1

    def new(self, config: OpConfig, canary: bool, now: float) -> SimReplica:
        before = self._configs()
        rid = f"r{next(self._ids)}"
        record = SimReplica(rid, f"{self.runner_name}:{self.name}:{rid}", config, canary,
                            self.config_epoch + (1 if (config, canary) not in before else 0), now)
        self.replicas[rid] = record
        self._bump_epoch_if_changed(before)
        return record

    def pick(self) -> SimReplica | None:
        for level in self._free:
            if level:
                return next(iter(level.values()))
        return None

    def active(self, canary: bool | None = None) -> list[SimReplica]:
        return [r for r in self.replicas.values() if not r.draining and not r.dead and (canary is None or r.canary == canary)]

    def choose_retire(self, config: OpConfig, count: int, canary: bool) -> list[SimReplica]:
        candidates = [r for r in self.active(canary) if r.config == config]
        candidates.sort(key=lambda r: (r.warm, r.inflight))
        return candidates[:count]

    def begin_drain(self, records: list[SimReplica]) -> None:
        before = self._configs()
        for r in records:
            r.draining = True
            self._unlist(r)
        self._bump_epoch_if_changed(before)

    def forget(self, record: SimReplica) -> None:
        before = self._configs()
        record.dead = True
        self._unlist(record)
        self.replicas.pop(record.replica_id, None)
        self._bump_epoch_if_changed(before)

    def snapshot(self, now: float) -> tuple[ReplicaState, ...]:
        return tuple(r.snapshot(now) for r in self.replicas.values())
