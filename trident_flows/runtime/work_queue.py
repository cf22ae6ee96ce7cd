"""The operator input queues the runner streams through.

Contract:
- ``Item``: one input row in flight, with its shard, size (``payload.row_bytes``) and failed
  attempts. A source row is held by value (``row``) and numbered (``seq``: its index in
  ``latency.LatencyLog``); a produced row by reference (``ref``, ``index``, ``node``,
  ``ref_bytes``) with the source item it descends from (``origin``; ``seq`` -1), from which it is
  produced again if its node dies (keeping only ``wanted`` ids, up to operator ``upto``).
- ``Unit``: a batch being retried, kept together or split, never merged, with the replica deaths
  it was in flight at.
- ``Queue``: an operator's input, retried units ahead of items in arrival order, with its item and
  byte counts (for the runner's backpressure bounds) and its oldest arrival. ``take(n)``: the next
  retried unit whole, else a new unit of up to ``n`` items. Retry rules are ``retry``'s.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Item:
    row: dict[str, Any]
    shard: str
    nbytes: int
    attempts: int = 0
    ref: Any = None
    index: int = -1
    node: str = ""
    origin: "Item | None" = None
    wanted: frozenset[str] | None = None
    upto: int = -1
    ref_bytes: int = 0
    seq: int = -1

    @property
    def source_seq(self) -> int:
        """The number of the input item this row is or descends from (-1 when the ledger did not number it)."""
        return self.origin.seq if self.origin is not None else self.seq


@dataclass(eq=False)
class Unit:
    """A pre-formed batch being retried (kept together or split, never merged)."""

    items: list[Item]
    deaths: int = 0


@dataclass
class Queue:
    items: collections.deque = field(default_factory=collections.deque)
    units: collections.deque = field(default_factory=collections.deque)
    n_items: int = 0
    n_bytes: int = 0
    oldest: float = 0.0

    def push(self, item: Item) -> None:
        if not self.items and not self.units:
            self.oldest = time.monotonic()
        self.items.append(item)
        self.n_items += 1
        self.n_bytes += item.nbytes

    def push_unit(self, unit: Unit) -> None:
        if not self.items and not self.units:
            self.oldest = time.monotonic()
        self.units.appendleft(unit)
        self.n_items += len(unit.items)
        self.n_bytes += sum(i.nbytes for i in unit.items)

    def take(self, n: int) -> Unit:
        if self.units:
            unit = self.units.popleft()
        else:
            unit = Unit([self.items.popleft() for _ in range(min(n, len(self.items)))])
        self.n_items -= len(unit.items)
        self.n_bytes -= sum(i.nbytes for i in unit.items)
        if self.items or self.units:
            self.oldest = time.monotonic()
        return unit

    def __len__(self) -> int:
        return self.n_items

