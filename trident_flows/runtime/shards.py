"""Exactly once: per input shard, what is still pending, written and dead-lettered, and its commit.

Contract:
- ``ShardLedger.open(shard_id)`` starts a shard (replacing an earlier record); ``count_in(shard,
  item)`` counts an admitted item pending and numbers it; ``close(shard)``: no more items.
- An item stays pending until every row it leads to is written or dead-lettered; rows go to the
  sink's writer by reference in parts of ``_PART_ROWS`` rows or ``_PART_BYTES`` bytes.
- A closed shard with nothing pending is committed atomically (``maybe_commit``, then
  ``SinkWriter.commit``). Rows of a part lost with its node are un-counted and handed to
  ``lost(items, operator)`` to be produced again, so the shard commits only once they are written.
- Totals: ``items_in``, ``rows_written``, ``rows_dropped``, ``rows_dead``; ``latency``
  (``latency.LatencyLog``) stamps each item's read and done times and its shard's commit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine

from trident_flows.core.state import ShardStatus
from trident_flows.runtime import sink_writer
from trident_flows.runtime.latency import LatencyLog
from trident_flows.runtime.metrics import RunMetrics
from trident_flows.runtime.spec import ID, SOURCE_ID
from trident_flows.runtime.wire import items_message, serialised_size
from trident_flows.runtime.work_queue import Item

# A staging part is written once it holds this many rows.
_PART_ROWS = 512
# A staging part is also written once its rows reach this many bytes: the rows' objects stay in
# the object store until written, so large rows (video frames, page images) are written sooner.
_PART_BYTES = 64 * 2**20


@dataclass
class Shard:
    shard_id: str
    number: int = -1  # its number in the run's LatencyLog
    items_in: int = 0
    pending: int = 0
    written: int = 0
    dropped: int = 0
    dead: int = 0
    closed: bool = False
    done: bool = False
    committing: bool = False
    rows: list[tuple[Item, int, bool]] = field(default_factory=list)  # (item, operator index, dropped) of rows to write
    rows_bytes: int = 0
    dead_rows: list[dict[str, Any]] = field(default_factory=list)
    writes: list[asyncio.Task] = field(default_factory=list)

    def status(self) -> ShardStatus:
        return ShardStatus(self.shard_id, self.items_in, self.written, self.dead, self.dropped, self.pending, self.closed, self.done)


class ShardLedger:
    """The shards of one run and their writes to the sink (see the module docstring).

    ``spawn`` runs a coroutine as one of the runner's tasks; ``wake`` tells the runner's pump that
    something changed; ``lost(items, operator)`` produces written rows whose object is gone again."""

    def __init__(self, writer: Any, metrics: RunMetrics, spawn: Callable[[Coroutine], asyncio.Task], wake: Callable[[], None],
                 lost: Callable[[list[Item], int], None]) -> None:
        self.writer = writer
        self.metrics = metrics
        self._spawn = spawn
        self._wake = wake
        self._lost = lost
        self.shards: dict[str, Shard] = {}
        self.items_in = self.rows_written = self.rows_dropped = self.rows_dead = 0
        self.latency = LatencyLog()

    def __getitem__(self, shard_id: str) -> Shard:
        return self.shards[shard_id]

    def open(self, shard_id: str) -> Shard:
        shard = Shard(shard_id, self.latency.shard())
        self.shards[shard_id] = shard
        return shard

    def count_in(self, shard: Shard, item: Item) -> None:
        item.seq = self.latency.read(shard.number)
        shard.items_in += 1
        shard.pending += 1
        self.items_in += 1

    def close(self, shard: Shard) -> None:
        shard.closed = True
        self.maybe_commit(shard)

    def all_done(self) -> bool:
        return all(s.done for s in self.shards.values())

    def write(self, shard: Shard, item: Item, op: int, dropped: bool) -> None:
        """Stage the row ``item`` (an output of operator ``op``) for the sink."""
        shard.rows.append((item, op, dropped))
        shard.rows_bytes += item.nbytes
        if dropped:
            shard.dropped += 1
            self.rows_dropped += 1
        shard.written += 1
        self.rows_written += 1
        self.metrics.completed()
        self.latency.done(item.source_seq)
        if len(shard.rows) >= _PART_ROWS or shard.rows_bytes >= _PART_BYTES:
            self._flush(shard)

    def dead_letter(self, item: Item, operator: str, error: str, pending_delta: int = -1) -> None:
        """Stage ``item`` for the dead-letter table with its reason; ``pending_delta`` is added to its
        shard's pending count (-1: the item itself was pending; 0: the router accounts for it)."""
        shard = self.shards[item.shard]
        source = item.row.get(SOURCE_ID)
        shard.dead_rows.append({"id": item.row[ID], "source_id": None if source is None else str(source), "shard": item.shard,
                                "operator": operator, "error": error[:2000], "attempts": max(1, item.attempts)})
        shard.dead += 1
        shard.pending += pending_delta
        self.rows_dead += 1
        self.metrics.completed()
        self.latency.done(item.source_seq)
        if pending_delta:
            self.maybe_commit(shard)

    def maybe_commit(self, shard: Shard) -> None:
        if shard.closed and shard.pending == 0 and not shard.done and not shard.committing:
            shard.committing = True
            self._flush(shard)
            self._spawn(self._commit(shard))

    def _flush(self, shard: Shard) -> None:
        rows, dead = shard.rows, shard.dead_rows
        shard.rows, shard.dead_rows, shard.rows_bytes = [], [], 0
        if rows or dead:
            shard.writes.append(self._spawn(self._write_part(shard, rows, dead)))

    async def _write_part(self, shard: Shard, rows: list[tuple[Item, int, bool]], dead: list[dict[str, Any]]) -> None:
        """Have the writer fetch and write rows (by reference) and dead letters; rows whose object is gone
        are un-counted and produced again."""
        pieces, groups, sent = items_message([item for item, _, _ in rows]) if rows else ([], [], 0)
        lost = await sink_writer.call(self.writer.write_part, shard.shard_id, pieces, dead)
        self.metrics.runner_bytes += serialised_size(shard.shard_id) + sent + serialised_size(dead) + serialised_size(lost)
        if not lost:
            return
        gone = {id(it) for k in lost for it in groups[k]}
        by_op: dict[int, list[Item]] = {}
        for item, op, dropped in rows:
            if id(item) in gone:
                shard.written -= 1
                self.rows_written -= 1
                if dropped:
                    shard.dropped -= 1
                    self.rows_dropped -= 1
                by_op.setdefault(op, []).append(item)
        for op, items in by_op.items():
            self._lost(items, op)

    async def _commit(self, shard: Shard) -> None:
        writes, shard.writes = shard.writes, []
        await asyncio.gather(*writes)
        if shard.pending:  # a part lost rows with a node: they are being produced again, then it commits
            shard.committing = False
            return
        await sink_writer.call(self.writer.commit, shard.shard_id)
        self.latency.committed(shard.number)
        shard.done = True
        shard.committing = False
        self._wake()
