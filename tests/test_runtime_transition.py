"""The pure planner from running state + target plan to rolling steps (no Ray)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from builders import operator_state, replica_state, runner_state

from trident_flows.core.state import OperatorState, RunnerState, RuntimeConfigError
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup, StepKind
from trident_flows.runtime.transition import rolling_steps

A = OpConfig.make("cpu", batch_size=8)
B = OpConfig.make("cpu", batch_size=16)
B_LITE = OpConfig.make("cpu", batch_size=16, model="lite")  # another model: its replicas restart
G = OpConfig.make("gpu", batch_size=32)


def _op(name: str, *replicas: tuple[OpConfig, bool]) -> OperatorState:
    reps = tuple(replica_state(replica_id=f"{name}-{k}", actor_name=f"r:{name}:{k}", config=c, canary=canary, busy_fraction=0.5, batches=10,
                               config_epoch=1) for k, (c, canary) in enumerate(replicas))
    return operator_state(name=name, replicas=reps, config_epoch=1, busy_fraction=0.5)


def _state(cpus: float, gpus: float, *ops: OperatorState) -> RunnerState:
    return runner_state(operators=ops, cluster_cpus=cpus, cluster_gpus=gpus)


def _plan(*ops: OperatorPlan) -> Plan:
    return Plan(ops, reason="test")


def _kinds(t):
    return [(s.kind, s.operator, s.config.batch_size, s.count) for s in t.steps]


def test_rolling_replacement_starts_before_it_retires_when_there_is_room():
    state = _state(8, 0, _op("parse", (A, False), (A, False)))
    t = rolling_steps(state, _plan(OperatorPlan("parse", (ReplicaGroup(B_LITE, 2),))))
    assert _kinds(t) == [(StepKind.START, "parse", 16, 2), (StepKind.RETIRE, "parse", 8, 2)]


def test_a_full_cluster_rolls_replica_by_replica():
    state = _state(2, 0, _op("parse", (A, False), (A, False)))
    t = rolling_steps(state, _plan(OperatorPlan("parse", (ReplicaGroup(B_LITE, 2),))))
    assert _kinds(t) == [(StepKind.RETIRE, "parse", 8, 1), (StepKind.START, "parse", 16, 1),
                         (StepKind.RETIRE, "parse", 8, 1), (StepKind.START, "parse", 16, 1)]


def test_a_batch_size_change_resizes_replicas_in_place_and_rolls_the_rest():
    # 3 x b8 -> 2 x b16 + 2 x b8-lite on a full 4-CPU node: two replicas resized in place (no start, no drain), the
    # third retired to make room for the first lite one, whose second starts on the fourth CPU
    state = _state(4, 0, _op("parse", (A, False), (A, False), (A, False)), _op("other", (A, False)))
    t = rolling_steps(state, _plan(OperatorPlan("parse", (ReplicaGroup(B, 2), ReplicaGroup(A, 0), ReplicaGroup(B_LITE, 1)))))
    assert _kinds(t)[0] == (StepKind.RESIZE, "parse", 16, 2)
    assert t.steps[0].from_config == A and t.steps[0].to_dict()["from_config"] == A.to_dict()
    assert [k for k in _kinds(t)[1:]] == [(StepKind.RETIRE, "parse", 8, 1), (StepKind.START, "parse", 16, 1)]
    assert "from_config" not in t.steps[1].to_dict()


def test_a_batch_size_change_of_another_device_or_share_is_no_resize():
    state = _state(8, 2, _op("embed", (G, False)))
    half = OpConfig.make("gpu", batch_size=16, gpus=0.5)
    t = rolling_steps(state, _plan(OperatorPlan("embed", (ReplicaGroup(half, 1),))))
    assert [s.kind for s in t.steps] == [StepKind.START, StepKind.RETIRE]


def test_moving_capacity_between_operators_and_untouched_operators():
    state = _state(5, 1, _op("parse", (A, False), (A, False), (A, False)), _op("embed", (G, False)), _op("other", (A, False)))
    t = rolling_steps(state, _plan(OperatorPlan("parse", (ReplicaGroup(A, 2),)), OperatorPlan("embed", (ReplicaGroup(G, 1), ReplicaGroup(A, 1)))))
    assert _kinds(t) == [(StepKind.RETIRE, "parse", 8, 1), (StepKind.START, "embed", 8, 1)]
    assert not any(s.operator == "other" for s in t.steps)


def test_canary_steps_and_no_change():
    state = _state(8, 1, _op("embed", (G, False)))
    t = rolling_steps(state, _plan(OperatorPlan("embed", (ReplicaGroup(G, 1),), canary=B)))
    assert _kinds(t) == [(StepKind.CANARY, "embed", 16, 1)]
    state = _state(8, 1, _op("embed", (G, False), (B, True)))
    t = rolling_steps(state, _plan(OperatorPlan("embed", (ReplicaGroup(G, 1),))))
    assert _kinds(t) == [(StepKind.END_CANARY, "embed", 16, 1)]
    t = rolling_steps(state, _plan(OperatorPlan("embed", (ReplicaGroup(G, 1),), canary=B)))
    assert t.steps == ()


def test_refusals_name_the_operator_and_the_fix():
    state = _state(4, 1, _op("parse", (A, False)))
    with pytest.raises(RuntimeConfigError, match="unknown operator 'ocr'"):
        rolling_steps(state, _plan(OperatorPlan("ocr", (ReplicaGroup(A, 1),))))
    with pytest.raises(RuntimeConfigError, match="needs 5 CPUs but the cluster has 4"):
        rolling_steps(state, _plan(OperatorPlan("parse", (ReplicaGroup(A, 5),))))
    with pytest.raises(RuntimeConfigError, match="'parse'.*gpus=2"):
        rolling_steps(state, _plan(OperatorPlan("parse", (ReplicaGroup(OpConfig.make("gpu", gpus=2.0), 1),))))


def test_a_retire_followed_by_a_start_frees_a_node_where_that_start_then_fits():
    from dataclasses import dataclass

    from trident_flows.core.types import TransitionStep
    from trident_flows.runtime.transition import retire_victims, room_for

    @dataclass
    class Replica:
        node: str
        config: OpConfig = A

    class Pool:  # the pools' contract: candidates in their own order (least loaded first)
        def __init__(self, *nodes: str) -> None:
            self.replicas = {k: Replica(n) for k, n in enumerate(nodes)}

        def choose_retire(self, config, count, canary):
            return list(self.replicas.values())[:count]

        def active(self, canary):
            return list(self.replicas.values())

    gpu = OpConfig.make("gpu", batch_size=32, cpus=1.0, gpus=1.0)
    steps = (TransitionStep(StepKind.RETIRE, "c", A, 2), TransitionStep(StepKind.START, "g", gpu, 2))
    # x: a free GPU, no free CPU; y: a free CPU and GPU (room for one start already); z: CPUs only
    free = {"x": (0.0, 1.0), "y": (1.0, 1.0), "z": (0.0, 0.0)}
    pool = Pool("z", "z", "x", "y")
    room = room_for(steps, 0, lambda: free, lambda r: r.node)
    assert [r.node for r in retire_victims(pool, steps[0], replaced=False, room=room)] == ["x", "z"]  # then the pool's order
    assert [r.node for r in retire_victims(pool, steps[0], replaced=False)] == ["z", "z"]  # without room: the pool's order
    assert room_for(steps, 1, lambda: free, lambda r: r.node) is None  # a START makes no room
    assert room_for(steps[:1], 0, lambda: free, lambda r: r.node) is None  # no start follows
    assert room_for(steps, 0, dict, lambda r: r.node) is None  # the nodes are not known


def test_a_start_whose_replicas_find_no_node_with_room_says_how_many_and_why():
    from trident_flows.core.types import TransitionStep
    from trident_flows.runtime.transition import no_room

    gpu = OpConfig.make("gpu", batch_size=32, cpus=1.0, gpus=1.0)
    start = TransitionStep(StepKind.START, "g", gpu, 2)
    # x: a free GPU, no free CPU beside it; y: a free CPU and GPU; z: CPUs only. 3 CPUs and 2 GPUs free in total
    free = {"x": (0.0, 1.0), "y": (1.0, 1.0), "z": (2.0, 0.0)}
    assert no_room(start, free) == ("no node has room for 1 of 2 gpu/b32 replica(s) (1 CPUs + 1 GPUs each, on one node; "
                                    "3 CPUs and 2 GPUs are free over 3 nodes) and no replica is draining")
    assert no_room(TransitionStep(StepKind.CANARY, "g", gpu, 1), free) is None  # y holds one
    assert no_room(TransitionStep(StepKind.START, "c", A, 3), free) is None  # CPU replicas: y and z
    assert no_room(start, {}) is None  # the nodes are not known: the runner waits as before
    assert no_room(TransitionStep(StepKind.START, "g", gpu, 2, node_class="big"), free) is None  # a class the runner places


def test_a_start_no_node_has_room_for_waits_for_the_plans_next_retire():
    # the steps are ordered by the class's totals (1 CPU and 1 GPU free), but the free CPU and the free GPU are on
    # different nodes: the runners pull the plan's next retire before the start, which then retires to make room
    from trident_flows.core.types import TransitionStep
    from trident_flows.runtime.transition import room_first, step_room

    gpu = OpConfig.make("gpu", batch_size=32, cpus=1.0, gpus=1.0)
    grow, start, retire = (TransitionStep(StepKind.START, "c", A, 1), TransitionStep(StepKind.START, "g", gpu, 1),
                           TransitionStep(StepKind.RETIRE, "c", B, 2))
    steps = (grow, start, TransitionStep(StepKind.END_CANARY, "c", A, 1), retire)
    apart = {"x": (0.0, 1.0), "z": (1.0, 0.0)}
    assert room_first(steps, 1, lambda: apart) == (grow, retire, start, steps[2])
    assert room_first(steps, 0, lambda: apart) == steps  # a CPU replica fits on z
    assert room_first(steps, 1, lambda: {"x": (1.0, 1.0)}) == steps  # room on one node: the order stands
    assert room_first(steps, 3, lambda: apart) == steps  # a retire is not moved
    # no retire follows: a CPU replica on x moves (started anew where a CPU is free, z; then retired where the start fits, x)
    no_retire = steps[:3]
    assert room_first(no_retire, 1, lambda: apart) == no_retire  # nothing may move: the start fails as before
    pools = [("c", SimpleNamespace(replicas={0: _Replica("x", A), 1: _Replica("x", A, canary=True), 2: _Replica("z", B, draining=True)})),
             ("g", SimpleNamespace(replicas={0: _Replica("x", gpu)}))]  # on x one CPU replica may move: not a canary, not draining
    moved = room_first(no_retire, 1, lambda: apart, pools, lambda r: r.node)
    why = "make room on one node for g gpu/b32"
    assert [(s.kind, s.operator, s.config, s.count, s.reason) for s in moved[1:3]] == [(StepKind.START, "c", A, 1, why),
                                                                                       (StepKind.RETIRE, "c", A, 1, why)]
    assert moved[:1] + moved[3:] == no_retire
    assert room_first(moved, 3, lambda: apart, pools, lambda r: r.node) == moved  # one move per replica the start asks for
    assert room_first(no_retire, 1, lambda: {"x": (0.0, 1.0)}, pools, lambda r: r.node) == no_retire  # no CPU free elsewhere
    assert step_room(moved, 1, lambda: apart, pools, lambda r: r.node) == (moved, None)  # a START makes no room
    assert step_room(moved, 2, lambda: apart, pools, lambda r: r.node)[1].config == gpu  # the move's retire: room for g


@dataclass
class _Replica:
    node: str
    config: OpConfig
    canary: bool = False
    draining: bool = False
    dead: bool = False
