"""The runner's pure parts, without Ray: retrying a failed batch, the backpressure bounds, producing
lost rows again, and routing one output batch (what is forwarded, written, dead-lettered, and
what stays pending). The streaming tests (test_runtime_stream, test_faults) run them end to end."""

from __future__ import annotations

import pytest

from trident_flows.core.state import RunnerSettings
from trident_flows.runtime.backpressure import Reservation, downstream_has_room, items_bound, source_room
from trident_flows.runtime.lineage import reruns
from trident_flows.runtime.metrics import RunMetrics
from trident_flows.runtime.payload import Outline
from trident_flows.runtime.retry import after_death, after_failure
from trident_flows.runtime.routing import route
from trident_flows.runtime.shards import ShardLedger
from trident_flows.runtime.work_queue import Item, Queue, Unit


def _items(n: int, shard: str = "s", nbytes: int = 10) -> list[Item]:
    return [Item({"id": f"r{k}"}, shard, nbytes) for k in range(n)]


def test_failing_batch_is_halved_until_the_bad_item_is_alone_then_given_up():
    bad = "r5"
    pending = [Unit(_items(8))]
    given_up = []
    rounds = 0
    while pending:
        rounds += 1
        unit = pending.pop()
        if all(it.row["id"] != bad for it in unit.items):
            continue  # this part succeeds
        retry = after_failure(unit, max_attempts=3)
        pending.extend(retry.requeue)
        if retry.give_up is not None:
            given_up.append(retry.give_up)
    assert [it.row["id"] for it in given_up] == [bad]
    assert given_up[0].attempts == 3
    assert rounds < 20


def test_a_batch_goes_whole_after_one_replica_death_and_split_after_two():
    unit = Unit(_items(4))
    first = after_death(unit, max_attempts=3)
    assert first.requeue == (unit,) and first.give_up is None
    second = after_death(unit, max_attempts=3)
    assert [len(u.items) for u in second.requeue] == [2, 2]
    single = Unit(_items(1))
    outcomes = [after_death(single, max_attempts=2) for _ in range(2)]
    assert outcomes[0].requeue == (single,)
    assert outcomes[1].give_up is single.items[0]


def test_a_queue_bound_grows_with_the_pools_on_both_sides_of_it():
    settings = RunnerSettings(queue_max_items=512)
    assert items_bound(settings, consumer_slots=64) == 512  # small pools: the setting
    # 704 OCR replicas of batch 4, 2 in flight each, feeding 64 langid replicas of batch 4: 512 + 5,632 outputs
    assert items_bound(settings, consumer_slots=64 * 4 * 2, producer_slots=704 * 4 * 2) == 512 + 5632
    # a splitter's outputs count at its growth: 10 decoders of batch 1, 5 clips per video
    assert items_bound(settings, consumer_slots=16, producer_slots=600, producer_growth=5.0) == 3016


def test_source_room_respects_both_bounds_and_an_empty_queue_always_takes_one():
    settings = RunnerSettings(queue_max_items=10, queue_max_bytes=1000)
    q = Queue()
    assert source_room(q, 100.0, settings, settings.queue_max_items) == 10
    assert source_room(q, 5000.0, settings, settings.queue_max_items) == 1  # a row over the byte bound still passes, alone
    for it in _items(10, nbytes=100):
        q.push(it)
    assert source_room(q, 100.0, settings, settings.queue_max_items) == 0


def test_downstream_room_counts_what_in_flight_batches_will_add():
    settings = RunnerSettings(queue_max_items=10, queue_max_bytes=10**6)
    nxt = Queue()
    reservation = Reservation(growth_items=1.0, growth_bytes=1.0)
    assert downstream_has_room(None, reservation, 100, 100, settings, settings.queue_max_items)  # the last operator
    assert downstream_has_room(nxt, reservation, 100, 100, settings, settings.queue_max_items)  # empty and nothing reserved: one batch moves
    reserved = reservation.reserve(Unit(_items(6)))
    assert not downstream_has_room(nxt, reservation, 6, 60, settings, settings.queue_max_items)  # 6 reserved + 6 expected > 10
    assert downstream_has_room(nxt, reservation, 4, 40, settings, settings.queue_max_items)
    reservation.release(reserved)
    assert reservation.items == 0 and reservation.bytes == 0


def test_lost_rows_of_one_source_item_are_produced_again_by_one_rerun():
    origin_a, origin_b = Item({"id": "a"}, "s", 10), Item({"id": "b"}, "s", 10)
    lost = [Item({"id": "a/0"}, "s", 5, origin=origin_a), Item({"id": "a/1"}, "s", 5, origin=origin_a),
            Item({"id": "b"}, "s", 5, origin=origin_b)]
    runs = reruns(lost, outputs_of=1)
    assert sorted((rerun.row["id"], sorted(rerun.wanted), rerun.upto, len(group)) for rerun, group in runs) == \
        [("a", ["a/0", "a/1"], 1, 2), ("b", ["b"], 1, 1)]


def _ledger() -> ShardLedger:
    def no_io(_coro):
        raise AssertionError("nothing is written or committed while the shard is open")
    return ShardLedger(writer=None, metrics=RunMetrics(16), spawn=no_io, wake=lambda: None, lost=lambda items, op: None)


def test_route_forwards_writes_and_dead_letters_and_keeps_pending_exact():
    ledger = _ledger()
    shard = ledger.open("s")
    unit = Unit(_items(4))
    for it in unit.items:
        ledger.count_in(shard, it)
    # r0 split in two, r1 filtered, r2 failed, r3 missing
    out = Outline("ref", ("r0/0", "r0/1", "r1", "r2"), (None,) * 4, (False, False, True, False), ("", "", "", "boom"), (7, 8, 9, 1))
    nxt = Queue()
    routed = route(unit, out, "node-1", 0, "parse", ledger, nxt)
    assert [it.row["id"] for it in nxt.items] == ["r0/0", "r0/1"]
    assert all(it.ref == "ref" and it.node == "node-1" and it.origin is unit.items[0] for it in nxt.items)
    assert (routed.rows_out, routed.forwarded, routed.forwarded_bytes) == (4, 2, 15)
    assert [it.row["id"] for it, _, dropped in shard.rows] == ["r1"] and shard.dropped == 1
    assert sorted(d["id"] for d in shard.dead_rows) == ["r2", "r3"]
    assert shard.pending == 2  # the two forwarded rows; every input item is accounted for


def test_route_refuses_an_untraceable_row_before_changing_anything():
    ledger = _ledger()
    shard = ledger.open("s")
    unit = Unit(_items(2))
    for it in unit.items:
        ledger.count_in(shard, it)
    out = Outline("ref", ("r0", "stranger"), (None, None), (False, False), ("", ""), (1, 1))
    nxt = Queue()
    with pytest.raises(ValueError, match="stranger"):
        route(unit, out, "", 0, "parse", ledger, nxt)
    assert len(nxt) == 0 and shard.pending == 2 and not shard.rows and not shard.dead_rows


def test_a_warm_replica_records_the_gpus_ray_gave_it_and_the_pool_counts_them_device_by_device():
    import asyncio

    from trident_flows.core.types import OpConfig
    from trident_flows.runtime.node_placement import GpuShare, NodePlacer
    from trident_flows.runtime.pool import OperatorPool, ReplicaRecord
    from trident_flows.runtime.spec import OperatorSpec

    class Ready:  # a replica actor's handle as far as ``_warm`` reads it
        def __init__(self, gpu_ids: list[str]) -> None:
            self.ready = self
            self.info = {"cold_start_s": 0.1, "node_id": "g", "gpu_ids": gpu_ids}

        def remote(self):
            future = asyncio.get_running_loop().create_future()
            future.set_result(self.info)
            return future

    placer = NodePlacer()
    placer.update([{"NodeID": "g", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0, "memory": 2**32}}])
    half = OpConfig("gpu", 4, cpus=1.0, gpus=0.5)
    pool = OperatorPool(OperatorSpec("embed", object, half), "r", None, "dev", 2, placer)
    for rid, device in (("embed-0", "0"), ("embed-1", "1")):
        pool.replicas[rid] = ReplicaRecord(rid, rid, half, Ready([device]), False, 0)
        asyncio.run(pool._warm(pool.replicas[rid]))
    assert pool.gpu_shares() == {"g": [GpuShare(0.5, ("0",)), GpuShare(0.5, ("1",))]}
    assert pool.free_by_node() == {"g": (6.0, 0.5)}  # a GPU's worth is free, split over two devices
