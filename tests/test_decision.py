"""The one ``Decision`` (core/decision.py): its named constructors, the shapes it refuses, its JSON, and that it is the
only class of that name in the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trident_flows.core.decision import Action, Decision, Hold, HoldKind
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, PlanKind, Rationale, ReplicaGroup

PLAN = Plan((OperatorPlan("ocr", (ReplicaGroup(OpConfig.make("cpu", batch_size=8), 3),), "grow"),), 2.0, "grow ocr",
            Rationale(PlanKind.THROUGHPUT, throughput_before=1.5, throughput_after=2.0))


def test_each_constructor_gives_its_action_with_a_plan_or_a_typed_hold() -> None:
    assert Decision.roll_out(PLAN, "faster", 2.0) == Decision(Action.ROLL_OUT, "faster", PLAN, 2.0)
    assert Decision.rollback(PLAN) == Decision(Action.ROLLBACK, "grow ocr", PLAN)
    assert Decision.canary(PLAN, "try b32").action == Action.CANARY
    assert Decision.wait("does not pay", Hold(HoldKind.DOES_NOT_PAY), 2.0) == Decision(Action.WAIT, "does not pay", None, 2.0,
                                                                                   Hold(HoldKind.DOES_NOT_PAY))
    assert Decision.no_change() == Decision(Action.NONE, "no change")
    assert Decision.error("placement: ValueError").hold == Hold(HoldKind.STEP_FAILED)
    assert Decision.roll_out(PLAN, "faster").rationale == PLAN.rationale and Decision.no_change().rationale is None


def test_a_decision_whose_action_plan_and_hold_disagree_is_refused() -> None:
    with pytest.raises(ValueError, match="a roll_out decision needs plan"):
        Decision(Action.ROLL_OUT, "faster")
    with pytest.raises(ValueError, match="a none decision takes no plan"):
        Decision(Action.NONE, "no change", PLAN)
    with pytest.raises(ValueError, match="a canary decision issues a plan: it has no hold"):
        Decision(Action.CANARY, "try", PLAN, hold=Hold(HoldKind.OPTIMAL))
    with pytest.raises(ValueError, match="a wait decision says why as a Hold"):
        Decision(Action.WAIT, "later")


def test_to_dict_is_json_ready() -> None:
    data = Decision.wait("gain too small", Hold(HoldKind.UNDER_MIN_GAIN, 0.01, 0.02), 3.0).to_dict()
    assert data == {"action": "wait", "reason": "gain too small", "plan": None, "predicted_throughput": 3.0,
                    "hold": {"kind": "under_min_gain", "gain": 0.01, "min_gain": 0.02}}
    assert Decision.roll_out(PLAN, "faster").to_dict()["plan"] == PLAN.to_dict()


def test_the_package_has_exactly_one_class_named_decision() -> None:
    package = Path(__file__).resolve().parents[1] / "trident_flows"
    found = [f"{path.relative_to(package)}:{node.lineno}" for path in sorted(package.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef) and node.name == "Decision"]
    assert len(found) == 1 and found[0].startswith("core/decision.py:"), found
