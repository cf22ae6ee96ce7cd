"""The placement MILP's network rows: bytes moved between nodes must fit each node's declared link."""

from __future__ import annotations

import dataclasses
import math

import pytest
from builders import batch_sample

from benchmarks.placement import make_cluster, make_demands
from trident_flows.core.state import RuntimeConfigError
from trident_flows.core.types import BatchSample, ClusterSpec, NodeClass, OpConfig
from trident_flows.runtime.nodes import NIC_LABEL, read_nodes
from trident_flows.scheduler.live_cluster import live_cluster
from trident_flows.scheduler.placement.milp import solve_placement
from trident_flows.scheduler.placement.model import Key, throughput_of
from trident_flows.scheduler.placement.types import GiB, OperatorDemand, PlacementOption
from trident_flows.scheduler.transfer import transfer_estimate

CPU1 = OpConfig.make("cpu", cpus=1)
GPU1 = OpConfig.make("gpu", cpus=1, gpus=1)


def render_then_embed(nic: float) -> tuple[list[OperatorDemand], ClusterSpec]:
    """A GPU renderer (100 items/s, GPU node only) feeding a CPU embedder (10 items/s per replica) that reads 50 MB per item;
    the GPU node has 2 CPUs (room for one embedder next to the renderer), the CPU node 8."""
    cluster = ClusterSpec((NodeClass("gpu", 1, 2, 1, 16 * GiB, nic_bandwidth_bps=nic), NodeClass("cpu", 1, 8, nic_bandwidth_bps=nic)))
    render = OperatorDemand("render", 1.0, (PlacementOption.from_rate(GPU1, 100.0, device_mem_bytes=GiB),))
    embed = OperatorDemand("embed", 1.0, (PlacementOption.from_rate(CPU1, 10.0),), input_bytes_per_item=50e6)
    return [render, embed], cluster


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_a_declared_link_caps_what_crosses_nodes_hand_computed(solver):
    # No link declared: 1 embedder beside the renderer + 8 on the CPU node = 90 items/s.
    demands, cluster = render_then_embed(nic=0.0)
    assert solve_placement(demands, cluster, solver=solver).throughput == pytest.approx(90.0)
    # 1 GB/s links: at most 1e9 / 50e6 = 20 items/s reach the CPU node, plus 10 read locally on the GPU node = 30.
    demands, cluster = render_then_embed(nic=1e9)
    res = solve_placement(demands, cluster, solver=solver)
    assert res.throughput == pytest.approx(30.0, rel=1e-6)
    on = {g.node_class: g.replicas for g in res.plan.for_operator("embed").groups}
    assert on.get("gpu") == 1, "the embedder that reads locally is kept beside the renderer"
    assert on.get("cpu", 0) >= 2
    assert throughput_of(demands, cluster, res.count_map) == pytest.approx(30.0, rel=1e-6)
    assert "bandwidth" in res.plan.reason


def test_a_declared_link_keeps_producer_and_consumer_together_on_each_node():
    # Two 4-CPU nodes; producer and consumer 10 items/s per replica; 200 MB per item cross a 1 GB/s link at 5 items/s.
    # 40 items/s needs every CPU, and only a placement with as many producers as consumers on each node moves nothing.
    cluster = ClusterSpec(tuple(NodeClass(name, 1, 4, nic_bandwidth_bps=1e9) for name in ("a", "b")))
    demands = [OperatorDemand("decode", 1.0, (PlacementOption.from_rate(CPU1, 10.0),)),
               OperatorDemand("detect", 1.0, (PlacementOption.from_rate(CPU1, 10.0),), input_bytes_per_item=200e6)]
    res = solve_placement(demands, cluster)
    assert res.throughput == pytest.approx(40.0)
    for name in ("a", "b"):
        per_op = {op.operator: sum(g.replicas for g in op.groups if g.node_class == name) for op in res.plan.operators}
        assert per_op["decode"] == per_op["detect"] == 2
    # all producers on one node, all consumers on the other: 40 items/s x 200 MB would need 8 GB/s, the link carries 5 items/s
    apart = {Key("decode", 0, "a"): 4, Key("detect", 0, "b"): 4}
    assert throughput_of(demands, cluster, apart) == pytest.approx(5.0)


@pytest.mark.parametrize("seed", range(4))
def test_no_declared_link_leaves_answers_unchanged(seed):
    demands, cluster = make_demands(5, seed), make_cluster(8)
    heavy = [dataclasses.replace(d, input_bytes_per_item=1e8) for d in demands]
    base = solve_placement(demands, cluster)
    assert solve_placement(heavy, cluster).counts == base.counts
    linked = ClusterSpec(tuple(dataclasses.replace(nc, nic_bandwidth_bps=1e9) for nc in cluster.node_classes))
    assert solve_placement(demands, linked).counts == base.counts, "a link with no measured bytes constrains nothing"


def test_bad_link_or_bytes_are_refused_with_what_to_write():
    with pytest.raises(ValueError, match=r"node class 'n': nic_bandwidth_bps must be bytes/s >= 0 .* e\.g\. 12\.5e9"):
        NodeClass("n", 1, 4, nic_bandwidth_bps=-1.0)
    with pytest.raises(ValueError, match=r"nic_bandwidth_bps"):
        NodeClass("n", 1, 4, nic_bandwidth_bps=math.inf)
    with pytest.raises(ValueError, match=r"operator 'embed': input_bytes_per_item must be a finite number >= 0"):
        OperatorDemand("embed", 1.0, (PlacementOption.from_rate(CPU1, 10.0),), input_bytes_per_item=-5.0)


def _sample(items: int, read: int, remote: int) -> BatchSample:
    return batch_sample(operator="embed", config=CPU1, items_in=items, bytes_from_other_nodes=remote, bytes_read=read)


def test_transfer_estimate_weighs_bytes_not_batches():
    est = transfer_estimate([_sample(10, 1000, 0), _sample(30, 5000, 5000), _sample(5, 0, 0)])
    assert est is not None and est.samples == 2
    assert est.bytes_per_item == pytest.approx(6000 / 40) and est.cross_node_share == pytest.approx(5000 / 6000)
    assert est.cross_node_bytes_per_item == pytest.approx(5000 / 40)
    assert transfer_estimate([_sample(10, 0, 0)]) is None  # rows the runner sent by value: nothing measured
    assert BatchSample.from_dict(_sample(3, 7, 2).to_dict()).bytes_read == 7


def _raw(node_id: str, nic: str | None = None) -> dict:
    return {"NodeID": node_id, "Alive": True, "Resources": {"CPU": 8.0, "memory": 32 * GiB},
            "Labels": {"ray.io/node-id": node_id, **({NIC_LABEL: nic} if nic else {})}}


def test_live_nodes_declare_their_link_by_label_and_the_policy_plans_with_it():
    nodes = read_nodes([_raw("a", "100Gbps"), _raw("b", "12.5GBps"), _raw("c")])
    assert [n.nic_bandwidth_bps for n in nodes] == [12.5e9, 12.5e9, 0.0]
    assert nodes[0].node_class == nodes[1].node_class == "8cpu-32g-nic12.5GBps" and nodes[2].node_class == "8cpu-32g"
    state = type("State", (), {"nodes": nodes})()
    spec = live_cluster(state)
    assert spec.node_class("8cpu-32g-nic12.5GBps").count == 2 and spec.node_class("8cpu-32g-nic12.5GBps").nic_bandwidth_bps == 12.5e9
    assert spec.node_class("8cpu-32g").nic_bandwidth_bps == 0.0
    # a class the policy was given with a link keeps it when the nodes carry no label
    given = ClusterSpec((NodeClass("cpu", 1, 8, nic_bandwidth_bps=1e9),))
    assert live_cluster(state, given).node_class("8cpu-32g").nic_bandwidth_bps == 1e9
    with pytest.raises(RuntimeConfigError, match=r"node a: label trident\.nic='fast' is not a rate.*--labels trident\.nic=100Gbps"):
        read_nodes([_raw("a", "fast")])


@pytest.mark.prefect
def test_ray_cluster_block_declares_the_local_nodes_link():
    from pydantic import ValidationError

    from trident_flows.blocks import RayClusterBlock

    assert RayClusterBlock(num_cpus=4, nic_bandwidth="100Gbps").init_kwargs()["labels"] == {NIC_LABEL: "100Gbps"}
    assert "labels" not in RayClusterBlock(num_cpus=4).init_kwargs()
    with pytest.raises(ValidationError, match=r"nic_bandwidth='lots' is not a rate; write e\.g\. 100Gbps"):
        RayClusterBlock(nic_bandwidth="lots")
    with pytest.raises(ValidationError, match=r"start them with `ray start --labels trident\.nic=100Gbps`"):
        RayClusterBlock(address="10.0.0.1:6379", nic_bandwidth="100Gbps")


def test_the_trident_policy_gives_the_milp_each_operators_measured_bytes_per_item():
    from test_controller import CLUSTER8, STEADY, SimRunner, two_ops

    from trident_flows.scheduler.trident_policy import TridentPolicy
    from trident_flows.scheduler.trident_settings import TridentSettings

    seen: list[list[OperatorDemand]] = []

    def solve(demands, *args, **kwargs):
        seen.append(list(demands))
        return solve_placement(demands, *args, **kwargs)

    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    linked = ClusterSpec((dataclasses.replace(CLUSTER8.node_classes[0], nic_bandwidth_bps=1e9),))
    policy = TridentPolicy(None, linked, TridentSettings.from_options(canaries=False, regime_duration_s=STEADY), solve=solve)
    for _ in range(12):
        # "b" reads 3 KB per item from "a", a third of it from another node; "a" reads source rows sent by value
        new = [dataclasses.replace(s, bytes_read=3000 * s.items_in, bytes_from_other_nodes=1000 * s.items_in) if s.operator == "b" else s
               for s in runner.advance(2.0)]
        record = policy.tick(runner.state(), new)
        if record.decision.plan is not None:
            runner.apply(record.decision.plan)
        if seen:
            break
    assert seen, "the placement was never solved"
    by_name = {d.name: d for d in seen[-1]}
    assert by_name["a"].input_bytes_per_item == 0.0 and by_name["b"].input_bytes_per_item == pytest.approx(3000.0)
