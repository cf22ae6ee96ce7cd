"""The per-batch messages between the runner and a replica: what they carry, and that their counted size is honest."""

from __future__ import annotations

import numpy as np

from trident_flows.core.types import OpConfig, Outcome
from trident_flows.runtime.payload import INLINE_BYTES, Outline, Piece, fetch
from trident_flows.runtime.replica import ReplicaActor
from trident_flows.runtime.spec import ID
from trident_flows.runtime.wire import Measured, decode_reply, encode_reply, piece_message, serialised_size, source_message

CONFIG = OpConfig.make("cpu", batch_size=4)
MEASURED = Measured(1000.0, 0.25, 3, 4, {"pages": 7.0}, 123456, 789, Outcome.OK)


def _decode(blob: bytes, input_ids):
    return decode_reply(blob, input_ids, "parse", "parse-0", CONFIG, epoch=3, inflight=2)


def test_a_reply_carries_the_outline_and_the_runner_completes_the_sample():
    out = Outline(None, ("a", "b", "c", "c/1"), (None, None, None, "c"), (False, True, False, False), ("", "", "corrupt PDF", ""),
                  (100, 2**40, 64, 64))
    result = _decode(encode_reply(out, ["a", "b", "c"], MEASURED), ["a", "b", "c"])
    assert result.ok and result.error == "" and result.lost == ()
    assert result.output == out
    s = result.sample
    assert (s.operator, s.replica_id, s.config, s.config_epoch, s.inflight) == ("parse", "parse-0", CONFIG, 3, 2)
    assert (s.start, s.end, s.busy_s, s.items_in, s.items_out) == (1000.0, 1000.25, 0.25, 3, 4)
    assert (dict(s.features), s.peak_host_mem_bytes, s.peak_device_mem_bytes, s.outcome) == ({"pages": 7.0}, 123456, 789, Outcome.OK)


def test_kept_ids_and_equal_sizes_travel_as_nothing_per_row():
    ids = tuple(f"item-{k:06d}" for k in range(64))
    out = Outline(None, ids, (None,) * 64, (False,) * 64, ("",) * 64, (1088,) * 64)
    kept = encode_reply(out, ids, MEASURED)
    assert _decode(kept, ids).output == out
    renamed = encode_reply(out, [f"other-{k}" for k in range(64)], MEASURED)
    assert len(kept) < 200 < len(renamed)  # the ids travel only when they are not the input's


def test_a_failed_batch_replies_its_error_and_lost_pieces():
    measured = Measured(5.0, 0.0, 0, 0, {}, 0, 0, Outcome.ERROR, "2 input piece(s) lost")
    result = _decode(encode_reply(None, (), measured, "2 input piece(s) lost", (0, 2)), ["x"])
    assert not result.ok and result.lost == (0, 2) and result.error == "2 input piece(s) lost"
    assert result.sample.outcome == Outcome.ERROR and result.sample.error == "2 input piece(s) lost"


def test_sizes_are_what_ray_writes_and_a_run_of_rows_costs_as_much_as_two(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Producer:
        @ray.method(num_returns=2)
        def make(self):
            return b"", np.zeros(INLINE_BYTES, np.uint8)

    # a batch in the object store, owned by this process, as the runner owns its replicas' outputs
    producer = Producer.remote()
    (_, ref), (_, other) = producer.make.remote(), producer.make.remote()
    ray.get([ref, other])
    blob = encode_reply(None, (), MEASURED)
    context = ray._private.worker.global_worker.get_serialization_context()
    assert serialised_size(blob) == len(blob) == context.serialize(blob).total_bytes  # bytes travel as they are
    two = piece_message([Piece(ref, (0, 1))])[1]
    assert piece_message([Piece(ref, tuple(range(64)))])[1] <= two + 32
    assert piece_message([Piece(ref, (0, 1)), Piece(other, (0, 1))])[1] >= two + 128  # each reference is paid for (id, owner)
    rows, size = source_message([{ID: f"item-{k:06d}"} for k in range(64)])
    assert len(rows) == 64 and 64 * len("item-000000") < size < 64 * 32
    ray.kill(producer)


def test_a_replica_keeps_even_a_small_output_batch_in_its_object_store(ray_cluster):
    ray = ray_cluster

    class Echo:
        def __init__(self, config):
            pass

        def __call__(self, batch):
            return batch

    replica = ReplicaActor.options(num_cpus=0).remote("echo", "echo-0", Echo, {}, CONFIG)
    reply_ref, batch_ref = replica.process.remote([{ID: "a"}, {ID: "b"}])
    result = _decode(ray.get(reply_ref), ["a", "b"])
    assert result.ok and result.output.ids == ("a", "b")
    [batch] = fetch([Piece(batch_ref, (0, 1))])
    assert list(batch[ID]) == ["a", "b"]
    # a few hundred bytes, which Ray would return inline, through the caller's memory, unless filled up
    assert ray.experimental.get_object_locations([batch_ref])[batch_ref]["node_ids"]
    assert result.output.stored_bytes >= INLINE_BYTES
    ray.kill(replica)
