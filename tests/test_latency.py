"""Per-item latency bookkeeping (runtime/latency.py through the feed, the router and the shard ledger),
without Ray: every item read gets a read time, every item written or dead-lettered a done time, every
item of a committed shard its commit time, and the sink's writer is called per part and per shard, never
per item."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from trident_flows.core.state import RunnerSettings
from trident_flows.runtime.feed import Feed
from trident_flows.runtime.latency import LatencyLog
from trident_flows.runtime.metrics import RunMetrics
from trident_flows.runtime.payload import Outline
from trident_flows.runtime.routing import route
from trident_flows.runtime.shards import ShardLedger
from trident_flows.runtime.work_queue import Queue


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now


class _Method:
    def __init__(self, calls: list[str], name: str, result: object) -> None:
        self.calls, self.name, self.result = calls, name, result

    def remote(self, *args: object) -> asyncio.Future:
        self.calls.append(self.name)
        future = asyncio.get_running_loop().create_future()
        future.set_result(self.result)
        return future


class _Writer:
    """The sink writer's interface, counting its calls (each would be one Ray call)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.write_part = _Method(self.calls, "write_part", ())
        self.commit = _Method(self.calls, "commit", {})


def test_the_log_stamps_read_done_and_commit_times_in_read_order():
    clock = _Clock()
    log = LatencyLog(clock.time)
    shard = log.shard()
    first, second = log.read(shard), log.read(shard)
    assert (first, second) == (0, 1)
    clock.now += 2.0
    log.done(first)
    clock.now += 1.0
    log.done(first)  # a later row of the same item: its done time is its last row's
    log.done(-1)  # an item the ledger did not number: nothing stamped
    snap = log.snapshot()
    assert snap.read_t.tolist() == [1000.0, 1000.0]
    assert snap.done_t[0] == pytest.approx(1003.0) and math.isnan(snap.done_t[1])
    assert np.isnan(snap.committed_t).all()
    assert snap.seconds().tolist() == pytest.approx([3.0])
    assert snap.percentiles() == {"latency_s_p50": pytest.approx(3.0), "latency_s_p99": pytest.approx(3.0)}
    clock.now += 1.0
    log.done(second)
    log.committed(shard)
    snap = log.snapshot()
    assert snap.committed_t.tolist() == pytest.approx([1004.0, 1004.0])
    assert LatencyLog().snapshot().percentiles() == {"latency_s_p50": None, "latency_s_p99": None}


def test_items_read_written_dead_lettered_and_committed_get_their_times_without_a_call_per_item():
    clock = _Clock()
    n = 1200

    async def scenario() -> tuple[ShardLedger, _Writer]:
        writer = _Writer()
        tasks: list[asyncio.Task] = []

        def spawn(coro) -> asyncio.Task:
            tasks.append(asyncio.ensure_future(coro))
            return tasks[-1]
        ledger = ShardLedger(writer, RunMetrics(16), spawn, wake=lambda: None, lost=lambda items, op: None)
        ledger.latency = LatencyLog(clock.time)
        queue = Queue()
        feed = Feed(queue, ledger, RunnerSettings(queue_max_items=10 * n), lambda: None, lambda: 8)
        shard = ledger.open("s")
        for k in range(n):
            feed.admit({"id": f"r{k}"}, shard)
        ledger.close(shard)
        clock.now += 5.0
        # operator 0 of 2: r0 is split in two rows that go on, r1 fails (dead-lettered), the rest are filtered (written)
        unit = queue.take(n)
        ids = ("r0/0", "r0/1", *(f"r{k}" for k in range(1, n)))
        errors = ("", "", "boom", *("",) * (n - 2))
        drops = (False, False, False, *(True,) * (n - 2))
        nxt = Queue()
        route(unit, Outline("ref", ids, (None,) * len(ids), drops, errors, (1,) * len(ids)), "node", 0, "parse", ledger, nxt)
        clock.now += 3.0
        last = nxt.take(1)  # r0/0 is written at 1008, r0/1 at 1010: r0 is done with its last row
        route(last, Outline("ref2", ("r0/0",), (None,), (False,), ("",), (1,)), "node", 1, "embed", ledger, None)
        clock.now += 2.0
        route(nxt.take(1), Outline("ref2", ("r0/1",), (None,), (False,), ("",), (1,)), "node", 1, "embed", ledger, None)
        clock.now += 1.0
        await asyncio.gather(*tasks)
        return ledger, writer

    ledger, writer = asyncio.run(scenario())
    snap = ledger.latency.snapshot()
    assert ledger.shards["s"].done and ledger.rows_dead == 1
    assert snap.read_t.tolist() == [1000.0] * n
    assert snap.done_t[0] == pytest.approx(1010.0)  # its second row, the last one
    assert snap.done_t[1] == pytest.approx(1005.0)  # dead-lettered by the first operator
    assert snap.done_t[2:].tolist() == pytest.approx([1005.0] * (n - 2))
    assert snap.committed_t.tolist() == pytest.approx([1011.0] * n)
    assert snap.percentiles()["latency_s_p99"] == pytest.approx(5.0)
    # the writer's calls are one per part of up to 512 rows and one commit: 1200 items cost 4 calls, none per item
    assert writer.calls.count("commit") == 1 and writer.calls.count("write_part") <= math.ceil(n / 512) + 1
