"""DS2's scaling manager on hand-built runner states: it evaluates once per policy interval, uses no sample
during the warm-up after the start and after each step, issues a step only when the activation window's
evaluations all called for one, does not issue a refused step again, and refuses bad settings by name."""

from __future__ import annotations

import dataclasses
import re

import pytest
from builders import batch_sample, operator_state, replica_state, runner_state

from trident_flows.core.decision import Action, Decision, Hold, HoldKind
from trident_flows.core.state import ApplyOutcome, OperatorState, RunnerState
from trident_flows.core.types import BatchSample, OpConfig
from trident_flows.scheduler.ds2 import DS2Policy, DS2Settings
from trident_flows.scheduler.policies import make_policy

CPU1 = OpConfig.make("cpu", batch_size=8)


def state(a: int, b: int, t: float, cpus: float = 16) -> RunnerState:
    """Operators a and b with ``a`` and ``b`` replicas at ``t`` seconds of the run."""
    def op(name: str, n: int) -> OperatorState:
        reps = tuple(replica_state(replica_id=f"{name}-{i}", actor_name=f"r:{name}-{i}", config=CPU1, inflight=1, busy_fraction=0.5,
                                   batches=10) for i in range(n))
        return operator_state(name=name, replicas=reps, items_in=100, items_out=100, busy_fraction=0.5)
    return runner_state(operators=(op("a", a), op("b", b)), items_in=1000, items_written=500, rows_written=500, wall_s=t, throughput=50.0, cluster_cpus=cpus)


def batches(b_busy_s: float, n: int = 4) -> list[BatchSample]:
    """``n`` batches of 8 items each at a (0.08 s: 100 items/s per replica) and at b (``b_busy_s`` each)."""
    return [batch_sample(operator=op, replica_id=f"{op}-0", config=CPU1, start=float(k), busy_s=busy,
                         items_in=8) for op, busy in (("a", 0.08), ("b", b_busy_s))
            for k in range(n)]


def held(decision: Decision) -> str:
    """The reason of a decision that keeps the configuration (and names no typed hold)."""
    assert decision.action == Action.NONE and decision.plan is None and decision.hold is None, decision
    return decision.reason


def test_it_evaluates_once_per_interval_after_the_warm_up_and_warms_up_again_after_a_step():
    policy = DS2Policy(settings=DS2Settings(source_rate=100.0))   # b at 25/s per replica needs 4 for 100/s
    assert "warming up until 30.0" in held(policy.decide(state(1, 1, 10.0), batches(0.32)))
    assert held(policy.decide(state(1, 1, 20.0), batches(0.32))) and policy.last is None  # warm-up samples: not used
    assert policy.decide(state(1, 1, 30.0), batches(0.32)) == Decision.no_change("warmed up: observing")
    assert "observing: 5.0 of 10 s" in held(policy.decide(state(1, 1, 35.0), batches(0.32)))
    plan = policy.decide(state(1, 1, 40.0), []).plan
    assert plan is not None and plan.for_operator("b").replicas == 4 and policy.last.rates["b"].batches == 4
    # the first tick after the step (the loop waited for it to land) starts a new warm-up; older samples are gone
    assert "warming up until 75.0" in held(policy.decide(state(1, 4, 55.0), batches(0.32)))
    assert held(policy.decide(state(1, 4, 75.0), []))
    assert "targets equal the current parallelism" in held(policy.decide(state(1, 4, 85.0), batches(0.32)))


def test_a_step_waits_for_activation_intervals_evaluations_in_a_row_calling_for_it():
    policy = make_policy("ds2", source_rate=100.0, activation_intervals=2, warm_up_intervals=0)
    assert held(policy.decide(state(1, 4, 0.0), []))            # the first interval starts
    assert "b 4->8; step (1 of 2 evaluations in a row)" in held(policy.decide(state(1, 4, 10.0), batches(0.64)))
    # b fast in this interval: over the window's two intervals (135 items/s per replica) one replica serves 100/s: a step
    # down, not the step up called for before, so the count starts again
    assert "b 4->1; step (1 of 2 evaluations in a row)" in held(policy.decide(state(1, 4, 20.0), batches(0.001, n=40)))
    plan = policy.decide(state(1, 4, 30.0), batches(0.64)).plan  # the window (the last two intervals) calls for it again
    assert plan is not None and plan.for_operator("b").replicas == 1
    # an evaluation that holds ends the run of evaluations
    policy = make_policy("ds2", source_rate=100.0, activation_intervals=2, warm_up_intervals=0)
    policy.decide(state(1, 4, 0.0), [])
    assert "(1 of 2" in held(policy.decide(state(1, 4, 10.0), batches(0.64)))
    assert "targets equal" in held(policy.decide(state(1, 4, 20.0), batches(0.08, n=8)))  # 30/s: 4 replicas
    assert "targets equal" in held(policy.decide(state(1, 4, 30.0), batches(0.64)))
    assert "(1 of 2" in held(policy.decide(state(1, 4, 40.0), batches(0.64)))
    assert policy.decide(state(1, 4, 50.0), batches(0.64)).plan.for_operator("b").replicas == 8


def test_a_step_the_runner_refused_is_not_issued_again_on_the_same_parallelism():
    policy = DS2Policy(settings=DS2Settings(source_rate=100.0, warm_up_intervals=0))
    policy.decide(state(1, 1, 0.0), [])
    plan = policy.decide(state(1, 1, 10.0), batches(0.32)).plan
    policy.observe_apply(plan, ApplyOutcome.refused("no node has room"))
    policy.decide(state(1, 1, 11.0), [])
    assert policy.decide(state(1, 1, 21.0), batches(0.32)).hold == Hold(HoldKind.REFUSED_BEFORE)
    # the same evaluation on another parallelism is a new step
    assert policy.decide(state(1, 2, 31.0), batches(0.32)).action == Action.ROLL_OUT


def test_an_operator_with_too_few_batches_in_the_window_is_measured_over_earlier_intervals_of_the_configuration():
    policy = DS2Policy(settings=DS2Settings(source_rate=100.0, warm_up_intervals=0, min_batches=6))
    policy.decide(state(1, 4, 0.0), [])
    assert "waiting for batches of a (3/6), b (3/6)" in held(policy.decide(state(1, 4, 10.0), batches(0.32, n=3)))
    decision = policy.decide(state(1, 4, 20.0), batches(0.32, n=3))
    assert policy.last.rates["b"].batches == 6 and "targets equal the current parallelism" in held(decision)


@pytest.mark.parametrize("field, value, fix", [
    ("policy_interval_s", 0.0, "give a positive number of seconds"),
    ("warm_up_intervals", -1, "give a count of intervals >= 0"),
    ("activation_intervals", 0, "give a count of intervals >= 1"),
    ("target_rate_ratio", 0.9, "give a ratio >= 1 (1: step on any shortfall)"),
    ("min_batches", 0, "give a count of batches >= 1"),
    ("source_rate", -1.0, "give a positive number of items/s, or None"),
    ("warm_up_intervals", 2.0, "give a whole number"),
])
def test_bad_settings_are_refused_naming_the_field_and_the_fix(field: str, value: object, fix: str):
    with pytest.raises(ValueError, match=re.escape(f"ds2: {field}={value!r} is refused: {fix}")):
        DS2Settings(**{field: value})
    assert dataclasses.fields(DS2Settings)  # every knob is a documented field (settings.documented)
