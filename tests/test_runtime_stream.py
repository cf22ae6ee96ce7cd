"""Streaming on real Ray: exactly once through failures, replica deaths, emulated OOM; backpressure; samples."""

from __future__ import annotations

import time

import numpy as np
import pyarrow.parquet as pq
import ray
from test_runtime_support import MIB, assert_exactly_once, input_ids, small_pipeline

from trident_flows.control.launch import find_runner, run_pipeline, start_runner
from trident_flows.core.state import RunnerSettings
from trident_flows.core.types import Outcome
from trident_flows.runtime.sink import account, read_ids
from trident_flows.scheduler.transfer import transfer_estimate


def _wait(handle, timeout: float = 60.0) -> dict:
    summary = ray.get(handle.wait.remote(timeout))
    assert summary["finished"], summary
    return summary


def _stop(handle) -> None:
    ray.get(handle.stop.remote())
    ray.kill(handle)


def test_static_run_writes_every_item_once_with_samples(ray_cluster, tmp_path):
    spec = small_pipeline(200, embed_device="gpu")
    handle = start_runner(spec, tmp_path, name="rt-static", namespace="rt")
    other = find_runner("rt-static", "rt")  # a second handle, as another driver would get
    summary = _wait(handle)
    state = ray.get(other.state.remote())
    page = ray.get(other.samples.remote(0))
    later = ray.get(other.samples.remote(page.next))
    lat = ray.get(other.latencies.remote())
    _stop(handle)
    assert state.finished and state.items_in == 200 and not state.error
    # every item read was done, then committed with its shard (runtime/latency.py)
    assert len(lat.read_t) == 200 and not np.isnan(lat.done_t).any()
    assert (lat.read_t <= lat.done_t).all() and (lat.done_t <= lat.committed_t).all()
    assert [o.name for o in state.operators] == ["parse", "filter", "embed"]
    data, dead = assert_exactly_once(spec, tmp_path)
    assert not dead
    acc = account(tmp_path)
    assert acc.duplicate_ids == 0 and acc.items_written == 200 and 0 < acc.items_dropped < 200
    assert summary["rows_written"] == 200
    samples = page.samples
    assert {s.operator for s in samples} == {"parse", "filter", "embed"}
    assert all(s.outcome == Outcome.OK and s.busy_s > 0 and s.peak_host_mem_bytes > 0 for s in samples)
    parse = [s for s in samples if s.operator == "parse"]
    assert sum(s.items_in for s in parse) == 200 and all(s.features["pages"] > 0 for s in parse)
    assert all(s.bytes_read == 0 for s in parse), "the runner sends source rows by value: no stored batch is read"
    moved = transfer_estimate(s for s in samples if s.operator == "filter")
    assert moved is not None and moved.bytes_per_item > 0 and moved.cross_node_share == 0  # one node: every read is local
    embed = [s for s in samples if s.operator == "embed"]
    assert all(s.peak_device_mem_bytes >= 100 * MIB for s in embed), "emulated device memory is reported"
    assert later.samples == () and later.next == page.next
    # every part is whole Parquet, and dropped rows carry their reason
    table = pq.read_table(next((tmp_path / "data").glob("*.parquet")))
    assert "_drop" in table.column_names


def test_failing_and_marked_items_are_dead_lettered_once(ray_cluster, tmp_path):
    ids = [f"item-{k:07d}" for k in range(60)]
    bad, marked = ids[5], ids[17]
    spec = small_pipeline(60, stage_params={"parse": {"fail_ids": (bad,)}, "embed": {"error_ids": (marked,)}})
    summary = run_pipeline(spec, tmp_path, settings=RunnerSettings(max_attempts=3))
    data, dead = assert_exactly_once(spec, tmp_path)
    assert set(dead) == {bad, marked}
    rows = {r["id"]: r for f in (tmp_path / "dead_letter").glob("*.parquet") for r in pq.read_table(f).to_pylist()}
    assert rows[bad]["operator"] == "parse" and rows[bad]["attempts"] == 3 and "injected failure" in rows[bad]["error"]
    assert rows[marked]["operator"] == "embed" and "bad input" in rows[marked]["error"]
    assert summary.items_dead_lettered == 2 and summary.items_written == 58 and summary.items_missing == 0
    assert summary.duplicate_ids == 0
    assert 0 < summary.latency_s_p50 <= summary.latency_s_p99  # every item's read to done, the dead-lettered ones too


def test_replica_killed_mid_batch_loses_nothing(ray_cluster, tmp_path):
    spec = small_pipeline(240, time_scale=4.0)
    handle = start_runner(spec, tmp_path, name="rt-kill", namespace="rt")
    deadline = time.time() + 30
    victim = None
    while time.time() < deadline:
        state = ray.get(handle.state.remote())
        busy = [r for r in state.operator("parse").replicas if r.inflight > 0]
        if busy and state.operator("parse").items_in > 20:
            victim = busy[0]
            break
        time.sleep(0.05)
    assert victim is not None
    ray.kill(ray.get_actor(victim.actor_name, namespace="rt"), no_restart=True)
    _wait(handle)
    state = ray.get(handle.state.remote())
    lat = ray.get(handle.latencies.remote())
    _stop(handle)
    assert len(lat.done_t) == 240 and not np.isnan(lat.done_t).any(), "the retried items are done too"
    replicas = state.operator("parse").replicas
    assert victim.replica_id not in {r.replica_id for r in replicas} and len(replicas) == 1, "the dead replica was replaced"
    data, dead = assert_exactly_once(spec, tmp_path)
    assert not dead


def test_emulated_oom_is_retried_smaller(ray_cluster, tmp_path):
    # 100 MiB resident + 10 MiB per item: a batch of 8 needs 180 MiB, the device has 150 MiB -> split to 4 (140 MiB).
    spec = small_pipeline(80, embed_device="gpu", embed_batch=8, regimes="short:80")
    summary = run_pipeline(spec, tmp_path, settings=RunnerSettings(device_memory_bytes=150 * MIB, linger_s=0.5))
    data, dead = assert_exactly_once(spec, tmp_path)
    assert not dead and summary.ooms > 0 and summary.operators["embed"]["ooms"] > 0


def test_emulated_oom_of_a_single_item_is_dead_lettered(ray_cluster, tmp_path):
    spec = small_pipeline(12, embed_device="gpu", embed_batch=4, regimes="short:12")
    summary = run_pipeline(spec, tmp_path, settings=RunnerSettings(device_memory_bytes=105 * MIB))
    data, dead = assert_exactly_once(spec, tmp_path)
    rows = [r for f in (tmp_path / "dead_letter").glob("*.parquet") for r in pq.read_table(f).to_pylist()]
    assert dead and all(r["operator"] == "embed" and r["error"].startswith("OOM") and r["attempts"] == 3 for r in rows)
    # dropped rows never reach embed, so they are written; every row embed saw is dead-lettered
    assert summary.items_written + summary.items_dead_lettered == 12 and summary.items_written == summary.items_dropped


def test_slow_last_operator_keeps_queues_under_the_byte_bound(ray_cluster, tmp_path):
    spec = small_pipeline(400, embed_batch=4, time_scale=1.0, regimes="short:400")
    bound = 6000
    settings = RunnerSettings(queue_max_items=10_000, queue_max_bytes=bound)
    handle = start_runner(spec, tmp_path, name="rt-bp", namespace="rt", settings=settings)
    peak = {"parse": 0, "filter": 0, "embed": 0}
    while True:
        state = ray.get(handle.state.remote())
        for op in state.operators:
            peak[op.name] = max(peak[op.name], op.queue_bytes)
        if state.finished:
            break
        time.sleep(0.02)
    _stop(handle)
    assert max(peak.values()) <= bound, peak
    assert peak["embed"] > bound / 3, f"the slow operator's queue filled up to its bound: {peak}"
    assert_exactly_once(spec, tmp_path)
    assert input_ids(spec)


def test_splitter_children_are_written_once_and_account_for_their_source(ray_cluster, tmp_path):
    from trident_flows.core.types import OpConfig
    from trident_flows.pipelines.emulated import Stage, emulated_pipeline
    from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile

    profile = PipelineProfile("split-test", (
        OperatorCost("decode", {"cpu": DeviceCost(per_item_s=0.001)}),
        OperatorCost("scenes", {"cpu": DeviceCost(per_item_s=0.001)}, selectivity=2.5),
        OperatorCost("embed", {"cpu": DeviceCost(per_item_s=0.001)}),
    ))
    child = "item-0000003/1"
    stages = [Stage("decode", OpConfig.make("cpu", batch_size=4)), Stage("scenes", OpConfig.make("cpu", batch_size=4)),
              Stage("embed", OpConfig.make("cpu", batch_size=8), params={"fail_ids": (child,)})]
    spec = emulated_pipeline(profile, stages, items=40)
    summary = run_pipeline(spec, tmp_path)
    data, dead = read_ids(tmp_path)
    assert dead == [child] and len(data) == len(set(data)) and 80 <= len(data) + len(dead) <= 120
    assert all(i.rsplit("/", 1)[0] in set(input_ids(spec)) for i in data + dead)
    assert summary.items_written == 40 and summary.items_missing == 0 and summary.duplicate_ids == 0
