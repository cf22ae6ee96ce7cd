"""DS2 and utilisation-threshold baselines: pure decisions on hand-built runner states."""

from __future__ import annotations

import re

import pytest

from trident_flows.runtime.spec import OperatorSpec, PipelineSpec
from trident_flows.core.state import OperatorState, ReplicaState, RunnerState
from trident_flows.scheduler.ds2 import DS2Policy, DS2Settings, ds2_decision
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.threshold import ThresholdSettings, pool_utilisation, threshold_decision
from trident_flows.core.types import BatchSample, OpConfig

CPU1 = OpConfig.make("cpu", batch_size=8)


def op_state(name: str, replicas: int, inflight: tuple[int, ...] | int = 0, *, items_in: int = 100, epoch: int = 0,
             config: OpConfig = CPU1, starting: int = 0) -> OperatorState:
    flights = inflight if isinstance(inflight, tuple) else (inflight,) * replicas
    reps = tuple(ReplicaState(f"{name}-{i}", f"r:{name}-{i}", config, i >= starting, False, False, flights[i], 0.5, 10, epoch)
                 for i in range(replicas))
    return OperatorState(name, reps, 0, 0, items_in, items_in, epoch, 0.5, 0, 0)


def runner_state(*ops: OperatorState, cpus: float = 8, gpus: float = 0) -> RunnerState:
    return RunnerState("p", tuple(ops), 1000, 500, 0, 0, 500, False, False, 10.0, 50.0, cpus, gpus, 0, 0)


def batches(op: str, n: int, items: int, busy_s: float, items_out: int | None = None, epoch: int = 0) -> list[BatchSample]:
    return [BatchSample(op, f"{op}-0", CPU1, float(k), float(k) + busy_s, busy_s, items, items if items_out is None else items_out,
                        config_epoch=epoch) for k in range(n)]


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
    assert pool_utilisation(OperatorState("x", (), 0, 0, 0, 0, 0, 0.0, 0, 0)) == float("inf")
    with pytest.raises(ValueError, match=re.escape("threshold: down=0.8 is refused: need 0 <= down < up (up=0.5)")):
        ThresholdSettings(up=0.5, down=0.8)
    policy = make_policy("threshold")
    assert policy.decide(runner_state(op_state("a", 1, 2)), []).for_operator("a").replicas == 2


# ------------------------------------------------------------------ DS2
def test_ds2_sizes_each_operator_to_its_upstreams_true_output_rate():
    state = runner_state(op_state("a", 2), op_state("b", 1), op_state("c", 1), cpus=16)
    # a: 10 items per 0.1 s busy = 100 items/s per replica, keeps 80% -> b needs 160 items/s;
    # b: 50 items/s per replica -> ceil(160 / 50) = 4; b keeps all -> c needs 160/s at 200/s -> 1.
    samples = batches("a", 5, 10, 0.1, items_out=8) + batches("b", 5, 8, 0.16) + batches("c", 5, 8, 0.04)
    decision = ds2_decision(state, samples)
    assert decision.targets == {"a": 2, "b": 4, "c": 1}
    assert decision.rates["a"].processing_rate == pytest.approx(100) and decision.rates["a"].selectivity == pytest.approx(0.8)
    assert [o.operator for o in decision.plan.operators] == ["b"] and decision.plan.for_operator("b").replicas == 4
    assert "160 items/s / true rate 50" in decision.plan.for_operator("b").reason
    with_source = ds2_decision(state, samples, source_rate=300)
    assert with_source.targets == {"a": 3, "b": 5, "c": 2}


def test_ds2_caps_the_source_rate_to_the_cluster_and_waits_for_fresh_batches():
    state = runner_state(op_state("a", 2), op_state("b", 1), cpus=5)
    samples = batches("a", 5, 8, 0.08) + batches("b", 5, 8, 0.32)   # b: 25 items/s per replica, needs 8 for 200/s
    decision = ds2_decision(state, samples)
    assert decision.targets == {"a": 1, "b": 4}
    assert "capped" in decision.reason
    stale = batches("b", 5, 8, 0.32, epoch=-1)
    waiting = ds2_decision(state, batches("a", 5, 8, 0.08) + stale)
    assert waiting.plan is None and "waiting for fresh batches of b (0/4)" in waiting.reason
    policy = DS2Policy()
    assert policy.decide(state, batches("a", 2, 8, 0.08)) is None
    assert policy.decide(state, batches("a", 3, 8, 0.08) + batches("b", 4, 8, 0.32)).for_operator("b").replicas == 4
    with pytest.raises(ValueError, match=re.escape("ds2: source_rate=-1 is refused: give a positive number of items/s, or None")):
        DS2Settings(source_rate=-1)
