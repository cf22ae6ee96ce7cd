"""DS2 and utilisation-threshold baselines: pure decisions on hand-built runner states."""

from __future__ import annotations

import dataclasses
import re

import builders
import pytest
from builders import batch_sample, operator_state, replica_state

from trident_flows.core.decision import Action
from trident_flows.core.state import OperatorState, RunnerState
from trident_flows.core.types import BatchSample, OpConfig
from trident_flows.runtime.spec import OperatorSpec, PipelineSpec
from trident_flows.scheduler.ds2 import ds2_decision, measure_rates
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.threshold import ThresholdSettings, pool_utilisation, threshold_decision

CPU1 = OpConfig.make("cpu", batch_size=8)


def op_state(name: str, replicas: int, inflight: tuple[int, ...] | int = 0, *, items_in: int = 100, epoch: int = 0,
             config: OpConfig = CPU1, starting: int = 0) -> OperatorState:
    flights = inflight if isinstance(inflight, tuple) else (inflight,) * replicas
    reps = tuple(replica_state(replica_id=f"{name}-{i}", actor_name=f"r:{name}-{i}", config=config, warm=i >= starting, inflight=flights[i],
                               busy_fraction=0.5, batches=10, config_epoch=epoch)
                 for i in range(replicas))
    return operator_state(name=name, replicas=reps, items_in=items_in, items_out=items_in, config_epoch=epoch, busy_fraction=0.5)


def runner_state(*ops: OperatorState, cpus: float = 8, gpus: float = 0) -> RunnerState:
    return builders.runner_state(operators=tuple(ops), items_in=1000, items_written=500, rows_written=500, wall_s=10.0, throughput=50.0,
                                 cluster_cpus=cpus, cluster_gpus=gpus)


def batches(op: str, n: int, items: int, busy_s: float, items_out: int | None = None, epoch: int = 0) -> list[BatchSample]:
    return [batch_sample(operator=op, replica_id=f"{op}-0", config=CPU1, start=float(k), busy_s=busy_s, items_in=items,
                         items_out=items if items_out is None else items_out, config_epoch=epoch) for k in range(n)]


# ------------------------------------------------------------------ threshold
def test_threshold_scales_a_saturated_pool_up_and_an_idle_one_down_one_step_each():
    state = runner_state(op_state("a", 2, 2), op_state("b", 3, 0), op_state("c", 2, (1, 1)), cpus=8)
    decision = threshold_decision(state)
    assert decision.utilisation == {"a": 2.0, "b": 0.0, "c": 1.0}
    plan = decision.plan
    assert {o.operator: o.replicas for o in plan.operators} == {"a": 3, "b": 2}
    assert "2.00 >= 1.75" in plan.for_operator("a").reason and "0.00 <= 0.5" in plan.for_operator("b").reason
    assert "within" in decision.reasons["c"]


def test_threshold_respects_free_resources_limits_and_pending_replicas():
    spec = PipelineSpec("p", tuple(OperatorSpec(n, object, CPU1, 2, min_replicas=2, max_replicas=3) for n in ("a", "b")), lambda: iter(()))
    full = runner_state(op_state("a", 4, 2), op_state("b", 4, 2), cpus=8)
    decision = threshold_decision(full)
    assert decision.plan is None and "free resources" in decision.reasons["a"]
    capped = threshold_decision(runner_state(op_state("a", 3, 2), op_state("b", 2, 0)), spec=spec)
    assert capped.plan is None
    assert "max_replicas=3" in capped.reasons["a"] and "min_replicas=2" in capped.reasons["b"]
    # only one free CPU: the first saturated pool takes it, the second is told why not
    one_free = threshold_decision(runner_state(op_state("a", 3, 2), op_state("b", 4, 2), cpus=8))
    assert [o.operator for o in one_free.plan.operators] == ["a"] and "free resources" in one_free.reasons["b"]
    pending = threshold_decision(runner_state(op_state("a", 3, 0, starting=1)))
    assert pending.plan is None and "still starting" in pending.reasons["a"]
    fresh = threshold_decision(runner_state(op_state("a", 2, 0, items_in=0)))
    assert fresh.plan is None and "no inputs" in fresh.reasons["a"]


def test_threshold_utilisation_is_ray_datas_and_bad_thresholds_are_refused():
    assert pool_utilisation(op_state("a", 4, (2, 2, 1, 0))) == pytest.approx(1.25)
    assert pool_utilisation(operator_state(name="x")) == float("inf")
    with pytest.raises(ValueError, match=re.escape("threshold: down=0.8 is refused: need 0 <= down < up (up=0.5)")):
        ThresholdSettings(up=0.5, down=0.8)
    policy = make_policy("threshold")
    decision = policy.decide(runner_state(op_state("a", 1, 2)), [])
    assert decision.action == Action.ROLL_OUT and decision.plan.for_operator("a").replicas == 2


# ------------------------------------------------------------------ DS2
def test_ds2_sizes_each_operator_to_its_upstreams_true_output_rate():
    state = runner_state(op_state("a", 2), op_state("b", 1), op_state("c", 1), cpus=15)
    # a: 10 items per 0.1 s busy = 100 items/s per replica, 8 out per 0.1 s: true output 80/s, selectivity 0.8;
    # at a source rate of 200/s, b needs 160 items/s at 50/s per replica -> 4; c needs 160/s at 200/s -> 1.
    samples = batches("a", 5, 10, 0.1, items_out=8) + batches("b", 5, 8, 0.16) + batches("c", 5, 8, 0.04)
    rates = measure_rates(state, samples)
    assert rates["a"].processing_rate == pytest.approx(100) and rates["a"].output_rate == pytest.approx(80)
    assert rates["a"].selectivity == pytest.approx(0.8) and rates["a"].batches == 5 and rates["a"].replicas == 2
    decision = ds2_decision(state, rates, source_rate=200)
    assert decision.targets == {"a": 2, "b": 4, "c": 1}
    assert [o.operator for o in decision.plan.operators] == ["b"] and decision.plan.for_operator("b").replicas == 4
    assert "160 items/s / true rate 50" in decision.plan.for_operator("b").reason
    assert ds2_decision(state, rates, source_rate=300).targets == {"a": 3, "b": 5, "c": 2}
    # a pull source has no rate of its own: the highest rate whose targets fit 15 CPUs (500/s: 5 + 8 + 2 replicas)
    pull = ds2_decision(state, rates)
    assert pull.targets == {"a": 5, "b": 8, "c": 2} and pull.source_rate == pytest.approx(500, rel=1e-6)
    assert "a pull source: the highest rate that fits" in pull.reason


def test_ds2_caps_a_given_source_rate_to_the_cluster_and_waits_for_batches():
    state = runner_state(op_state("a", 2), op_state("b", 1), cpus=5)
    rates = measure_rates(state, batches("a", 5, 8, 0.08) + batches("b", 5, 8, 0.32))  # b: 25 items/s per replica
    decision = ds2_decision(state, rates, source_rate=200)   # 2 + 8 replicas: more than 5 CPUs
    assert decision.targets == {"a": 1, "b": 4} and decision.source_rate == pytest.approx(100, rel=1e-6)
    assert "capped" in decision.reason
    stale = batches("b", 5, 8, 0.32, epoch=-1)  # another config epoch: not the operator's current configuration
    waiting = ds2_decision(state, measure_rates(state, batches("a", 5, 8, 0.08) + stale))
    assert waiting.plan is None and "waiting for batches of b (0/4)" in waiting.reason


def test_ds2_holds_within_the_target_rate_ratio_and_ignores_a_scale_down_by_one():
    # a: 100/s per replica, b: 25/s per replica; 1 + 4 replicas sustain 100/s
    state = runner_state(op_state("a", 1), op_state("b", 4), cpus=16)
    rates = measure_rates(state, batches("a", 5, 8, 0.08) + batches("b", 5, 8, 0.32))
    near = ds2_decision(state, rates, source_rate=115)       # a and b need 2 and 5 for 115/s: 15% short
    assert near.targets == {"a": 2, "b": 5} and near.plan is None and "within the target rate ratio 1.2" in near.reason
    short = ds2_decision(state, rates, source_rate=125)      # 25% short: a step
    assert short.plan is not None and short.plan.for_operator("b").replicas == 5
    assert ds2_decision(state, rates, source_rate=125, target_rate_ratio=1.3).plan is None
    assert ds2_decision(state, rates, source_rate=115, target_rate_ratio=1.1).plan is not None
    one_less = ds2_decision(state, rates, source_rate=75)    # b 4 -> 3: one replica fewer is no change
    assert one_less.targets["b"] == 3 and one_less.plan is None
    two_less = ds2_decision(state, rates, source_rate=50)    # b 4 -> 2: a step
    assert {o.operator: o.replicas for o in two_less.plan.operators} == {"b": 2}
    same = ds2_decision(state, rates, source_rate=100)
    assert same.plan is None and "targets equal the current parallelism" in same.reason


def test_ds2_with_a_pull_source_takes_no_step_that_only_frees_replicas():
    # b may not grow past 4 (25/s each): 100/s is the highest rate; c holds 5 replicas where 1 serves it
    spec = PipelineSpec("p", (OperatorSpec("a", object, CPU1, 1), OperatorSpec("b", object, CPU1, 4, max_replicas=4),
                              OperatorSpec("c", object, CPU1, 5)), lambda: iter(()))
    state = runner_state(op_state("a", 1), op_state("b", 4), op_state("c", 5), cpus=10)
    rates = measure_rates(state, batches("a", 5, 8, 0.08) + batches("b", 5, 8, 0.32) + batches("c", 5, 8, 0.08))
    pull = ds2_decision(state, rates, spec=spec)
    assert pull.targets == {"a": 1, "b": 4, "c": 1} and pull.plan is None and "hold" in pull.reason  # nothing gains from c's 4
    given = ds2_decision(state, rates, spec=spec, source_rate=100)  # a target rate: DS2 saves what it does not need
    assert {o.operator: o.replicas for o in given.plan.operators} == {"c": 1}


def test_ds2_leaves_operators_whose_input_is_finished_and_pulls_at_the_first_busy_one():
    a = op_state("a", 3)
    b = operator_state(name="b", replicas=op_state("b", 2).replicas, queue_items=40, items_in=100, items_out=100, busy_fraction=0.5)  # items still queued at b
    closed = dataclasses.replace(runner_state(a, b, op_state("c", 1), cpus=8), input_closed=True)
    rates = measure_rates(closed, batches("b", 5, 8, 0.32) + batches("c", 5, 8, 0.08))  # no batch of a: it has finished
    decision = ds2_decision(closed, rates)
    assert "a" not in decision.targets and "finished: a" in decision.reason and "pull source at b" in decision.reason
    assert decision.targets == {"b": 4, "c": 1}   # 5 CPUs left beside a's 3: b 4 x 25/s, c 1 x 100/s
