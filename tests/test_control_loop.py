"""Live control of a running pipeline on real Ray: scale up/down, rolling config change, canary,
sharded input, and refusal of bad settings before anything starts."""

from __future__ import annotations

import json
import time

import pytest
import ray
from test_runtime_support import assert_exactly_once, small_pipeline

from trident_flows.control.launch import start_runner
from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerSettings, RuntimeConfigError
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup, StepKind, Transition, TransitionStep
from trident_flows.runtime.sink import read_ids

B8 = OpConfig.make("cpu", batch_size=8)


def _plan(op: str, *groups: tuple[OpConfig, int], canary: OpConfig | None = None, reason: str = "test") -> Plan:
    return Plan((OperatorPlan(op, tuple(ReplicaGroup(c, n) for c, n in groups), reason=reason, canary=canary),), reason=reason)


def _finish(handle) -> dict:
    ray.get(handle.close_input.remote())
    summary = ray.get(handle.wait.remote(90))
    ray.get(handle.stop.remote())
    ray.kill(handle)
    assert summary["finished"] and not summary["error"], summary
    return summary


def test_scale_up_then_down_with_drain_keeps_exactly_once(ray_cluster, tmp_path):
    spec = small_pipeline(300, time_scale=3.0, regimes="short:300")
    rows = list(spec.source())
    handle = start_runner(spec, tmp_path, name="rt-scale", namespace="rt", external_input=True)
    ray.get(handle.add_shard.remote("s0", rows[:150]))
    up = ray.get(handle.apply.remote(_plan("parse", (B8, 3), reason="parse is the bottleneck")))
    assert up.ok and [s["kind"] for s in up.steps_done] == ["start"] and up.steps_done[0]["count"] == 2
    state = ray.get(handle.state.remote())
    assert len(state.operator("parse").active) == 3 and all(r.warm for r in state.operator("parse").active)
    ray.get(handle.add_shard.remote("s1", rows[150:]))
    down = ray.get(handle.apply.remote(_plan("parse", (B8, 1))))
    assert down.ok and [s["kind"] for s in down.steps_done] == ["retire"] and len(down.steps_done[0]["replicas"]) == 2
    state = ray.get(handle.state.remote())
    assert len(state.operator("parse").replicas) == 1, "retired replicas are drained and gone"
    _finish(handle)
    data, dead = assert_exactly_once(spec, tmp_path)
    assert not dead


def test_rolling_config_change_starts_new_before_draining_old(ray_cluster, tmp_path):
    spec = small_pipeline(400, time_scale=5.0, regimes="short:400")
    rows = list(spec.source())
    handle = start_runner(spec, tmp_path, name="rt-roll", namespace="rt", external_input=True)
    ray.get(handle.add_shard.remote("s0", rows))
    while ray.get(handle.state.remote()).items_written < 40:
        time.sleep(0.05)
    before = ray.get(handle.state.remote()).operator("parse").config_epoch
    b4 = OpConfig.make("cpu", batch_size=4, cpus=0.5)  # other resources: new replicas (a batch size alone is resized in place)
    report = ray.get(handle.apply.remote(_plan("parse", (b4, 2), reason="smaller batches on half a CPU")))
    assert report.ok, report.error
    assert [s["kind"] for s in report.steps_done] == ["start", "retire"]
    assert report.throughput_before > 0 and 0.0 <= report.dip <= 1.0
    state = ray.get(handle.state.remote())
    parse = state.operator("parse")
    assert {r.config for r in parse.replicas} == {b4} and len(parse.replicas) == 2
    assert parse.config_epoch > before
    summary = _finish(handle)
    assert summary["rolling_update_dip"] == report.dip and summary["reconfigurations"] == 1
    assert_exactly_once(spec, tmp_path)


def test_canary_runs_beside_the_pool_and_ends(ray_cluster, tmp_path):
    spec = small_pipeline(300, time_scale=10.0, regimes="short:300")
    rows = list(spec.source())
    handle = start_runner(spec, tmp_path, name="rt-canary", namespace="rt", external_input=True)
    ray.get(handle.add_shard.remote("s0", rows))
    candidate = OpConfig.make("cpu", batch_size=4)
    report = ray.get(handle.apply.remote(_plan("parse", (B8, 1), canary=candidate, reason="try b4")))
    assert [s["kind"] for s in report.steps_done] == ["canary"]
    parse = ray.get(handle.state.remote()).operator("parse")
    canaries = [r for r in parse.replicas if r.canary]
    assert len(canaries) == 1 and canaries[0].config == candidate and len(parse.replicas) == 2
    seen: list = []
    deadline = time.time() + 60  # a replica took 5-25 s to start on a loaded machine
    while time.time() < deadline:
        seen += ray.get(handle.samples.remote(0)).samples
        if any(s.config == candidate for s in seen):
            break
        time.sleep(0.05)
    assert any(s.config == candidate and s.replica_id == canaries[0].replica_id for s in seen), "the canary processed batches"
    ended = ray.get(handle.apply.remote(Transition((TransitionStep(StepKind.END_CANARY, "parse", candidate),))))
    assert ended.ok and [s["kind"] for s in ended.steps_done] == ["end_canary"]
    parse = ray.get(handle.state.remote()).operator("parse")
    assert [r.canary for r in parse.replicas] == [False]
    _finish(handle)
    assert_exactly_once(spec, tmp_path)


def test_shards_are_idempotent_when_re_run(ray_cluster, tmp_path):
    spec = small_pipeline(60)
    rows = list(spec.source())
    handle = start_runner(spec, tmp_path, name="rt-shards", namespace="rt", external_input=True)
    ray.get(handle.add_shard.remote("a", rows[:40]))
    ray.get(handle.add_shard.remote("b", rows[40:]))
    for _ in range(200):
        if ray.get(handle.shard_status.remote("a")).done:
            break
        time.sleep(0.05)
    status = ray.get(handle.shard_status.remote("a"))
    assert status.done and status.items_in == 40 and status.items_written == 40 and status.pending == 0
    ray.get(handle.add_shard.remote("a", rows[:40]))  # re-run: replaces the partition
    _finish(handle)
    data, dead = read_ids(tmp_path)
    assert sorted(data + dead) == sorted(r["id"] for r in rows), "no duplicates after re-running a shard"
    assert sorted(p.name for p in (tmp_path / "data").glob("*.parquet")) == ["shard=a.parquet", "shard=b.parquet"]


def test_bad_settings_are_refused_before_anything_starts(ray_cluster, tmp_path):
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        OpConfig.make("cpu", batch_size=0)
    with pytest.raises(RuntimeConfigError, match="max_attempts"):
        RunnerSettings(max_attempts=0)
    too_many = small_pipeline(10, embed_device="gpu")
    ops = tuple(o if o.name != "embed" else type(o)(o.name, o.cls, o.config, 3, o.params, o.space) for o in too_many.operators)
    spec = type(too_many)(too_many.name, ops, too_many.source, too_many.items)
    with pytest.raises(RuntimeConfigError, match=r"needs 3 GPUs .*'embed'.* cluster has 2"):
        start_runner(spec, tmp_path, name="rt-refused", namespace="rt")
    with pytest.raises(ValueError):
        ray.get_actor("rt-refused", namespace="rt")
    handle = start_runner(small_pipeline(10), tmp_path / "ok", name="rt-validate", namespace="rt", external_input=True)
    with pytest.raises(RuntimeConfigError, match="unknown operator 'ocr'"):
        ray.get(handle.apply.remote(_plan("ocr", (B8, 1))))
    with pytest.raises(RuntimeConfigError, match="needs 3 GPUs but the cluster has 2"):
        ray.get(handle.apply.remote(_plan("embed", (OpConfig.make("gpu", batch_size=8), 3))))
    with pytest.raises(RuntimeConfigError, match="no replicas"):
        ray.get(handle.apply.remote(_plan("parse", (B8, 0))))
    state = ray.get(handle.state.remote())
    assert len(state.operator("parse").replicas) == 1 and state.reconfigurations == 0, "a refused plan changes nothing"
    _finish(handle)


def test_the_control_thread_never_outranks_the_ray_workers_it_steers():
    # the runner actor (the pipeline's dispatcher) runs at Ray's worker niceness; a controller at a
    # higher priority preempted it on every tick
    import os
    import threading

    from trident_flows.control.loop import yield_to_ray_workers

    seen = {}

    def body():
        yield_to_ray_workers()
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen["nice"] >= int(os.environ.get("RAY_worker_niceness", "15"))
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < seen["nice"]  # only the control thread yields


class _FailsOnce:
    """A test policy that raises at its first call and records the first sample it is offered at each call."""

    name = "fails-once"

    def __init__(self) -> None:
        self.first_samples: list = []

    def decide(self, state, samples):
        self.first_samples.append(samples[0] if samples else None)
        if len(self.first_samples) == 1:
            raise RuntimeError("the policy failed")
        return Decision.no_change()


def test_a_failing_tick_keeps_the_sample_cursor_so_the_next_tick_is_offered_the_same_samples(ray_cluster, tmp_path):
    from trident_flows.control.loop import ControlLoop

    spec = small_pipeline(100, regimes="short:100")
    handle = start_runner(spec, tmp_path, name="rt-cursor", namespace="rt", external_input=True)
    ray.get(handle.add_shard.remote("s0", list(spec.source())))
    deadline = time.time() + 60
    while not ray.get(handle.samples.remote(0)).samples and time.time() < deadline:
        time.sleep(0.2)
    policy = _FailsOnce()
    log = tmp_path / "decisions.jsonl"
    loop = ControlLoop(handle, policy, decision_log=log)
    failed = loop.tick()
    assert failed.error == "policy failed: RuntimeError: the policy failed" and loop.loop_state.cursor == 0
    assert not loop.tick().finished and loop.loop_state.cursor > 0  # the run is still open (its input is not closed)
    assert [json.loads(line)["error"] for line in log.read_text().splitlines()] == [failed.error]
    first, second = policy.first_samples
    assert first is not None and second == first  # not lost with the failed tick
    _finish(handle)
