"""A canary that finds no free device takes the place of one of its operator's own replicas (scheduler/trident/canaries.py),
and the runner's rolling steps carry that out: retire one, start the canary; give the replica back when it ends."""

from __future__ import annotations

from builders import operator_state, replica_state, runner_state

from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup, StepKind
from trident_flows.runtime.transition import rolling_steps
from trident_flows.scheduler.trident.canaries import in_place_of, with_one_more

G8 = OpConfig.make("gpu", batch_size=8)
G1 = OpConfig.make("gpu", batch_size=1)
C4 = OpConfig.make("cpu", batch_size=4)


def test_a_canary_takes_the_place_of_a_replica_on_its_device_only_where_the_operator_keeps_one():
    assert in_place_of({G8: 2}, G1, free_cpus=0.0, free_gpus=0.0) == G8
    assert in_place_of({G8: 1}, G1, free_cpus=4.0, free_gpus=0.0) is None  # its last replica
    assert in_place_of({G8: 2}, C4, free_cpus=0.0, free_gpus=0.0) is None  # another device: no own replica frees a CPU for it
    assert in_place_of({G8: 2}, OpConfig.make("gpu", batch_size=1, gpus=2.0), free_cpus=0.0, free_gpus=0.0) is None  # one GPU is not enough
    assert in_place_of({G8: 3, OpConfig.make("gpu", batch_size=16): 1}, G1, free_cpus=0.0, free_gpus=0.0) == G8  # the largest group gives


def test_groups_lose_and_regain_one_replica_of_a_config():
    groups = (ReplicaGroup(C4, 1), ReplicaGroup(G8, 2))
    assert with_one_more(groups, G8, -1) == (ReplicaGroup(C4, 1), ReplicaGroup(G8, 1))
    assert with_one_more(with_one_more(groups, G8, -1), G8, 1) == groups
    assert with_one_more((ReplicaGroup(G8, 1), ReplicaGroup(C4, 1)), G8, -1) == (ReplicaGroup(C4, 1),)
    assert with_one_more((ReplicaGroup(C4, 1),), G8, 1) == (ReplicaGroup(C4, 1), ReplicaGroup(G8, 1))
    assert with_one_more(groups, None, -1) == groups


def _embed(*replicas: tuple[OpConfig, bool]):
    reps = tuple(replica_state(replica_id=f"e-{k}", actor_name=f"r:embed:{k}", config=c, canary=canary, busy_fraction=0.9, batches=10,
                               config_epoch=1) for k, (c, canary) in enumerate(replicas))
    return runner_state(operators=(operator_state(name="embed", replicas=reps, config_epoch=1, busy_fraction=0.9),), cluster_cpus=8,
                        cluster_gpus=2)


def test_on_a_full_device_the_runner_retires_one_replica_for_the_canary_and_starts_it_again_after():
    full = _embed((G8, False), (G8, False))
    start = rolling_steps(full, Plan((OperatorPlan("embed", with_one_more((ReplicaGroup(G8, 2),), G8, -1), canary=G1),), reason="t"))
    assert [(s.kind, s.config, s.count) for s in start.steps] == [(StepKind.RETIRE, G8, 1), (StepKind.CANARY, G1, 1)]
    measuring = _embed((G8, False), (G1, True))
    end = rolling_steps(measuring, Plan((OperatorPlan("embed", with_one_more((ReplicaGroup(G8, 1),), G8, 1)),), reason="t"))
    assert [(s.kind, s.config, s.count) for s in end.steps] == [(StepKind.END_CANARY, G1, 1), (StepKind.START, G8, 1)]
