"""Backpressure: how much may enter an operator's input queue, given its bounds and what is on its way.

Contract (pure: no Ray, no I/O, no clock):
- Every queue is bounded by ``queue_max_bytes`` and, in items, by ``items_bound`` (at least
  ``queue_max_items``, more for large pools: ``slots`` of its consumer and producer); the bounds
  below take it as ``max_items``.
- ``source_room(queue, row_bytes, settings, max_items)``: how many source rows operator 0's queue
  can take now; an empty queue always takes one, a full one none.
- ``Reservation``: per operator, the items and bytes its in-flight batches are expected to add to
  the next queue (growth estimates from ``observe``/``track``), held from dispatch until routed.
- ``downstream_has_room(next_queue, reservation, n_items, n_bytes, settings, max_items)``: whether
  a batch may be sent (the next queue plus reservations plus its expected output stays within the
  bounds; an empty next queue with nothing reserved always takes one batch; the last operator
  always has room).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trident_flows.core.state import RunnerSettings
from trident_flows.runtime.work_queue import Queue, Unit


def track(estimate: float, observed: float) -> float:
    """A conservative growth estimate: jumps up to a larger observation, decays slowly down."""
    return max(observed, 0.9 * estimate + 0.1 * observed, 0.05)


def items_bound(settings: RunnerSettings, consumer_slots: int, producer_slots: int = 0, producer_growth: float = 1.0) -> int:
    """An input queue's bound in items: ``queue_max_items``, or when more its operator's ``consumer_slots``, plus
    ``producer_slots`` (the previous operator's; none for the first queue) times ``producer_growth``.

    A fixed bound starves large pools: hundreds of replicas may have more items in flight than the bound, and
    reserved outputs count against the next queue, so a pool would sit mostly idle with work waiting upstream."""
    return max(settings.queue_max_items, consumer_slots + math.ceil(producer_slots * producer_growth))


def source_room(queue: Queue, row_bytes: float, settings: RunnerSettings, max_items: int) -> int:
    """Source rows ``queue`` takes now (see the module docstring); 0 when full."""
    room = min(max_items - queue.n_items, int((settings.queue_max_bytes - queue.n_bytes) / max(1.0, row_bytes)))
    if room > 0 or queue.n_items == 0:
        return max(1, room)
    return 0


@dataclass
class Reservation:
    items: int = 0
    bytes: int = 0
    growth_items: float = 2.0  # conservative until measured
    growth_bytes: float = 2.0

    def reserve(self, unit: Unit) -> tuple[int, int]:
        """Reserve the expected output of ``unit``; returns what to ``release`` once it is routed."""
        items = int(len(unit.items) * self.growth_items + 0.999)
        nbytes = int(sum(it.nbytes for it in unit.items) * self.growth_bytes)
        self.items += items
        self.bytes += nbytes
        return items, nbytes

    def release(self, reserved: tuple[int, int]) -> None:
        self.items -= reserved[0]
        self.bytes -= reserved[1]

    def observe(self, items_in: int, items_out: int, in_bytes: int, forwarded: int, forwarded_bytes: int) -> None:
        """Update the growth estimates from one routed batch (bytes only when rows were forwarded)."""
        self.growth_items = track(self.growth_items, items_out / max(1, items_in))
        if forwarded:
            self.growth_bytes = track(self.growth_bytes, forwarded_bytes / max(1, in_bytes))


def downstream_has_room(next_queue: Queue | None, reservation: Reservation, n_items: int, n_bytes: int, settings: RunnerSettings,
                        max_items: int) -> bool:
    """Whether a batch may be sent (see the module docstring)."""
    if next_queue is None:
        return True
    if len(next_queue) == 0 and reservation.items == 0:
        return True
    items = next_queue.n_items + reservation.items + n_items * reservation.growth_items
    nbytes = next_queue.n_bytes + reservation.bytes + n_bytes * reservation.growth_bytes
    return items <= max_items and nbytes <= settings.queue_max_bytes
