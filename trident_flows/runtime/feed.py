"""Input admission: source rows into operator 0's queue, as fast as its bounds allow.

Contract:
- ``Feed.room()`` waits until the first queue has room (``backpressure.source_room``, at a
  running estimate of an input row's size) and returns how many rows may be admitted now.
  ``notify_room()`` (the dispatcher took from that queue) wakes it.
- ``admit(row, shard)`` refuses a row without an ``id`` (``ValueError``), stores a copy with its id
  as a string, counts it pending in its shard (which stamps its read time) and queues it.
- ``read_source(source, shard_items)`` reads an iterator of rows (in a thread, at most 256 at a
  time) into implicit shards ``part-NNNNNN`` of ``shard_items`` items, closing each when full and
  the last at the end.
- ``add_rows(shard, rows)`` admits one added shard's rows in chunks as room appears, then closes it.
Every admitted chunk wakes the runner's pump (``wake``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterator

from trident_flows.core.state import RunnerSettings
from trident_flows.runtime.backpressure import items_bound, source_room, track
from trident_flows.runtime.payload import row_bytes
from trident_flows.runtime.shards import Shard, ShardLedger
from trident_flows.runtime.spec import ID
from trident_flows.runtime.work_queue import Item, Queue

# Rows admitted per round: enough to fill a batch or two, few enough that the pump dispatches soon.
_CHUNK = 256


class Feed:
    """Admits input rows to the first operator's queue (see the module docstring)."""

    def __init__(self, queue: Queue, ledger: ShardLedger, settings: RunnerSettings, wake: Callable[[], None],
                 slot_items: Callable[[], int]) -> None:
        self.queue = queue
        self._slot_items = slot_items  # the first operator's pool (backpressure.items_bound)
        self.ledger = ledger
        self.settings = settings
        self._wake = wake
        self._room = asyncio.Event()
        self._row_bytes = 256.0  # running estimate of input row bytes, to size source reads

    def notify_room(self) -> None:
        self._room.set()

    async def room(self) -> int:
        while True:
            room = source_room(self.queue, self._row_bytes, self.settings, items_bound(self.settings, self._slot_items()))
            if room:
                return room
            self._room.clear()
            await self._room.wait()

    def admit(self, row: dict[str, Any], shard: Shard) -> None:
        if ID not in row or row[ID] is None:
            raise ValueError(f"input row without an {ID!r} column: {sorted(row)}")
        row = dict(row)
        row[ID] = str(row[ID])
        item = Item(row, shard.shard_id, row_bytes(row))
        self.ledger.count_in(shard, item)
        self._row_bytes = track(self._row_bytes, item.nbytes)
        self.queue.push(item)

    async def read_source(self, source: Iterator[dict[str, Any]], shard_items: int) -> None:
        index = 0
        shard: Shard | None = None
        while True:
            room = await self.room()
            rows = await asyncio.to_thread(_take, source, min(room, _CHUNK))
            for row in rows:
                if shard is None or shard.items_in >= shard_items:
                    if shard is not None:
                        self.ledger.close(shard)
                    shard = self.ledger.open(f"part-{index // shard_items:06d}")
                self.admit(row, shard)
                index += 1
            self._wake()
            if not rows:
                break
        if shard is not None:
            self.ledger.close(shard)

    async def add_rows(self, shard: Shard, rows: list[dict[str, Any]]) -> None:
        start = 0
        while start < len(rows):
            room = min(await self.room(), _CHUNK)
            for row in rows[start:start + room]:
                self.admit(row, shard)
            start += room
            self._wake()
        self.ledger.close(shard)


def _take(source: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    rows = []
    for row in source:
        rows.append(row)
        if len(rows) >= n:
            break
    return rows
