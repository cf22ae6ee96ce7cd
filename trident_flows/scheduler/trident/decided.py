"""What one tick of the Trident policy decided, before it is recorded.

Contract: ``Decided`` is frozen: the tick's ``Action``, its reason, the plan to issue (None: keep the
current placement, with why as a ``Hold``) and the MILP's predicted pipeline throughput (input
items/s; 0.0 when nothing was placed). Named constructors build each kind: ``roll_out``,
``rollback``, ``optimal`` (the current placement is the MILP's optimum), ``wait`` (a better placement
exists but is not rolled out now), ``holding`` (nothing is planned this tick, for the reason
``hold`` names) and ``nothing`` (no step decided anything).
"""

from __future__ import annotations

from dataclasses import dataclass

from trident_flows.core.types import Plan
from trident_flows.scheduler.decision_log import Action, Hold, HoldKind


@dataclass(frozen=True)
class Decided:
    """The tick's action, reason, plan, predicted throughput and hold (see the module docstring)."""

    action: Action
    reason: str
    plan: Plan | None
    predicted: float
    hold: Hold | None = None

    @classmethod
    def roll_out(cls, plan: Plan, reason: str, predicted: float) -> "Decided":
        return cls(Action.ROLL_OUT, reason, plan, predicted)

    @classmethod
    def rollback(cls, plan: Plan) -> "Decided":
        return cls(Action.ROLLBACK, plan.reason, plan, 0.0)

    @classmethod
    def optimal(cls, reason: str, predicted: float) -> "Decided":
        return cls(Action.NONE, reason, None, predicted, Hold(HoldKind.OPTIMAL))

    @classmethod
    def wait(cls, reason: str, predicted: float, hold: Hold) -> "Decided":
        return cls(Action.WAIT, reason, None, predicted, hold)

    @classmethod
    def holding(cls, reason: str, hold: Hold) -> "Decided":
        return cls(Action.NONE, reason, None, 0.0, hold)

    @classmethod
    def nothing(cls) -> "Decided":
        return cls(Action.NONE, "", None, 0.0)
