"""The apply step the control loops share (loop/apply.py): no Ray."""

from __future__ import annotations

from trident_flows.core.state import ApplyReport, ApplyStatus
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.loop.apply import apply_plan

PLAN = Plan((OperatorPlan("parse", (ReplicaGroup(OpConfig.make(batch_size=4), 2),), "one more parse replica"),), reason="grow parse")


class Told:
    """A policy that records every outcome it is told."""

    def __init__(self) -> None:
        self.told = []

    def observe_apply(self, plan, outcome) -> None:
        self.told.append((plan, outcome))


def test_a_landed_apply_returns_its_report_and_tells_the_policy():
    report = ApplyReport(({"kind": "start"},), 1.5, 10.0, 9.0, 0.1)
    policy = Told()
    applied = apply_plan(lambda plan: report, PLAN, policy)
    assert applied.report is report and applied.error == ""
    assert applied.outcome.status == ApplyStatus.LANDED and applied.outcome.changed
    assert policy.told == [(PLAN, applied.outcome)]


def test_an_apply_that_raises_is_a_refusal_named_after_the_exception_and_the_policy_hears_it():
    def refuse(plan):
        raise ValueError("needs 3 CPUs, 2 free")

    policy = Told()
    applied = apply_plan(refuse, PLAN, policy)
    assert applied.report is None and applied.error == "ValueError: needs 3 CPUs, 2 free"
    assert applied.outcome.status == ApplyStatus.REFUSED and applied.outcome.reason == applied.error and not applied.outcome.changed
    assert policy.told == [(PLAN, applied.outcome)]


def test_a_policy_without_observe_apply_is_not_told():
    report = ApplyReport((), 0.0, 0.0, 0.0, 0.0, ok=False, error="nothing fits")
    applied = apply_plan(lambda plan: report, PLAN, object())
    assert applied.outcome.status == ApplyStatus.REFUSED and applied.outcome.reason == "nothing fits"
