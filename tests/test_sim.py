"""The simulator against hand-computed cases: one operator's throughput, a queue filling up
(backpressure) and growing with large pools, an OOM retried with split, a cold start delaying capacity, node loss, the rows a
filter or splitter picks (the emulated operators' own), the
cluster spec, and the unchanged policies running on it."""

from __future__ import annotations

import json

import pytest

from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerSettings
from trident_flows.core.types import CPU, GPU, ClusterSpec, OpConfig, OperatorPlan, Outcome, Plan, ReplicaGroup, StepKind, Transition, TransitionStep
from trident_flows.pipelines.emulated import Stage, emulated_pipeline
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.scheduler.policies import make_policy
from trident_flows.sim.actor_start import ActorStart, NodeStarts
from trident_flows.sim.call_cost import CallCost
from trident_flows.sim.clock import EventQueue
from trident_flows.sim.cluster import SimCluster, parse_cluster
from trident_flows.sim.driver import simulate
from trident_flows.sim.runner import SimRunner
from trident_flows.sim.tick_clock import SimClock

# the hand-computed cases below leave actor start-up and the emulated call's own cost out
FREE_START = ActorStart(latency_s=0.0, cpu_s=0.0)
NO_CALL_COST = CallCost.none()


def _pipeline(ops: list[tuple[str, dict[str, DeviceCost], float]], stages: list[Stage], items: int):
    profile = PipelineProfile("hand", tuple(OperatorCost(n, d, s) for n, d, s in ops), workloads={"default": {}})
    return emulated_pipeline(profile, stages, items=items)


def _run_to_end(runner: SimRunner, step: float = 0.5) -> None:
    runner.start()
    while not runner.finished:
        runner.run_until(runner.now + step)


def test_single_operator_throughput_is_batches_times_service_time() -> None:
    # 40 items, batch 4, 0.1 s per item: 10 batches of 0.4 s on one replica = 4.0 s; two replicas: 2.0 s
    cost = {CPU: DeviceCost(per_item_s=0.1)}
    for replicas, expected in ((1, 4.0), (2, 2.0)):
        spec = _pipeline([("work", cost, 1.0)], [Stage("work", OpConfig.make(CPU, batch_size=4), replicas)], 40)
        runner = SimRunner(spec, ClusterSpec.single_node(4), actor_start=FREE_START, call_cost=NO_CALL_COST)
        _run_to_end(runner)
        state = runner.state()
        assert runner.inputs_done == 40 and runner.rows_written == 40
        assert state.wall_s == pytest.approx(expected, abs=1e-6)
        assert state.operators[0].busy_fraction == pytest.approx(1.0, abs=1e-6)
        samples = runner.samples(0).samples
        assert len(samples) == 10 and all(s.busy_s == pytest.approx(0.4) and s.items_in == 4 for s in samples)


def test_an_emulated_call_adds_its_working_set_fill_or_its_device_round_trip() -> None:
    # batch of 4 items, 0.1 s and 1 MiB each: a CPU batch holds 4 MiB, filled at 0.01 s/MiB after a 1 ms call:
    # 0.4 + 0.001 + 0.04 = 0.441 s, 10 batches on one replica 4.41 s; on a GPU: 0.4 s kernel + 5 ms round trip
    cost = CallCost(cpu_call_s=0.001, fill_s_per_byte=0.01 / 2**20, device_call_s=0.005)
    for device, batch_s in ((CPU, 0.441), (GPU, 0.405)):
        spec = _pipeline([("work", {device: DeviceCost(per_item_s=0.1, per_item_bytes=2**20)}, 1.0)],
                         [Stage("work", OpConfig.make(device, batch_size=4))], 40)
        runner = SimRunner(spec, ClusterSpec.single_node(4, 1, gpu_memory_bytes=2**30), actor_start=FREE_START, call_cost=cost)
        _run_to_end(runner)
        assert [s.busy_s for s in runner.samples(0).samples] == [pytest.approx(batch_s)] * 10
        assert runner.state().wall_s == pytest.approx(10 * batch_s)


def test_queue_fills_and_backpressure_holds_a_fast_operator_to_the_slow_ones_pace() -> None:
    # fast (0.01 s/item) feeds slow (1 s/item) through a queue bounded at 8 items: the queue fills,
    # never exceeds 8, and from then on fast takes items at slow's pace (1 item/s), not at 100/s
    spec = _pipeline([("fast", {CPU: DeviceCost(per_item_s=0.01)}, 1.0), ("slow", {CPU: DeviceCost(per_item_s=1.0)}, 1.0)],
                     [Stage("fast", OpConfig.make(CPU, batch_size=1)), Stage("slow", OpConfig.make(CPU, batch_size=1))], 200)
    runner = SimRunner(spec, ClusterSpec.single_node(4), settings=RunnerSettings(queue_max_items=8), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    peak = 0
    for k in range(1, 101):
        runner.run_until(k * 0.1)
        peak = max(peak, runner.state().operator("slow").queue_items)
    fast_at_10 = runner.state().operator("fast").items_in
    runner.run_until(30.0)
    state = runner.state()
    assert peak <= 8 and state.operator("slow").queue_items >= 6
    assert fast_at_10 <= 8 + 10 + 2 + 2  # queue + slow's items done + slow's in flight + fast's reservation
    assert state.operator("fast").items_in - fast_at_10 == pytest.approx(20, abs=2)  # 20 s at slow's 1 item/s
    assert state.operator("slow").items_in == pytest.approx(30, abs=1)


def test_a_large_pool_is_not_starved_by_a_fixed_queue_bound() -> None:
    # 64 producers feed 64 consumers (1 s per item each) through queues whose fixed bound is 8 items: a
    # bound of 8 would let only 8 producer batches be in flight (their outputs are reserved against it),
    # 8 items/s and 80 s for 640 items; the bound grows with the pools, so both run 64 at once: ~11 s
    cost = {CPU: DeviceCost(per_item_s=1.0)}
    spec = _pipeline([("produce", cost, 1.0), ("consume", cost, 1.0)],
                     [Stage("produce", OpConfig.make(CPU, batch_size=1), 64), Stage("consume", OpConfig.make(CPU, batch_size=1), 64)], 640)
    runner = SimRunner(spec, ClusterSpec.single_node(128), settings=RunnerSettings(queue_max_items=8), actor_start=FREE_START,
                       call_cost=NO_CALL_COST)
    _run_to_end(runner)
    assert runner.rows_written == 640
    assert runner.state().wall_s == pytest.approx(11.0, abs=1.0)


def test_oom_is_retried_with_split_until_the_halves_fit() -> None:
    # 300 bytes per item on a 1000-byte device: a batch of 8 (2400 B) and its halves of 4 (1200 B)
    # run out of memory (3 OOMs); the quarters of 2 (600 B) fit: every item written, none lost
    cost = {GPU: DeviceCost(per_item_s=0.1, per_item_bytes=300)}
    spec = _pipeline([("model", cost, 1.0)], [Stage("model", OpConfig.make(GPU, batch_size=8, gpus=1.0))], 8)
    cluster = ClusterSpec.single_node(4, 1, gpu_memory_bytes=1000)
    runner = SimRunner(spec, cluster, actor_start=FREE_START, call_cost=NO_CALL_COST)
    _run_to_end(runner, 0.1)
    samples = runner.samples(0).samples
    assert runner.ooms == 3 and runner.state().operator("model").ooms == 3
    assert [s.items_in for s in samples if s.outcome == Outcome.OOM] == [8, 4, 4]
    assert sorted(s.items_in for s in samples if s.outcome == Outcome.OK) == [2, 2, 2, 2]
    assert runner.inputs_done == 8 and runner.inputs_dead == 0
    assert runner.state().wall_s == pytest.approx(0.8 + 3 * 0.002, abs=1e-6)


def test_an_item_that_never_fits_is_dead_lettered_after_max_attempts() -> None:
    cost = {GPU: DeviceCost(per_item_s=0.1, per_item_bytes=2000)}
    spec = _pipeline([("model", cost, 1.0)], [Stage("model", OpConfig.make(GPU, batch_size=1, gpus=1.0))], 1)
    runner = SimRunner(spec, ClusterSpec.single_node(4, 1, gpu_memory_bytes=1000), settings=RunnerSettings(max_attempts=3),
                       actor_start=FREE_START, call_cost=NO_CALL_COST)
    _run_to_end(runner, 0.1)
    assert runner.ooms == 3 and runner.inputs_dead == 1 and runner.inputs_done == 1


def test_cold_start_delays_the_new_capacity() -> None:
    # 1 s per item; a second replica requested at t=0 has a 5 s cold start: the apply takes 5 s,
    # and by t=10 replica 1 has done 10 items and replica 2 (serving from t=5) 5: 15 in all
    cost = {CPU: DeviceCost(per_item_s=1.0, cold_start_s=5.0)}
    config = OpConfig.make(CPU, batch_size=1)
    spec = _pipeline([("work", cost, 1.0)], [Stage("work", config)], 100)
    runner = SimRunner(spec, ClusterSpec.single_node(4), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    t0 = runner.now
    assert t0 == pytest.approx(5.0)  # the initial replica's own cold start
    report = runner.apply(Plan((OperatorPlan("work", (ReplicaGroup(config, 2),)),)))
    assert report.ok and report.seconds == pytest.approx(5.0)
    runner.run_until(t0 + 10.0)
    assert runner.inputs_done == 15
    assert runner.reconfigurations == 1 and len(runner.state().operator("work").active) == 2


def test_actor_starts_requested_together_share_the_nodes_cores() -> None:
    # 4 initial replicas on a node whose actors start on 2 cores, 1 CPU s of start-up each: they share
    # the cores (0.5 CPU s per second each) and finish start-up at t=2; + 0.5 s latency + a 1 s
    # constructor: all warm at t=3.5, and each reports that cold start (what trident prices a new
    # replica at). One replica added later starts alone: 1 + 0.5 + 1 = 2.5 s.
    cost = {CPU: DeviceCost(per_item_s=0.1, cold_start_s=1.0)}
    config = OpConfig.make(CPU, batch_size=1)
    spec = _pipeline([("work", cost, 1.0)], [Stage("work", config, 4)], 1000)
    runner = SimRunner(spec, ClusterSpec.single_node(8), actor_start=ActorStart(latency_s=0.5, cpu_s=1.0, host_cores=2))
    runner.start()
    assert runner.now == pytest.approx(3.5)
    assert [r.cold_start_s for r in runner.state().operator("work").replicas] == [pytest.approx(3.5)] * 4
    report = runner.apply(Plan((OperatorPlan("work", (ReplicaGroup(config, 5),)),)))
    assert report.ok and report.seconds == pytest.approx(2.5)
    # without host_cores, a node of 8 CPUs starts the 4 on its own cores: 1 + 0.5 + 1 = 2.5 s
    runner = SimRunner(spec, ClusterSpec.single_node(8), actor_start=ActorStart(latency_s=0.5, cpu_s=1.0))
    runner.start()
    assert runner.now == pytest.approx(2.5)


def test_an_actor_start_arriving_midway_shares_the_cores_from_then_on() -> None:
    # one core, 1 CPU s each: A alone from t=0, B from t=0.5. A has 0.5 left at 0.5, both progress at
    # 0.5/s: A done at 1.5; B has 0.5 left then, alone again: done at 2.0
    events = EventQueue()
    starts = NodeStarts(events, cores=1.0, cpu_s=1.0)
    done: dict[str, float] = {}
    starts.begin("A", lambda: done.setdefault("A", events.now))
    events.run_until(0.5)
    starts.begin("B", lambda: done.setdefault("B", events.now))
    events.run_until(10.0)
    assert done == {"A": pytest.approx(1.5), "B": pytest.approx(2.0)}


def _two_work_replicas_streaming(cpus: int) -> SimRunner:
    """400 items through one operator of 2 replicas at batch 4 on a node of ``cpus`` CPUs, 2 s into the run."""
    cost = {CPU: DeviceCost(per_item_s=0.05, cold_start_s=1.0)}
    spec = _pipeline([("work", cost, 1.0)], [Stage("work", OpConfig.make(CPU, batch_size=4), 2)], 400)
    runner = SimRunner(spec, ClusterSpec.single_node(cpus), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    runner.run_until(runner.now + 2.0)
    return runner


def test_rolling_replace_keeps_every_item() -> None:
    runner = _two_work_replicas_streaming(4)
    report = runner.apply(Plan((OperatorPlan("work", (ReplicaGroup(OpConfig.make(CPU, batch_size=8, cpus=0.5), 2),)),)))
    # 2 CPUs are free: both new replicas start (one step), then both old ones drain and retire
    assert report.ok and [(s["kind"], s["count"]) for s in report.steps_done] == [("start", 2), ("retire", 2)]
    assert report.steps_done[0]["seconds"] == pytest.approx(1.0)
    while not runner.finished:
        runner.run_until(runner.now + 1.0)
    assert runner.inputs_done == 400 and runner.inputs_dead == 0
    assert {r.config.batch_size for r in runner.state().operator("work").active} == {8}


def test_a_batch_size_change_resizes_in_place_and_the_next_batches_take_the_new_size() -> None:
    runner = _two_work_replicas_streaming(2)
    before = {r.replica_id for r in runner.state().operator("work").active}
    epoch = runner.state().operator("work").config_epoch
    report = runner.apply(Plan((OperatorPlan("work", (ReplicaGroup(OpConfig.make(CPU, batch_size=8), 2),)),)))
    # the node is full, but no replica restarts: the same two take batches of 8 at once
    assert report.ok and [(s["kind"], s["count"]) for s in report.steps_done] == [("resize", 2)]
    assert report.seconds == 0.0
    work = runner.state().operator("work")
    assert {r.replica_id for r in work.active} == before and {r.config.batch_size for r in work.active} == {8}
    assert work.config_epoch > epoch
    seen = runner.samples().samples
    while not runner.finished:
        runner.run_until(runner.now + 1.0)
    later = runner.samples().samples[len(seen):]
    assert later and all(s.items_in <= s.config.batch_size for s in later)
    assert max(s.items_in for s in later) == 8
    assert runner.inputs_done == 400 and runner.inputs_dead == 0


def test_each_retired_replica_leaves_when_its_own_batches_are_back() -> None:
    # 3 replicas, batch 1, 1 s per item, 5 items at t=0: r0 and r1 get 2 batches each (busy until t=2), r2 one
    # (until t=1). Retiring 2 at t=0.5 drains the least loaded: r2 (leaves at t=1, its CPU free from then on,
    # as the live rollout releases each victim) and one of r0/r1 (leaves at t=2). Replica-seconds at t=2:
    # the survivor 2 + 1 + 2 = 5 (held until the slowest victim drained, it would be 6).
    cost = {CPU: DeviceCost(per_item_s=1.0)}
    config = OpConfig.make(CPU, batch_size=1)
    spec = _pipeline([("work", cost, 1.0)], [Stage("work", config, 3)], 5)
    runner = SimRunner(spec, ClusterSpec.single_node(3), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    runner.run_until(0.5)
    free_cpus_at_1_5: list[float] = []
    runner.events.at(1.5, lambda: free_cpus_at_1_5.append(runner.cluster.nodes[0].free_cpus))
    report = runner.apply(Plan((OperatorPlan("work", (ReplicaGroup(config, 1),)),)))
    assert report.ok and [(s["kind"], s["count"]) for s in report.steps_done] == [("retire", 2)]
    assert report.steps_done[0]["seconds"] == pytest.approx(1.5) and "r2" in report.steps_done[0]["replicas"]
    assert free_cpus_at_1_5 == [pytest.approx(1.0)]  # r2's CPU, back while the other victim still drains
    assert runner.replica_seconds()["work"] == pytest.approx(5.0)
    while not runner.finished:
        runner.run_until(runner.now + 0.5)
    assert runner.inputs_done == 5 and runner.cluster.nodes[0].free_cpus == pytest.approx(2.0)


def test_a_retired_replica_stopped_past_the_drain_timeout_gives_its_batches_back() -> None:
    # 2 replicas, batch 1, 1,000 s per item, 3 items: retiring one at t=1 waits RETIRE_TIMEOUT_S (600 s) for its batch,
    # then stops it as live does; its item goes back to the queue and the survivor does it: all 3 done, none dead-lettered
    from trident_flows.sim.rollout import RETIRE_TIMEOUT_S

    cost = {CPU: DeviceCost(per_item_s=1000.0)}
    config = OpConfig.make(CPU, batch_size=1)
    spec = _pipeline([("work", cost, 1.0)], [Stage("work", config, 2)], 3)
    runner = SimRunner(spec, ClusterSpec.single_node(2), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    runner.run_until(1.0)
    report = runner.apply(Plan((OperatorPlan("work", (ReplicaGroup(config, 1),)),)))
    assert report.ok and report.steps_done[0]["seconds"] == pytest.approx(RETIRE_TIMEOUT_S)
    runner.run_until(runner.now + 5000.0)  # the last item needs 1,000 s after the stop
    assert runner.finished and runner.inputs_done == 3 and runner.inputs_dead == 0 and runner.counters[0].errors == 0


def test_node_loss_requeues_work_and_replaces_replicas() -> None:
    cost = {CPU: DeviceCost(per_item_s=0.1)}
    spec = _pipeline([("work", cost, 1.0)], [Stage("work", OpConfig.make(CPU, batch_size=2), 3)], 200)
    cluster = parse_cluster("2x(cpus=2)")
    runner = SimRunner(spec, cluster, node_loss=((3.0, 0),), actor_start=ActorStart(latency_s=0.5, cpu_s=0.0), call_cost=NO_CALL_COST)
    _run_to_end(runner)
    assert runner.inputs_done == 200 and runner.inputs_dead == 0
    assert not runner.cluster.nodes[0].alive
    # 3 replicas placed first-fit (2 on node 0, 1 on node 1); after the loss only node 1's 2 CPUs are left
    assert len(runner.state().operator("work").active) == 3
    assert sum(1 for r in runner.pools[0].replicas.values() if r.placement is not None) == 2


def test_replicas_go_where_the_live_runtime_places_them() -> None:
    # runtime.node_placement.NodePlacer.choose: a CPU replica goes to a node without GPUs first, then to the
    # node with the most free CPUs (ties: the lowest index); a GPU replica needs a free device as well
    cluster = SimCluster(parse_cluster("1x(cpus=4,gpus=1,gpu_mem=1GiB)+2x(cpus=4)"))
    cpu, gpu = OpConfig.make(CPU, batch_size=1), OpConfig.make(GPU, batch_size=1)
    nodes = [cluster.place(cpu, f"c{k}", 0, 0).node.index for k in range(9)]
    assert nodes == [1, 2, 1, 2, 1, 2, 1, 2, 0]  # spread over the CPU-only nodes, then the GPU node
    assert cluster.place(gpu, "g0", 0, 0).node.index == 0
    assert cluster.place(gpu, "g1", 0, 0) is None  # its one device is taken
    # no room: the replica waits pinned to the node with the most free CPUs, and only that node's room places it
    full = SimCluster(parse_cluster("2x(cpus=2)"))
    held = [full.place(cpu, f"c{k}", 0, 0) for k in range(4)]
    assert full.place(cpu, "late", 0, 0) is None
    pinned = full.pin(cpu)
    assert pinned.index == 0
    full.release(held[1], "c1", cpu, 0)  # c1 ran on node 1
    assert held[1].node.index == 1 and full.place(cpu, "late", 0, 0, only=pinned) is None
    full.release(held[0], "c0", cpu, 0)
    assert full.place(cpu, "late", 0, 0, only=pinned).node is pinned


def test_a_cpu_replica_leaves_a_cpu_beside_every_free_gpu() -> None:
    # as NodePlacer.choose: node 0 has 2 free CPUs and 2 free GPUs, node 1 one free CPU and its GPUs taken;
    # a CPU replica on node 0 (the most free CPUs) would leave one CPU for two GPU replicas
    cluster = SimCluster(parse_cluster("2x(cpus=4,gpus=2,gpu_mem=1GiB)"))
    cpu, gpu = OpConfig.make(CPU, batch_size=1), OpConfig.make(GPU, batch_size=1)
    zero, one = cluster.nodes
    for k, (config, node) in enumerate([(gpu, one), (gpu, one), (cpu, one), (cpu, zero), (cpu, zero)]):
        assert cluster.place(config, f"r{k}", 0, 0, only=node).node is node
    assert cluster.place(cpu, "c", 0, 0).node is one
    assert [cluster.place(gpu, f"g{k}", 0, 0).node for k in range(2)] == [zero, zero]


def test_an_apply_blocks_the_ticks_and_a_start_no_node_has_room_for_fails_at_once() -> None:
    # as live: ControlLoop waits tick_s after each tick and its apply blocks it until the steps are done. The
    # initial replicas are warm at t=20 (20 s constructors); the tick at t=21 adds a replica, warm at t=41; the
    # next tick comes tick_s after the apply returned (t=42), then every second
    config = OpConfig.make(CPU, batch_size=1)
    spec = _pipeline([("work", {CPU: DeviceCost(per_item_s=0.01, cold_start_s=20.0)}, 1.0)], [Stage("work", config, 2)], 100000)
    seen: list[float] = []

    class AskOnce:
        name = "ask-once"

        def decide(self, state, samples):
            seen.append(state.wall_s)
            return Decision.roll_out(Plan((OperatorPlan("work", (ReplicaGroup(config, 3),)),)), "grow") if len(seen) == 1 else Decision.no_change()

    run = simulate(spec, ClusterSpec.single_node(4), AskOnce(), duration_s=45.5, tick_s=1.0, actor_start=FREE_START, call_cost=NO_CALL_COST)
    assert [round(t) for t in seen] == [21, 42, 43, 44, 45]
    assert run.runner.apply_reports[0].seconds == pytest.approx(20.0) and run.summary["reconfigurations"] == 1
    # a START no node has room for, while no replica drains, fails at once (as runtime.rollout.Rollout._start):
    # waiting out warm_timeout_s held the control loop, and on a fixed cluster nothing else makes room
    spec = _pipeline([("work", {CPU: DeviceCost(per_item_s=0.01)}, 1.0)], [Stage("work", config, 2)], 100000)
    runner = SimRunner(spec, ClusterSpec.single_node(2), settings=RunnerSettings(warm_timeout_s=20.0), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    report = runner.apply(Transition((TransitionStep(StepKind.START, "work", config, 1),)))
    assert report.seconds == 0.0 and "no node has room for 1 of 1 cpu/b1 replica(s)" in report.error
    assert runner.now == 0.0 and runner.reconfigurations == 0 and len(runner.pools[0].replicas) == 2


def test_a_decision_costs_the_clock_its_cpu_seconds_times_the_hosts_slowdown_or_the_fixed_charge() -> None:
    spec = _pipeline([("work", {CPU: DeviceCost(per_item_s=0.01)}, 1.0)], [Stage("work", OpConfig.make(CPU, batch_size=1), 2)], 100000)
    runner = SimRunner(spec, ClusterSpec.single_node(4), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    shared = SimClock(runner, 1.0, 1.0, 1e9, lambda r, done, t: {}, decide_s_per_cpu_s=4.0)
    before = runner.now
    shared.charge(0.25, 0.3)  # a controller sharing its host's cores: 4 s per CPU second
    assert runner.now == pytest.approx(before + 1.0) and shared.tick_ms == [250.0] and shared.tick_wall_ms == [pytest.approx(300.0)]
    fixed = SimClock(runner, 1.0, 1.0, 1e9, lambda r, done, t: {}, tick_charge_s=0.1, decide_s_per_cpu_s=4.0)
    fixed.charge(0.25, 0.3)
    assert runner.now == pytest.approx(before + 1.1)
    with pytest.raises(ValueError, match="decide_s_per_cpu_s must be >= 1"):
        simulate(spec, ClusterSpec.single_node(4), None, decide_s_per_cpu_s=0.5)


def test_a_swap_in_place_whose_start_fails_restores_the_retired_replica_and_loses_no_item() -> None:
    # the operator's last replica is retired to make room for its replacement, which cannot start (2 CPUs on a
    # 1-CPU node): the failed apply gives the operator one replica of the config it retired back, as live
    # (runtime.rollout), so the pipeline does not stall with no replica of it
    old, new = OpConfig.make(CPU, batch_size=2), OpConfig.make(CPU, batch_size=2, cpus=2.0)
    spec = _pipeline([("work", {CPU: DeviceCost(per_item_s=0.01)}, 1.0)], [Stage("work", old, 1)], 300)
    runner = SimRunner(spec, ClusterSpec.single_node(1), settings=RunnerSettings(warm_timeout_s=5.0), actor_start=FREE_START,
                       call_cost=NO_CALL_COST)
    runner.start()
    runner.run_until(runner.now + 0.5)
    report = runner.apply(Transition((TransitionStep(StepKind.RETIRE, "work", old, 1, reason="swap"),
                                      TransitionStep(StepKind.START, "work", new, 1))))
    assert not report.ok and [s["kind"] for s in report.steps_done] == ["retire"]
    assert "restored after the failed swap: work: restarted cpu/b2" in report.error
    assert [r.config for r in runner.state().operator("work").replicas] == [old]
    while not runner.finished:
        runner.run_until(runner.now + 1.0)
    assert runner.inputs_done == 300 and runner.inputs_dead == 0


def test_a_policy_that_raises_is_logged_and_the_simulated_run_goes_on(tmp_path) -> None:
    # the failure rule of every loop (loop.TickLoop): an error line, the samples offered again next tick, no abort
    config = OpConfig.make(CPU, batch_size=4)
    spec = _pipeline([("work", {CPU: DeviceCost(per_item_s=0.01)}, 1.0)], [Stage("work", config, 1)], 2000)
    offered: list[int] = []

    class FailsAtFirst:
        name = "fails-at-first"

        def decide(self, state, samples):
            offered.append(len(samples))
            if len(offered) == 1:
                raise RuntimeError("model fit failed")
            return Decision.roll_out(Plan((OperatorPlan("work", (ReplicaGroup(config, 2),)),), reason="grow"), "grow") if len(offered) == 2 \
                else Decision.no_change()

    log = tmp_path / "d.jsonl"
    run = simulate(spec, ClusterSpec.single_node(4), FailsAtFirst(), tick_s=1.0, decision_log=log, actor_start=FREE_START,
                   call_cost=NO_CALL_COST)
    s = run.summary
    assert s["items_written"] == 2000 and s["tick_errors"] == 1 and s["decisions"] == 1 and s["reconfigurations"] == 1
    assert run.errors == [{"sim_t": 1.0, "error": "policy failed: RuntimeError: model fit failed"}]
    assert offered[1] > offered[0] > 0  # the first tick's samples were offered again with the second's
    assert [d["reason"] for d in run.decisions] == ["grow"] and run.decisions[0]["sim_t"] == pytest.approx(2.0, abs=0.05)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [("error" in line, line["tick"]) for line in lines] == [(True, 1), (False, 2)] and lines[1]["outcome"]["status"] == "landed"


def test_a_retire_that_makes_room_frees_the_node_where_the_next_start_fits() -> None:
    # two nodes of 2 CPUs + 1 GPU: g holds node 0's GPU and a CPU, c runs once there and twice on node 1. A GPU
    # replica needs its CPU beside a free GPU, so retiring the c on node 0 (the pool's least loaded) would leave the
    # start waiting out the warm timeout; the c retired is one on node 1, and the start lands at once
    cpu, gpu = OpConfig.make(CPU, batch_size=1), OpConfig.make(GPU, batch_size=1)
    spec = _pipeline([("g", {GPU: DeviceCost(per_item_s=0.01)}, 1.0), ("c", {CPU: DeviceCost(per_item_s=0.01)}, 1.0)],
                     [Stage("g", gpu, 1), Stage("c", cpu, 3)], 100000)
    runner = SimRunner(spec, parse_cluster("2x(cpus=2,gpus=1,gpu_mem=1GiB)"), settings=RunnerSettings(warm_timeout_s=20.0),
                       actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    runner.run_until(1.0)
    c = runner.pools[1]
    assert runner.pools[0].active(canary=False)[0].placement.node.index == 0
    assert c.choose_retire(cpu, 1, canary=False)[0].placement.node.index == 0  # the pool's own choice: the wrong node
    report = runner.apply(Transition((TransitionStep(StepKind.RETIRE, "c", cpu, 1), TransitionStep(StepKind.START, "g", gpu, 1))))
    assert report.error == "" and report.seconds < 1.0
    assert sorted(r.placement.node.index for r in c.active(canary=False)) == [0, 1]
    assert sorted(r.placement.node.index for r in runner.pools[0].active(canary=False)) == [0, 1]


def test_parse_cluster_spec() -> None:
    spec = parse_cluster("8x(cpus=96,gpus=8,gpu_mem=80GiB,host_device=32GBps)+2x(cpus=32,host_mem=256GiB,nic=100Gbps,name=cpu)")
    assert spec.total_cpus == 8 * 96 + 64 and spec.total_gpus == 64
    assert spec.node_classes[0].gpu_memory_bytes == 80 * 2**30 and spec.node_classes[1].name == "cpu"
    assert spec.node_classes[0].host_device_bandwidth_bps == pytest.approx(32e9) and spec.node_classes[0].nic_bandwidth_bps == 0
    assert spec.node_classes[1].nic_bandwidth_bps == pytest.approx(100e9 / 8) and spec.node_classes[1].host_device_bandwidth_bps == 0
    with pytest.raises(ValueError, match=r"'net' is ambiguous; write nic=100Gbps .* or host_device=100Gbps"):
        parse_cluster("2x(cpus=8,net=100Gbps)")
    with pytest.raises(ValueError, match=r"nic='fast' is not a rate; write e.g. 100Gbps"):
        parse_cluster("2x(cpus=8,nic=fast)")
    with pytest.raises(ValueError, match="gpu_mem"):
        parse_cluster("2x(cpus=8,gpus=1)")
    with pytest.raises(ValueError, match="COUNTx"):
        parse_cluster("eight nodes")


@pytest.mark.parametrize("name", ["ds2", "threshold", "trident"])
def test_policies_run_unchanged_on_the_simulator(name: str) -> None:
    from trident_flows.pipelines import build_pipeline

    spec = build_pipeline("emulated-docs", synth=400, seed=1, regimes="short:200,scans:200")
    cluster = ClusterSpec.single_node(16, 2, gpu_memory_bytes=8 * 2**30)
    run = simulate(spec, cluster, make_policy(name, spec=spec, cluster=cluster), tick_s=1.0)
    s = run.summary
    assert s["simulated"] and s["items_missing"] == 0 and s["items_in_flight"] == 0
    assert s["items_written"] + s["items_dead_lettered"] == 400
    assert len(run.tick_ms) >= 3 and s["wall_s"] > 0
    # the ticks' wall time is charged: the simulated run is at least as long as the ticks took
    assert s["wall_s"] >= sum(run.tick_ms) / 1e3


@pytest.mark.parametrize("selectivity", [0.6, 2.5])
def test_filters_and_splitters_pick_the_rows_the_emulated_operators_pick(selectivity: float) -> None:
    # the emulated operators hash (operator, id); the simulator carries ids as numbers and must
    # drop, and split, the very same rows: which rows survive decides how later batches are made
    import numpy as np

    from trident_flows.pipelines.emulated import EmulatedOperator
    from trident_flows.runtime.spec import DROP, ID
    from trident_flows.sim.ids import id_columns
    from trident_flows.sim.operator import SimOperator
    from trident_flows.sim.workload import ID_CRC, ID_LEN, Stream

    cost = OperatorCost("pick", {CPU: DeviceCost()}, selectivity)
    ids = [f"item-{k:07d}" for k in range(200)]
    live = EmulatedOperator(OpConfig.make(CPU), name="pick", cost=cost)({ID: np.array(ids, dtype=object)})
    kept = [i for i, d in zip(live[ID], live[DROP]) if not d]
    stream = Stream.from_rows([{ID: i} for i in ids], ())
    passed, dropped = SimOperator(cost, ()).route(stream.take(200))
    assert len(passed) + len(dropped) == len(live[ID])
    crc, length = id_columns(kept)
    assert passed[:, ID_CRC].tolist() == crc.tolist() and passed[:, ID_LEN].tolist() == length.tolist()


def test_a_gpu_start_whose_free_cpu_and_gpu_sit_on_different_nodes_moves_a_cpu_replica_first() -> None:
    # 2 nodes of 2 CPUs + 1 GPU: after a GPU replica gave way to a CPU one and a CPU replica left, node 0 has a free
    # CPU and node 1 a free GPU, so the class's totals have room for a GPU replica (1 CPU + 1 GPU) no node has: a CPU
    # replica moves from node 1 to node 0 (started there, then retired on node 1) and the GPU replica starts on node 1
    c, g = OpConfig.make(CPU, batch_size=1), OpConfig.make(GPU, batch_size=1)
    spec = _pipeline([("c", {CPU: DeviceCost(per_item_s=0.01)}, 1.0), ("g", {GPU: DeviceCost(per_item_s=0.01)}, 1.0)],
                     [Stage("c", c, 2), Stage("g", g, 2)], 100000)
    runner = SimRunner(spec, parse_cluster("2x(cpus=2,gpus=1,gpu_mem=1GiB)"), actor_start=FREE_START, call_cost=NO_CALL_COST)
    runner.start()
    runner.run_until(1.0)

    def nodes(name: str) -> list[int]:
        return sorted(r.placement.node.index for r in runner.pools[runner.names.index(name)].replicas.values() if not r.dead)

    runner.apply(Transition((TransitionStep(StepKind.RETIRE, "g", g, 1), TransitionStep(StepKind.START, "c", c, 1))))
    runner.apply(Transition((TransitionStep(StepKind.RETIRE, "c", c, 1),)))
    assert (nodes("c"), nodes("g")) == ([1, 1], [0])  # node 0: a free CPU; node 1: a free GPU
    report = runner.apply(Transition((TransitionStep(StepKind.START, "g", g, 1),)))
    assert report.error == "" and report.outcome.status.value == "landed"
    assert [(s["kind"], s["operator"]) for s in report.steps_done] == [("start", "c"), ("retire", "c"), ("start", "g")]
    assert (nodes("c"), nodes("g")) == ([0, 1], [0, 1])
