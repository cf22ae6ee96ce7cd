"""Dispatch: which queued batch goes to which replica, and when.

Contract: ``Dispatcher.dispatch()`` (whenever something changed) sends every batch that may go now
through ``launch(i, replica, unit, reserved)``:
- operators are walked from the last to the first, so downstream work drains first;
- a batch goes to the replica ``OperatorPool.pick`` chooses while the next queue has room
  (``backpressure.downstream_has_room``); its expected output is reserved and the replica's
  in-flight count raised before ``launch``, so the next pick sees them; ``release(i, reserved)``
  undoes the reservation once the batch is routed or failed;
- a retried unit goes whole; otherwise up to ``batch_size`` items, a partial batch lingering up to
  ``linger_s`` unless its queue is full or every earlier operator is idle with the input closed;
- taking from operator 0's queue calls ``on_source_room`` (the feed may admit more).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Callable

from trident_flows.core.state import RunnerSettings
from trident_flows.runtime.backpressure import Reservation, downstream_has_room, items_bound
from trident_flows.runtime.pool import OperatorPool, ReplicaRecord
from trident_flows.runtime.work_queue import Queue, Unit


class Dispatcher:
    """Sends queued batches to replicas under backpressure (see the module docstring)."""

    def __init__(self, queues: list[Queue], pools: list[OperatorPool], settings: RunnerSettings, input_closed: Callable[[], bool],
                 launch: Callable[[int, ReplicaRecord, Unit, tuple[int, int]], None], on_source_room: Callable[[], None],
                 wake: Callable[[], None]) -> None:
        self.queues = queues
        self.pools = pools
        self.settings = settings
        self.reservations = [Reservation() for _ in queues]
        self._input_closed = input_closed
        self._launch = launch
        self._on_source_room = on_source_room
        self._wake = wake
        self._linger_armed = False

    def dispatch(self) -> None:
        linger_needed = False
        for i in reversed(range(len(self.queues))):
            linger_needed |= self._dispatch_operator(i)
        if linger_needed and not self._linger_armed:
            self._linger_armed = True

            def fire() -> None:
                self._linger_armed = False
                self._wake()
            asyncio.get_running_loop().call_later(self.settings.linger_s, fire)

    def release(self, i: int, reserved: tuple[int, int]) -> None:
        self.reservations[i].release(reserved)

    def _dispatch_operator(self, i: int) -> bool:
        """Send operator ``i``'s batches while it may; returns whether a partial batch is lingering."""
        q, pool = self.queues[i], self.pools[i]
        next_queue = self.queues[i + 1] if i + 1 < len(self.queues) else None
        bound = self._bound(i)
        next_bound = self._bound(i + 1) if next_queue is not None else 0
        while len(q):
            # prefer a replica on the node that stores the next batch's rows (its first row's, as a rule all of them)
            replica = pool.pick(near=(q.units[0].items[0] if q.units else q.items[0]).node)
            if replica is None:
                return False
            size = replica.config.batch_size
            if not q.units and len(q) < size:
                full = q.n_items >= bound or q.n_bytes >= self.settings.queue_max_bytes
                if not (full or self._upstream_idle(i) or time.monotonic() - q.oldest >= self.settings.linger_s):
                    return True
            peek = q.units[0].items if q.units else list(itertools.islice(q.items, size))
            if not downstream_has_room(next_queue, self.reservations[i], len(peek), sum(it.nbytes for it in peek), self.settings, next_bound):
                return False
            unit = q.take(size)
            if i == 0:
                self._on_source_room()
            reserved = self.reservations[i].reserve(unit)
            replica.inflight += 1
            replica.idle.clear()
            self._launch(i, replica, unit, reserved)
        return False

    def _bound(self, j: int) -> int:
        """Queue ``j``'s bound in items (``backpressure.items_bound``)."""
        if j == 0:
            return items_bound(self.settings, self.pools[0].slot_items())
        return items_bound(self.settings, self.pools[j].slot_items(), self.pools[j - 1].slot_items(), self.reservations[j - 1].growth_items)

    def _upstream_idle(self, i: int) -> bool:
        if not self._input_closed():
            return False
        return all(len(self.queues[j]) == 0 and all(r.inflight == 0 for r in self.pools[j].replicas.values()) for j in range(i))
