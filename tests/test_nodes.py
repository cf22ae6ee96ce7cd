"""Node classes from the live nodes, node-by-node fit, and class-aware rolling steps (pure, no Ray)."""

from __future__ import annotations

import pytest
from builders import operator_state, replica_state, runner_state

from trident_flows.core.state import NodeState, ReplicaState, RunnerState, RuntimeConfigError
from trident_flows.core.types import ClusterSpec, OpConfig, OperatorPlan, Plan, ReplicaGroup, StepKind
from trident_flows.runtime.nodes import check_fits, pack, read_nodes
from trident_flows.runtime.transition import rolling_steps
from trident_flows.scheduler.live_cluster import live_cluster
from trident_flows.scheduler.placement.inputs import current_placement

GiB = 2**30
A = OpConfig.make("cpu", batch_size=8)
G = OpConfig.make("gpu", batch_size=8)


def _raw(node_id: str, cpus: float, gpus: float = 0, memory_gib: float = 4.0, alive: bool = True, **extra: float) -> dict:
    res = {"CPU": cpus, "memory": memory_gib * GiB, "object_store_memory": 1e8, f"node:10.0.0.{node_id}": 1.0, **extra}
    if gpus:
        res["GPU"] = gpus
    return {"NodeID": node_id, "Alive": alive, "Resources": res}


def test_identical_nodes_share_a_class_and_dead_nodes_are_left_out():
    nodes = read_nodes([_raw("a", 2, memory_gib=4.2), _raw("b", 2, memory_gib=4.7), _raw("c", 4, 1, **{"accelerator_type:A100": 1.0}),
                        _raw("d", 2, ssd=1.0), _raw("e", 2, alive=False)], gpu_memory_bytes=16 * GiB)
    assert [n.node_id for n in nodes] == ["a", "b", "c", "d"]
    assert nodes[0].node_class == nodes[1].node_class == "2cpu-4g"
    assert nodes[2].node_class == "4cpu-1gpu-A100-4g" and nodes[2].gpu_memory_bytes == 16 * GiB
    assert nodes[3].node_class == "2cpu-ssd-4g"


def test_live_cluster_counts_nodes_per_class_and_follows_joins_and_losses():
    three = read_nodes([_raw("a", 2), _raw("b", 2), _raw("c", 4, 1)], gpu_memory_bytes=8 * GiB)
    state = runner_state(cluster_gpus=1, nodes=three)
    spec = live_cluster(state)
    assert {(c.name, c.count, c.cpus, c.gpus) for c in spec.node_classes} == {("2cpu-4g", 2, 2.0, 0), ("4cpu-1gpu-4g", 1, 4.0, 1)}
    assert spec.node_class("4cpu-1gpu-4g").gpu_memory_bytes == 8 * GiB
    smaller = live_cluster(runner_state(cluster_cpus=6, cluster_gpus=1, nodes=three[1:]))
    assert smaller.total_cpus == 6 and smaller.node_class("2cpu-4g").count == 1
    # the memory a policy was given for a class of the same shape wins over Ray's estimate
    given = ClusterSpec.single_node(2, 0, host_memory_bytes=64 * GiB)
    assert live_cluster(state, given).node_class("2cpu-4g").host_memory_bytes == 64 * GiB
    assert live_cluster(runner_state(cluster_gpus=1)) is None


def test_pack_places_node_by_node():
    nodes = read_nodes([_raw("a", 2), _raw("b", 2)])
    assert pack(nodes, [("x", "2cpu-4g", 1.5, 0)] * 2) == []
    assert pack(nodes, [("x", "2cpu-4g", 1.5, 0)] * 3) == ["x"]  # 4.5 CPUs of 4 in total, but 1.5 + 1.5 fits no node
    with pytest.raises(RuntimeConfigError, match="fit no node"):
        check_fits(nodes, [("x", None, 1.5, 0)] * 2 + [("y", None, 1.0, 0)])


def _rep(rid: str, config: OpConfig, node: NodeState) -> ReplicaState:
    return replica_state(replica_id=rid, config=config, busy_fraction=0.5, batches=1, config_epoch=1, node_id=node.node_id, node_class=node.node_class)


def _state(nodes, **ops) -> RunnerState:
    states = tuple(operator_state(name=name, replicas=reps, config_epoch=1, busy_fraction=0.5) for name, reps in ops.items())
    return runner_state(operators=states, cluster_cpus=sum(n.cpus for n in nodes), cluster_gpus=sum(n.gpus for n in nodes), nodes=nodes)


def test_a_plan_naming_classes_gives_steps_on_those_classes():
    nodes = read_nodes([_raw("a", 2), _raw("c", 4, 1)], gpu_memory_bytes=8 * GiB)
    cpu_class, gpu_class = nodes[0].node_class, nodes[1].node_class
    state = _state(nodes, parse=(_rep("p0", A, nodes[1]),), embed=(_rep("e0", G, nodes[1]),))
    assert current_placement(state).for_operator("parse") == (ReplicaGroup(A, 1, gpu_class),)
    plan = Plan((OperatorPlan("parse", (ReplicaGroup(A, 2, cpu_class),)),), reason="test")
    t = rolling_steps(state, plan)
    assert [(s.kind, s.operator, s.count, s.node_class) for s in t.steps] == [(StepKind.START, "parse", 2, cpu_class),
                                                                              (StepKind.RETIRE, "parse", 1, gpu_class)]


def test_a_plan_the_live_nodes_cannot_hold_is_refused_with_the_reason():
    nodes = read_nodes([_raw("a", 2), _raw("b", 2)])
    state = _state(nodes, parse=(_rep("p0", A, nodes[0]),))
    big = A.with_changes(cpus=1.2)  # 3.6 of 4 CPUs in total, but two fit no node
    with pytest.raises(RuntimeConfigError, match="does not fit the live nodes"):
        rolling_steps(state, Plan((OperatorPlan("parse", (ReplicaGroup(big, 3, "2cpu-4g"),)),)))
    with pytest.raises(RuntimeConfigError, match="no live node has"):
        rolling_steps(state, Plan((OperatorPlan("parse", (ReplicaGroup(A, 1, "8cpu-1gpu-4g"),)),)))


def test_a_pipeline_is_sized_to_fit_node_by_node():
    from test_runtime_support import small_pipeline

    from trident_flows.runtime.sizing import fit_to_cluster, fit_to_nodes

    spec = small_pipeline(10)  # 3 replicas of 1 CPU, each at its operator's minimum
    nodes = read_nodes([_raw("a", 1), _raw("b", 1.5)])
    by_totals = fit_to_cluster(spec, 2.5, 0).spec  # 3 x 0.8333 CPU
    sized = fit_to_nodes(spec, nodes).spec
    as_replicas = lambda s: [(o.name, None, o.config.cpus, o.config.gpus) for o in s.operators for _ in range(o.replicas)]  # noqa: E731
    assert pack(nodes, as_replicas(by_totals))  # the cluster's 5 CPUs hold them, its nodes do not
    assert pack(nodes, as_replicas(sized)) == []
    assert fit_to_nodes(spec, read_nodes([_raw("a", 8)])).spec == fit_to_cluster(spec, 8, 0).spec


def test_a_new_replica_goes_where_it_fits_cpu_work_off_the_gpu_nodes():
    from trident_flows.runtime.node_placement import NodePlacer

    placer = NodePlacer(gpu_memory_bytes=GiB)
    placer.update([_raw("h", 1), _raw("g", 2, 1)])
    assert placer.choose(1, 0, {}) == "h"  # room on both: the CPU replica keeps the GPU node free
    assert placer.choose(1, 1, {}) == "g"
    assert placer.choose(1, 1, {"g": (2.0, 0.0)}) == "g"  # no room: queued on the one node that can ever hold it
    assert placer.choose(1, 2, {}) is None  # no node has 2 GPUs
    placer.suspect("h")
    assert placer.choose(1, 0, {}) == "g"  # a replica just died on h (its node may be dead)
    assert placer.update([_raw("g", 2, 1)]) == (set(), {"h"})


def test_a_cpu_replica_leaves_a_cpu_beside_every_free_gpu():
    from trident_flows.runtime.node_placement import NodePlacer

    placer = NodePlacer(gpu_memory_bytes=GiB)
    placer.update([_raw("a", 4, 2), _raw("b", 4, 2)])
    # a: 2 CPUs and 2 GPUs free; b: 1 CPU free, its GPUs held. Taking a CPU on a (the most free CPUs) would
    # leave 1 CPU for 2 free GPUs: one GPU replica could never start there
    held = {"a": (2.0, 0.0), "b": (3.0, 2.0)}
    assert placer.choose(1, 0, held) == "b"
    assert placer.choose(1, 1, held) == "a"
    # where every node would strand a GPU, the most free CPUs as before
    assert placer.choose(1, 0, {"a": (2.0, 0.0), "b": (3.0, 1.0)}) == "a"


def test_free_gpus_are_counted_device_by_device_as_ray_places_them():
    from trident_flows.runtime.node_placement import GpuShare, NodePlacer, gpus_free

    half_each = [GpuShare(0.5, ("0",)), GpuShare(0.5, ("1",))]  # two half-GPU replicas on two devices
    assert gpus_free(2, half_each) == 0.5  # one GPU's worth is free, but on no one device: no whole-GPU replica fits
    assert gpus_free(2, [GpuShare(0.5, ("0",)), GpuShare(0.5, ("0",))]) == 1.0  # packed on one device: one whole free
    assert gpus_free(2, [GpuShare(1.0, ("1",)), GpuShare(0.25, ("0",))]) == 0.75
    assert gpus_free(2, [GpuShare(2.0, ("0", "1"))]) == 0.0
    assert gpus_free(2, []) == 2.0
    # replicas still starting (devices not known yet) go where Ray puts them: a fraction first-fit, whole GPUs on free devices
    assert gpus_free(2, [GpuShare(0.5), GpuShare(0.5)]) == 1.0
    assert gpus_free(2, [GpuShare(0.5, ("1",)), GpuShare(1.0)]) == 0.5
    placer = NodePlacer(gpu_memory_bytes=GiB)
    placer.update([_raw("g", 8, 2)])
    held = {"g": (2.0, 1.0)}
    assert placer.free(held) == {"g": (6.0, 1.0)}  # by totals, as without shares
    assert placer.free(held, {"g": half_each}) == {"g": (6.0, 0.5)}
    assert placer.free(held, {}) == {"g": (6.0, 2.0)}  # no GPU replica there


def test_a_whole_gpu_replica_is_queued_where_the_free_gpu_is_split_over_devices():
    from trident_flows.runtime.node_placement import GpuShare, NodePlacer

    placer = NodePlacer(gpu_memory_bytes=GiB)
    placer.update([_raw("a", 4, 2), _raw("b", 4, 2)])
    held = {"a": (2.0, 1.0), "b": (3.0, 1.0)}
    shares = {"a": [GpuShare(0.5, ("0",)), GpuShare(0.5, ("1",))], "b": [GpuShare(1.0, ("0",))]}
    assert placer.choose(1, 1, held) == "a"  # by totals both have a GPU free; a has more free CPUs
    assert placer.choose(1, 1, held, shares=shares) == "b"  # only b has a whole device free
