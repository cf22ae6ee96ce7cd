"""Placement MILP, its resource model and transition planning (issue 6). Fast, no Ray."""

from __future__ import annotations

import math

import pytest

from trident_flows.core.types import ClusterSpec, NodeClass, OpConfig, ReplicaGroup, StepKind, TransitionVerdict
from trident_flows.scheduler.placement.milp import PlacementError, solve_placement
from trident_flows.scheduler.placement.model import class_capacity, throughput_of
from trident_flows.scheduler.placement.transition_cost import plan_transition, step_usage
from trident_flows.scheduler.placement.types import CurrentPlacement, GiB, OperatorDemand, PlacementOption

CPU1 = OpConfig.make("cpu", cpus=1)
GPU1 = OpConfig.make("gpu", cpus=1, gpus=1)


def node(cpus: float, gpus: int = 0, gpu_mem_gib: int = 16, bw: float = 0.0) -> ClusterSpec:
    return ClusterSpec((NodeClass("n", 1, cpus, gpus, gpu_mem_gib * GiB if gpus else 0, 64 * GiB, bw),))


def parse(rate: float = 8.0) -> OperatorDemand:
    return OperatorDemand("parse", 1.0, (PlacementOption.from_rate(CPU1, rate, cold_start_s=1.0),))


def embed(*options: PlacementOption, work: float = 1.0) -> OperatorDemand:
    return OperatorDemand("embed", work, options)


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_cpu_and_gpu_operator_share_a_node_hand_computed_optimum(solver):
    # 4 CPUs + 1 GPU. embed on the GPU (1 CPU, 30/s) leaves 3 CPUs for parse (8/s each): T = min(24, 30) = 24.
    # embed on CPUs (2/s each) would give at best min(8k, 2(4-k)) = 6.
    demands = [parse(), embed(PlacementOption.from_rate(CPU1, 2.0), PlacementOption.from_rate(GPU1, 30.0, device_mem_bytes=4 * GiB))]
    res = solve_placement(demands, node(4, 1), solver=solver)
    assert res.throughput == pytest.approx(24.0)
    assert res.status == "optimal"
    assert res.plan.for_operator("parse").replicas == 3
    (g,) = res.plan.for_operator("embed").groups
    assert g.config.device == "gpu" and g.replicas == 1
    assert res.bottlenecks == ("parse",)
    assert res.plan.for_operator("parse").reason.startswith("bottleneck")


def test_work_per_item_scales_the_demand():
    # 10 chunks per document: embed needs 10x the capacity of parse per input item.
    demands = [parse(100.0), embed(PlacementOption.from_rate(CPU1, 10.0), work=10.0)]
    res = solve_placement(demands, node(11))
    assert res.throughput == pytest.approx(10.0)  # 1 parse (100/s) + 10 embed (100 chunks/s = 10 docs/s)
    assert res.plan.for_operator("embed").replicas == 10


def test_cpu_options_with_a_memory_bound_place_on_nodes_whose_host_memory_is_not_modelled():
    # A cluster given as CPUs/GPUs only (host memory unknown, e.g. `simulate --cluster 1x(cpus=16,gpus=2)`)
    # with CPU options that carry a host memory bound: the bound limits nothing (inf // bound was nan).
    cluster = ClusterSpec((NodeClass("n", 1, 4),))
    demands = [OperatorDemand("parse", 1.0, (PlacementOption.from_rate(CPU1, 8.0, host_mem_bytes=2 * GiB),))]
    res = solve_placement(demands, cluster)
    assert res.plan.for_operator("parse").replicas == 4
    assert res.throughput == pytest.approx(32.0)


def test_diminishing_returns_curve_is_respected():
    curve = PlacementOption(CPU1, ((1, 10.0), (2, 15.0), (4, 18.0)))
    assert curve.rate_at(3) == pytest.approx(16.5)
    assert curve.rate_at(6) == pytest.approx(21.0)  # the last slope continues
    res = solve_placement([OperatorDemand("op", 1.0, (curve,))], node(4))
    assert res.throughput == pytest.approx(18.0)
    with pytest.raises(ValueError, match="concave"):
        PlacementOption(CPU1, ((1, 10.0), (2, 25.0)))


def test_config_whose_device_memory_exceeds_the_gpu_is_never_chosen():
    big = PlacementOption.from_rate(OpConfig.make("gpu", batch_size=64, cpus=1, gpus=1), 100.0, device_mem_bytes=24 * GiB)
    small = PlacementOption.from_rate(OpConfig.make("gpu", batch_size=8, cpus=1, gpus=1), 20.0, device_mem_bytes=8 * GiB)
    res = solve_placement([parse(100.0), embed(big, small)], node(4, 1, gpu_mem_gib=16))
    (g,) = res.plan.for_operator("embed").groups
    assert g.config.batch_size == 8
    assert res.throughput == pytest.approx(20.0)


def test_operator_that_fits_no_device_names_operator_and_resource():
    big = PlacementOption.from_rate(GPU1, 100.0, device_mem_bytes=24 * GiB)
    with pytest.raises(PlacementError, match=r"operator 'embed' fits no device: .*needs 24 GiB GPU memory, largest GPU has 16 GiB"):
        solve_placement([parse(), embed(big)], node(4, 1, gpu_mem_gib=16))
    with pytest.raises(PlacementError, match=r"operator 'embed' fits no device: .*needs a gpu device, the cluster has none"):
        solve_placement([parse(), embed(PlacementOption.from_rate(GPU1, 10.0))], node(4))


def test_minimum_replicas_that_do_not_fit_name_the_resource():
    demands = [OperatorDemand(f"op{i}", 1.0, (PlacementOption.from_rate(OpConfig.make("cpu", cpus=2), 1.0),)) for i in range(3)]
    with pytest.raises(PlacementError, match=r"need at least 6 CPUs, the cluster has 4"):
        solve_placement(demands, node(4))


def test_bandwidth_caps_gpu_throughput():
    # 100 MB per item over 1 GB/s: at most 10 items/s however fast the GPU is.
    gpu = PlacementOption.from_rate(GPU1, 100.0, device_mem_bytes=2 * GiB, bandwidth_bytes_per_item=1e8)
    res = solve_placement([parse(100.0), embed(gpu)], node(4, 1, bw=1e9))
    assert res.throughput == pytest.approx(10.0, rel=1e-6)
    unlimited = solve_placement([parse(100.0), embed(gpu)], node(4, 1, bw=0.0))  # 0 = not modelled
    assert unlimited.throughput == pytest.approx(100.0)


def test_fractional_gpus_pack_by_fraction_and_device_memory():
    quarter = OpConfig.make("gpu", cpus=1, gpus=0.25)
    light = PlacementOption.from_rate(quarter, 10.0, device_mem_bytes=3 * GiB)   # 4 fit on a 16 GiB GPU
    heavy = PlacementOption.from_rate(quarter, 10.0, device_mem_bytes=6 * GiB)   # memory allows only 2
    res = solve_placement([parse(100.0), embed(light)], node(8, 1))
    assert res.throughput == pytest.approx(40.0) and res.plan.for_operator("embed").replicas == 4
    res = solve_placement([parse(100.0), embed(heavy)], node(8, 1))
    assert res.throughput == pytest.approx(20.0) and res.plan.for_operator("embed").replicas == 2
    (g,) = res.plan.for_operator("embed").groups
    assert g.config.gpus == pytest.approx(0.5)  # requested from Ray so two can never share a GPU with a third
    assert "gpus 0.25->0.5" in res.plan.for_operator("embed").reason
    running = CurrentPlacement.from_plan(res.plan)  # the raised fraction still maps to its option
    assert plan_transition([parse(100.0), embed(heavy)], node(8, 1), running, res.plan, 3600).steps == ()


def test_a_running_gpu_config_no_option_offers_maps_to_none_beside_cpu_options():
    # A GPU replica running a config the demand does not offer (e.g. a batch size the policy no longer
    # prices) is "no option", even where the demand lists cpu options: it must not raise.
    demand = embed(PlacementOption.from_rate(CPU1, 2.0), PlacementOption.from_rate(OpConfig.make("gpu", batch_size=16, cpus=1, gpus=0.5), 30.0))
    assert demand.option_index(OpConfig.make("gpu", batch_size=8, cpus=1, gpus=1)) is None
    assert demand.option_index(OpConfig.make("gpu", batch_size=16, cpus=1, gpus=1)) == 1  # the raised fraction
    assert demand.option_index(CPU1) == 0


def test_node_classes_aggregate_and_plans_pack_node_by_node():
    # 3 nodes x 3 CPUs: 2-CPU replicas fit one per node (aggregate 9 CPUs would suggest 4).
    cluster = ClusterSpec((NodeClass("small", 3, 3, host_memory_bytes=8 * GiB),))
    op = OperatorDemand("op", 1.0, (PlacementOption.from_rate(OpConfig.make("cpu", cpus=2), 5.0),))
    res = solve_placement([op], cluster)
    assert res.plan.for_operator("op").replicas == 3 and res.throughput == pytest.approx(15.0)
    many = ClusterSpec((NodeClass("cpu", 200, 32, host_memory_bytes=128 * GiB), NodeClass("gpu", 56, 16, 4, 16 * GiB, 64 * GiB)))
    res = solve_placement([parse(), embed(PlacementOption.from_rate(GPU1, 30.0, device_mem_bytes=4 * GiB))], many)
    assert res.status == "optimal"
    assert res.plan.for_operator("embed").replicas == 224  # every GPU


def test_allowed_node_classes_and_max_replicas_are_limits():
    cluster = ClusterSpec((NodeClass("a", 1, 8), NodeClass("b", 1, 8)))
    op = OperatorDemand("op", 1.0, (PlacementOption.from_rate(CPU1, 1.0),), max_replicas=5, node_classes=("b",))
    res = solve_placement([op], cluster)
    assert [(g.node_class, g.replicas) for g in res.plan.for_operator("op").groups] == [("b", 5)]


# --- transitions -------------------------------------------------------------------

def _scenario(cpus: int = 8):
    cpu_embed = PlacementOption.from_rate(OpConfig.make("cpu", batch_size=4, cpus=1), 2.0, cold_start_s=5.0, drain_s=2.0)
    gpu_embed = PlacementOption.from_rate(GPU1, 30.0, device_mem_bytes=4 * GiB, cold_start_s=60.0, drain_s=2.0)
    demands = [parse(8.0), embed(cpu_embed, gpu_embed)]
    return demands, node(cpus, 1), cpu_embed, gpu_embed


def test_large_gain_rolls_out_with_starts_before_retires():
    # 8 CPUs + 1 GPU, 7 CPUs in use (T = 8). Best: embed 1 GPU + 2 CPU replicas, parse 5: T = min(40, 34) = 34.
    demands, cluster, cpu_embed, _ = _scenario()
    current = CurrentPlacement.from_mapping({"parse": [ReplicaGroup(CPU1, 3, "n")], "embed": [ReplicaGroup(cpu_embed.config, 4, "n")]})
    res = solve_placement(demands, cluster, current)
    tr = plan_transition(demands, cluster, current, res.plan, regime_duration_s=3600)
    assert tr.verdict == TransitionVerdict.ROLL_OUT, tr.reason
    assert res.throughput == pytest.approx(34.0)
    assert tr.expected_gain == pytest.approx(34.0 - 8.0)
    kinds = [(s.kind, s.operator) for s in tr.steps]
    first_embed_retire = kinds.index((StepKind.RETIRE, "embed"))
    assert kinds.index((StepKind.START, "embed")) < first_embed_retire
    assert all(k == StepKind.START for k, _ in kinds[:kinds.index((StepKind.RETIRE, "embed"))])
    assert "roll out" in tr.reason and "interleaved" not in tr.reason
    _assert_limits_hold(demands, cluster, current, tr)


def test_small_gain_over_a_short_regime_waits_with_reason():
    demands, cluster, cpu_embed, _ = _scenario()
    current = CurrentPlacement.from_mapping({"parse": [ReplicaGroup(CPU1, 4, "n")], "embed": [ReplicaGroup(cpu_embed.config, 4, "n")]})
    res = solve_placement(demands, cluster, current)
    tr = plan_transition(demands, cluster, current, res.plan, regime_duration_s=30)  # shorter than the 60 s cold start
    assert tr.verdict == TransitionVerdict.WAIT
    assert "does not pay" in tr.reason and "cost" in tr.reason
    same = plan_transition(demands, cluster, CurrentPlacement.from_plan(res.plan), res.plan, regime_duration_s=3600)
    assert same.verdict == TransitionVerdict.WAIT and same.steps == ()


def test_unchanged_operators_say_so():
    demands, cluster, _, _ = _scenario()
    res = solve_placement(demands, cluster)
    again = solve_placement(demands, cluster, CurrentPlacement.from_plan(res.plan))
    assert all(o.reason.startswith("unchanged") for o in again.plan.operators)


def test_tight_resources_interleave_and_limits_hold_at_every_step():
    # 4 CPUs all in use: embed's GPU replica needs a CPU, so one CPU replica must retire first.
    demands, cluster, cpu_embed, _ = _scenario(cpus=4)
    current = CurrentPlacement.from_mapping({"parse": [ReplicaGroup(CPU1, 2, "n")], "embed": [ReplicaGroup(cpu_embed.config, 2, "n")]})
    res = solve_placement(demands, cluster, current)
    tr = plan_transition(demands, cluster, current, res.plan, regime_duration_s=3600)
    assert tr.verdict == TransitionVerdict.ROLL_OUT
    assert "interleaved" in tr.reason
    assert tr.steps[0].kind == StepKind.RETIRE and "interleaved" in tr.steps[0].reason
    _assert_limits_hold(demands, cluster, current, tr)
    live = {"parse": 2, "embed": 2}
    for s in tr.steps:  # no operator is ever left without a replica
        live[s.operator] += s.count if s.kind == StepKind.START else -s.count
        assert min(live.values()) >= 1
    assert live == {"parse": res.plan.for_operator("parse").replicas, "embed": res.plan.for_operator("embed").replicas}


def _assert_limits_hold(demands, cluster, current, tr):
    caps = {nc.name: class_capacity(nc) for nc in cluster.node_classes}
    for usage in step_usage(demands, cluster, current, tr):
        for c, used in usage.items():
            assert all(u <= cap + 1e-9 for u, cap in zip(used, caps[c])), (c, used, caps[c])


def test_throughput_of_matches_plan():
    demands, cluster, _, _ = _scenario()
    res = solve_placement(demands, cluster)
    assert throughput_of(demands, cluster, res.count_map) == pytest.approx(res.plan.predicted_throughput)


def test_time_limit_returns_a_feasible_plan_with_status_and_gap():
    from benchmarks.placement import make_cluster, make_demands
    from trident_flows.scheduler.placement.model import pack_cluster

    demands, cluster = make_demands(10, seed=9), make_cluster(16)
    res = solve_placement(demands, cluster, time_limit_s=0.01)
    assert res.status in ("optimal", "time_limit")
    assert 0.0 <= res.gap < 0.1
    assert res.plan.reason and f"gap {res.gap:.2g}" in res.plan.reason
    assert all(res.plan.for_operator(d.name).replicas >= 1 for d in demands)
    assert not pack_cluster(demands, cluster, res.count_map)  # fits node by node
    assert throughput_of(demands, cluster, res.count_map) == pytest.approx(res.throughput)


def test_a_blocked_start_retires_just_enough_first_not_every_shrinking_operator():
    # 4 CPUs all in use (parse 3, embed 1 on CPU); the plan: embed on the GPU (needs a CPU), parse 1.
    # The GPU replica must not wait for parse's 2 retirements to drain: one CPU freed is enough to start it.
    from trident_flows.core.step_order import order_steps

    current = {("parse", 0, "n"): 3, ("embed", 0, "n"): 1}
    target = {("parse", 0, "n"): 1, ("embed", 1, "n"): 1}
    usage = {("parse", 0, "n"): (1.0, 0.0), ("embed", 0, "n"): (1.0, 0.0), ("embed", 1, "n"): (1.0, 1.0)}
    phases = order_steps(current, target, {"n": (4.0, 1.0)}, usage.__getitem__, ["embed", "parse"])
    first, second = phases[0], phases[1]
    assert first.kind == StepKind.RETIRE and sum(n for _, n in first.moves) == 1, phases
    assert second.kind == StepKind.START and second.moves == ((("embed", 1, "n"), 1),), phases
    retired = sum(n for p in phases if p.kind == StepKind.RETIRE for k, n in p.moves if k[0] == "parse")
    assert retired == 2


def test_steps_are_ordered_on_a_cluster_that_does_not_state_its_host_memory():
    # a node class without host memory has infinite memory capacity (class_capacity); the simulator's
    # '8x(cpus=16,gpus=2,gpu_mem=8GiB)' is one: every trident move on video-8 failed with "cannot convert
    # float NaN to integer" (inf // bytes) and the policy never moved
    from trident_flows.core.step_order import order_steps

    current = {("parse", 0, "n"): 3, ("embed", 0, "n"): 1}
    target = {("parse", 0, "n"): 1, ("embed", 0, "n"): 3}
    usage = {("parse", 0, "n"): (1.0, 0.0, 2.0e8), ("embed", 0, "n"): (1.0, 0.0, 5.0e8)}
    phases = order_steps(current, target, {"n": (4.0, 0.0, math.inf)}, usage.__getitem__, ["embed", "parse"])
    started = sum(n for p in phases if p.kind == StepKind.START for _, n in p.moves)
    retired = sum(n for p in phases if p.kind == StepKind.RETIRE for _, n in p.moves)
    assert (started, retired) == (2, 2), phases


def test_a_plan_that_only_starts_replicas_is_priced_over_the_run_left_not_the_regime():
    # 8 CPUs + 1 GPU, embed on 4 CPU replicas, parse 3: one CPU free and the GPU idle. Adding a GPU embed
    # replica stops nothing; over a 30 s regime its 60 s cold start never pays, over 10 minutes left it does.
    demands, cluster, cpu_embed, gpu_embed = _scenario()
    current = CurrentPlacement.from_mapping({"parse": [ReplicaGroup(CPU1, 3, "n")], "embed": [ReplicaGroup(cpu_embed.config, 4, "n")]})
    plan = CurrentPlacement.from_mapping({"parse": [ReplicaGroup(CPU1, 3, "n")],
                                          "embed": [ReplicaGroup(cpu_embed.config, 4, "n"), ReplicaGroup(GPU1, 1, "n")]})
    from trident_flows.core.types import OperatorPlan, Plan
    add = Plan(tuple(OperatorPlan(op, groups, "test") for op, groups in plan.groups), 0.0, "add a GPU replica")
    assert all(s.kind == StepKind.START for s in plan_transition(demands, cluster, current, add, 30).steps)
    assert plan_transition(demands, cluster, current, add, 30).verdict == TransitionVerdict.WAIT
    assert plan_transition(demands, cluster, current, add, 30, run_left_s=600).verdict == TransitionVerdict.ROLL_OUT
    assert plan_transition(demands, cluster, current, add, 30, run_left_s=20).verdict == TransitionVerdict.WAIT  # ends before it is warm


def test_running_replicas_the_plan_does_not_need_stay_while_nothing_else_needs_their_cpus():
    # 16 CPUs + 1 GPU. embed on the GPU (30/s) is the bottleneck; parse needs 4 replicas (8/s each) for T = 30, and runs 12.
    # Retiring 8 idle parse replicas frees CPUs no other replica takes: they stay. Only new replicas are trimmed.
    parse_op, gpu_embed = parse(8.0), PlacementOption.from_rate(GPU1, 30.0, device_mem_bytes=4 * GiB)
    demands = [parse_op, embed(gpu_embed)]
    current = CurrentPlacement.from_mapping({"parse": [ReplicaGroup(CPU1, 12, "n")], "embed": [ReplicaGroup(GPU1, 1, "n")]})
    res = solve_placement(demands, node(16, 1), current)
    assert res.throughput == pytest.approx(30.0)
    assert res.plan.for_operator("parse").replicas == 12
    assert solve_placement(demands, node(16, 1)).plan.for_operator("parse").replicas == 4  # nothing runs: none is kept
    # when another operator needs the CPUs, the running replicas go
    cpu_embed = PlacementOption.from_rate(OpConfig.make("cpu", batch_size=4, cpus=1), 4.0)
    demands = [parse_op, embed(cpu_embed, gpu_embed)]
    res = solve_placement(demands, node(16, 1), current)
    assert res.plan.for_operator("parse").replicas < 12
    assert res.throughput > 30.0
