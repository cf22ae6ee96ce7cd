"""What a policy decided at one tick: the frozen ``Decision`` every policy returns.

Contract:
- ``Decision`` holds the tick's ``Action`` (none, wait, roll_out, canary, rollback, error), its reason
  (text for people and logs), the plan to hand to the runner (present exactly for roll_out, rollback
  and canary), the predicted pipeline throughput (input items/s; 0.0 when not predicted) and, when it
  issues no plan, why as a typed ``Hold`` (``HoldKind`` with its figures). ``rationale`` is the
  plan's typed ``Rationale`` (None without a plan, or from a policy that gives none).
- Built by its named constructors: ``roll_out``, ``rollback``, ``canary``, ``wait`` (its ``Hold``
  required), ``no_change`` (a ``Hold`` when the policy says why) and ``error`` (a failed step: the
  current plan is kept, hold ``STEP_FAILED``); a mismatched action, plan and hold is refused.
- The control loop hands it unchanged to the apply step, its recorders and the Prefect layer;
  ``to_dict()`` is JSON-ready. Plain data: no Ray, no Prefect.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from trident_flows.core.types import Plan, Rationale


class Action(str, Enum):
    """What a tick decided."""

    NONE = "none"
    WAIT = "wait"
    ROLL_OUT = "roll_out"
    CANARY = "canary"
    ROLLBACK = "rollback"
    ERROR = "error"

    def __str__(self) -> str:  # log text and f-strings show the value ("roll_out"), as the JSON does
        return self.value

    @property
    def issues_nothing(self) -> bool:
        """The tick decided on no plan of its own: nothing to change, or a change judged not worth it."""
        return self in (Action.NONE, Action.WAIT)

    @property
    def issues_plan(self) -> bool:
        """The decision hands a plan to the runner."""
        return self in (Action.ROLL_OUT, Action.CANARY, Action.ROLLBACK)


class HoldKind(str, Enum):
    """Why a tick changed nothing."""

    WAITING_FOR_SAMPLES = "waiting_for_samples"  # the evidence gate: not every operator has a model and enough samples
    VERIFYING = "verifying"                      # the last rollout is measured before planning again
    OPTIMAL = "optimal"                          # the current placement is the best one found
    NO_GAIN = "no_gain"                          # no other placement is predicted to be faster
    DOES_NOT_PAY = "does_not_pay"                # a faster placement would not pay back its switch in time
    UNDER_MIN_GAIN = "under_min_gain"            # the predicted gain is under the share a change must bring
    MAX_CHANGES = "max_changes"                  # the better placement changes more operators than a plan may
    ROLLED_BACK_BEFORE = "rolled_back_before"    # the better placement was rolled back before for this workload
    CANNOT_PRICE = "cannot_price"                # the change could not be ordered or priced
    REFUSED_BEFORE = "refused_before"            # the runner refused this plan against this placement before
    STEP_FAILED = "step_failed"                  # a step of the tick raised; the current plan is kept


@dataclass(frozen=True)
class Hold:
    """Why a tick changed nothing; ``gain`` and ``min_gain`` (shares: 0.02 = 2%) are given with
    ``UNDER_MIN_GAIN``."""

    kind: HoldKind
    gain: float | None = None
    min_gain: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", HoldKind(self.kind))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "gain": self.gain, "min_gain": self.min_gain}


@dataclass(frozen=True)
class Decision:
    """One tick's decision (see the module docstring); build it with a named constructor."""

    action: Action
    reason: str
    plan: Plan | None = None
    predicted_throughput: float = 0.0
    hold: Hold | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Action(self.action))
        if self.action.issues_plan != (self.plan is not None):
            raise ValueError(f"a {self.action} decision {'needs' if self.action.issues_plan else 'takes no'} plan")
        if self.hold is not None and self.plan is not None:
            raise ValueError(f"a {self.action} decision issues a plan: it has no hold")
        if self.action in (Action.WAIT, Action.ERROR) and self.hold is None:
            raise ValueError(f"a {self.action} decision says why as a Hold")

    @classmethod
    def roll_out(cls, plan: Plan, reason: str, predicted_throughput: float = 0.0) -> "Decision":
        return cls(Action.ROLL_OUT, reason, plan, predicted_throughput)

    @classmethod
    def rollback(cls, plan: Plan) -> "Decision":
        return cls(Action.ROLLBACK, plan.reason, plan)

    @classmethod
    def canary(cls, plan: Plan, reason: str, predicted_throughput: float = 0.0) -> "Decision":
        return cls(Action.CANARY, reason, plan, predicted_throughput)

    @classmethod
    def wait(cls, reason: str, hold: Hold, predicted_throughput: float = 0.0) -> "Decision":
        return cls(Action.WAIT, reason, None, predicted_throughput, hold)

    @classmethod
    def no_change(cls, reason: str = "no change", hold: Hold | None = None, predicted_throughput: float = 0.0) -> "Decision":
        return cls(Action.NONE, reason, None, predicted_throughput, hold)

    @classmethod
    def error(cls, reason: str, predicted_throughput: float = 0.0) -> "Decision":
        return cls(Action.ERROR, reason, None, predicted_throughput, Hold(HoldKind.STEP_FAILED))

    @property
    def rationale(self) -> Rationale | None:
        return self.plan.rationale if self.plan is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "reason": self.reason, "plan": self.plan.to_dict() if self.plan else None,
                "predicted_throughput": self.predicted_throughput, "hold": self.hold.to_dict() if self.hold else None}
