"""One operator's simulated replicas (the twin of ``runtime.pool.OperatorPool``).

Contract:
- A ``SimReplica`` is placed on a node (``cluster.Placement``) when it starts and becomes warm
  after its cold start; it serves one batch at a time from the batches assigned to it (at
  most ``max_inflight``, as a Ray actor queues calls), so ``inflight`` counts both.
- ``pick()`` is the warm, non-draining replica with the fewest batches in flight below
  ``max_inflight``, the earliest started among equals, as the live pool picks (the runner
  reports ``mark_warm`` and every ``load_changed``); ``choose_retire`` the least loaded (not yet warm first) replicas of a
  config; ``resize(records, config)`` gives serving replicas another batch size in place; ``config_epoch`` increases whenever the set of (config, canary) among active
  replicas changes; ``slot_items`` is the items active replicas take in flight (batch size x
  ``max_inflight`` each: an input queue's bound grows with it, ``runtime.backpressure.items_bound``); ``snapshot(now)`` gives the ``ReplicaState``s ``RunnerState`` carries
  (busy fraction = busy seconds / seconds since warm).
"""

from __future__ import annotations

import collections
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from trident_flows.core.state import ReplicaState
from trident_flows.core.types import OpConfig
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
    pinned: Any = None         # the node (cluster.SimNode) a replica with no room waits for, as live
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
    order: int = 0             # start order in its pool (pick's tie-break)
    listed: set[int] = field(default_factory=set)  # levels of SimPool._free holding an entry for it

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
        # per number of batches in flight (0 .. max_inflight-1), a heap of (start order, replica):
        # pick() in O(log n) (a pool may hold hundreds of replicas at 8+ nodes, and pick runs on
        # every event); an entry whose replica has left that level is dropped when it surfaces,
        # and a replica has at most one entry per level
        self._free: list[list[tuple[int, SimReplica]]] = [[] for _ in range(max_inflight)]
        self.slot_items = 0  # items the active replicas take in flight (runtime.pool.OperatorPool.slot_items)

    def _list(self, record: SimReplica) -> None:
        level = record.inflight
        if record.warm and not record.draining and not record.dead and level < self.max_inflight and level not in record.listed:
            record.listed.add(level)
            heapq.heappush(self._free[level], (record.order, record))

    def mark_warm(self, record: SimReplica) -> None:
        self._list(record)

    def load_changed(self, record: SimReplica, before: int) -> None:
        """``record``'s batches in flight went from ``before`` to ``record.inflight``."""
        self._list(record)

    def _configs(self) -> frozenset[tuple[OpConfig, bool]]:
        return frozenset((r.config, r.canary) for r in self.replicas.values() if not r.draining and not r.dead)

    def _bump_epoch_if_changed(self, before: frozenset) -> None:
        if self._configs() != before:
            self.config_epoch += 1

    def new(self, config: OpConfig, canary: bool, now: float) -> SimReplica:
        before = self._configs()
        order = next(self._ids)
        rid = f"r{order}"
        record = SimReplica(rid, f"{self.runner_name}:{self.name}:{rid}", config, canary,
                            self.config_epoch + (1 if (config, canary) not in before else 0), now, order=order)
        self.replicas[rid] = record
        self.slot_items += config.batch_size * self.max_inflight
        self._bump_epoch_if_changed(before)
        return record

    def pick(self) -> SimReplica | None:
        for k, heap in enumerate(self._free):
            while heap:
                record = heap[0][1]
                if record.inflight == k and record.warm and not record.draining and not record.dead:
                    return record
                heapq.heappop(heap)
                record.listed.discard(k)
        return None

    def active(self, canary: bool | None = None) -> list[SimReplica]:
        return [r for r in self.replicas.values() if not r.draining and not r.dead and (canary is None or r.canary == canary)]

    def choose_retire(self, config: OpConfig, count: int, canary: bool) -> list[SimReplica]:
        candidates = [r for r in self.active(canary) if r.config == config]
        candidates.sort(key=lambda r: (r.warm, r.inflight))
        return candidates[:count]

    def resize(self, records: list[SimReplica], config: OpConfig) -> None:
        """Give ``records`` (serving, not draining) ``config``, which differs from theirs only in batch size."""
        before = self._configs()
        for r in records:
            self.slot_items += (config.batch_size - r.config.batch_size) * self.max_inflight
            r.config = config
        self._bump_epoch_if_changed(before)
        for r in records:
            r.epoch = self.config_epoch

    def begin_drain(self, records: list[SimReplica]) -> None:
        before = self._configs()
        for r in records:
            if not r.draining and not r.dead:
                self.slot_items -= r.config.batch_size * self.max_inflight
            r.draining = True
        self._bump_epoch_if_changed(before)

    def forget(self, record: SimReplica) -> None:
        before = self._configs()
        if not record.draining and not record.dead and record.replica_id in self.replicas:
            self.slot_items -= record.config.batch_size * self.max_inflight
        record.dead = True
        self.replicas.pop(record.replica_id, None)
        self._bump_epoch_if_changed(before)

    def snapshot(self, now: float) -> tuple[ReplicaState, ...]:
        return tuple(r.snapshot(now) for r in self.replicas.values())
